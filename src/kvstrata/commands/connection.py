"""Connection commands: PING, ECHO, HELLO, AUTH, QUIT, SELECT, RESET and the CLIENT family."""

from __future__ import annotations

from typing import Any

from kvstrata import __version__
from kvstrata import acl as acl_mod
from kvstrata.commands.args import INT64_MAX, parse_db_index, parse_int, parse_timeout_ms
from kvstrata.commands.context import REPLY_OFF, REPLY_SKIP, REPLY_SKIP_NEXT, ClientState, Context
from kvstrata.commands.registry import command, container
from kvstrata.commands.transactions import end_transaction
from kvstrata.errors import CommandError, WrongPassError, syntax_error, wrong_arity
from kvstrata.protocol.encoder import OK, PONG, Status, Verbatim
from kvstrata.server.pause import ALL, KINDS, OFF, now_ms
from kvstrata.server.tracking import BCAST, BROKEN_REDIR

# The Redis version whose behaviour we follow; clients use it to pick features.
REDIS_COMPAT_VERSION = "7.0.15"


@command("ping", -1, "fast", values=(1, 0), group="connection", summary="Returns the server's liveliness response.",
         syntax="PING [message]")
def ping(ctx: Context, args: list[bytes]) -> Any:
    if len(args) > 2:
        raise wrong_arity("ping")
    if ctx.client.proto == 2 and ctx.client.subscribed:  # as Redis: a RESP2 subscriber's PING is an array
        return [b"pong", args[1] if len(args) == 2 else b""]
    return PONG if len(args) == 1 else args[1]


@command("echo", 2, "fast loading stale", values=(1, 0), group="connection", summary="Returns the given string.")
def echo(ctx: Context, args: list[bytes]) -> Any:
    return args[1]


def _check_password(ctx: Context, username: bytes, password: bytes) -> None:
    """AUTH / HELLO AUTH against the ACL users (``default`` is the one requirepass sets)."""
    acl = acl_mod.acl_of(ctx)
    name = bytes(username).decode("utf-8", "surrogateescape")
    user = acl.authenticate(name, bytes(password))
    if user is None:
        acl.record(ctx.client, "auth", name)
        raise WrongPassError()
    ctx.client.user = user
    ctx.client.authenticated = True


@command("auth", -2, "no_auth fast stale noscript loading allow_busy",
         group="connection", summary="Authenticates the connection.",
         syntax="AUTH [username] password")
def auth(ctx: Context, args: list[bytes]) -> Any:
    if len(args) > 3:
        raise syntax_error()
    if len(args) == 2 and acl_mod.acl_of(ctx).default.nopass:
        raise CommandError(
            "AUTH <password> called without any password configured for the default user. "
            "Are you sure your configuration is correct?"
        )
    username, password = (b"default", args[1]) if len(args) == 2 else (args[1], args[2])
    _check_password(ctx, username, password)
    return OK


def _valid_name(name: bytes) -> bool:
    return all(33 <= c <= 126 for c in name)


@command("hello", -1, "no_auth fast stale noscript loading allow_busy",
         group="connection", since="6.0.0",
         summary="Handshakes with the Redis server.",
         syntax="HELLO [protover [AUTH username password] [SETNAME clientname]]")
def hello(ctx: Context, args: list[bytes]) -> Any:
    proto = ctx.client.proto
    if len(args) > 1:
        try:
            proto = parse_int(args[1])
        except CommandError:
            raise CommandError("Protocol version is not an integer or out of range") from None
        if proto not in (2, 3):
            raise CommandError("NOPROTO unsupported protocol version", raw=True)
    i = 2
    name: bytes | None = None
    while i < len(args):
        opt = args[i].upper()
        if opt == b"AUTH" and i + 2 < len(args):
            _check_password(ctx, args[i + 1], args[i + 2])
            i += 3
        elif opt == b"SETNAME" and i + 1 < len(args):
            name = bytes(args[i + 1])  # a large argument may be a pool buffer: keep a copy
            if not _valid_name(name):
                raise CommandError("Client names cannot contain spaces, newlines or special characters.")
            i += 2
        else:
            raise CommandError(f"Syntax error in HELLO option '{args[i].decode(errors='replace')}'")
    if not ctx.client.authenticated:
        raise CommandError(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO "
            "AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol "
            "version at the same time", raw=True)
    if name is not None:
        ctx.client.name = name
    ctx.client.proto = proto
    return {
        "server": "redis",
        "version": REDIS_COMPAT_VERSION,
        "proto": proto,
        "id": ctx.client.id,
        "mode": "standalone",
        "role": "master",
        "modules": [],
        "kvstrata": __version__,
    }


@command("quit", -1, "no_auth fast stale noscript loading allow_busy",
         group="connection", summary="Closes the connection.")
def quit_(ctx: Context, args: list[bytes]) -> Any:
    ctx.client.closing = True
    return OK


@command("select", 2, "fast loading stale", group="connection", summary="Changes the selected database.")
def select(ctx: Context, args: list[bytes]) -> Any:
    parse_db_index(args[1])
    return OK


@command("reset", 1, "no_auth fast stale noscript loading allow_busy",
         group="connection", since="6.2.0", summary="Resets the connection.")
def reset(ctx: Context, args: list[bytes]) -> Any:
    client = ctx.client
    end_transaction(ctx)
    if client.monitor:
        client.monitor = False
        ctx.server.monitors.discard(client.id)
    if client.subscribed and ctx.server is not None:
        ctx.server.pubsub.forget(ctx.server.clients[client.id])
    if client.tracking and ctx.server is not None:
        ctx.server.tracking.disable(ctx.server.clients[client.id])
    client.proto = 2
    client.name = b""
    client.reply &= REPLY_SKIP  # as Redis: replies back on, but a pending SKIP still swallows RESET's own reply
    acl_mod.acl_of(ctx).attach(client)
    return Status("RESET")


# ---- CLIENT ----
container("client", "", group="connection", summary="A container for client connection commands.")


def _cmd_name(spec: Any) -> str:
    return spec if isinstance(spec, str) else spec.full_name


def _flags(c: ClientState) -> str:
    """CLIENT LIST's flags, in Redis's order: O a monitor, P a subscriber, x in MULTI, b blocked (WAIT, CLIENT
    PAUSE), t tracking (R its redirection broken, B in BCAST mode), U the Unix socket, e CLIENT NO-EVICT, N none."""
    flags = ("O" if c.monitor else "") + ("P" if c.subscribed else "") + ("x" if c.multi is not None else "")
    if c.blocked:
        flags += "b"
    if c.tracking:
        flags += "t" + ("R" if c.tracking & BROKEN_REDIR else "") + ("B" if c.tracking & BCAST else "")
    if c.unix:
        flags += "U"
    if c.no_evict:
        flags += "e"
    return flags or "N"


def client_line(c: ClientState, now_ms: int, running: bool = False) -> str:
    """One CLIENT LIST line; ``running``: ``c`` is the client asking (its command counts in qbuf/argv-mem)."""
    age = (now_ms - c.created_ms) // 1000
    idle = (now_ms - c.last_ms) // 1000
    qbuf, qfree, argv, oll, omem, total = c.memory(running) if c.memory is not None else (0, 0, 0, 0, 0, 0)
    events = "rw" if omem else "r"
    return (
        f"id={c.id} addr={c.addr} laddr={c.laddr} fd={c.fd} name={c.name.decode(errors='replace')} age={age} "
        f"idle={idle} flags={_flags(c)} db=0 sub={len(c.pubsub[0])} psub={len(c.pubsub[1])} ssub={len(c.pubsub[2])} "
        f"multi={-1 if c.multi is None else len(c.multi)} qbuf={qbuf} qbuf-free={qfree} "
        f"argv-mem={argv} multi-mem={c.multi_bytes} rbs=0 rbp=0 obl=0 oll={oll} omem={omem} tot-mem={total} events={events} "
        f"cmd={_cmd_name(c.last_cmd)} "
        f"user={c.user.name if c.user is not None else 'default'} "
        f"redir={c.tracking_redirect if c.tracking else -1} resp={c.proto} "
        f"lib-name={c.lib_name.decode(errors='replace')} "
        f"lib-ver={c.lib_ver.decode(errors='replace')}"
    )


def _connections(ctx: Context) -> list[Any]:
    return list(ctx.server.clients.values()) if ctx.server is not None else []


def _now(ctx: Context) -> int:
    return ctx.store.clock.now_ms()


@command("id", 2, "noscript loading stale", parent="client", group="connection", since="5.0.0",
         summary="Returns the unique client ID of the connection.")
def client_id(ctx: Context, args: list[bytes]) -> Any:
    return ctx.client.id


@command("setname", 3, "noscript loading stale", parent="client", group="connection", since="2.6.9",
         summary="Sets the connection name.")
def client_setname(ctx: Context, args: list[bytes]) -> Any:
    if not _valid_name(args[2]):
        raise CommandError("Client names cannot contain spaces, newlines or special characters.")
    ctx.client.name = bytes(args[2])
    return OK


@command("getname", 2, "noscript loading stale", parent="client", group="connection", since="2.6.9",
         summary="Returns the name of the connection.")
def client_getname(ctx: Context, args: list[bytes]) -> Any:
    return ctx.client.name or None


@command("info", 2, "noscript loading stale", parent="client", group="connection", since="6.2.0",
         summary="Returns information about the connection.")
def client_info(ctx: Context, args: list[bytes]) -> Any:
    return Verbatim(client_line(ctx.client, _now(ctx), running=True) + "\n")


@command("list", -2, "admin noscript loading stale", parent="client", group="connection", since="2.4.0",
         summary="Lists open connections.", syntax="CLIENT LIST [TYPE normal|master|replica|pubsub] [ID id ...]")
def client_list(ctx: Context, args: list[bytes]) -> Any:
    conns = _connections(ctx)
    if len(args) > 2:
        opt = args[2].upper()
        if opt == b"TYPE" and len(args) == 4:
            kind = args[3].lower()
            if kind not in (b"normal", b"master", b"replica", b"pubsub", b"slave"):
                raise CommandError(f"Unknown client type '{args[3].decode(errors='replace')}'")
            if kind != b"normal":
                conns = []
        elif opt == b"ID" and len(args) > 3:
            ids = {parse_int(a, "Invalid client ID") for a in args[3:]}
            conns = [c for c in conns if c.client.id in ids]
        else:
            raise syntax_error()
    now = _now(ctx)
    states = [c.client for c in conns] if conns or ctx.server is not None else [ctx.client]
    return Verbatim("".join(client_line(s, now, s is ctx.client) + "\n" for s in states))


@command("setinfo", 4, "fast", parent="client", group="connection", since="7.2.0",
         summary="Sets information specific to the client or connection.",
         syntax="CLIENT SETINFO LIB-NAME libname | LIB-VER libver")
def client_setinfo(ctx: Context, args: list[bytes]) -> Any:
    attr = args[2].upper()
    if not _valid_name(args[3]):
        raise CommandError(f"{attr.decode().lower()} cannot contain spaces, newlines or special characters.")
    if attr == b"LIB-NAME":
        ctx.client.lib_name = bytes(args[3])
    elif attr == b"LIB-VER":
        ctx.client.lib_ver = bytes(args[3])
    else:
        raise CommandError(f"Unrecognized option '{args[2].decode(errors='replace')}'")
    return OK


@command("kill", -3, "admin noscript loading stale", parent="client", group="connection", since="2.4.0",
         summary="Terminates open connections.",
         syntax="CLIENT KILL ip:port | [ID client-id] [TYPE type] [USER username] [ADDR ip:port] "
                "[LADDR ip:port] [SKIPME yes|no] [MAXAGE seconds]")
def client_kill(ctx: Context, args: list[bytes]) -> Any:
    conns = _connections(ctx)
    if len(args) == 3:
        addr = args[2].decode(errors="replace")
        for c in conns:
            if c.client.addr == addr:
                _kill(ctx, c)
                return OK
        raise CommandError("No such client")
    skipme = True
    filters: list[tuple[bytes, bytes]] = []
    for i in range(2, len(args), 2):
        if i + 1 == len(args):  # as Redis: the pairs before a filter without its value are checked first
            raise syntax_error()
        opt, val = args[i].upper(), args[i + 1]
        text = val.decode(errors="replace")
        if opt == b"ID":
            if parse_int(val, "client-id should be greater than 0") <= 0:
                raise CommandError("client-id should be greater than 0")
        elif opt == b"SKIPME":
            if val.lower() not in (b"yes", b"no"):
                raise syntax_error()
            skipme = val.lower() == b"yes"
            continue
        elif opt == b"MAXAGE":  # Redis 7.4
            if parse_int(val, "maxage is not an integer or out of range") <= 0:
                raise CommandError("maxage should be greater than 0")
        elif opt == b"TYPE":
            if val.lower() not in _CLIENT_TYPES:
                raise CommandError(f"Unknown client type '{text}'")
        elif opt == b"USER":
            if text not in acl_mod.acl_of(ctx).users:
                raise CommandError(f"No such user '{text}'")
        elif opt not in (b"ADDR", b"LADDR"):
            raise syntax_error()
        filters.append((opt, val))
    killed = 0
    now_s = _now(ctx) // 1000
    for c in conns:
        s = c.client
        if skipme and s.id == ctx.client.id:
            continue
        if all(_kill_filter_ok(s, opt, val, now_s) for opt, val in filters):
            _kill(ctx, c)
            killed += 1
    return killed


# What Redis's getClientTypeByName knows; every kvstrata connection is "normal".
_CLIENT_TYPES = (b"normal", b"master", b"replica", b"slave", b"pubsub")


def _kill_filter_ok(s: ClientState, opt: bytes, val: bytes, now_s: int) -> bool:
    text = val.decode(errors="replace")
    if opt == b"ID":
        return s.id == int(val)
    if opt == b"MAXAGE":  # Redis compares whole seconds: now - ctime
        return now_s - s.created_ms // 1000 >= int(val)
    if opt == b"ADDR":
        return s.addr == text
    if opt == b"LADDR":
        return s.laddr == text
    if opt == b"USER":
        return text == (s.user.name if s.user is not None else "default")
    return val.lower() == b"normal"  # TYPE


def _kill(ctx: Context, conn: Any) -> None:
    """The caller itself is closed after its reply (as Redis's CLIENT_CLOSE_AFTER_REPLY); others at once."""
    if conn.client is ctx.client:
        ctx.client.closing = True
    else:
        conn.kill()


@command("reply", 3, "noscript loading stale", parent="client", group="connection", since="3.2.0",
         summary="Instructs the server whether to reply to commands.", syntax="CLIENT REPLY ON | OFF | SKIP")
def client_reply(ctx: Context, args: list[bytes]) -> Any:
    """The connection drops the replies (its ``_reply_done``); OFF and SKIP have none themselves."""
    client = ctx.client
    mode = args[2].lower()
    if mode == b"on":
        client.reply &= ~(REPLY_OFF | REPLY_SKIP)
    elif mode == b"off":
        client.reply |= REPLY_OFF
    elif mode == b"skip":
        if not client.reply & REPLY_OFF:
            client.reply |= REPLY_SKIP_NEXT | REPLY_SKIP  # SKIP: this reply goes, SKIP_NEXT: the next one too
    else:
        raise syntax_error()
    return OK


@command("no-evict", 3, "admin noscript loading stale", parent="client", group="connection", since="7.0.0",
         summary="Sets the client eviction mode of the connection.")
def client_no_evict(ctx: Context, args: list[bytes]) -> Any:
    """Whether maxmemory-clients may close this client (it counts in the total either way)."""
    mode = args[2].lower()
    if mode not in (b"on", b"off"):
        raise syntax_error()
    ctx.client.no_evict = mode == b"on"
    return OK


@command("pause", -3, "admin noscript loading stale", parent="client", group="connection", since="2.9.50", most=4,
         summary="Suspends commands processing.", syntax="CLIENT PAUSE timeout [WRITE | ALL]")
def client_pause(ctx: Context, args: list[bytes]) -> Any:
    """Holds clients' commands (every one, or those that write) until the timeout (ms) or CLIENT UNPAUSE: the
    server's ``ClientPause`` (server/pause.py), which the connections consult before each command."""
    kind = ALL
    if len(args) == 4:
        kind = KINDS.get(args[3].lower(), OFF)
        if kind == OFF:
            raise CommandError("CLIENT PAUSE mode must be WRITE or ALL")
    timeout = parse_timeout_ms(args[2])
    if ctx.server is not None:
        # Redis adds the current time to a non-zero timeout (0 stays 0: a pause that has already ended).
        ctx.server.pause.pause(timeout and min(INT64_MAX, now_ms() + timeout), kind)
    return OK


@command("unpause", 2, "admin noscript loading stale", parent="client", group="connection", since="6.2.0",
         summary="Resumes processing commands from paused clients.")
def client_unpause(ctx: Context, args: list[bytes]) -> Any:
    if ctx.server is not None:
        ctx.server.pause.unpause()
    return OK


@command("unblock", -3, "admin noscript loading stale", parent="client", group="connection", since="5.0.0", most=4,
         summary="Unblocks a client blocked by a blocking command from a different connection.",
         syntax="CLIENT UNBLOCK client-id [TIMEOUT | ERROR]")
def client_unblock(ctx: Context, args: list[bytes]) -> Any:
    """1 when the client was blocked in WAIT (the only blocking command here) and is now unblocked, else 0. A
    client held by CLIENT PAUSE is not blocked in a command: 0, and it stays held. Redis has no safe answer to
    copy: 7.0.15 crashes on it, and 7.2-7.4's code unblocks it (ERROR: -UNBLOCKED, the held command dropped;
    TIMEOUT reaches a panic for a postponed client)."""
    target = parse_int(args[2])
    error = False
    if len(args) == 4:
        reason = args[3].lower()
        if reason not in (b"timeout", b"error"):
            raise CommandError("CLIENT UNBLOCK reason should be TIMEOUT or ERROR")
        error = reason == b"error"
    conn = ctx.server.clients.get(target) if ctx.server is not None else None
    unblock = conn.client.unblock if conn is not None else None
    if unblock is None or unblock.done():
        return 0
    unblock.set_result(error)
    return 1


@command("help", 2, "loading stale", parent="client", group="connection", summary="Returns helpful text about the "
         "different subcommands.")
def client_help(ctx: Context, args: list[bytes]) -> Any:
    from kvstrata.commands.registry import REGISTRY

    spec = REGISTRY[b"client"]
    return [f"{s.syntax or s.name.upper()}: {s.summary}" for s in spec.subcommands.values()]
