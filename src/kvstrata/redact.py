"""Secrets out of everything a client, an operator's log or the HTTP port can read.

``redact_args`` is what Redis's ``redactClientCommandArgument`` does for the slow log: the password arguments
of AUTH, HELLO ... AUTH, MIGRATE ... AUTH/AUTH2, CONFIG SET of a secret parameter and ACL SETUSER become
``(redacted)``.
``redact_url`` hides the password inside a URL (``redis://user:secret@host`` -> ``redis://user:***@host``).
``public_args`` is the HTTP side's view of a command: its name and how many arguments it had, never a key or a
value.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REDACTED = b"(redacted)"
URL_MASK = "***"
# Parameters whose values are secrets (Redis: requirepass, masterauth, tls-*-pass) or may hold one (a URL).
SECRET_PARAMS = frozenset({"requirepass", "masterauth", "masteruser", "tls-key-file-pass",
                           "tls-client-key-file-pass"})
URL_PARAMS = frozenset({"pool"})
# ACL SETUSER rules that carry a password or its hash.
_PASSWORD_RULES = (b">", b"<", b"#", b"!")


def _lower(arg: Any) -> bytes:
    return bytes(arg[:64]).lower()


def secret_positions(args: Sequence[Any]) -> list[int]:
    """Indexes of ``args`` (a command as sent) that hold secrets."""
    if not args:
        return []
    name = _lower(args[0])
    n = len(args)
    if name == b"auth":
        return list(range(1, n))
    if name == b"hello":
        out = []
        i = 2
        while i < n:
            if _lower(args[i]) == b"auth":
                out += [j for j in (i + 1, i + 2) if j < n]
                i += 3
            else:
                i += 2 if _lower(args[i]) == b"setname" else 1
        return out
    if name == b"migrate":  # AUTH password, AUTH2 username password (Redis redacts both of AUTH2's)
        out = []
        i = 6
        while i < n:
            opt = _lower(args[i])
            if opt == b"keys":
                break
            if opt == b"auth":
                out += [j for j in (i + 1,) if j < n]
                i += 2
            elif opt == b"auth2":
                out += [j for j in (i + 1, i + 2) if j < n]
                i += 3
            else:
                i += 1
        return out
    if n < 2:
        return []
    sub = _lower(args[1])
    if name == b"config" and sub == b"set":
        out = []
        for i in range(2, n - 1, 2):
            param = _lower(args[i]).decode("latin-1").replace("_", "-")
            if param in SECRET_PARAMS or param in URL_PARAMS:
                out.append(i + 1)
        return out
    if name == b"acl" and sub == b"setuser":
        return [i for i in range(3, n) if bytes(args[i][:1]) in _PASSWORD_RULES]
    if name == b"migrate":
        out = []
        for i in range(6, n):
            word = _lower(args[i - 1])
            if word == b"auth":
                out.append(i)
            elif word == b"auth2":
                out += [j for j in (i, i + 1) if j < n]
        return out
    return []


def redact_args(args: Sequence[Any]) -> list[Any]:
    """``args`` with every secret replaced by ``(redacted)`` (a new list; the same list object when none)."""
    positions = secret_positions(args)
    if not positions:
        return args if isinstance(args, list) else list(args)
    out = list(args)
    for i in positions:
        out[i] = REDACTED
    return out


def has_secrets(args: Sequence[Any]) -> bool:
    return bool(secret_positions(args))


def redact_url(url: str) -> str:
    """The URL with the password of each ``user:password@`` replaced by ``***`` (several hosts allowed), and the
    value of every query option named ``*password`` (``?password=``, ``?sentinel_password=``) too."""
    if "@" not in url and "password" not in url.lower():
        return url
    head, q, query = url.partition("?")
    if q:  # on the text: urlunsplit would turn unix:///path into unix:/path
        url = head + q + _QUERY_PASSWORD.sub(rf"\1{URL_MASK}", query)
    try:
        parts = urlsplit(url)
    except ValueError:
        return URL_MASK
    netloc = parts.netloc
    if "@" not in netloc:
        return url
    userinfo, _, hosts = netloc.rpartition("@")
    user, sep, _ = userinfo.partition(":")
    # A lone ``secret@host`` is a password too (redis://secret@host is how some clients spell it).
    masked = f"{user}:{URL_MASK}" if sep else URL_MASK
    return urlunsplit(parts._replace(netloc=f"{masked}@{hosts}"))


_QUERY_PASSWORD = re.compile(r"((?:^|&)[^&=]*password=)[^&]*", re.IGNORECASE)


def public_args(args: Sequence[Any]) -> list[str]:
    """What the HTTP side may show of a command: its name (and subcommand) and its argument count."""
    if not args:
        return []
    words = [bytes(args[0][:64]).decode("utf-8", errors="backslashreplace").lower()]
    rest = len(args) - 1
    if rest and bytes(args[0][:16]).lower() in _CONTAINERS and _WORD.fullmatch(bytes(args[1][:33])):
        words.append(bytes(args[1][:32]).decode("utf-8", errors="backslashreplace").lower())
        rest -= 1
    if rest:
        words.append(f"({rest} argument{'s' if rest != 1 else ''})")
    return words


_WORD = re.compile(rb"[A-Za-z][A-Za-z0-9_-]{0,31}")
_CONTAINERS = frozenset({b"client", b"config", b"acl", b"slowlog", b"latency", b"memory", b"command",
                         b"object", b"debug", b"cluster"})
