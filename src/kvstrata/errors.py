"""Exception types that carry their RESP error text, so every layer can raise and the server can reply."""

from __future__ import annotations


class CommandError(Exception):
    """An error reply for one command; the connection and the server carry on.

    ``message`` is the full text after ``-`` (it starts with its prefix, e.g. ``ERR`` or ``WRONGTYPE``).
    """

    prefix = "ERR"

    def __init__(self, text: str, *, raw: bool = False) -> None:
        message = text if raw else f"{self.prefix} {text}"
        super().__init__(message)
        self.message = message


class WrongTypeError(CommandError):
    prefix = "WRONGTYPE"

    def __init__(self) -> None:
        super().__init__("Operation against a key holding the wrong kind of value")


class OutOfMemoryError(CommandError):
    prefix = "OOM"

    def __init__(self, text: str = "command not allowed when used memory > 'maxmemory'.") -> None:
        super().__init__(text)


class NoAuthError(CommandError):
    prefix = "NOAUTH"

    def __init__(self) -> None:
        super().__init__("Authentication required.")


class WrongPassError(CommandError):
    prefix = "WRONGPASS"

    def __init__(self) -> None:
        super().__init__("invalid username-password pair or user is disabled.")


class VersionMismatchError(CommandError):
    prefix = "VERMISMATCH"


class BusyKeyError(CommandError):
    prefix = "BUSYKEY"

    def __init__(self) -> None:
        super().__init__("Target key name already exists.")


class UnblockedError(CommandError):
    prefix = "UNBLOCKED"

    def __init__(self) -> None:
        super().__init__("client unblocked via CLIENT UNBLOCK")


class ProtocolError(Exception):
    """Malformed input on the wire; the server replies ``-ERR Protocol error: ...`` and closes."""

    def __init__(self, text: str) -> None:
        super().__init__(f"ERR Protocol error: {text}")
        self.message = f"ERR Protocol error: {text}"


# Texts shared by many commands, spelled exactly as Redis spells them.
NOT_INTEGER = "value is not an integer or out of range"
NOT_FLOAT = "value is not a valid float"
SYNTAX = "syntax error"
NO_SUCH_KEY = "no such key"
OVERFLOW = "increment or decrement would overflow"


def wrong_arity(name: str) -> CommandError:
    return CommandError(f"wrong number of arguments for '{name.lower()}' command")


def not_integer() -> CommandError:
    return CommandError(NOT_INTEGER)


def syntax_error() -> CommandError:
    return CommandError(SYNTAX)
