"""The declarative command table: name, arity, flags, key specs, waits, handler, docs.

The server dispatches from it; COMMAND, COMMAND DOCS, arity errors, auth checks and docs/commands.md are all
generated from it. Container commands (CLIENT, CONFIG, ...) keep their subcommands in the same form: each
subcommand is a first-class entry (``config|get``) with its own arity, flags, key spec and ACL categories, and the
dispatcher (``server.connection``) resolves it before anything else runs, as Redis 7 does: arity errors, ACL
rules (``+config|get``), statistics (``cmdstat_config|get``) and CLIENT LIST's ``cmd=`` all name the subcommand.

Keys are declared the way Redis 7 does (``key_specs``): where the search begins (an argument index) and how keys
are found from there (a range with a last key and a step). A command whose options follow its keys (TAIR.KV.MGET
... WITHVERSIONS, TAIR.KV.PREFETCH ... PRIORITY n) cannot be described by positions alone, so it names a
key-extraction function (Redis's ``getkeys_proc``); its option words are never taken for keys. ``spec.keys(args)``
is the one way to get a command's keys: the tier loader and ACL key checks both use it.

Waits are declared too: ``load`` (default for commands with keys: their keys are read from the lower tiers, off
the event loop, before the handler runs; PREFETCH says ``load=False``: it only queues them; EXISTS, TYPE and the TTL
family, and the writes that replace a value without reading it (SET without GET, SETEX, MSET, TAIR.KV.SETEX...)
say ``load="meta"``: only their record headers are probed, the handler asks ``store.probe``) and ``settle``
(the command needs the SSD writer drained first: DBSIZE counts committed records).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvstrata.errors import CommandError, wrong_arity

Handler = Callable[[Any, list[bytes]], Any]
KeyFn = Callable[[list[bytes]], list[bytes]]


@dataclass(frozen=True)
class KeySpec:
    """One key spec: begin_search by ``index``, then find_keys as a range (Redis 7's ``key_specs``).

    ``lastkey`` is relative to ``index`` when >= 0 (0: only the key at ``index``) and counts from the end of the
    arguments when negative (-1: the last argument); ``step`` is the distance between keys.
    """

    index: int
    lastkey: int = 0
    step: int = 1
    flags: tuple[str, ...] = ("RO", "access")
    notes: str = ""  # Redis's note on the spec (COMMAND INFO shows it)

    def find(self, args: list[bytes]) -> list[bytes]:
        last = self.index + self.lastkey if self.lastkey >= 0 else len(args) + self.lastkey
        return args[self.index : last + 1 : self.step]

    @classmethod
    def from_range(cls, first: int, last: int, step: int, write: bool) -> KeySpec:
        """The spec of the classic (first, last, step) triple."""
        flags = ("RW", "update") if write else ("RO", "access")
        return cls(first, last - first if last >= 0 else last, step, flags)


def variable_key_flags(name: str, argv: list[bytes]) -> tuple[str, ...]:
    """The flags of a key whose access depends on the arguments (Redis's setGetKeys and bitfieldGetKeys); ()
    for the other commands."""
    if name == "set":
        reads = len(argv) > 3 and any(a.lower() == b"get" for a in argv[3:])
        return ("RW", "access", "update") if reads else ("OW", "update")
    if name == "bitfield":
        i = 2
        while i < len(argv):
            word, left = argv[i].lower(), len(argv) - i - 1
            if word == b"get" and left >= 2:
                i += 3
            elif word == b"overflow" and left >= 1:
                i += 2
            else:  # a write, or a syntax error (as Redis: not read-only then)
                return ("RW", "access", "update")
        return ("RO", "access")
    return ()


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
    denyoom: bool = False  # may use more memory: refused with -OOM while DRAM is over budget (connection.execute)
    noauth: bool = False
    key_specs: tuple[KeySpec, ...] = ()
    # Commands with options after their keys: the function that picks the keys out (options never are keys).
    getkeys: KeyFn | None = None
    # Waits: read the keys from lower tiers before running ("meta": their record headers only; a function of the
    # arguments for a command that needs the value with some options only, SET ... GET); drain the SSD writer
    # before running.
    load: bool | str | Callable[[list[bytes]], bool | str] = True
    settle: bool = False
    # Subcommands whose handler bounds a variadic arity (SLOWLOG GET [count]): the most arguments accepted, the
    # container and subcommand names included; more get Redis's "unknown subcommand or wrong number" error.
    most: int = 0
    # The arguments the command stores as they are (first, step; step 0: that one alone; first 0: none): a value
    # received into a buffer of its own stays in it (the zero-copy receive), every other one is made bytes.
    values: tuple[int, int] = (0, 0)

    @property
    def full_name(self) -> str:
        return f"{self.parent.name}|{self.name}" if self.parent else self.name

    def keys(self, args: list[bytes]) -> list[bytes]:
        """The keys ``args`` name (from the key-extraction function, else the key specs), in argument order."""
        if self.getkeys is not None:
            return self.getkeys(args)
        specs = self.key_specs
        if not specs:
            return []
        if len(specs) == 1:
            return specs[0].find(args)
        return [k for spec in specs for k in spec.find(args)]

    def keys_with_flags(self, args: list[bytes]) -> list[tuple[bytes, tuple[str, ...]]]:
        """The keys ``args`` name with each one's key-spec flags, as Redis's getKeysFromCommandWithSpecs (COMMAND
        GETKEYSANDFLAGS, ACL's read and write key permissions); () for a key no spec describes."""
        if self.getkeys is not None or len(self.key_specs) == 1:
            flags = variable_key_flags(self.full_name, args) or (self.key_specs[0].flags if self.key_specs else ())
            return [(key, flags) for key in self.keys(args)]
        return [(key, ks.flags) for ks in self.key_specs for key in ks.find(args)]

    def own_arguments(self, args: list[Any]) -> None:
        """Make bytes every argument of ``args`` that is not ``bytes`` and not one of the values the command stores
        (a key, a name or an option sent as a large bulk, received into a bytearray: those are hashed, compared and
        upper-cased, which a bytearray cannot always be)."""
        first, step = self.values
        for i, a in enumerate(args):
            if a.__class__ is bytes:
                continue
            if first and i >= first and (i == first if not step else (i - first) % step == 0):
                continue
            args[i] = bytes(a)

    def probes(self, args: list[bytes]) -> bool:
        """Whether the keys' record headers are enough (``load="meta"``): the handler asks ``store.probe``."""
        load = self.load
        return (load(args) if callable(load) else load) == "meta"

    def load_keys(self, args: list[bytes]) -> list[bytes]:
        """The keys to read from lower tiers before the handler runs (none for commands that only queue them)."""
        return self.keys(args) if self.load else []

    def arity_ok(self, n: int) -> bool:
        return n == self.arity if self.arity >= 0 else n >= -self.arity

    def too_many(self, args: list[Any]) -> CommandError | None:
        """Redis's error for a subcommand given more arguments than its handler takes (``most``), else None."""
        if self.most and len(args) > self.most and self.parent is not None:
            return subcommand_syntax_error(args)
        return None


def subcommand_syntax_error(args: list[Any]) -> CommandError:
    """``ERR unknown subcommand or wrong number of arguments for 'get'. Try SLOWLOG HELP.`` (Redis's
    addReplySubcommandSyntaxError: what a subcommand's handler answers to arguments it cannot take; both names
    as sent, the container's upper-cased)."""
    sub = bytes(args[1]).split(b"\0", 1)[0][:128].decode("latin-1")
    return CommandError(f"unknown subcommand or wrong number of arguments for '{sub}'. "
                        f"Try {bytes(args[0]).decode('latin-1').upper()} HELP.")


def unknown_subcommand(container: bytes, sub: bytes) -> CommandError:
    """Redis's text for a container given a subcommand it lacks (the name cut at 128 bytes, as a C string)."""
    shown = bytes(sub).split(b"\0", 1)[0][:128].decode("latin-1")
    return CommandError(f"unknown subcommand '{shown}'. Try {bytes(container).decode('latin-1').upper()} HELP.")


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
    getkeys: KeyFn | None = None,
    load: bool | str | Callable[[list[bytes]], bool | str] = True,
    settle: bool = False,
    group: str = "generic",
    summary: str = "",
    since: str = "1.0.0",
    syntax: str = "",
    parent: str | None = None,
    most: int = 0,
    values: tuple[int, int] = (0, 0),
    key_specs: tuple[KeySpec, ...] | None = None,
) -> Callable[[Handler], Handler]:
    """Register a handler ``fn(ctx, args) -> reply``; ``args[0]`` is the command name as sent.

    ``keys`` is the classic (first, last, step) triple COMMAND reports; it becomes the command's key spec.
    ``getkeys`` replaces it for finding keys when options follow them (the triple still describes the range).
    ``values``: the arguments stored as received, (first, step) as ``CommandSpec.values``.
    ``key_specs``: Redis's key specs where the triple cannot say them (BITOP's overwritten destination and read
    sources); ``keys`` is still the triple COMMAND reports.
    """

    def register(fn: Handler) -> Handler:
        flagset = frozenset(flags.split())
        write = "write" in flagset
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
            write=write,
            denyoom="denyoom" in flagset,
            noauth="no_auth" in flagset,
            key_specs=key_specs if key_specs is not None else (KeySpec.from_range(*keys, write),) if keys[0] else (),
            getkeys=getkeys,
            load=load,
            settle=settle,
            most=most,
            values=values,
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
    """A command whose first argument picks a subcommand (CLIENT, CONFIG, ...); ``bare`` answers it alone.

    The connection's dispatcher resolves subcommands itself (arity, ACL, statistics per subcommand); this handler
    only answers the container alone and serves callers that run a handler directly.
    """

    def dispatch(ctx: Any, args: list[bytes]) -> Any:
        if len(args) == 1 and bare is not None:
            return bare(ctx, args)
        spec = REGISTRY[name.encode()]
        sub = spec.subcommands.get(args[1].lower())
        if sub is None:
            raise unknown_subcommand(args[0], args[1])
        if not sub.arity_ok(len(args)):
            raise wrong_arity(sub.full_name)
        too_many = sub.too_many(args)
        if too_many is not None:
            raise too_many
        return sub.handler(ctx, args)

    command(name, -1 if bare is not None else -2, flags, group=group, summary=summary, since=since)(dispatch)


def lookup(name: bytes) -> CommandSpec | None:
    spec = REGISTRY.get(name)
    if spec is None:
        spec = REGISTRY.get(name.lower())
    return spec


def lookup_full(name: bytes) -> CommandSpec | None:
    """A command or subcommand by its full name, any case: ``get``, ``config|get`` (None when unknown)."""
    parent, sep, sub = name.lower().partition(b"|")
    spec = REGISTRY.get(parent)
    if spec is None or not sep:
        return spec
    return spec.subcommands.get(sub)


def resolve(spec: CommandSpec, args: list[bytes]) -> CommandSpec:
    """The spec that will handle ``args`` given the command's (the subcommand's for containers, for key positions
    and flags)."""
    if spec.subcommands and len(args) > 1:
        return spec.subcommands.get(args[1].lower(), spec)
    return spec
