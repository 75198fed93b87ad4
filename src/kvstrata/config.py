"""Server configuration: one table of parameters read from flags > environment > TOML file > defaults.

The same table drives the command-line flags, the environment variables, the file keys, ``CONFIG GET`` and
``CONFIG SET`` (for the parameters marked mutable), and ``docs/configuration.md``.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvstrata import output_limits
from kvstrata.cpulist import normalize_cpulist
from kvstrata.observability.latency import percentile_text
from kvstrata.redact import URL_PARAMS, redact_url
from kvstrata.sizes import parse_memory, parse_size


def _default_dram_size() -> int:
    """A quarter of physical memory, at most 4 GiB: safe beside an inference engine on a shared host."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 4 * 1024**3
    return max(64 * 1024**2, min(total // 4, 4 * 1024**3))


def _yes_no(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("yes", "true", "1", "on"):
        return True
    if value in ("no", "false", "0", "off"):
        return False
    raise ValueError("argument must be 'yes' or 'no'")  # Redis's text, so CONFIG SET answers as Redis does


INT64_MAX = 2**63 - 1


def _int(text: str | int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("argument couldn't be parsed into an integer") from None
    if not -INT64_MAX - 1 <= value <= INT64_MAX:  # Redis's string2ll fails outside a long long
        raise ValueError("argument couldn't be parsed into an integer")
    return value


def _count(text: str | int) -> int:
    """A non-negative integer (a number of things)."""
    value = _int(text)
    if value < 0:
        raise ValueError("argument must be a non-negative integer")
    return value


def _str(text: str | Any) -> str:
    return str(text)


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = str(text).strip().lower()
        if value not in choices:
            raise ValueError(f"argument(s) must be one of the following: {', '.join(choices)}")
        return value

    return parse


def _notify_classes(text: str) -> str:
    from kvstrata.server.notify import canonical  # late: config stays importable without the server

    return canonical(text)


def _tier_order(text: str) -> str:
    """``dram`` then names from the tier registry (kvstrata.engine.tiers.registry), not a fixed list."""
    from kvstrata.engine.tiers import registry  # late: config stays importable without the engine

    return registry.check_order(text)


def _octal(text: str | int) -> str:
    """File permissions in octal, kept as written (``700``), as Redis's unixsocketperm."""
    value = str(text).strip()
    try:
        if not 0 <= int(value, 8) <= 0o777:
            raise ValueError
    except ValueError:
        raise ValueError("argument must be octal file permissions, e.g. 700") from None
    return value


def _float(text: str | float) -> float:
    return float(text)


def save_points(text: str) -> list[tuple[int, int]]:
    """``"3600 1 300 100"`` -> ``[(3600, 1), (300, 100)]``: Redis's save points, (seconds, changes) pairs, with
    Redis's checks (seconds >= 1, changes >= 0, an even count); ``""`` is none."""
    words = str(text).split()
    if not all(w.lstrip("+-").isascii() and w.lstrip("+-").isdigit() and len(w) - len(w.lstrip("+-")) <= 1
               for w in words):
        raise ValueError("Invalid save parameters")
    numbers = [min(int(w), INT64_MAX) for w in words]  # as Redis's strtoll, which saturates
    if len(numbers) % 2 or any(n < 1 if i % 2 == 0 else n < 0 for i, n in enumerate(numbers)):
        raise ValueError("Invalid save parameters")
    return list(zip(numbers[::2], numbers[1::2], strict=True))


def _memory_or_percent(text: str | int) -> str:
    """maxmemory-clients as Redis reads it: a memory value (``1mb``; empty is 0) or a percentage (``10%``, at
    most 100); kept as text, ``"0"`` or ``"<n>%"`` or bytes."""
    text = str(text)
    if len(text) > 1 and text.endswith("%") and text[:-1].isascii() and text[:-1].isdigit():
        if int(text[:-1]) > 100:
            raise ValueError("percentage argument must be less or equal to 100")
        return f"{int(text[:-1])}%" if int(text[:-1]) else "0"
    try:
        return str(parse_memory(text)) if text else "0"
    except ValueError:
        raise ValueError("argument must be a memory or percent value") from None


_DOUBLE = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf|infinity)", re.ASCII | re.IGNORECASE)


def _percentiles(text: str) -> str:
    """latency-tracking-info-percentiles as Redis reads it: numbers from 0 to 100 (strtod's forms), or none."""
    values = []
    for word in str(text).split():
        if _DOUBLE.fullmatch(word) is None:
            raise ValueError("Invalid latency-tracking-info-percentiles parameters")
        value = float(word)
        if not 0.0 <= value <= 100.0:
            raise ValueError("latency-tracking-info-percentiles parameters should sit between [0.0,100.0]")
        values.append(value)
    return " ".join(percentile_text(v) for v in values)


def _save(text: str) -> str:
    return " ".join(f"{s} {c}" for s, c in save_points(text))


@dataclass(frozen=True)
class Param:
    """One configuration parameter. ``name`` is the Redis-style spelling used by CONFIG and the file."""

    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    mutable: bool = False
    env: tuple[str, ...] = ()
    # Inclusive (low, high) an integer value must lie in: Redis's bounds for the parameters it also has.
    bounds: tuple[int, int] | None = None
    # For a value that may name only some of its parts (client-output-buffer-limit's classes): the value in
    # force from the one it replaces and what was parsed.
    merge: Callable[[Any, Any], Any] | None = None

    @property
    def env_names(self) -> tuple[str, ...]:
        """Environment variables that set it: the documented ones (DRAM_SIZE, ...), then KVSTRATA_<NAME>."""
        return (*self.env, "KVSTRATA_" + self.name.upper().replace("-", "_"))

    def render(self, value: Any) -> str:
        """The text CONFIG GET answers with."""
        if isinstance(value, bool):
            return "yes" if value else "no"
        if value is None:
            return ""
        if self.name in URL_PARAMS:
            return redact_url(str(value))
        return str(value)


PARAMS: tuple[Param, ...] = (
    Param("bind", _str, "127.0.0.1", "Address to listen on (loopback by default)."),
    Param("port", _int, 6379, "TCP port for the RESP protocol."),
    Param("unixsocket", _str, "", "Also listen on this Unix domain socket path (empty: no Unix socket)."),
    Param("unixsocketperm", _octal, "700",
          "Permissions of the Unix socket file, in octal (as Redis: 700 lets only the server's user connect)."),
    Param("arena", _yes_no, True,
          "Keep large DRAM values in a shared-memory arena that Unix-socket clients can map read-only "
          "(docs/dataplane.md)."),
    Param("arena-size", parse_size, 0,
          "Size of the shared-memory arena (0: the DRAM budget plus a quarter, plus ssd-write-queue with lower "
          "tiers; only touched pages use memory)."),
    Param("arena-hugepages", _yes_no, True, "Try huge pages for the arena (MFD_HUGETLB, then MADV_HUGEPAGE)."),
    Param("lease-default-ms", _int, 10_000, "Lease time of TAIR.KV.MGETREF without LEASE.", mutable=True),
    Param("lease-max-ms", _int, 60_000, "Longest lease a client may ask for.", mutable=True),
    Param("lease-max-per-client", _int, 64, "Most leases one client may hold at once.", mutable=True),
    Param("stage-size", parse_size, 128 * 1024 * 1024,
          "Size of each writer's staging segment for two-phase writes (TAIR.KV.STAGE; 0: off; only touched pages "
          "use memory; docs/dataplane.md)."),
    Param("stage-max-reservations", _int, 256, "Most two-phase write reservations one client may hold at once.",
          mutable=True),
    Param("stage-reserve-ms", _int, 60_000, "How long a two-phase write reservation lasts uncommitted.",
          mutable=True),
    Param("stage-idle-ms", _int, 60_000,
          "How long a staging segment keeps its pages without reservations before they go back to the kernel "
          "(kept pages make the next two-phase write fast; they are outside the DRAM budget).", mutable=True),
    Param("stage-offload-min", parse_size, 2 * 1024 * 1024,
          "A two-phase write's TAIR.KV.COMMIT of a value this large or larger copies and verifies it in a worker "
          "thread, so other clients are not held up meanwhile (smaller ones run inline: the thread hop costs more "
          "than it saves).", mutable=True),
    Param("pull-store", _yes_no, False,
          "Let Unix-socket clients store values that the server copies straight out of their memory "
          "(TAIR.KV.PULL, process_vm_readv: one copy instead of two-phase writes' two; only the connecting "
          "process's memory, as far as the kernel's ptrace rules allow; docs/dataplane.md).", mutable=True),
    Param("server-cpulist", normalize_cpulist, "",
          "CPUs the server's threads run on, in Redis's server_cpulist syntax (0-3,8 or 0-7:2; empty: wherever "
          "the kernel puts them). Keeping the server and its local clients on separate CPUs stops the kernel from "
          "running both on one core after a client's idle moment (docs/deploy.md, \"CPU placement\")."),
    Param("requirepass", lambda v: str(v) or None, None, "Password clients must AUTH with.", mutable=True),
    Param("protected-mode", _yes_no, True,
          "Refuse non-loopback clients when no password is set.", mutable=True),
    Param("aclfile", _str, "",
          "File of ACL users (`user <name> <rules...>` lines, as in Redis); ACL LOAD/SAVE read and write it."),
    Param("acl-pubsub-default", _choice("allchannels", "resetchannels"), "resetchannels",
          "The channels a new ACL user, a new selector and `reset` start with: none (resetchannels, Redis 7's "
          "default) or all (allchannels, Redis 6's).", mutable=True),
    Param("acllog-max-len", _int, 128, "Entries ACL LOG keeps (the oldest go first).", mutable=True,
          bounds=(0, INT64_MAX)),
    Param("tls-port", _int, 0,
          "TCP port for RESP over TLS (0: none); needs tls-cert-file and tls-key-file. With --port 0 the server "
          "serves TLS only."),
    Param("tls-cert-file", _str, "", "Server certificate (PEM) for the TLS port and the HTTPS endpoint."),
    Param("tls-key-file", _str, "", "Private key (PEM) of tls-cert-file."),
    Param("tls-key-file-pass", _str, "", "Passphrase of tls-key-file, if it is encrypted."),
    Param("tls-ca-cert-file", _str, "", "CA certificates (PEM) that client certificates are verified against."),
    Param("tls-auth-clients", _choice("yes", "no", "optional"), "yes",
          "yes: TLS clients must present a certificate signed by tls-ca-cert-file; optional: verified if given; "
          "no: not asked for."),
    Param("http-tls", _yes_no, False,
          "Serve the HTTP endpoint over TLS (HTTPS) with tls-cert-file and tls-key-file (client certificates as "
          "tls-auth-clients says)."),
    Param("http-host-names", _str, "",
          "Extra names the HTTP endpoint answers to in the Host header (besides its bound addresses, localhost "
          "when bound to loopback, and this machine's host name): a guard against DNS rebinding."),
    Param("dram-size", parse_size, None,
          "DRAM tier budget in bytes (e.g. 512mb, 16G); default a quarter of RAM, at most 4 GiB. 0 is an "
          "SSD-only server, refused without an SSD tier (there is no unlimited budget).",
          mutable=True, env=("DRAM_SIZE",)),
    Param("maxmemory-policy", _choice("allkeys-lru", "noeviction"), "allkeys-lru",
          "At the DRAM budget: allkeys-lru demotes (or evicts) by the eviction policy; noeviction answers -OOM.",
          mutable=True),
    Param("eviction-policy", _choice("lru", "lru-k", "lru-k-compact", "arc", "s3-fifo", "w-tinylfu"), "lru-k",
          "How DRAM entries are ranked for demotion (the default is chosen by `kvstrata bench hitrate`); "
          "lru-k-compact makes lru-k's decisions in flat arrays (~60 B of policy memory per key instead of "
          "~215 B) at ~4x lru-k's CPU per DRAM hit: for a DRAM tier of many small values."),
    Param("lru-k", _int, 2, "K of LRU-K: the K-th most recent reference decides the rank."),
    Param("eviction-scan-guard", _yes_no, False,
          "DRAM admission that refuses one-off keys (ScanGuard, engine/policy/chain.py): when DRAM is full, a "
          "client write of a new key not seen among the last misses (as many as DRAM holds keys) goes straight "
          "to the SSD tier instead of displacing a DRAM entry; written again, it is admitted. Needs the SSD "
          "tier. Off by default, by `kvstrata bench hitrate --ssd --ssd-scan-guard` (BENCHMARKS.md)."),
    Param("lru-k-crp", _float, 0.0,
          "LRU-K correlated-reference period in policy accesses (not seconds, so the ranking does not depend on "
          "how fast clients run): references to a key closer than this count once."),
    Param("essd-path", _str, "", "Directory of the SSD tier (LMDB); empty disables the SSD tier.",
          env=("ESSD_PATH",)),
    Param("essd-size", parse_size, 16 * 1024**3, "SSD tier budget in bytes.", env=("ESSD_SIZE",)),
    Param("ssd-policy", _choice("fifo", "clock", "s3-compact", "s3-fifo", "lru", "lru-k", "arc"), "s3-compact",
          "What the SSD tier evicts at its budget: fifo (the oldest write first), or a ranking of its records by "
          "reads (a key written back soon after it left counts as read): s3-compact (S3-FIFO in flat arrays, "
          "~85 B of memory per record), clock (second chance in flat arrays, ~58 B), s3-fifo, lru, lru-k, arc "
          "(Python dicts, 165-280 B per record). Rebuilt in write order at startup. The default is chosen by "
          "`kvstrata bench hitrate --ssd` (BENCHMARKS.md, \"Eviction: SSD tier\")."),
    Param("pool", _str, "",
          "Shared memory pool: redis://[user:pass@]host:port[/db], rediss:// (TLS), valkey://, unix:///path "
          "(one Redis/Valkey), redis-cluster://[user:pass@]host:port[,host:port...] (a Redis/Valkey Cluster, "
          "via redis-py's cluster client) or redis-sentinel://[user:pass@]host:port[,host:port...]/service[/db]"
          "[?sentinel_password=...] (the master of a Sentinel service, followed through failovers); empty "
          "disables it. Checked at startup (docs/pool.md)."),
    Param("pool-ack", _choice("pool", "replicas", "local"), "pool",
          "When a write is acknowledged: pool (the pool holds it; an error if it does not), replicas (also "
          "WAIT pool-replicas replicas of its master), local (at once; the pool write follows)."),
    Param("pool-replicas", _int, 1, "Replicas a write must reach with pool-ack replicas (Redis WAIT)."),
    Param("pool-tombstone-ttl", _float, 0.0,
          "Seconds a delete's tombstone stays in the pool (at least twice pool-ttl; 0: twice pool-ttl)."),
    Param("pool-start-degraded", _yes_no, False,
          "Start even when the pool fails its startup check (unreachable, wrong password, wrong kind of "
          "endpoint): the node starts degraded and says so; without it the server refuses to start."),
    Param("pool-size", parse_size, 4 * 1024**3,
          "Budget of bytes this node keeps in the pool; over it, its oldest pool records are removed."),
    Param("pool-ttl", _float, 3600.0,
          "Seconds a record lives in the pool (an entry's own TTL, when sooner, wins)."),
    Param("pool-timeout", _int, 1000,
          "Milliseconds a pool command may take before the pool is marked degraded (socket timeout)."),
    Param("pool-connect-timeout", _int, 500, "Milliseconds to connect to a pool node."),
    Param("pool-backoff-max", _int, 5000,
          "Longest wait in milliseconds between retries of a degraded pool (backoff doubles from 100 ms)."),
    Param("pool-key-prefix", _str, "kvs:",
          "Prefix of every pool key (it has no braces, so a key's {hash tag} still picks its cluster slot)."),
    Param("pool-pubsub", _yes_no, True,
          "PUBLISH reaches the subscribers of every node on the pool (forwarded through the pool's Pub/Sub, as "
          "Redis Cluster forwards it); no: each node's messages stay on it. SPUBLISH and keyspace notifications "
          "stay on their node either way.", mutable=True),
    Param("pool-node-id", _int, -1,
          "This node's id (0-255) in the low bits of its versions, the tie-break between nodes; -1: random."),
    Param("tier-order", _tier_order, "dram,pool,ssd",
          "Order of the tiers, fastest first: dram, then registered lower tiers (ssd, pool; configured ones "
          "must be named, unconfigured ones are skipped). dram,pool,ssd demotes DRAM entries to the pool (the "
          "SSD keeps its copy per durability) and reads this node's pool records before LMDB; dram,ssd,pool "
          "reads the pool only after LMDB misses. Writes are published to the pool either way."),
    Param("hbm-size", parse_size, 0, "GPU tier budget (used by the embedded engine; the server has none).",
          env=("HBM_SIZE",)),
    Param("durability", _choice("write-back", "write-through"), "write-back",
          "write-back: values reach SSD when demoted; write-through: every write also goes to SSD."),
    Param("fsync", _choice("always", "everysec", "no"), "everysec", "When SSD writes are forced to disk."),
    Param("consistency", _choice("strong", "eventual"), "strong", "Default TAIR.KV.MGET consistency level.",
          mutable=True),
    Param("promote-hits", _int, 2,
          "An SSD entry moves up to DRAM on this many reads within promote-window seconds (1 = every read).",
          mutable=True),
    Param("promote-window", _float, 60.0, "Window for promote-hits, in seconds.", mutable=True),
    Param("hot-max-fraction", _float, 0.5, "Largest share of the DRAM budget that pinned (hot) keys may hold.",
          mutable=True),
    Param("prefetch-predict", _yes_no, True,
          "Profile key access (chunk chains, sessions) and prefetch the chunks a reader will need next from the "
          "SSD/pool tiers (docs/prefetch.md). Only with a lower tier."),
    Param("prefetch-window", _int, 8, "Chunks the predictor keeps ahead of a reader inside one request (topped "
          "up a few reads at a time; a trusted walk keeps a few more: [prefetch.md](prefetch.md))."),
    Param("prefetch-link-window", _float, 8.0,
          "Two keys a stream touches one after the other are linked into a chain only if they are at most this "
          "many times the stream's usual gap apart, counted in accesses (the gap adapts to the load).",
          mutable=True),
    Param("prefetch-session-max", _int, 64,
          "Chunks a returning session's read may bring up at once (the rest of its context)."),
    Param("prefetch-along", _count, 4,
          "When a GET must load the first chunk of a known chain from below DRAM, this many predicted next chunks "
          "are loaded in the same read (the rest of the walk is queued); 0: only the GET's own chunk.",
          mutable=True),
    Param("prefetch-min-confidence", _float, 0.6,
          "A predicted chunk is prefetched only if the chain links leading to it are this likely to be followed.",
          mutable=True),
    Param("prefetch-protect", _float, 1.0,
          "A prefetch displaces a DRAM key only if that key's expected next use (predicted, or from its access "
          "history, in accesses) is more than this many times later than the prefetched chunk's.",
          mutable=True),
    Param("prefetch-half-life", _float, 1.0,
          "Half-life of the access counts behind the temporal score, in DRAMs full of accesses (this many times "
          "the number of keys DRAM holds).",
          mutable=True),
    Param("profile-max-keys", _int, 262_144,
          "Most keys with an access profile (fixed memory; the longest-unused profiles are reused first)."),
    Param("prefetch-min-value", parse_size, 4096,
          "Values smaller than this are not profiled nor predicted: KV chunks are large, and profiling costs a few "
          "microseconds per access.", mutable=True),
    Param("chain-evict", _yes_no, True,
          "Demotion keeps chain heads (a conversation's first own chunk, which triggers the prefetch of the rest) "
          "head-keep times longer than other keys. Needs prefetch-predict.", mutable=True),
    Param("head-keep", _float, 2.0, "How many times longer chain heads stay in DRAM under chain-evict.",
          mutable=True),
    Param("ssd-inline-max", parse_size, 256 * 1024,
          "A load of SSD records whose pages are all in memory (page cache) and that hold at most this many bytes "
          "is read on the event loop instead of a loader thread (0: always a thread; docs/architecture.md, "
          "'Disk I/O off the event loop').",
          mutable=True),
    Param("ssd-key-filter", _yes_no, True,
          "Reads of keys the SSD tier never held (a miss of a chunk never stored, a new key's SET) are answered on "
          "the event loop from a Bloom filter of its keys, ~1.2 bytes a key, instead of a lookup in a loader thread "
          "(no: always the lookup; the filter is kept either way; docs/architecture.md, 'Disk I/O off the event "
          "loop').", mutable=True),
    Param("ssd-writer-pause", _int, 200,
          "Microseconds of work after which the SSD writer thread sleeps 50 us, so that the event loop, waiting for "
          "the interpreter (GIL) with a client's request in hand, runs first (0: never; docs/architecture.md, "
          "'Disk I/O off the event loop').",
          mutable=True, bounds=(0, 1_000_000)),
    Param("ssd-write-queue", parse_size, 64 * 1024**2,
          "Bytes of demoted values waiting for the SSD writer before writers are made to wait.", mutable=True),
    Param("proto-max-bulk-len", parse_size, 512 * 1024**2, "Largest bulk string a client may send.",
          mutable=True, bounds=(1024**2, INT64_MAX)),
    Param("client-query-buffer-limit", parse_size, 1024**3, "Largest pending request of one client.",
          mutable=True, bounds=(1024**2, INT64_MAX)),
    Param("client-output-buffer-limit", output_limits.parse, output_limits.DEFAULT,
          "Pending reply bytes after which a client that does not read is disconnected, per client class as "
          "Redis's: `<class> <hard> <soft> <soft seconds>`, for normal, replica (no client here) and pubsub "
          "(a client with a subscription); a class not named keeps its limits; 0 is no limit; a bare size is "
          "the hard limit of every class.", mutable=True, merge=output_limits.merge),
    Param("large-value-threshold", parse_size, 64 * 1024,
          "Bulk values at least this large are received straight into their own buffer."),
    Param("maxmemory-clients", _memory_or_percent, "0",
          "Memory all clients may hold together (request bytes, arguments, unsent replies, MULTI queues, watched "
          "keys, subscriptions: CLIENT LIST's tot-mem), in bytes or as a percentage of dram-size (`10%`), at "
          "least 128 KiB; past it the clients holding the most are closed, except those with CLIENT NO-EVICT (as "
          "Redis 7); 0: no limit.", mutable=True),
    Param("tcp-keepalive", _int, 300,
          "Seconds of silence after which a client's TCP connection is probed (three unanswered probes a third "
          "of that apart drop it: a vanished client is found); 0: never.", mutable=True, bounds=(0, 2**31 - 1)),
    Param("tcp-backlog", _int, 511,
          "Connections the kernel queues before they are accepted (capped by net.core.somaxconn).",
          bounds=(0, 2**31 - 1)),
    Param("maxclients", _int, 10000, "Most clients connected at once.", mutable=True,
          bounds=(1, 2**32 - 1)),
    Param("timeout", _int, 0, "Close a client idle this many seconds (0: never).", mutable=True,
          bounds=(0, 2**31 - 1)),
    Param("hz", _int, 10, "Background cycles per second (active expiry).", mutable=True,
          bounds=(0, 2**31 - 1)),
    Param("active-expire-keys", _int, 20, "Keys sampled per active-expiry round.", mutable=True),
    Param("slowlog-log-slower-than", _int, 10000,
          "Microseconds after which a command is logged as slow (0: every command, -1: none).", mutable=True,
          bounds=(-1, INT64_MAX)),
    Param("slowlog-max-len", _int, 128, "Entries kept in the slow log.", mutable=True,
          bounds=(0, INT64_MAX)),
    Param("notify-keyspace-events", _notify_classes, "",
          "Keyspace notifications, Redis's classes (K keyspace, E keyevent, g generic, $ string, x expired, e "
          "evicted from the last tier, A for all, m key miss, n new key; empty: off). Published through Pub/Sub "
          "on this node.",
          mutable=True),
    Param("tracking-table-max-keys", _int, 1_000_000,
          "Keys remembered for CLIENT TRACKING's default mode (0: no limit); past it the oldest are forgotten and "
          "the clients caching them sent an invalidation, as Redis does.", mutable=True, bounds=(0, INT64_MAX)),
    Param("latency-tracking", _yes_no, True,
          "Keep each command's latency histogram (INFO latencystats, LATENCY HISTOGRAM, /metrics), as Redis 7.",
          mutable=True),
    Param("latency-tracking-info-percentiles", _percentiles, "50 99 99.9",
          "The percentiles INFO latencystats shows, each from 0 to 100 (empty: none), as Redis 7.", mutable=True),
    Param("latency-monitor-threshold", _int, 0,
          "LATENCY LATEST/HISTORY record a command's slowest latency of each second when it reaches this many "
          "milliseconds (0: off, as in Redis).", mutable=True,
          bounds=(0, INT64_MAX)),
    Param("http-port", _int, 9379,
          "Port of the HTTP endpoint: /metrics (Prometheus), /stats.json, /healthz and the dashboard at /; 0 "
          "disables it. If the default port is taken the server runs without it (with a warning); a port given "
          "explicitly must be free."),
    Param("http-bind", _str, "127.0.0.1",
          "Address(es) of the HTTP endpoint. A non-loopback address requires requirepass: clients send it as a "
          "Bearer token or as the basic-auth password."),
    Param("save", _save, "",
          "Save points, as Redis's: \"<seconds> <changes> [...]\" checkpoints write-back DRAM to the SSD tier in "
          "the background once at least <changes> writes happened and <seconds> passed since the last save (e.g. "
          "\"3600 1 300 100 60 10000\"); \"\" (default): only SAVE, BGSAVE and a clean shutdown do. With save points "
          "(or after a SAVE) a saved key keeps its SSD copy when read back or written. Needs essd-path (without it "
          "a non-empty value is refused); under write-through every write is on SSD already.",
          mutable=True),
    Param("appendonly", _choice("no"), "no", "Accepted for compatibility: there is no append-only file."),
    Param("cluster-enabled", _choice("no"), "no", "Accepted for Tair compatibility; only 'no' is supported."),
    Param("databases", _int, 1, "Only database 0 exists."),
    Param("logfile", _str, "",
          "Log to this file (appended to, and opened again when it is moved, so logrotate works) instead of "
          "standard error (empty)."),
    Param("pidfile", _str, "", "Write the server's process id to this file at start and remove it at exit (empty: "
          "none)."),
    Param("loglevel", _choice("debug", "verbose", "notice", "warning"), "notice", "Log verbosity.",
          mutable=True),
)
PARAMS_BY_NAME: dict[str, Param] = {p.name: p for p in PARAMS}
# Redis's CONFIG_MIN_HZ / CONFIG_MAX_HZ: any hz within the bounds is accepted and used as 1..500.
CLAMPS: dict[str, tuple[int, int]] = {"hz": (1, 500)}
# Redis calls the DRAM budget `maxmemory`; accept both names everywhere.
ALIASES: dict[str, str] = {"maxmemory": "dram-size"}


def canonical(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    return ALIASES.get(key, key)


@dataclass
class Config:
    """Parameter values by Redis-style name; attribute access uses underscores (``cfg.dram_size``)."""

    values: dict[str, Any] = field(default_factory=dict)
    # Parameters given by a flag, the environment or a file (not left at their defaults).
    explicit: set[str] = field(default_factory=set)
    # What CONFIG REWRITE writes (config_rewrite.py): the config file's values and those CONFIG SET changed, as
    # they were given (a parsed value does not always read back: an octal mode, a size with units).
    persisted: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for p in PARAMS:
            self.values.setdefault(p.name, p.default)
        if self.values["dram-size"] is None:
            self.values["dram-size"] = _default_dram_size()

    def __getattr__(self, attr: str) -> Any:
        try:
            return self.__dict__["values"][attr.replace("_", "-")]
        except KeyError:
            raise AttributeError(attr) from None

    def set(self, name: str, raw: Any, *, runtime: bool = False) -> None:
        """Parse and set one parameter; raises ValueError (unknown, immutable at runtime, or bad value)."""
        key = canonical(name)
        param = PARAMS_BY_NAME.get(key)
        if param is None:
            raise ValueError(f"Unknown option or number of arguments for CONFIG SET - '{name}'")
        if runtime and not param.mutable:
            raise ValueError(f"can't set immutable config '{name}'")
        value = param.parse(raw)
        if param.bounds is not None and not param.bounds[0] <= value <= param.bounds[1]:
            raise ValueError(f"argument must be between {param.bounds[0]} and {param.bounds[1]} inclusive")
        if param.merge is not None:
            value = param.merge(self.values[key], value)
        if key in CLAMPS:  # accepted, then brought into range (CONFIG GET shows the value in use), as Redis
            value = max(CLAMPS[key][0], min(CLAMPS[key][1], value))
        self.values[key] = value

    def get(self, name: str) -> Any:
        values = self.values
        # Callers almost always use the canonical spelling: one dict lookup, no string work.
        return values[name] if name in values else values[canonical(name)]


def load_file(path: str) -> dict[str, Any]:
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    return {canonical(k): v for k, v in data.items()}


def env_values(environ: Mapping[str, str]) -> dict[str, str]:
    """Parameters from the environment: the documented names (DRAM_SIZE, ...) and KVSTRATA_<NAME> for all."""
    found: dict[str, str] = {}
    for p in PARAMS:
        for env_name in p.env_names:
            if env_name in environ:
                found[p.name] = environ[env_name]
    return found


def build_config(flags: Mapping[str, Any], environ: Mapping[str, str], file: str | None = None) -> Config:
    """Merge defaults < file < environment < flags. Raises ValueError with the offending name on bad input."""
    cfg = Config()
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if file:
        layers.append((f"file {file}", load_file(file)))
    layers.append(("environment", env_values(environ)))
    layers.append(("flags", flags))
    for source, layer in layers:
        for name, raw in layer.items():
            if raw is None:
                continue
            try:
                cfg.set(name, raw)
            except ValueError as exc:
                raise ValueError(f"{source}: {name}: {exc}") from None
            cfg.explicit.add(canonical(name))
            if source.startswith("file "):
                cfg.persisted[canonical(name)] = raw
    return cfg
