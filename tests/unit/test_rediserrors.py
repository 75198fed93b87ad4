"""kvstrata.client.rediserrors maps error replies exactly as redis-py's own parser does (class, message,
status code), so SDK callers see the same exceptions whichever transport carried a command."""

from __future__ import annotations

import pytest
import redis.exceptions as rx
from redis._parsers.base import BaseParser

from kvstrata.client.fast import RespError
from kvstrata.client.rediserrors import acl_refused, reply_error, socket_error

REPLIES = [
    "OOM command not allowed when used memory > 'maxmemory'.",
    "NOPERM User tenant has no permissions to access the 'other:0' key",
    "WRONGPASS invalid username-password pair or user is disabled.",
    "NOAUTH Authentication required.",
    "ERR invalid password",
    "ERR max number of clients reached",
    "ERR unknown command 'X', with args beginning with: ",
    "ERR checksum mismatch; nothing was stored",
    "READONLY You can't write against a read only replica.",
    "LOADING Redis is loading the dataset in memory",
    "TRYAGAIN Multiple keys request during rehashing of slot",
    "EXECABORT Transaction discarded because of previous errors.",
    "MASTERDOWN Link with MASTER is down",
    "WRONGTYPE Operation against a key holding the wrong kind of value",
    "VERSIONMISMATCH expected 3",
    "OOM",
]


@pytest.mark.parametrize("text", REPLIES)
def test_reply_errors_match_redis_py(text: str) -> None:
    ours, theirs = reply_error(text), BaseParser.parse_error(text)
    assert type(ours) is type(theirs)
    assert str(ours) == str(theirs)
    assert getattr(ours, "status_code", None) == getattr(theirs, "status_code", None)


def test_socket_errors() -> None:
    assert isinstance(socket_error(TimeoutError(), "reading"), rx.TimeoutError)
    err = socket_error(ConnectionRefusedError(111, "refused"), "connecting")
    assert type(err) is rx.ConnectionError and "refused" in str(err)
    assert type(socket_error(ConnectionError("server closed the connection"), "while storing")) is rx.ConnectionError


@pytest.mark.parametrize("text", REPLIES)
def test_acl_refused_in_both_forms(text: str) -> None:
    """An ACL refusal is told apart the same way as redis-py's exception (its text without the code) and as the
    transport's RespError (with it); no other reply is one."""
    refused = text.startswith("NOPERM")
    assert acl_refused(reply_error(text)) is refused
    assert acl_refused(BaseParser.parse_error(text)) is refused
    assert acl_refused(RespError(text)) is refused
