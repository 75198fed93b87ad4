"""Server commands: COMMAND (generated from the table), CONFIG, INFO, TIME."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kvstrata import acl as acl_mod
from kvstrata.commands import info as info_report
from kvstrata.commands.args import parse_int, parse_timeout_ms
from kvstrata.commands.context import Context
from kvstrata.commands.observe import help_reply
from kvstrata.commands.registry import REGISTRY, CommandSpec, command, container, lookup_full
from kvstrata.commands.waits import Await, Commit, Suspend
from kvstrata.config import ALIASES, PARAMS_BY_NAME, canonical
from kvstrata.config_rewrite import rewrite
from kvstrata.engine.keyspace import glob_match
from kvstrata.errors import CommandError, UnblockedError, syntax_error
from kvstrata.protocol.encoder import NO_REPLY, OK, Status, Verbatim
from kvstrata.server.hangup import blocked, until_done_or_gone
from kvstrata.server.limits import empty_budget, save_problem


def _spec_info(spec: CommandSpec) -> list[Any]:
    # As Redis: a command whose keys a function finds (options after them) has movable keys.
    flags = [Status(f) for f in sorted(spec.flags | ({"movablekeys"} if spec.getkeys is not None else set()))]
    cats = [Status("@" + c) for c in acl_mod.categories(spec)]  # the same categories ACL rules use
    return [
        spec.full_name,
        spec.arity,
        flags,
        spec.first_key,
        spec.last_key,
        spec.step,
        cats,
        [],
        _key_specs(spec),
        [_spec_info(s) for s in spec.subcommands.values()],
    ]


def _key_specs(spec: CommandSpec) -> list[Any]:
    return [{
        **({"notes": ks.notes} if ks.notes else {}),
        "flags": [Status(f) for f in ks.flags],
        "begin_search": {"type": "index", "spec": {"index": ks.index}},
        "find_keys": {"type": "range", "spec": {"lastkey": ks.lastkey, "keystep": ks.step, "limit": 0}},
    } for ks in spec.key_specs]


def _spec_docs(spec: CommandSpec) -> dict[str, Any]:
    docs: dict[str, Any] = {
        "summary": spec.summary,
        "since": spec.since,
        "group": spec.group,
        "syntax": spec.syntax,
    }
    if spec.subcommands:
        docs["subcommands"] = {s.full_name: _spec_docs(s) for s in spec.subcommands.values()}
    return docs


def _all_commands(ctx: Context, args: list[bytes]) -> Any:
    return [_spec_info(s) for s in REGISTRY.values()]


container("command", "loading stale", group="server", since="2.8.13",
          summary="Returns detailed information about all commands.", bare=_all_commands)


@command("count", 2, "loading stale", parent="command", group="server", since="2.8.13",
         summary="Returns a count of commands.")
def command_count(ctx: Context, args: list[bytes]) -> Any:
    return len(REGISTRY)  # as Redis: top-level commands; subcommands are inside their containers


@command("info", -2, "loading stale", parent="command", group="server", since="2.8.13",
         summary="Returns information about one, multiple or all commands.",
         syntax="COMMAND INFO [command-name [command-name ...]]")
def command_info(ctx: Context, args: list[bytes]) -> Any:
    """Every top-level command (each container with its subcommands), or the named ones: ``config|get`` names
    a subcommand; an unknown name is a null."""
    if len(args) == 2:
        return [_spec_info(s) for s in REGISTRY.values()]
    out = []
    for name in args[2:]:
        spec = lookup_full(bytes(name))
        out.append(None if spec is None else _spec_info(spec))
    return out


@command("docs", -2, "loading stale", parent="command", group="server", since="7.0.0",
         summary="Returns documentary information about one, multiple or all commands.",
         syntax="COMMAND DOCS [command-name [command-name ...]]")
def command_docs(ctx: Context, args: list[bytes]) -> Any:
    """As COMMAND INFO, but a map keyed by (full) name; unknown names are left out."""
    specs = list(REGISTRY.values()) if len(args) == 2 else [lookup_full(bytes(n)) for n in args[2:]]
    return {spec.full_name: _spec_docs(spec) for spec in specs if spec is not None}


def _with_subcommands() -> list[CommandSpec]:
    """Every command, each container followed by its subcommands (COMMAND LIST's order in Redis 7)."""
    return [s for spec in REGISTRY.values() for s in (spec, *spec.subcommands.values())]


@command("list", -2, "loading stale", parent="command", group="server", since="7.0.0",
         summary="Returns a list of command names.", syntax="COMMAND LIST [FILTERBY MODULE name | ACLCAT category "
                                                            "| PATTERN pattern]")
def command_list(ctx: Context, args: list[bytes]) -> Any:
    specs = _with_subcommands()
    if len(args) == 5 and args[2].upper() == b"FILTERBY":
        kind, value = args[3].upper(), args[4].decode(errors="replace")
        if kind == b"PATTERN":
            specs = [s for s in specs if glob_match(args[4], s.full_name.encode(), nocase=True)]
        elif kind == b"ACLCAT":
            specs = [s for s in specs if value.lower().lstrip("@") in acl_mod.categories(s)]
        elif kind == b"MODULE":
            specs = []
        else:
            raise syntax_error()
    elif len(args) != 2:
        raise syntax_error()
    return [s.full_name for s in specs]


def _command_keys(args: list[bytes]) -> list[tuple[bytes, tuple[str, ...]]]:
    """COMMAND GETKEYS / GETKEYSANDFLAGS: the keys of the command in ``args[2:]`` with each one's key-spec flags,
    checked as Redis checks (the command, whether it has keys at all, its arity)."""
    spec = REGISTRY.get(bytes(args[2]).lower())
    if spec is not None and spec.subcommands and len(args) > 3:
        spec = spec.subcommands.get(bytes(args[3]).lower())
    if spec is None:
        raise CommandError("Invalid command specified")
    if not spec.key_specs and spec.getkeys is None:
        raise CommandError("The command has no key arguments")
    if not spec.arity_ok(len(args) - 2):
        raise CommandError("Invalid number of arguments specified for command")
    found = spec.keys_with_flags(args[2:])
    if not found:
        raise CommandError("Invalid arguments specified for command")
    return found


@command("getkeys", -4, "loading stale", parent="command", group="server", since="2.8.13",
         summary="Extracts the key names from an arbitrary command.",
         syntax="COMMAND GETKEYS command [arg [arg ...]]")
def command_getkeys(ctx: Context, args: list[bytes]) -> Any:
    return [key for key, _ in _command_keys(args)]


@command("getkeysandflags", -4, "loading stale", parent="command", group="server", since="7.0.0",
         summary="Extracts the key names and access flags for an arbitrary command.",
         syntax="COMMAND GETKEYSANDFLAGS command [arg [arg ...]]")
def command_getkeysandflags(ctx: Context, args: list[bytes]) -> Any:
    return [[key, [Status(f) for f in flags]] for key, flags in _command_keys(args)]


@command("help", 2, "loading stale", parent="command", group="server", since="5.0.0",
         summary="Returns helpful text about the different subcommands.")
def command_help(ctx: Context, args: list[bytes]) -> Any:
    return [f"{s.syntax or s.name.upper()}: {s.summary}" for s in REGISTRY[b"command"].subcommands.values()]


# ---- CONFIG ----
container("config", "", group="server", summary="A container for server configuration commands.")


@command("get", -3, "admin noscript loading stale", parent="config", group="server", since="2.0.0",
         summary="Returns the effective values of configuration parameters.")
def config_get(ctx: Context, args: list[bytes]) -> Any:
    """Redis's rules: a name without glob characters is looked up exactly (any case, replied as first spelled),
    a pattern is matched case-insensitively against every name; each name appears once (in any case)."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    names = [*PARAMS_BY_NAME, *ALIASES]
    for raw in args[2:]:
        text = raw.decode(errors="replace")
        if not any(c in raw for c in b"[*?"):
            param = PARAMS_BY_NAME.get(canonical(text))
            if param is not None and text.lower() not in seen:
                seen.add(text.lower())
                out[text] = param.render(ctx.config.get(text))
            continue
        for name in names:
            if name not in seen and glob_match(raw, name.encode(), nocase=True):
                seen.add(name)
                out[name] = PARAMS_BY_NAME[canonical(name)].render(ctx.config.get(name))
    return out


@command("set", -4, "admin noscript loading stale", parent="config", group="server", since="2.0.0",
         summary="Sets configuration parameters in-flight.")
def config_set(ctx: Context, args: list[bytes]) -> Any:
    """Redis 7's order: the names are checked first (the first unknown, immutable or repeated one is named as
    spelled), then the values are set in turn and all restored if one is refused (named
    by its parameter name)."""
    if len(args) % 2 != 0:  # as Redis 7: a name without a value (the arity took fewer than one pair)
        raise syntax_error()
    pairs = [(args[i].decode(errors="replace"), args[i + 1].decode(errors="replace"))
             for i in range(2, len(args), 2)]
    seen: set[str] = set()
    for name, value in pairs:
        key = canonical(name)
        if key not in PARAMS_BY_NAME:
            raise CommandError(f"Unknown option or number of arguments for CONFIG SET - '{name}'")
        if not PARAMS_BY_NAME[key].mutable and not _unchanged(ctx, key, value):
            raise CommandError(f"CONFIG SET failed (possibly related to argument '{name}') - "
                               "can't set immutable config")
        if key in seen:
            raise CommandError(f"CONFIG SET failed (possibly related to argument '{name}') - duplicate parameter")
        seen.add(key)
    old = {canonical(n): ctx.config.get(n) for n, _ in pairs}
    for name, value in pairs:
        if not PARAMS_BY_NAME[canonical(name)].mutable:
            continue  # set to the value it has (checked above): nothing to do
        try:
            ctx.config.set(name, value, runtime=True)
        except ValueError as exc:
            _restore(ctx, old)
            spelled = name.strip().lower()
            shown = spelled if spelled in ALIASES else canonical(name)  # maxmemory stays maxmemory
            raise CommandError(f"CONFIG SET failed (possibly related to argument '{shown}') - {exc}") from None
    problem = empty_budget(int(ctx.config.get("dram-size")), ctx.store.ssd is not None)
    if problem is not None:
        shown = next((n.strip().lower() for n, _ in pairs if canonical(n) == "dram-size"), "dram-size")
        _restore(ctx, old)
        raise CommandError(f"CONFIG SET failed (possibly related to argument '{shown}') - {problem}")
    problem = save_problem(ctx.config.get("save"), ctx.store.ssd is not None)
    if problem is not None:
        _restore(ctx, old)
        raise CommandError(f"CONFIG SET failed (possibly related to argument 'save') - {problem}")
    for name, value in pairs:
        param = PARAMS_BY_NAME[canonical(name)]
        if param.merge is not None:  # a value naming some parts: the whole one in force is what stays true
            ctx.config.persisted[param.name] = param.render(ctx.config.get(param.name))
        elif param.mutable:
            ctx.config.persisted[param.name] = value  # CONFIG REWRITE writes it as given
    if ctx.server is not None:
        ctx.server.apply_config()
    return OK


# Immutable in Redis too: CONFIG SET refuses them whatever the value, as Redis does.
_REDIS_IMMUTABLE = frozenset({"databases", "cluster-enabled", "aclfile"})


def _unchanged(ctx: Context, key: str, value: str) -> bool:
    """A parameter kvstrata cannot change at runtime (but Redis can, or Redis does not have) may be "set" to
    the value it already has: the effective configuration stays true, and a client that writes back what
    CONFIG GET gave it (as Redis's own CONFIG sanity test does) works."""
    if key in _REDIS_IMMUTABLE:
        return False
    try:
        return PARAMS_BY_NAME[key].parse(value) == ctx.config.get(key)
    except ValueError:
        return False


@command("resetstat", 2, "admin noscript loading stale", parent="config", group="server", since="2.0.0",
         summary="Resets the server's statistics.")
def config_resetstat(ctx: Context, args: list[bytes]) -> Any:
    ctx.store.stats.reset()
    for s in ctx.store.tier_stats.values():
        s.reset()
    if ctx.server is not None:
        ctx.server.reset_stats()
    return OK


def _restore(ctx: Context, old: dict[str, Any]) -> None:
    """A refused CONFIG SET leaves every value as it was (all or nothing)."""
    for param, previous in old.items():
        ctx.config.values[param] = previous


@command("rewrite", 2, "admin noscript loading stale", parent="config", group="server", since="2.8.0",
         summary="Persists the effective configuration to file.")
def config_rewrite(ctx: Context, args: list[bytes]) -> Any:
    path = ctx.server.config_file if ctx.server is not None else None
    if not path:
        raise CommandError("The server is running without a config file")
    try:
        rewrite(ctx.config, path)
    except OSError as exc:
        raise CommandError(f"Rewriting config file: {exc.strerror or exc}") from None
    return OK


@command("help", 2, "loading stale", parent="config", group="server", since="5.0.0",
         summary="Returns helpful text about the different subcommands.")
def config_help(ctx: Context, args: list[bytes]) -> Any:
    return help_reply("CONFIG", [
        "GET <pattern>",
        "    Return parameters matching the glob-like <pattern> and their values.",
        "SET <directive> <value>",
        "    Set the configuration <directive> to <value>.",
        "RESETSTAT",
        "    Reset statistics reported by the INFO command.",
        "REWRITE",
        "    Rewrite the configuration file.",
        "HELP",
        "    Prints this help.",
    ])


@command("info", -1, "loading stale", group="server", summary="Returns information and statistics about the "
         "server.", syntax="INFO [section [section ...]]")
def info(ctx: Context, args: list[bytes]) -> Any:
    text = info_report.render(ctx, [a.decode(errors="replace") for a in args[1:]])
    return Verbatim(text) if ctx.client.proto == 3 else text


@command("time", 1, "loading stale fast", group="server", since="2.6.0", summary="Returns the server time.")
def time_(ctx: Context, args: list[bytes]) -> Any:
    now = time.time_ns() // 1000
    return [str(now // 1_000_000).encode(), str(now % 1_000_000).encode()]


@command("lastsave", 1, "loading stale fast", group="server", summary="Returns the Unix timestamp of the last "
         "successful save to disk.")
def lastsave(ctx: Context, args: list[bytes]) -> Any:
    """When the last save (SAVE, BGSAVE, a save point) completed; as Redis, the server's start before any."""
    return ctx.server.saves.last_save if ctx.server is not None else int(time.time())


@command("role", 1, "noscript loading stale fast", group="server", since="2.8.12",
         summary="Returns the replication role.")
def role(ctx: Context, args: list[bytes]) -> Any:
    """A kvstrata node is a master without replicas (nodes share data through the pool, as its clients)."""
    return [b"master", 0, []]


async def _blocked_until(ctx: Context, deadline: float | None) -> int | CommandError:
    """WAIT's block: no replica will acknowledge, so until the timeout, until the client is gone (none), or until
    CLIENT UNBLOCK (``ClientState.unblock``: TIMEOUT answers as the timeout would, ERROR with -UNBLOCKED)."""
    server, client = ctx.server, ctx.client
    unblock: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    client.unblock = unblock
    conn = server.clients.get(client.id) if server is not None else None
    try:
        with blocked(server, client):
            if conn is not None and await until_done_or_gone(
                    unblock, lambda: client.closing or conn.hung_up(), deadline, WAIT_POLL_S) and unblock.result():
                return UnblockedError()
    finally:
        client.unblock = None
    return 0


WAIT_POLL_S = 0.5  # how soon a WAIT without a timeout notices its client left


# group "connection": Redis's ACL categories for WAIT are @slow @connection.
@command("wait", 3, "noscript", group="connection", since="3.0.0",
         summary="Wait for the synchronous replication of all the write commands sent in the context of the current "
                 "connection", syntax="WAIT numreplicas timeout")
def wait(ctx: Context, args: list[bytes]) -> Any:
    """As a Redis master without replicas: 0 acknowledgements, at once when none are asked for (or inside EXEC),
    else after the timeout (0: until the client disconnects). kvstrata nodes share data through the pool, whose
    own acknowledgements are ``pool-ack``'s."""
    want = parse_int(args[1])
    timeout = parse_timeout_ms(args[2])
    if want <= 0 or ctx.client.executing or ctx.server is None:
        return 0
    deadline = None if timeout == 0 else asyncio.get_running_loop().time() + timeout / 1000
    return Suspend(Await(lambda: _blocked_until(ctx, deadline)), _answer)


def _answer(result: int | CommandError) -> int:
    if isinstance(result, CommandError):
        raise result
    return result


def _saves(ctx: Context) -> Any:
    """The server's saves (kvstrata.server.saves), refusing a server without the SSD tier or with a save running."""
    if ctx.store.ssd is None:
        raise CommandError("no SSD tier configured (start with --essd-path)")
    saves = ctx.server.saves if ctx.server is not None else None
    if saves is not None and saves.running:
        raise CommandError("Background save already in progress")
    return saves


@command("save", 1, "admin noscript no_async_loading no_multi", group="server",
         summary="Synchronously saves the database(s) to disk.")
def save(ctx: Context, args: list[bytes]) -> Any:
    """Writes every DRAM value not yet on the SSD tier and answers once the SSD writer committed them; an error if
    some could not be written (a full or failing disk: they stay in memory and are retried)."""
    saves = _saves(ctx)
    if saves is None:
        ctx.store.checkpoint()
        return OK
    run = saves.begin()
    seq = ctx.store.checkpoint()

    def then(_: Any) -> Any:
        reason = saves.finish(run)
        if reason is not None:
            raise CommandError(f"SAVE failed: {reason}")
        return OK

    return Suspend(Commit(seq), then)


@command("bgsave", -1, "admin noscript no_async_loading", group="server", syntax="BGSAVE [SCHEDULE]",
         summary="Asynchronously saves the database(s) to disk.")
def bgsave(ctx: Context, args: list[bytes]) -> Any:
    """Starts writing every DRAM value not yet on the SSD tier in the background (LASTSAVE and INFO persistence
    tell when it is done). SCHEDULE, and any BGSAVE inside EXEC, starts it from the next server cycle, as Redis."""
    if len(args) > 2 or (len(args) == 2 and bytes(args[1]).upper() != b"SCHEDULE"):
        raise syntax_error()
    saves = _saves(ctx)
    if saves is None:
        raise CommandError("no server")
    if ctx.client.executing:
        saves.scheduled = True
        return Status("Background saving scheduled")
    saves.start()
    return Status("Background saving started")


@command("shutdown", -1, "admin noscript loading stale no_multi allow_busy", group="server", summary="Synchronously saves the database(s) to "
         "disk and shuts down the Redis server.", syntax="SHUTDOWN [NOSAVE | SAVE] [NOW] [FORCE]")
def shutdown(ctx: Context, args: list[bytes]) -> Any:
    """As Redis: no reply when the server goes down (the connection closes), ``Errors trying to SHUTDOWN`` when
    it would lose data it could not write, unless FORCE or NOSAVE says to go anyway. What cannot be written is the
    SSD tier's failed writes (a full or failing disk), still held in memory and retried; the checkpoint of
    write-back DRAM data runs on the way down in every case (saving more than asked loses nothing)."""
    if ctx.server is None:
        raise CommandError("no server")
    opts = {bytes(a).upper() for a in args[1:]}
    if not opts <= {b"NOSAVE", b"SAVE", b"NOW", b"FORCE", b"ABORT"} or {b"NOSAVE", b"SAVE"} <= opts \
            or (b"ABORT" in opts and len(opts) > 1):
        raise syntax_error()
    if b"ABORT" in opts:
        raise CommandError("No shutdown in progress.")  # a shutdown here never waits for replicas: none to abort
    ssd = ctx.store.ssd
    failed = len(ssd.stuck) + len(ssd.retrying) if ssd is not None else 0  # retrying: queued again, not written
    if failed and not opts & {b"FORCE", b"NOSAVE"}:
        assert ssd is not None
        raise CommandError(f"Errors trying to SHUTDOWN. Check logs. {failed} writes to the SSD tier failed "
                           f"({ssd.degraded or 'being retried'}) and are held in memory only; SHUTDOWN FORCE exits "
                           "anyway and loses them.")
    ctx.server.request_shutdown()
    ctx.client.closing = True
    return NO_REPLY
