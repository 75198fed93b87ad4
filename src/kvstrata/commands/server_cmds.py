"""Server commands: COMMAND (generated from the table), CONFIG, INFO, TIME."""

from __future__ import annotations

import fnmatch
import time
from typing import Any

from kvstrata import acl as acl_mod
from kvstrata.commands import info as info_report
from kvstrata.commands.context import Context
from kvstrata.commands.registry import REGISTRY, CommandSpec, command, container
from kvstrata.config import ALIASES, PARAMS_BY_NAME, canonical
from kvstrata.errors import CommandError, syntax_error, wrong_arity
from kvstrata.protocol.encoder import OK, Status, Verbatim


def _spec_info(spec: CommandSpec) -> list[Any]:
    flags = [Status(f) for f in sorted(spec.flags)]
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
    return len(REGISTRY)


@command("info", -2, "loading stale", parent="command", group="server", since="2.8.13",
         summary="Returns information about one, multiple or all commands.")
def command_info(ctx: Context, args: list[bytes]) -> Any:
    names = args[2:] or list(REGISTRY)
    return [_spec_info(REGISTRY[n.lower()]) if n.lower() in REGISTRY else None for n in names]


@command("docs", -2, "loading stale", parent="command", group="server", since="7.0.0",
         summary="Returns documentary information about one, multiple or all commands.")
def command_docs(ctx: Context, args: list[bytes]) -> Any:
    names = args[2:] or list(REGISTRY)
    out: dict[str, Any] = {}
    for n in names:
        spec = REGISTRY.get(n.lower())
        if spec is not None:
            out[spec.name] = _spec_docs(spec)
    return out


@command("list", -2, "loading stale", parent="command", group="server", since="7.0.0",
         summary="Returns a list of command names.", syntax="COMMAND LIST [FILTERBY MODULE name | ACLCAT category "
                                                            "| PATTERN pattern]")
def command_list(ctx: Context, args: list[bytes]) -> Any:
    names = [s.name for s in REGISTRY.values()]
    if len(args) == 5 and args[2].upper() == b"FILTERBY":
        kind, value = args[3].upper(), args[4].decode(errors="replace")
        if kind == b"PATTERN":
            names = [n for n in names if fnmatch.fnmatchcase(n, value)]
        elif kind == b"ACLCAT":
            names = [s.name for s in REGISTRY.values() if value.lower().lstrip("@") in acl_mod.categories(s)]
        elif kind == b"MODULE":
            names = []
        else:
            raise syntax_error()
    elif len(args) != 2:
        raise syntax_error()
    return names


@command("getkeys", -3, "loading stale", parent="command", group="server", since="2.8.13",
         summary="Extracts the key names from an arbitrary command.")
def command_getkeys(ctx: Context, args: list[bytes]) -> Any:
    spec = REGISTRY.get(args[2].lower())
    if spec is None:
        raise CommandError("Invalid command specified")
    if not spec.arity_ok(len(args) - 2):
        raise CommandError("Invalid number of arguments specified for command")
    keys = spec.keys(args[2:])
    if not keys:
        raise CommandError("The command has no key arguments")
    return keys


@command("help", 2, "loading stale", parent="command", group="server", since="5.0.0",
         summary="Returns helpful text about the different subcommands.")
def command_help(ctx: Context, args: list[bytes]) -> Any:
    return [f"{s.syntax or s.name.upper()}: {s.summary}" for s in REGISTRY[b"command"].subcommands.values()]


# ---- CONFIG ----
container("config", "", group="server", summary="A container for server configuration commands.")


@command("get", -3, "admin", parent="config", group="server", since="2.0.0",
         summary="Returns the effective values of configuration parameters.")
def config_get(ctx: Context, args: list[bytes]) -> Any:
    out: dict[str, str] = {}
    names = [*PARAMS_BY_NAME, *ALIASES]
    for raw in args[2:]:
        pattern = raw.decode(errors="replace").lower()
        for name in names:
            if fnmatch.fnmatchcase(name, pattern):
                param = PARAMS_BY_NAME[canonical(name)]
                value = ctx.config.get(name)
                out[name] = param.render(value)
    return out


@command("set", -4, "admin", parent="config", group="server", since="2.0.0",
         summary="Sets configuration parameters in-flight.")
def config_set(ctx: Context, args: list[bytes]) -> Any:
    if len(args) % 2 != 0:
        raise wrong_arity("config|set")
    pairs = [(args[i].decode(errors="replace"), args[i + 1].decode(errors="replace"))
             for i in range(2, len(args), 2)]
    old = {canonical(n): ctx.config.get(n) for n, _ in pairs if canonical(n) in PARAMS_BY_NAME}
    try:
        for name, value in pairs:
            ctx.config.set(name, value, runtime=True)
    except ValueError as exc:
        for param, value in old.items():
            ctx.config.values[param] = value
        if str(exc).startswith("Unknown option"):
            raise CommandError(str(exc)) from None
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
    return Verbatim(text) if ctx.client.proto == 3 else text


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
