"""The SDK's socket failures and error replies as the redis-py exceptions its callers catch.

The SDK sends on ``FastClient`` (kvstrata.client.fast), which raises ``RespError`` for an error reply and
``OSError`` for a socket failure. Callers of ``KVCacheClient`` have always seen redis-py's classes (``except
redis.exceptions.OutOfMemoryError``, ``NoPermissionError``...), whichever transport carried the command, so the
replies are mapped the way redis-py's own parser maps them: by the error code, which is then dropped from the
message (redis-py's ``OutOfMemoryError("command not allowed ...")``, ``ResponseError("unknown command ...")``).
"""

from __future__ import annotations

from collections.abc import Callable

import redis.exceptions as rx

# Error code -> class, as redis-py's parser had them before 8.2 (the codes a KV client can meet); used only where
# redis-py's parser cannot be imported.
_BY_CODE: dict[str, type[rx.ResponseError] | type[rx.RedisError]] = {
    "OOM": rx.OutOfMemoryError,
    "NOPERM": rx.NoPermissionError,
    "WRONGPASS": rx.AuthenticationError,
    "NOAUTH": rx.AuthenticationError,
    "READONLY": rx.ReadOnlyError,
    "LOADING": rx.BusyLoadingError,
    "TRYAGAIN": rx.TryAgainError,
    "EXECABORT": rx.ExecAbortError,
    "MASTERDOWN": rx.MasterDownError,
}
_ERR_TEXT: dict[str, type[rx.RedisError]] = {
    "invalid password": rx.AuthenticationError,
    "max number of clients reached": rx.ConnectionError,
}


try:  # redis-py's own mapping, which grows with its releases (8.2 made 'max number of clients' a class of its own)
    from redis._parsers.base import BaseParser

    _PARSE: Callable[[str], rx.RedisError] | None = BaseParser.parse_error
except ImportError:  # a redis-py without it: the table above
    _PARSE = None


def reply_error(text: str) -> rx.RedisError:
    """An error reply's text (``"OOM command not allowed ..."``) as the exception redis-py would raise."""
    if _PARSE is not None:
        return _PARSE(text)
    code, _, rest = text.partition(" ")
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(rest, status_code=code)
    if code == "ERR":
        return _ERR_TEXT.get(rest, rx.ResponseError)(rest, status_code=code)
    return rx.ResponseError(text)


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
