"""The SDK's socket failures and error replies as the redis-py exceptions its callers catch.

The SDK sends on ``FastClient`` (kvstrata.client.fast), which raises ``RespError`` for an error reply and
``OSError`` for a socket failure. Callers of ``KVCacheClient`` have always seen redis-py's classes (``except
redis.exceptions.OutOfMemoryError``, ``NoPermissionError``...), whichever transport carried the command, so the
replies are mapped the way redis-py's own parser maps them: by the error code, which is then dropped from the
message (redis-py's ``OutOfMemoryError("command not allowed ...")``, ``ResponseError("unknown command ...")``).
"""

from __future__ import annotations

import redis.exceptions as rx
from redis._parsers.base import BaseParser


def reply_error(text: str) -> rx.RedisError:
    """An error reply's text (``"OOM command not allowed ..."``) as the exception redis-py would raise: its own
    parser's mapping (every redis-py >= 5.0 has it), which grows with its releases (8.2 made 'max number of
    clients reached' a class of its own)."""
    return BaseParser.parse_error(text)


def acl_refused(exc: BaseException) -> bool:
    """Whether an error reply was ``-NOPERM`` (the server knows the command; its ACL refused it), in either form
    the SDK meets: redis-py's ``NoPermissionError`` (the code dropped from its text) or a transport's ``RespError``
    (the text with its code)."""
    return isinstance(exc, rx.NoPermissionError) or str(exc).startswith("NOPERM")


def socket_error(exc: OSError, doing: str) -> rx.RedisError:
    """A socket failure while ``doing`` something, as redis-py's TimeoutError or ConnectionError."""
    if isinstance(exc, TimeoutError):  # socket.timeout too
        return rx.TimeoutError(f"timeout {doing}")
    return rx.ConnectionError(f"error {doing}: {exc}")
