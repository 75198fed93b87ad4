"""MIGRATE: move (or, with COPY, copy) keys to another Redis-protocol server - Redis, Valkey or another kvstrata -
as Redis does: one connection, AUTH and SELECT, then a RESTORE per key with its remaining TTL and its DUMP payload
(kvstrata.protocol.dump_payload), sent in one write; each key the target restored is deleted here.

The transfer runs on the event loop's sockets (an ``Await`` wait), so other clients are served meanwhile. That is
the one difference from Redis, which blocks: a key written here by another client while its RESTORE was in flight
is not deleted afterwards (its version changed), so no acknowledged write is lost. No connection is cached between
calls (Redis keeps one per target for 10 s).
"""

from __future__ import annotations

import asyncio
from typing import Any

from kvstrata.client.fast import pack
from kvstrata.commands.args import parse_int
from kvstrata.commands.context import Context
from kvstrata.commands.pool_acks import after_pool_delete, delete_tracked
from kvstrata.commands.registry import command
from kvstrata.commands.waits import Await, Suspend
from kvstrata.errors import CommandError, syntax_error
from kvstrata.protocol import dump_payload
from kvstrata.protocol.encoder import OK, ErrorReply, Status

NOKEY = Status("NOKEY")
LINE_LIMIT = 1024  # Redis reads each reply line into 1 KiB


class MigrateIOError(CommandError):
    prefix = "IOERR"


def _options(args: list[bytes]) -> tuple[bool, bool, list[bytes] | None, int]:
    """(copy, replace, the AUTH or AUTH2 arguments, index of the first key): Redis's parse, its errors."""
    copy = replace = False
    auth: list[bytes] | None = None
    first = 3
    j = 6
    while j < len(args):
        opt = args[j].lower()
        more = len(args) - 1 - j
        if opt == b"copy":
            copy = True
        elif opt == b"replace":
            replace = True
        elif opt == b"auth":
            if not more:
                raise syntax_error()
            auth = [args[j + 1]]
            j += 1
        elif opt == b"auth2":
            if more < 2:
                raise syntax_error()
            auth = [args[j + 1], args[j + 2]]
            j += 2
        elif opt == b"keys":
            if args[3]:
                raise CommandError("When using MIGRATE KEYS option, the key argument must be set to the empty "
                                   "string")
            first = j + 1
            break
        else:
            raise syntax_error()
        j += 1
    return copy, replace, auth, first


def _keys(args: list[bytes]) -> list[bytes]:
    """The keys MIGRATE names (for ACL checks and loading): after KEYS, else the key argument."""
    try:
        first = _options(args)[3]
    except CommandError:
        return [args[3]] if len(args) > 3 and args[3] else []
    return list(args[first:]) if first > 3 else ([args[3]] if args[3] else [])


async def _transfer(host: str, port: int, timeout_s: float, request: list[Any], replies: int) -> list[bytes]:
    """Send ``request`` and read ``replies`` reply lines; MigrateIOError as Redis words it."""
    try:
        if not host:
            raise ValueError("no host")
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=LINE_LIMIT * 64),
                                                timeout_s)
    except ConnectionRefusedError:
        # Redis's connect is non-blocking and succeeds for a refused one: its first write fails.
        raise MigrateIOError("error or timeout writing to target instance") from None
    except (TimeoutError, OSError, ValueError, OverflowError, UnicodeError):
        raise MigrateIOError("error or timeout connecting to the client") from None
    try:
        try:
            writer.writelines(request)
            await asyncio.wait_for(writer.drain(), timeout_s)
        except (TimeoutError, OSError):
            raise MigrateIOError("error or timeout writing to target instance") from None
        lines = []
        try:
            for _ in range(replies):
                line = await asyncio.wait_for(reader.readline(), timeout_s)
                if not line.endswith(b"\n"):
                    raise ConnectionError("closed")
                lines.append(line.rstrip(b"\r\n"))
        except (TimeoutError, OSError, ValueError, asyncio.LimitOverrunError):
            if not lines:
                raise MigrateIOError("error or timeout reading to target instance") from None
        return lines  # fewer than asked for after a read error: the caller acts on those that came
    finally:
        writer.close()


# getkeys: the keys follow KEYS, or are the one key argument. Loaded first (load=True): their values are dumped.
@command("migrate", -6, "write", keys=(3, 3, 1), getkeys=_keys, group="generic", since="2.6.0",
         summary="Atomically transfers a key from one Redis instance to another.",
         syntax="MIGRATE host port <key | \"\"> destination-db timeout [COPY] [REPLACE] [AUTH password | "
                "AUTH2 username password] [KEYS key [key ...]]")
def migrate(ctx: Context, args: list[bytes]) -> Any:
    copy, replace, auth, first = _options(args)
    timeout = parse_int(args[5])
    db = parse_int(args[4])
    if timeout <= 0:
        timeout = 1000
    store = ctx.store
    now = store.clock.now_ms()
    keys = list(args[first:]) if first > 3 else [args[3]]
    request: list[Any] = []  # RESP frames (kvstrata.client.fast.pack: each payload sent as it is, not copied)
    if auth is not None:
        pack([b"AUTH", *auth], request)
    pack([b"SELECT", db], request)
    replies = 1 + (auth is not None)
    moved: list[tuple[bytes, int]] = []
    for key in keys:
        entry = store.get(key, touch=False, count=True)  # a read Redis counts (and a keymiss when absent)
        if entry is None:
            continue
        ttl = 0
        if entry.expire_at:
            ttl = max(entry.expire_at - now, 1)
        payload = dump_payload.dump(entry.value)
        pack([b"RESTORE", key, ttl, payload, *([b"REPLACE"] if replace else [])], request)
        moved.append((bytes(key), entry.version))
    if not moved:
        return NOKEY
    try:
        host = args[1].decode()
    except UnicodeDecodeError:
        host = ""
    port = _atoi(args[2])
    expected = replies + len(moved)

    def finish(lines: list[bytes]) -> Any:
        failed = next((line for line in lines[:replies] if line[:1] == b"-"), None)  # AUTH's, SELECT's
        error: str | None = None
        done: list[bytes] = []
        for (key, version), line in zip(moved, lines[replies:], strict=False):  # lines: fewer after a read error
            refused = failed if failed is not None else line if line[:1] == b"-" else None
            if refused is not None:
                if error is None:  # Redis reports the first one and goes on with the others
                    error = f"ERR Target instance replied with error: {refused[1:].decode('latin-1')}"
                continue
            current = store.probe(key)
            if not copy and current is not None and current.version == version:
                done.append(key)  # unchanged while in flight: a newer write here is kept
        if error is None and len(lines) < expected:
            error = "IOERR error or timeout reading to target instance"
        seqs = delete_tracked(ctx, done)[1] if done else []
        return after_pool_delete(ctx, ErrorReply(error) if error else OK, seqs)

    return Suspend(Await(lambda: _transfer(host, port, timeout / 1000, request, expected)), finish)


def _atoi(raw: bytes) -> int:
    """The port as C's atoi reads it (Redis does): leading digits, else 0 (a connect that fails)."""
    digits = raw.lstrip(b" ")
    sign = -1 if digits[:1] == b"-" else 1
    digits = digits.lstrip(b"+-")
    n = 0
    for b in digits:
        if not 48 <= b <= 57:
            break
        n = n * 10 + b - 48
    return sign * n
