"""Generates docs/commands.md and docs/configuration.md from the command table and the parameter table.

Run ``python -m kvstrata.docgen`` after changing either table; a test fails while the files are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kvstrata.commands import REGISTRY, CommandSpec
from kvstrata.config import PARAMS

_GROUP_TITLES = {
    "tairkv": "KV-cache commands (TAIR.KV.*)",
    "string": "String commands",
    "bitmap": "Bitmap commands",
    "generic": "Keyspace commands",
    "connection": "Connection commands",
    "server": "Server commands",
    "transactions": "Transactions",
    "pubsub": "Pub/Sub commands",
}

_TRANSACTION_NOTES = """
As in Redis: after MULTI each command answers +QUEUED; one refused while queued (unknown, wrong arity, NOAUTH,
ACL, -OOM) makes EXEC answer -EXECABORT; EXEC runs the queue with no other client's command in between (on a
tiered server the keys of every queued command, and the watched ones, are loaded into DRAM first) and answers
each command's reply, a runtime error included. WATCH keeps each key's version and expiry: any write, EXPIRE,
PERSIST, DEL, FLUSHALL or expiry of a watched key makes EXEC answer a null array. redis-py's default
`pipeline()` works. Not queued: the TAIR.KV commands, SHUTDOWN and HELLO; MULTI is refused while the pool
acknowledges writes (`pool-ack` other than `local`).
"""

_SERVER_NOTES = """
**Saves.** `SAVE`, `BGSAVE [SCHEDULE]` and the `save` points write every DRAM value that has no copy on the SSD
tier yet to it (needs `--essd-path`; under write-through everything is there already). `SAVE` answers once the
SSD writer committed them, or `-ERR SAVE failed: ...` when writes failed or the tier evicted some of them to make
room; `BGSAVE` answers at once (inside EXEC it is scheduled, as in Redis). LASTSAVE and INFO `persistence`
(`rdb_changes_since_last_save`, `rdb_bgsave_in_progress`, `rdb_last_bgsave_status`, `rdb_saves`) report them.
From the first save (or with save points) on, a saved key keeps its SSD copy when read back or written, so a
crash loses only keys created since the last save: [architecture](architecture.md), "Saves". `ROLE` and INFO `replication` say
`master` with no replicas (kvstrata nodes share data through the pool, as its clients), and `WAIT` answers as such
a Redis master: 0, at once when no acknowledgement is asked for (or inside EXEC), else after its timeout (0: until
the client disconnects), serving other clients meanwhile; CLIENT UNBLOCK ends it (TIMEOUT: 0, ERROR:
`-UNBLOCKED`). What the pool acknowledges is `pool-ack`'s business.

**CLIENT PAUSE** timeout [WRITE | ALL] holds commands as Redis 7.0 does: `WRITE` holds every write (a write sent
inside MULTI before it is queued, an EXEC whose transaction writes) and serves reads; `ALL` holds every command,
CLIENT UNPAUSE included, so such a pause ends only at its deadline. Pauses combine (the stronger kind, the later
end), held commands run in their order once the pause ends (checked again: a new pause holds them again), a held
client that disconnects is dropped without running its command, and keys do not expire actively meanwhile (INFO
`blocked_clients` counts the held clients). It pauses this node only: other nodes on the pool keep writing. Use it
to stop writes while keys are moved away (MIGRATE, DUMP) or a node is replaced, without closing connections.

**CLIENT TRACKING** (server-assisted client-side caching) works as in Redis 7.0: the default mode (a key a tracking
client read is invalidated once, on its first change), OPTIN/OPTOUT with CLIENT CACHING (for one command or one
transaction), BCAST with prefixes (the keys changed under each prefix in one loop turn, in one message), NOLOOP,
REDIRECT (to a RESP3 connection, or to a RESP2 one subscribed to `__redis__:invalidate`; `tracking-redir-broken`
once it is gone), a flush as a null, CLIENT TRACKINGINFO / GETREDIR, INFO `tracking_*` and CLIENT LIST's `t`, `R`,
`B` and `redir=`. A change is any write, delete or expiry change, a key that expired, a key the last tier evicted
(not a demotion to a lower tier) and, with a pool, another node's write or delete of the key. A client's own change
is told after the reply of its command, as Redis does; `tracking-table-max-keys` bounds the table (past it the
oldest keys are forgotten and their clients told; Redis picks random ones). In BCAST mode a user limited to some
key patterns is sent only the keys it may read, as KEYS and SCAN show it only those (Redis 7.0 sends every key under
the prefix); prefixes are matched by one lookup per distinct prefix length. redis-py 8's `cache_config` refuses
any server that reports a version below 7.4, so against kvstrata (which reports 7.0.15) it refuses to connect as it
does against Redis 7.0; clients that use tracking without that check work. (The SDK's `local_tier` is an
in-process LRU of chunks, without invalidation: chunk keys name immutable prefixes.)

**MONITOR** streams every command the server runs, in Redis's format and with Redis's rules: `@admin` commands
and commands refused before they ran are not shown, AUTH's and HELLO's credentials are redacted, a transaction's
commands show when EXEC runs them, a monitor cannot touch keys, RESET ends it. Unlike Redis, an argument longer
than 1 KiB shows its first 64 bytes and its length (`"abc..."...(1048576 bytes)`: KV chunks are megabytes), a
monitor that does not keep up is closed at `client-output-buffer-limit` (its normal class), and MONITOR needs `allkeys` under ACL
([security](security.md)).
"""

_KEYSPACE_NOTES = """
DUMP and RESTORE use Redis's payload format for strings, so keys move between kvstrata and Redis or Valkey in
both directions (tools that copy keys with DUMP on one side and RESTORE on the other).
RESTORE reads what Redis writes: integer and LZF-compressed strings, RDB versions up to 12 (Redis 7.4), with
Redis's checks and texts (`-BUSYKEY`, `Bad data format`, `DUMP payload version or checksum are wrong`); a payload
of another type (list, hash, ...) is refused by name. DUMP writes integers and plain strings, never LZF (KV-cache
values do not shrink), with RDB version 9, which Redis from 5.0 and every Valkey read; for a value Redis would not
compress it is byte for byte Redis's bar that version. IDLETIME and FREQ are checked and not kept (the eviction
policies keep their own counts). A relative TTL whose expiry time does not fit in 64 bits is held at the latest
time (Redis wraps it around and the key comes out expired). The checksum and LZF loops are native where the
install had a C compiler (`kvstrata.native._rdb`), in Python otherwise (about 280x slower: a quarter of a second
a megabyte, on the event loop). Figures against redis-server: BENCHMARKS.md, "DUMP and RESTORE".

MIGRATE sends keys to another Redis-protocol server as Redis's does (AUTH or AUTH2, SELECT, then a RESTORE per key
with its remaining TTL, in one write; Redis's replies and errors: NOKEY, `-IOERR ...`, `Target instance replied
with error: ...`; a key the target refused stays here, the others are deleted unless COPY). It waits for the target
on the event loop's sockets, not blocking the server as Redis does, so other clients run meanwhile; a key one of
them writes while its RESTORE is in flight is not deleted. No connection is cached between calls, and MIGRATE is
refused inside MULTI.

OBJECT ENCODING answers what Redis answers for a value SET stored (`int`, `embstr` up to 44 bytes, `raw`; Redis
says `raw` also for short values built by APPEND or SETRANGE). OBJECT REFCOUNT is 1 (values are never shared;
Redis shares the integers 0-9999 when no maxmemory is set). OBJECT FREQ is refused with Redis's text for an LRU
policy (so `redis-cli --hotkeys` stops with it, as against Redis under allkeys-lru), and OBJECT IDLETIME with
`idle time not tracked`: the eviction policies rank keys by counts of accesses and keep no access time per key.
"""

_PUBSUB_NOTES = """
Pub/Sub works as in Redis 7.0: channels, glob patterns and shard channels (a node is one shard, so `SSUBSCRIBE` and
`SPUBLISH` are channels of their own namespace), RESP2 arrays and RESP3 pushes, the RESP2 subscribed mode (only
the (un)subscribe commands, PING, QUIT and RESET), a message to a connection's own subscription after the replies
it has pending. `PUBLISH` counts a subscriber once per matching subscription. ACL channel rules (`&pattern`,
`allchannels`, `resetchannels`) are enforced, with Redis's rules and texts (a PSUBSCRIBE pattern must be one of
the user's patterns literally; users made with ACL SETUSER start with no channels unless `acl-pubsub-default` is
`allchannels`), and a connection subscribed to a channel its user loses (ACL SETUSER, ACL LOAD) is closed, as in
Redis 7. A subscriber that does not read is closed at `client-output-buffer-limit`'s pubsub class (Redis's classes, limits and defaults: 32 MB, or 8 MB
for more than 60 s). Nodes that share a pool forward PUBLISH to each other through the pool's own Pub/Sub, as Redis
Cluster forwards it to every node (`pool-pubsub`, on by default): a subscriber on any node gets every message
once, each node's in order; PUBLISH counts the receivers on its own node, as a Redis Cluster node does. Shard
channels (SPUBLISH) stay on their node (a node is one shard), and a message published while the pool cannot be
reached is lost for the other nodes (INFO `pool` `pubsub_dropped`).

**Keyspace notifications** (`notify-keyspace-events`, Redis's classes and canonical form) are sent as Redis 7.0
sends them, on `__keyspace@0__:<key>` and `__keyevent@0__:<event>`: `set` (SET and its family, GETSET, MSET,
BITOP's destination, and every TAIR.KV write: SETEX, COMMIT, PULL, MPULL), `expire` (with a TTL given), `append`,
`setrange`, `incrby`, `incrbyfloat`, `setbit`, `del` (DEL, UNLINK, GETDEL, an expiry time in the past, MIGRATE,
BITOP's empty result), `persist`, `rename_from`/`rename_to`, `copy_to`, `restore`, `expired` (a key found past its
TTL, in whichever tier) and `evicted` (a key the last tier dropped; moving down to the SSD is not an eviction).
A KV-cache router can follow which chunks a node holds from `set`, `del`, `expired` and `evicted`. Class `n`
sends `new` (a write created the key, before the command's own event; not in `A`, as in Redis, and while on each
write looks up the key's header below DRAM first); class `m` sends `keymiss` (a read found the key in no tier),
where Redis counts a keyspace miss: GET, MGET, EXISTS, TTL, TYPE, GETRANGE and the other reads, not a write's
lookup (INCR, APPEND, SETRANGE, SETBIT) and not OBJECT's. Events are this node's, as in Redis Cluster (they are
not forwarded through the pool).
"""

_TAIRKV_NOTES = """
### KV-cache command details

- **Versions.** Every write (any command that changes a value) gets the next value of a per-node counter that
  survives restarts when the SSD tier is on. `TAIR.KV.SETEX` replies with it; `TAIR.KV.VERSION` and
  `TAIR.KV.MGET ... WITHVERSIONS` read it. `VER expected` makes `TAIR.KV.SETEX` a compare-and-set: when the
  key's current version (0 for a missing key) differs, the reply is `-VERMISMATCH version mismatch: expected E,
  current C` and nothing is written.
- **TTL.** `TAIR.KV.SETEX` takes milliseconds; 0 means no expiry. An entry expires in whichever tier holds it.
- **COLD_STORAGE** writes the value straight to the SSD tier (it needs `--essd-path`); DRAM is untouched.
- **CONSISTENCY_LEVEL.** `STRONG` (the default unless `--consistency eventual`) answers only with acknowledged
  data: under write-through it waits for in-flight writes of the requested keys to be committed to SSD.
  `EVENTUAL` answers from whatever copy is at hand, including writes not yet acknowledged to their writers.
  Options are read from the end of the argument list, so a key may not be named `WITHVERSIONS`.
- **PREFETCH** queues keys (highest `PRIORITY` first; a bounded queue, duplicates and keys already in DRAM are
  skipped) and replies with how many were queued; a background task promotes them to DRAM.
- **MARKHOT pattern [PX ms]** pins keys matching a glob in DRAM (they are never demoted while pinned) and brings
  matching SSD keys up; pinned bytes are capped at `hot-max-fraction` of the DRAM budget. Replies with how many
  DRAM keys were pinned at once. `UNMARKHOT` removes the pattern and unpins.
- **TIER key** replies `dram`, `ssd` or nil.
"""


def commands_markdown() -> str:
    lines = [
        "# Commands",
        "",
        "Generated from the command table (`python -m kvstrata.docgen`). Arity follows Redis: a positive number",
        "is the exact argument count including the command name, a negative one the minimum. Errors use Redis's",
        "texts. Only database 0 exists and every value is a string.",
        "",
    ]
    groups: dict[str, list[CommandSpec]] = {}
    for spec in REGISTRY.values():
        groups.setdefault(spec.group, []).append(spec)
    for group in sorted(groups, key=lambda g: list(_GROUP_TITLES).index(g) if g in _GROUP_TITLES else 99):
        lines += [f"## {_GROUP_TITLES.get(group, group)}", "", "| command | arity | flags | summary |",
                  "|---|---|---|---|"]
        for spec in sorted(groups[group], key=lambda s: s.name):
            lines.append(_row(spec))
            for sub in sorted(spec.subcommands.values(), key=lambda s: s.name):
                lines.append(_row(sub))
        lines.append("")
        if group == "tairkv":
            lines += _TAIRKV_NOTES.strip("\n").splitlines() + [""]
        if group == "generic":
            lines += _KEYSPACE_NOTES.strip("\n").splitlines() + [""]
        if group == "server":
            lines += _SERVER_NOTES.strip("\n").splitlines() + [""]
        if group == "pubsub":
            lines += _PUBSUB_NOTES.strip("\n").splitlines() + [""]
        if group == "transactions":
            lines += _TRANSACTION_NOTES.strip("\n").splitlines() + [""]
    return "\n".join(lines)


def _row(spec: CommandSpec) -> str:
    syntax = spec.syntax
    if spec.parent is not None and not syntax.upper().startswith(spec.parent.name.upper() + " "):
        syntax = f"{spec.parent.name.upper()} {syntax}"
    syntax = syntax.replace("|", "\\|")
    return f"| `{syntax}` | {spec.arity} | {' '.join(sorted(spec.flags))} | {spec.summary} |"


def configuration_markdown() -> str:
    lines = [
        "# Configuration",
        "",
        "Generated from the parameter table (`python -m kvstrata.docgen`).",
        "",
        "Every parameter can be given four ways; the first that is set wins:",
        "",
        "1. a flag: `kvstrata serve --dram-size 16G` (also `--dram-size=16G`, and the Tair-style "
        "`--port=6379 --cluster-enabled=no`);",
        "2. the environment: `KVSTRATA_<NAME>` with dashes as underscores (`KVSTRATA_DRAM_SIZE=16G`), and the "
        "documented short names `DRAM_SIZE`, `ESSD_PATH`, `ESSD_SIZE`, `HBM_SIZE`;",
        "3. a TOML file: `kvstrata serve --config kvstrata.toml` with `dram-size = \"16G\"` (dashes or "
        "underscores);",
        "4. the default below.",
        "",
        "Sizes accept Redis's units (`k`/`m`/`g` are powers of 1000, `kb`/`mb`/`gb` powers of 1024; a single "
        "upper-case letter as in `16G` means GiB). `maxmemory` is an alias of `dram-size`. Parameters marked "
        "*runtime* can be changed with `CONFIG SET` while the server runs; `CONFIG GET pattern` reads any.",
        "",
        "| parameter | default | runtime | environment | meaning |",
        "|---|---|---|---|---|",
    ]
    for p in PARAMS:
        default = "¼ of RAM, at most 4 GiB" if p.name == "dram-size" else (p.render(p.default) or "(unset)")
        env = ", ".join(f"`{e}`" for e in p.env_names)
        lines.append(f"| `{p.name}` | `{default}` | {'yes' if p.mutable else ''} | {env} | {p.help} |")
    lines += [
        "",
        "## What survives what",
        "",
        "| setup | clean restart (SIGTERM, SIGINT, `SHUTDOWN`) | crash, `kill -9` | power loss |",
        "|---|---|---|---|",
        "| memory only (no `--essd-path`; the server says so at startup) | nothing | nothing | nothing |",
        "| `--essd-path`, write-back (default) | every unexpired key (DRAM is checkpointed to SSD on the way out) | "
        "what was on SSD: demoted and not read back since; once saves are asked for (`SAVE`, `BGSAVE`, save "
        "points), every key saved or demoted, with its last value | what was on SSD and fsynced (`--fsync`) |",
        "| `--essd-path`, write-through | every unexpired key | every acknowledged write | per `--fsync` "
        "(below) |",
        "",
        "Keys come back with their TTL and version; the version counter keeps increasing across restarts. Records "
        "in the shared pool (`--pool`) outlive this node until `pool-ttl`, but the node's accounting of them "
        "starts afresh. `CONFIG SET` changes survive only through the TOML file: a server started with "
        "`--config FILE` writes them there on `CONFIG REWRITE` (the file's parameters with their current values, "
        "plus those changed at run time, as given; flags and the environment are not written; the file is "
        "replaced atomically with its permissions, and its comments are not kept); without a file, REWRITE is "
        "refused as in Redis. What never survives a restart: `TAIR.KV.MARKHOT` patterns, access profiles, the "
        "slow log and the statistics. `--save` takes Redis's save points (`--save \"3600 1 300 100 60 10000\"`; "
        "`CONFIG SET save` too): under write-back they checkpoint DRAM to the SSD tier in the background, writing "
        "what changed since the last save, as `BGSAVE` does; LASTSAVE and INFO `persistence` tell when the last "
        "one completed and how many writes came since. From then on a key that reached the SSD tier keeps its copy "
        "there (read back into DRAM, or written again: the write goes to the SSD too), so a crash loses only the "
        "keys created since the last save and not yet demoted ([architecture](architecture.md), \"Saves\"). "
        "Save points need `--essd-path`: without it a non-empty `--save` is a startup error (and "
        "CONFIG SET refuses it) rather than a promise that would be broken at the next restart; `--save \"\"` "
        "means none, as in Redis.",
        "",
        "## Durability modes",
        "",
        "| `--durability` | `--fsync` | a write is acknowledged | lost on kill -9 / power loss |",
        "|---|---|---|---|",
        "| `write-back` (default) | any | at once, in DRAM | data only in DRAM (it reaches SSD when demoted, on "
        "`SAVE`/`BGSAVE` and save points, and on clean shutdown) |",
        "| `write-through` | `always` | after the LMDB transaction holding it is committed and fsynced "
        "(group commit) | nothing acknowledged |",
        "| `write-through` | `everysec` | after the LMDB commit; fsync within about a second | nothing on kill -9; "
        "up to ~1 s of writes on power loss |",
        "| `write-through` | `no` | after the LMDB commit; the OS flushes when it likes | nothing on kill -9; "
        "unflushed writes on power loss |",
        "",
        "The SSD tier is LMDB: a crash never leaves it half-written (a transaction commits whole or not at all), "
        "and every record carries an xxh3 checksum that is verified on read.",
        "",
    ]
    return "\n".join(lines)


def write(root: Path) -> list[Path]:
    docs = root / "docs"
    docs.mkdir(exist_ok=True)
    written = []
    for name, text in (("commands.md", commands_markdown()), ("configuration.md", configuration_markdown())):
        path = docs / name
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1] if len(sys.argv) > 1 else ".")):
        print(f"wrote {path}")
