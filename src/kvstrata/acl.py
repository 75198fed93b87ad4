"""Access control lists with Redis's model: users, passwords, command permissions and ``~pattern`` key patterns.

A user is ``on``/``off``, has SHA-256 password hashes (or ``nopass``), a set of allowed commands built from
``+cmd``/``-cmd``/``+cmd|sub``/``+@category`` rules applied in order, and key patterns (``~tenantA:*`` or
``allkeys``). Categories are derived from the command table (flags and groups) plus Redis's assignments of
@admin and @dangerous. The ``default`` user is the one ``requirepass`` sets the password of.

Enforcement (``Acl.deny``) runs before a command: its (sub)command must be allowed, and every key it names
(``CommandSpec.keys``, with the TAIR.KV options told apart from keys) must match one of the user's patterns.
Commands that take a pattern instead of keys (TAIR.KV.MARKHOT/UNMARKHOT) are allowed only when every key the
pattern can match lies inside one of the user's patterns; FLUSHALL, FLUSHDB and TAIR.KV.ARENA (its mapping shows
every value) need ``allkeys``; KEYS, SCAN and RANDOMKEY filter their results (``visible``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvstrata.commands.registry import REGISTRY, CommandSpec, resolve, variable_key_flags
from kvstrata.engine.keyspace import glob_match

# Redis's categories (those with no commands here still parse, so rules written for Redis work unchanged).
CATEGORIES = ("keyspace", "read", "write", "set", "sortedset", "list", "hash", "string", "bitmap", "hyperloglog",
              "geo", "stream", "pubsub", "admin", "fast", "slow", "blocking", "dangerous", "connection",
              "transaction", "scripting", "kvcache")
_GROUP_CATEGORY = {"string": "string", "generic": "keyspace", "connection": "connection", "tairkv": "kvcache",
                   "pubsub": "pubsub", "bitmap": "bitmap", "transactions": "transaction"}
# Redis's @admin / @dangerous assignments for the commands kvstrata has, by full name. MEMORY STATS and
# MEMORY DOCTOR are added because here they show the top key prefixes of every tenant.
_ADMIN = frozenset({"client|kill", "client|list", "config|get", "config|set", "config|resetstat",
                    "config|rewrite", "slowlog|get", "slowlog|len", "slowlog|reset", "latency|latest",
                    "latency|history", "latency|reset", "latency|histogram", "save", "shutdown", "lastsave", "role",
                    "acl|setuser", "acl|getuser", "acl|deluser", "acl|list", "acl|users", "acl|load", "acl|save",
                    "acl|log", "acl|dryrun", "memory|stats", "memory|doctor"})
_DANGEROUS = _ADMIN | {"keys", "flushall", "flushdb", "info", "restore", "migrate", "swapdb"}
_KEYSPACE = frozenset({"dbsize", "flushall", "flushdb", "swapdb"})
# Redis puts COMMAND and its subcommands in @connection (their group is server); PUBSUB HELP in no group's category.
_NO_GROUP = frozenset({"pubsub|help"})
# Commands whose first argument is a key pattern (not a key).
PATTERN_COMMANDS = frozenset({"tair.kv.markhot", "tair.kv.unmarkhot"})
# Commands that act on every key, or show every value: only for users with allkeys (kvstrata's rule; Redis
# leaves them to the command rules, so a tenant allowed +@all could flush every other tenant's keys). The arena's
# descriptor maps every value in DRAM into the client, whoever stored it, and a mapping cannot be taken back:
# only a user who may read every key gets one (a tenant's SDK reads over its socket instead). MONITOR shows every
# client's keys and values.
WHOLE_KEYSPACE = frozenset({"flushall", "flushdb", "tair.kv.arena", "monitor"})
# Commands that name channels: where the channels start and end in the arguments, and whether they are patterns
# (which must be one of the user's channel patterns literally, as in Redis). Unsubscribing is always allowed.
CHANNEL_ARGS: dict[str, tuple[int, int | None, bool]] = {
    "publish": (1, 2, False), "spublish": (1, 2, False), "subscribe": (1, None, False),
    "ssubscribe": (1, None, False), "psubscribe": (1, None, True)}
_GLOB_SPECIAL = frozenset(b"*?[\\")
# Key permissions of a pattern: %R~ read, %W~ write, ~ both (Redis 7).
READ, WRITE = 1, 2
ALL = READ | WRITE
_ALLKEYS_TAKEN = ("Adding a pattern after the * pattern (or the 'allkeys' flag) is not valid and does not have any "
                  "effect. Try 'resetkeys' to start with an empty list of patterns")
ACL_LOG_GROUP_MS = 60_000


def categories(spec: CommandSpec) -> list[str]:
    """The ACL categories of one command or subcommand, derived from its flags and group."""
    if spec.subcommands and spec.arity < -1:
        return ["slow"]  # a container that never runs alone (Redis: no flags): its subcommands carry categories
    name = spec.full_name
    out = []
    if spec.write:
        out.append("write")
    elif "readonly" in spec.flags:
        out.append("read")
    if (spec.parent or spec).name == "command":
        group: str | None = "connection"
    else:
        group = None if name in _NO_GROUP else _GROUP_CATEGORY.get(spec.group)
    if group is not None:
        out.append(group)
    if name in _KEYSPACE:
        out.append("keyspace")
    if "admin" in spec.flags or name in _ADMIN:
        out.append("admin")
    out.append("fast" if "fast" in spec.flags else "slow")
    if "admin" in spec.flags or name in _DANGEROUS:
        out.append("dangerous")
    return out


def all_specs() -> list[CommandSpec]:
    """Every command and subcommand of the table."""
    out: list[CommandSpec] = []
    for spec in REGISTRY.values():
        out.append(spec)
        out.extend(spec.subcommands.values())
    return out


def category_specs(category: str) -> list[CommandSpec]:
    return [s for s in all_specs() if category in categories(s)]


def hash_password(password: bytes) -> str:
    return hashlib.sha256(password).hexdigest()


def _lookup(name: str) -> list[CommandSpec] | None:
    """``get`` -> [get]; ``client`` -> [client, its subcommands]; ``client|list`` -> [client|list]."""
    parent, sep, sub = name.lower().partition("|")
    spec = REGISTRY.get(parent.encode())
    if spec is None:
        return None
    if sep:
        child = spec.subcommands.get(sub.encode())
        return None if child is None else [child]
    return [spec, *spec.subcommands.values()]


def _is_literal(pattern: bytes) -> bool:
    return not any(c in _GLOB_SPECIAL for c in pattern)


@dataclass(eq=False, kw_only=True)
class Selector:
    """One set of permissions: the commands, the key patterns (each with its READ/WRITE bits) and the channel
    patterns a command must all fit (Redis 7's selector). A user is its root selector plus the selectors it was
    given in parentheses; a command runs when one of them allows it whole."""

    cmd_rules: list[str] = field(default_factory=lambda: ["-@all"])
    allowed: set[CommandSpec] = field(default_factory=set)
    patterns: list[bytes] = field(default_factory=list)  # key patterns, in the order given
    perms: dict[bytes, int] = field(default_factory=dict)  # each pattern's READ/WRITE bits
    allkeys: bool = False
    allchannels: bool = False
    # &pattern rules, in the order given (a dict: a rule given again is found at once among thousands)
    channels: dict[bytes, None] = field(default_factory=dict)
    # For each permission a key may need (0, READ, WRITE, ALL), the patterns granting it sorted for speed:
    # ``literal*`` as prefixes (one startswith call), literals, the rest as globs.
    _index: dict[int, tuple[tuple[bytes, ...], frozenset[bytes], tuple[bytes, ...]]] = field(default_factory=dict)

    # ---- rules ----
    def apply(self, rule: str) -> None:
        """Apply one key, channel or command rule; raises ValueError with Redis's reason on a bad one."""
        low = rule.lower()
        if low in ("allkeys", "~*"):
            self.allkeys = True
            self.patterns = [b"*"]
            self.perms = {b"*": ALL}
        elif low == "resetkeys":
            self.allkeys = False
            self.patterns = []
            self.perms = {}
        elif rule[:1] in ("~", "%"):
            self._add_pattern(rule)
        elif low in ("allchannels", "&*"):
            self.allchannels = True
            self.channels = {}
        elif low == "resetchannels":
            self.allchannels = False
            self.channels = {}
        elif rule.startswith("&"):
            if self.allchannels:  # Redis's refusal: the pattern would add nothing
                raise ValueError("Adding a pattern after the * pattern (or the 'allchannels' flag) is not valid "
                                 "and does not have any effect. Try 'resetchannels' to start with an empty list "
                                 "of channels")
            name = rule[1:].encode("utf-8", "surrogateescape")
            self.channels[name] = None
        elif low in ("allcommands", "+@all"):
            self.allowed = set(all_specs())
            self.cmd_rules = ["+@all"]
        elif low in ("nocommands", "-@all"):
            self.allowed = set()
            self.cmd_rules = ["-@all"]
        elif rule[:1] in ("+", "-"):
            add = rule[0] == "+"
            target = rule[1:]
            if target.startswith("@"):
                if target[1:].lower() not in CATEGORIES:
                    raise ValueError("Unknown command or category name in ACL")
                specs = category_specs(target[1:].lower())
            else:
                found = _lookup(target)
                if found is None:
                    raise ValueError("Unknown command or category name in ACL")
                specs = found
            if add:
                self.allowed.update(specs)
            else:
                self.allowed.difference_update(specs)
            self.cmd_rules.append(rule.lower())
        else:
            raise ValueError("Syntax error")
        self._index = {}  # built again when a key is next checked: a user of 10,000 rules costs no 10,000 builds

    def _index_patterns(self) -> dict[int, tuple[tuple[bytes, ...], frozenset[bytes], tuple[bytes, ...]]]:
        for need in (0, READ, WRITE, ALL):
            prefixes, exact, globs = [], set(), []
            for p in self.patterns:
                if self.perms[p] & need != need:
                    continue
                if p.endswith(b"*") and _is_literal(p[:-1]):
                    prefixes.append(p[:-1])
                elif _is_literal(p):
                    exact.add(p)
                else:
                    globs.append(p)
            self._index[need] = (tuple(prefixes), frozenset(exact), tuple(globs))
        return self._index

    def _add_pattern(self, rule: str) -> None:
        """``~pattern`` (read and write) or ``%R~``, ``%W~``, ``%RW~pattern``, parsed as Redis 7's ACLSetSelector
        (a pattern given again gains the new permissions)."""
        if self.allkeys:
            raise ValueError(_ALLKEYS_TAKEN)
        perms, at = ALL, 1
        if rule[0] == "%":
            perms = 0
            while at < len(rule):
                c = rule[at].upper()
                at += 1
                if c == "~":
                    break
                bit = READ if c == "R" else WRITE if c == "W" else 0
                if not bit or perms & bit:
                    raise ValueError("Syntax error")
                perms |= bit
            if not perms:
                raise ValueError("Syntax error")
        pattern = rule[at:]
        if any(c.isspace() for c in pattern):
            raise ValueError("Syntax error")
        raw = pattern.encode("utf-8", "surrogateescape")
        if raw == b"*" and perms == ALL:
            self.allkeys = True
            self.patterns = [b"*"]
            self.perms = {b"*": ALL}
        elif raw in self.perms:
            self.perms[raw] |= perms
        else:
            self.patterns.append(raw)
            self.perms[raw] = perms

    # ---- checks ----
    def key_ok(self, key: bytes, need: int) -> bool:
        """Whether a pattern granting ``need`` (READ, WRITE, both, or 0: any pattern) matches ``key``."""
        return self.first_refused([key], need) is None

    def first_refused(self, keys: list[Any], need: int) -> int | None:
        """The position of the first of ``keys`` no pattern granting ``need`` matches, or None (key_ok over a
        command's keys, the index looked up once)."""
        if self.allkeys:
            return None
        prefixes, exact, globs = (self._index or self._index_patterns())[need]
        for at, key in enumerate(keys):
            if key.__class__ is not bytes:
                key = bytes(key)
            if not (key.startswith(prefixes) or key in exact or any(glob_match(p, key) for p in globs)):
                return at
        return None

    def pattern_ok(self, pattern: bytes, need: int) -> bool:
        """True when every key ``pattern`` can match lies inside one of this selector's patterns granting
        ``need``."""
        if self.allkeys:
            return True
        pattern = bytes(pattern)
        for own in self.patterns:
            if self.perms[own] & need != need:
                continue
            if own == pattern:
                return True
            if own.endswith(b"*") and _is_literal(own[:-1]) and pattern.startswith(own[:-1]):
                return True
        return False

    def channel_ok(self, name: bytes, pattern: bool) -> bool:
        """Whether channel ``name`` is allowed (``pattern``: a PSUBSCRIBE pattern, which must be one of the
        patterns literally, as in Redis; a channel must match one)."""
        if self.allchannels:
            return True
        if pattern:
            return name in self.channels
        return any(glob_match(p, name) for p in self.channels)

    # ---- rendering ----
    def commands_text(self) -> str:
        return " ".join(self.cmd_rules) or "-@all"

    def key_words(self) -> list[str]:
        """The key rules as Redis 7 writes them: ``~p`` (read and write), ``%R~p``, ``%W~p``."""
        marks = {ALL: "~", READ: "%R~", WRITE: "%W~"}
        return [marks[self.perms[p]] + p.decode("utf-8", "surrogateescape") for p in self.patterns]

    def keys_text(self) -> str:
        return " ".join(self.key_words())

    def channel_words(self) -> list[str]:
        """The channel rules as written: ``&*``, or each ``&pattern`` (none: no channel)."""
        if self.allchannels:
            return ["&*"]
        return ["&" + c.decode("utf-8", "surrogateescape") for c in self.channels]

    def fields(self) -> dict[str, str]:
        """ACL GETUSER's description of the selector."""
        return {"commands": self.commands_text(), "keys": self.keys_text(),
                "channels": " ".join(self.channel_words())}

    def rules(self) -> list[str]:
        """The selector as rules (ACL LIST, ACL SAVE, and the replay of ACL SETUSER), as Redis describes one: keys,
        channels (after ``resetchannels`` unless all), commands."""
        words = self.key_words()  # none: nothing, as Redis 7
        words += self.channel_words() if self.allchannels else ["resetchannels", *self.channel_words()]
        words += self.cmd_rules or ["-@all"]
        return words


@dataclass(eq=False)
class User(Selector):
    """An ACL user: its name, whether it is on, its password hashes, its root permissions (the selector it is) and
    the further selectors given in parentheses."""

    name: str
    enabled: bool = False
    nopass: bool = False
    # acl-pubsub-default as its rules are applied: the channels a new selector and ``reset`` start with.
    channels_default: bool = False
    passwords: list[str] = field(default_factory=list)  # SHA-256 hex digests, in the order they were added
    selectors: list[Selector] = field(default_factory=list)
    # True when every command, key and channel is allowed (and no selector is needed): the connection then skips
    # all checks.
    unrestricted: bool = False

    # ---- rules ----
    def apply(self, rule: str) -> None:
        """Apply one ACL SETUSER rule; raises ValueError with Redis's reason on a bad one."""
        low = rule.lower()
        if low == "on":
            self.enabled = True
        elif low == "off":
            self.enabled = False
        elif low == "nopass":
            self.nopass = True
            self.passwords = []
        elif low == "resetpass":
            self.nopass = False
            self.passwords = []
        elif rule.startswith(">"):
            self._add_hash(hash_password(rule[1:].encode("utf-8", "surrogateescape")))
        elif rule.startswith("#"):
            digest = rule[1:].lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError("The password hash must be exactly 64 characters and contain only lowercase "
                                 "hexadecimal characters")
            self._add_hash(digest)
        elif rule.startswith("<"):
            self._remove_hash(hash_password(rule[1:].encode("utf-8", "surrogateescape")))
        elif rule.startswith("!"):
            self._remove_hash(rule[1:].lower())
        elif len(rule) > 1 and rule[0] == "(" and rule[-1] == ")":
            selector = Selector(allchannels=self.channels_default)
            for word in rule[1:-1].split():
                selector.apply(word)
            self.selectors.append(selector)
        elif low == "clearselectors":
            self.selectors = []
        elif low == "reset":
            for r in ("resetpass", "resetkeys", "resetchannels", "off", "clearselectors", "-@all"):
                self.apply(r)
            self.allchannels = self.channels_default
        else:
            super().apply(rule)
        self.unrestricted = self.allkeys and self.allchannels and len(self.allowed) == len(all_specs())

    def _add_hash(self, digest: str) -> None:
        self.nopass = False
        if digest not in self.passwords:
            self.passwords.append(digest)

    def _remove_hash(self, digest: str) -> None:
        if digest not in self.passwords:
            raise ValueError("no such password")
        self.passwords.remove(digest)

    # ---- checks ----
    @property
    def every_selector(self) -> list[Selector]:
        """The root selector (the user itself) first, then the others in the order given."""
        return [self, *self.selectors]

    def check_password(self, password: bytes) -> bool:
        if not self.enabled:
            return False
        if self.nopass:
            return True
        given = hash_password(password)
        ok = False
        for digest in self.passwords:  # every hash is compared, in constant time each
            ok |= hmac.compare_digest(given, digest)
        return ok

    def may_read(self, key: bytes) -> bool:
        """Whether a selector lets the user read ``key`` (a listing - KEYS, SCAN, CLIENT TRACKING BCAST - shows it)."""
        return any(s.key_ok(key, READ) for s in self.every_selector)

    def may_use_channel(self, name: bytes, pattern: bool) -> bool:
        """Whether a selector allows channel ``name`` (a subscriber keeps its subscriptions while one does)."""
        return any(s.channel_ok(name, pattern) for s in self.every_selector)

    # ---- rendering ----
    def flags(self) -> list[str]:
        """ACL GETUSER's flags, as Redis 7.0 lists them."""
        return ["on" if self.enabled else "off", *(["nopass"] if self.nopass else [])]

    def definition(self) -> list[str]:
        """The rules that make this user from nothing (passwords only as their hashes; each further selector as
        one rule in parentheses)."""
        words = ["on" if self.enabled else "off"]
        if self.nopass:
            words.append("nopass")
        words += ["#" + d for d in self.passwords]
        words += self.rules()
        words += ["(" + " ".join(s.rules()) + ")" for s in self.selectors]
        return words

    def describe(self) -> str:
        """The ACL LIST / ACL SAVE line."""
        return " ".join(["user", self.name, *self.definition()])


@dataclass
class LogEntry:
    count: int
    reason: str
    context: str
    object: str
    username: str
    created_ms: int
    updated_ms: int
    client_info: str
    entry_id: int


def merge_selectors(words: Iterable[str]) -> list[str]:
    """Rules with each selector given over several words (``(+get``, ``~k)``) joined into one, as Redis's
    ACLMergeSelectorArguments; ValueError for a selector never closed."""
    merged: list[str] = []
    opened: list[str] = []
    for word in words:
        if opened:
            opened.append(word)
            if word.endswith(")"):
                merged.append(" ".join(opened))
                opened = []
        elif word.startswith("(") and not word.endswith(")"):
            opened = [word]
        else:
            merged.append(word)
    if opened:
        raise ValueError(f"Unmatched parenthesis in acl selector starting at '{opened[0]}'.")
    return merged


def default_user(requirepass: str | None) -> User:
    user = User("default")
    for rule in ("on", "~*", "&*", "+@all"):
        user.apply(rule)
    user.apply(">" + requirepass if requirepass else "nopass")
    return user


def _message(reason: str, obj: str) -> str:
    # Redis 7.0's texts (the version kvstrata follows).
    if reason == "command":
        return f"NOPERM this user has no permissions to run the '{obj}' command"
    if reason == "channel":
        return "NOPERM this user has no permissions to access one of the channels used as arguments"
    return "NOPERM this user has no permissions to access one of the keys used as arguments"


class Acl:
    """The users of one server, its ACL LOG and the checks the connection runs."""

    def __init__(self, requirepass: str | None = None, aclfile: str = "", pubsub_default: bool = False) -> None:
        self.users: dict[str, User] = {"default": default_user(requirepass)}
        self.requirepass = requirepass
        self.aclfile = aclfile
        self.log: deque[LogEntry] = deque()
        self.log_max = 128  # acllog-max-len
        self.pubsub_default = pubsub_default  # acl-pubsub-default: allchannels (True) or resetchannels
        self._log_ids = 0
        if aclfile:
            self.load(aclfile)

    @property
    def default(self) -> User:
        return self.users["default"]

    def open_default(self) -> bool:
        """True when a new connection is authenticated as ``default`` without a password."""
        d = self.default
        return d.enabled and d.nopass

    # ---- users ----
    def _new_user(self, name: str) -> User:
        """A user with no rules yet: off, no password, no command or key, channels as acl-pubsub-default says."""
        d = self.pubsub_default
        return User(name, allchannels=d, channels_default=d)

    def setuser(self, name: str, rules: Iterable[str]) -> None:
        """ACL SETUSER: all rules apply or none (ValueError names the failing one)."""
        existing = self.users.get(name)
        trial = self._new_user(name)
        if existing is not None:
            for rule in existing.definition():
                trial.apply(rule)
        for rule in merge_selectors(rules):
            try:
                trial.apply(rule)
            except ValueError as exc:
                raise ValueError(f"Error in ACL SETUSER modifier '{rule}': {exc}") from None
        if existing is None:
            self.users[name] = trial
        else:
            existing.__dict__.update(trial.__dict__)  # connected clients hold the object: they see the change

    def on_requirepass(self, value: str | None) -> None:
        """CONFIG SET requirepass: the default user's only password (or nopass when empty), as in Redis."""
        if value == self.requirepass:
            return
        self.requirepass = value
        d = self.default
        d.apply("resetpass")
        d.apply(">" + value if value else "nopass")

    # ---- authentication ----
    def authenticate(self, username: str, password: bytes) -> User | None:
        user = self.users.get(username)
        if user is None or not user.check_password(password):
            return None
        return user

    def attach(self, client: Any) -> None:
        """A new (or RESET) connection: the default user, authenticated if it needs no password."""
        client.user = self.default
        client.authenticated = self.open_default()

    # ---- enforcement ----
    def deny(self, client: Any, spec: CommandSpec, args: list[Any]) -> str | None:
        """The NOPERM error text when ``client``'s user may not run ``args`` (logged in ACL LOG); None when it
        may."""
        refused = check(client.user, spec, args)
        if refused is None:
            return None
        reason, obj = refused
        self.record(client, reason, obj)
        return _message(reason, obj)

    def record(self, client: Any, reason: str, obj: str, context: str = "toplevel") -> None:
        """An ACL LOG entry; a repeat of a recent one (same reason, context, object, user) only bumps its count.
        ``context``: ``toplevel``, or ``multi`` for a command EXEC found refused."""
        now = int(time.time() * 1000)
        username = client.user.name if getattr(client, "user", None) is not None else "default"
        if reason == "auth":
            username = obj
            obj = "auth"
        for e in self.log:
            if ((e.reason, e.context, e.object, e.username) == (reason, context, obj, username)
                    and now - e.updated_ms < ACL_LOG_GROUP_MS):
                e.count += 1
                e.updated_ms = now
                return
        from kvstrata.commands.connection import client_line

        info = client_line(client, now)
        self.log.appendleft(LogEntry(1, reason, context, obj, username, now, now, info, self._log_ids))
        self._log_ids += 1
        while len(self.log) > self.log_max:
            self.log.pop()

    # ---- the ACL file ----
    def load(self, path: str) -> None:
        """Read ``user <name> <rules...>`` lines; the whole file applies or nothing does (ValueError)."""
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as fh:
                lines = fh.read().splitlines()
        except OSError as exc:
            raise ValueError(f"cannot read the ACL file {path}: {exc.strerror or exc}") from None
        users: dict[str, User] = {}
        for n, line in enumerate(lines, 1):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if words[0] != "user" or len(words) < 2:
                raise ValueError(f"{path}:{n}: should start with user keyword")
            if words[1] in users:
                raise ValueError(f"{path}:{n}: duplicate user '{words[1]}'")
            user = self._new_user(words[1])
            try:
                rules = merge_selectors(words[2:])
            except ValueError:
                raise ValueError(f"{path}:{n}: Unmatched parenthesis in selector definition.") from None
            for rule in rules:
                try:
                    user.apply(rule)
                except ValueError as exc:
                    raise ValueError(f"{path}:{n}: Error in user declaration '{rule}': {exc}") from None
            users[user.name] = user
        if "default" not in users:
            users["default"] = default_user(self.requirepass)
        self.users = users

    def save(self, path: str) -> None:
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write("".join(u.describe() + "\n" for u in self.users.values()))
        os.replace(tmp, path)


_NEED_BY_FLAGS: dict[tuple[str, ...], int] = {}


def key_need(flags: tuple[str, ...], spec: CommandSpec) -> int:
    """The permission a key with these key-spec flags needs, as Redis 7's ACLSelectorCheckKey: READ for access,
    WRITE for insert, delete or update, 0 (any pattern) for neither (EXISTS, TYPE). A key no spec describes
    needs what its command does (kvstrata's rule: never less than the command's writes)."""
    if not flags:
        return WRITE if "write" in spec.flags else READ
    need = _NEED_BY_FLAGS.get(flags)
    if need is None:
        need = READ if "access" in flags else 0
        if "insert" in flags or "delete" in flags or "update" in flags:
            need |= WRITE
        _NEED_BY_FLAGS[flags] = need
    return need


# Which refusal a user is told when no selector allows a command, as Redis's ACLCheckAllUserCommandPerm: a
# channel over a key over the command; between two of a kind, the one further in the arguments.
_RANK = {"command": 1, "key": 2, "channel": 4}


# What a command's check looks at, worked out once per command (_plan): the key rule (_NO_KEYS: none to check;
# _WHOLE: it needs allkeys; _PATTERN: its first argument is a key pattern; _PER_KEY: each key by its own flags;
# _VARIABLE: every key the same, decided by the arguments; else the permission every key needs) and its
# channels (CHANNEL_ARGS).
_NO_KEYS, _WHOLE, _PATTERN, _PER_KEY, _VARIABLE = -1, -2, -3, -4, -5
_PLANS: dict[CommandSpec, tuple[int, tuple[int, int | None, bool] | None]] = {}


def _plan(spec: CommandSpec) -> tuple[int, tuple[int, int | None, bool] | None]:
    plan = _PLANS.get(spec)
    if plan is None:
        name = spec.full_name
        if name in WHOLE_KEYSPACE:
            rule = _WHOLE
        elif name in PATTERN_COMMANDS:
            rule = _PATTERN
        elif not spec.key_specs and spec.getkeys is None:
            rule = _NO_KEYS
        elif spec.getkeys is not None or len(spec.key_specs) == 1:
            flags = spec.key_specs[0].flags if spec.key_specs else ()
            rule = _VARIABLE if "variable_flags" in flags else key_need(flags, spec)
        else:
            rule = _PER_KEY
        plan = _PLANS[spec] = (rule, CHANNEL_ARGS.get(name))
    return plan


def check(user: User, spec: CommandSpec, args: list[Any]) -> tuple[str, str] | None:
    """Why ``user`` may not run ``args`` as (reason, object) - ("command", its name), ("key", the key, ``*`` for
    a command on every key) or ("channel", the channel) - or None when one of its selectors allows the command,
    every key and every channel."""
    sub = resolve(spec, args) if spec.subcommands else spec
    keys: list[tuple[bytes, tuple[str, ...]]] = []
    if not user.selectors:  # the usual user: its own rules only
        refused = _refusal(user, sub, args, keys)
        return None if refused is None else (refused[2], refused[3])
    worst: tuple[int, int, str, str] | None = None
    for selector in user.every_selector:
        refused = _refusal(selector, sub, args, keys)
        if refused is None:
            return None
        if worst is None or refused[:2] > worst[:2]:
            worst = refused
    assert worst is not None
    return worst[2], worst[3]


def _refusal(selector: Selector, sub: CommandSpec, args: list[Any],
             keys: list[tuple[bytes, tuple[str, ...]]]) -> tuple[int, int, str, str] | None:
    """One selector's refusal as (rank, argument position, reason, object), or None when it allows the whole
    command (Redis's ACLSelectorCheckCmd). ``keys``: the command's keys with their flags, filled on first use
    and kept for the next selector."""
    if sub not in selector.allowed and not sub.noauth:  # AUTH, HELLO, QUIT, RESET: always, as in Redis
        return _RANK["command"], 0, "command", sub.full_name
    rule, channels = _plan(sub)
    if rule != _NO_KEYS and not selector.allkeys:
        if rule == _WHOLE:
            return _RANK["key"], 0, "key", "*"
        if rule == _PATTERN:
            if len(args) > 1 and not selector.pattern_ok(args[1], key_need((), sub)):
                return _RANK["key"], 1, "key", bytes(args[1]).decode("utf-8", "surrogateescape")
        elif rule == _PER_KEY:
            if not keys:
                keys.extend(sub.keys_with_flags(args))
            for at, (key, flags) in enumerate(keys):
                if not selector.key_ok(key, key_need(flags, sub)):
                    return _RANK["key"], at + 1, "key", bytes(key).decode("utf-8", "surrogateescape")
        else:  # every key needs the same: the keys alone
            need = key_need(variable_key_flags(sub.full_name, args), sub) if rule == _VARIABLE else rule
            names = sub.keys(args)
            at = selector.first_refused(names, need)
            if at is not None:
                return _RANK["key"], at + 1, "key", bytes(names[at]).decode("utf-8", "surrogateescape")
    if channels is not None and not selector.allchannels:
        first, end, pattern = channels
        for at, channel in enumerate(args[first:end], first):
            if not selector.channel_ok(bytes(channel), pattern):
                return _RANK["channel"], at, "channel", bytes(channel).decode("utf-8", "surrogateescape")
    return None


def visible(ctx: Any, keys: list[bytes]) -> list[bytes]:
    """``keys`` without those the connection's user may not access (KEYS, SCAN, RANDOMKEY results)."""
    user = getattr(ctx.client, "user", None)
    if user is None or user.allkeys:
        return keys
    return [k for k in keys if user.may_read(k)]


def acl_of(ctx: Any) -> Acl:
    """The server's ACL, or (a handler run without a server, in tests) one kept on the context."""
    server = ctx.server
    acl = getattr(server, "acl", None) if server is not None else None
    if acl is None:
        acl = ctx.extra.get("acl")
        if acl is None:
            acl = ctx.extra["acl"] = Acl(ctx.config.get("requirepass"))
    return acl
