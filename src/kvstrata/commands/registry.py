"""The declarative command table: name, arity, flags, key positions, handler, docs.

The server dispatches from it; COMMAND, COMMAND DOCS, arity errors, auth checks and docs/commands.md are all
generated from it. Container commands (CLIENT, CONFIG, ...) keep their subcommands in the same form.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvstrata.errors import CommandError, wrong_arity

Handler = Callable[[Any, list[bytes]], Any]


@dataclass(eq=False)
class CommandSpec:
    name: str
    arity: int
    flags: frozenset[str]
    first_key: int
    last_key: int
    step: int
    handler: Handler
    group: str
    summary: str
    since: str
    syntax: str
    parent: CommandSpec | None = None
    subcommands: dict[bytes, CommandSpec] = field(default_factory=dict)
    write: bool = False
    noauth: bool = False

    @property
    def full_name(self) -> str:
        return f"{self.parent.name}|{self.name}" if self.parent else self.name

    def keys(self, args: list[bytes]) -> list[bytes]:
        if self.first_key == 0:
            return []
        last = self.last_key if self.last_key >= 0 else len(args) + self.last_key
        return args[self.first_key : last + 1 : self.step]

    def arity_ok(self, n: int) -> bool:
        return n == self.arity if self.arity >= 0 else n >= -self.arity


REGISTRY: dict[bytes, CommandSpec] = {}


def _default_syntax(name: str, arity: int, keys: tuple[int, int, int]) -> str:
    """``NAME key`` for single-key commands, ``NAME key value`` for key-value ones; others spell it out."""
    words = [name.upper()]
    if keys == (1, 1, 1):
        words.append("key")
        if arity == 3:
            words.append("value")
    return " ".join(words)


def command(
    name: str,
    arity: int,
    flags: str = "",
    *,
    keys: tuple[int, int, int] = (0, 0, 0),
    group: str = "generic",
    summary: str = "",
    since: str = "1.0.0",
    syntax: str = "",
    parent: str | None = None,
) -> Callable[[Handler], Handler]:
    """Register a handler ``fn(ctx, args) -> reply``; ``args[0]`` is the command name as sent."""

    def register(fn: Handler) -> Handler:
        flagset = frozenset(flags.split())
        spec = CommandSpec(
            name=name.lower(),
            arity=arity,
            flags=flagset,
            first_key=keys[0],
            last_key=keys[1],
            step=keys[2],
            handler=fn,
            group=group,
            summary=summary or (fn.__doc__ or "").strip().splitlines()[0] if (summary or fn.__doc__) else "",
            since=since,
            syntax=syntax or _default_syntax(name, arity, keys),
            write="write" in flagset,
            noauth="no_auth" in flagset,
        )
        if parent is None:
            REGISTRY[spec.name.encode()] = spec
        else:
            owner = REGISTRY[parent.lower().encode()]
            spec.parent = owner
            owner.subcommands[spec.name.encode()] = spec
        return fn

    return register


def container(
    name: str,
    flags: str = "",
    *,
    group: str = "server",
    summary: str = "",
    since: str = "2.0.0",
    bare: Handler | None = None,
) -> None:
    """A command whose first argument picks a subcommand (CLIENT, CONFIG, ...); ``bare`` answers it alone."""

    def dispatch(ctx: Any, args: list[bytes]) -> Any:
        if len(args) == 1 and bare is not None:
            return bare(ctx, args)
        spec = REGISTRY[name.encode()]
        sub = spec.subcommands.get(args[1].lower())
        if sub is None:
            raise CommandError(
                f"unknown subcommand '{args[1].decode(errors='replace')}'. Try {name.upper()} HELP."
            )
        if not sub.arity_ok(len(args)):
            raise wrong_arity(f"{name}|{sub.name}")
        ctx.client.last_cmd = sub
        if ctx.server is not None:
            ctx.server.command_counts[sub].calls += 1
        return sub.handler(ctx, args)

    command(name, -1 if bare is not None else -2, flags, group=group, summary=summary, since=since)(dispatch)


def lookup(name: bytes) -> CommandSpec | None:
    spec = REGISTRY.get(name)
    if spec is None:
        spec = REGISTRY.get(name.lower())
    return spec


def resolve(spec: CommandSpec, args: list[bytes]) -> CommandSpec:
    """The spec that will handle ``args`` given the command's (the subcommand's for containers, for key positions
    and flags)."""
    if spec.subcommands and len(args) > 1:
        return spec.subcommands.get(args[1].lower(), spec)
    return spec
