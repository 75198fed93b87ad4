"""Server commands: COMMAND (generated from the table), CONFIG, INFO, TIME."""

from __future__ import annotations

import fnmatch
import time
from typing import Any

from kvstrata.commands import info as info_report
from kvstrata.commands.context import Context
from kvstrata.commands.registry import REGISTRY, CommandSpec, command, container
from kvstrata.config import PARAMS, PARAMS_BY_NAME, canonical
from kvstrata.errors import CommandError
from kvstrata.protocol.encoder import OK, Status, Verbatim

_ACL = {"string": "@string", "generic": "@keyspace", "connection": "@connection", "server": "@admin",
        "tairkv": "@kvcache"}


def _spec_info(spec: CommandSpec) -> list[Any]:
    flags = [Status(f) for f in sorted(spec.flags)]
    cats = [Status(_ACL.get(spec.group, "@" + spec.group))]
    cats.append(Status("@write" if spec.write else "@read"))
    return [
        spec.full_name,
        spec.arity,
        flags,
        spec.first_key,
        spec.last_key,
        spec.step,
        cats,
        [],
        [],
        [_spec_info(s) for s in spec.subcommands.values()],
    ]


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


def _command(ctx: Context, args: list[bytes]) -> Any:
    if len(args) == 1:
        return [_spec_info(s) for s in REGISTRY.values()]
    sub = args[1].lower()
    if sub == b"count" and len(args) == 2:
        return len(REGISTRY)
    if sub == b"info":
        names = args[2:] or list(REGISTRY)
        return [_spec_info(REGISTRY[n.lower()]) if n.lower() in REGISTRY else None for n in names]
    if sub == b"docs":
        names = args[2:] or list(REGISTRY)
        out: dict[str, Any] = {}
        for n in names:
            spec = REGISTRY.get(n.lower())
            if spec is not None:
                out[spec.name] = _spec_docs(spec)
        return out
    if sub == b"list":
        names = [s.name for s in REGISTRY.values()]
        if len(args) == 5 and args[2].upper() == b"FILTERBY" and args[3].upper() == b"PATTERN":
            pattern = args[4].decode(errors="replace")
            names = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        elif len(args) != 2:
            raise CommandError("syntax error")
        return names
    if sub == b"getkeys" and len(args) > 2:
        spec = REGISTRY.get(args[2].lower())
        if spec is None:
            raise CommandError("Invalid command specified")
        keys = spec.keys(args[2:])
        if not keys:
            raise CommandError("The command has no key arguments")
        return keys
    if sub == b"help":
        return ["COMMAND [COUNT|INFO|DOCS|LIST|GETKEYS]"]
    raise CommandError(f"unknown subcommand '{args[1].decode(errors='replace')}'. Try COMMAND HELP.")


command("command", -1, "loading stale", group="server", since="2.8.13",
        summary="Returns detailed information about all commands.")(_command)


# ---- CONFIG ----
container("config", "", group="server", summary="A container for server configuration commands.")


@command("get", -3, "admin", parent="config", group="server", since="2.0.0",
         summary="Returns the effective values of configuration parameters.")
def config_get(ctx: Context, args: list[bytes]) -> Any:
    out: dict[str, str] = {}
    names = [p.name for p in PARAMS] + ["maxmemory"]
    for raw in args[2:]:
        pattern = raw.decode(errors="replace").lower()
        for name in names:
            if fnmatch.fnmatchcase(name, pattern):
                param = PARAMS_BY_NAME[canonical(name)]
                value = ctx.config.get(name)
                out[name] = param.render(value) if not (param.secret and value is None) else ""
    return out


@command("set", -4, "admin", parent="config", group="server", since="2.0.0",
         summary="Sets configuration parameters in-flight.")
def config_set(ctx: Context, args: list[bytes]) -> Any:
    if len(args) % 2 != 0:
        raise CommandError("wrong number of arguments for 'config|set' command")
    pairs = [(args[i].decode(errors="replace"), args[i + 1].decode(errors="replace"))
             for i in range(2, len(args), 2)]
    old = {canonical(n): ctx.config.get(n) for n, _ in pairs if canonical(n) in PARAMS_BY_NAME}
    try:
        for name, value in pairs:
            ctx.config.set(name, value, runtime=True)
    except ValueError as exc:
        for name, value in old.items():
            ctx.config.values[name] = value
        name = next(n for n, _ in pairs)
        raise CommandError(f"CONFIG SET failed (possibly related to argument '{name}') - {exc}") from None
    if ctx.server is not None:
        ctx.server.apply_config()
    return OK


@command("resetstat", 2, "admin", parent="config", group="server", since="2.0.0",
         summary="Resets the server's statistics.")
def config_resetstat(ctx: Context, args: list[bytes]) -> Any:
    ctx.store.stats.reset()
    for s in ctx.store.tier_stats.values():
        s.reset()
    if ctx.server is not None:
        ctx.server.reset_stats()
    return OK


@command("rewrite", 2, "admin", parent="config", group="server", since="2.8.0",
         summary="Persists the effective configuration to file.")
def config_rewrite(ctx: Context, args: list[bytes]) -> Any:
    raise CommandError("The server is running without a config file")


@command("info", -1, "loading stale", group="server", summary="Returns information and statistics about the "
         "server.", syntax="INFO [section [section ...]]")
def info(ctx: Context, args: list[bytes]) -> Any:
    text = info_report.render(ctx, [a.decode(errors="replace") for a in args[1:]])
    return Verbatim(text + "\r\n") if ctx.client.proto == 3 else text + "\r\n"


@command("time", 1, "loading stale fast", group="server", since="2.6.0", summary="Returns the server time.")
def time_(ctx: Context, args: list[bytes]) -> Any:
    now = time.time_ns() // 1000
    return [str(now // 1_000_000).encode(), str(now % 1_000_000).encode()]


@command("lastsave", 1, "loading stale fast", group="server", summary="Returns the Unix timestamp of the last "
         "successful save to disk.")
def lastsave(ctx: Context, args: list[bytes]) -> Any:
    return int(time.time())


@command("save", 1, "admin", group="server", summary="Synchronously saves the database(s) to disk.")
def save(ctx: Context, args: list[bytes]) -> Any:
    if ctx.store.ssd is None:
        raise CommandError("no SSD tier configured (start with --essd-path)")
    ctx.store.checkpoint()
    return OK


@command("shutdown", -1, "admin loading stale", group="server", summary="Synchronously saves the database(s) to "
         "disk and shuts down the Redis server.", syntax="SHUTDOWN [NOSAVE | SAVE] [NOW] [FORCE]")
def shutdown(ctx: Context, args: list[bytes]) -> Any:
    if ctx.server is None:
        raise CommandError("no server")
    ctx.server.request_shutdown()
    ctx.client.closing = True
    return OK
