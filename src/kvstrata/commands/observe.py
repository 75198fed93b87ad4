"""Redis-side introspection: SLOWLOG, LATENCY, MEMORY and MONITOR.

- ``SLOWLOG GET/LEN/RESET/HELP`` read the slow log the connection fills (``slowlog-log-slower-than``).
- ``LATENCY HISTOGRAM`` answers from the per-command power-of-two histograms, in Redis 7's format.
  ``LATENCY LATEST/HISTORY/RESET`` read kvstrata's latency monitor: one event per command, sampled once a
  second (``kvstrata.observability.history``), recorded at ``latency-monitor-threshold`` ms and above.
- ``MEMORY USAGE key [SAMPLES n]`` is the bytes the key is charged in the tier that holds it (DRAM: key, value
  and the per-entry overhead; SSD: the record and its index entry). ``MEMORY STATS`` reports the tiers, the
  per-entry overhead and the top key prefixes by bytes (sampled). ``MEMORY DOCTOR`` reads them back in words.
- ``MONITOR`` streams the commands the server runs to this connection (``kvstrata.server.monitor``).
"""

from __future__ import annotations

from typing import Any

from kvstrata.commands.args import parse_int
from kvstrata.commands.context import Context
from kvstrata.commands.registry import REGISTRY, KeySpec, command, container
from kvstrata.engine.bufpool import BufferPool, trim_malloc
from kvstrata.errors import CommandError, syntax_error
from kvstrata.observability import memory
from kvstrata.observability.latency import cumulative_usec
from kvstrata.observability.snapshot import count_keys, sample_dram, top_prefixes
from kvstrata.protocol.encoder import NO_REPLY, OK, Status


def help_reply(name: str, lines: list[str]) -> list[Status]:
    return [Status(f"{name} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"),
            *(Status(line) for line in lines)]


# ---- SLOWLOG ----
container("slowlog", "", group="server", since="2.2.12",
          summary="A container for slow log commands.")


@command("get", -2, "admin loading stale", parent="slowlog", group="server", since="2.2.12", most=3,
         summary="Returns the slow log's entries.", syntax="GET [count]")
def slowlog_get(ctx: Context, args: list[bytes]) -> Any:
    count = 10
    if len(args) == 3:
        count = parse_int(args[2], "count should be greater than or equal to -1")
        if count < -1:
            raise CommandError("count should be greater than or equal to -1")
    if ctx.server is None:
        return []
    entries = list(ctx.server.slowlog.entries)
    if count >= 0:
        entries = entries[:count]
    return [[e.id, e.when, e.usec, list(e.args), e.client_addr, e.client_name] for e in entries]


@command("len", 2, "admin loading stale", parent="slowlog", group="server", since="2.2.12",
         summary="Returns the number of entries in the slow log.")
def slowlog_len(ctx: Context, args: list[bytes]) -> Any:
    return len(ctx.server.slowlog.entries) if ctx.server is not None else 0


@command("reset", 2, "admin loading stale", parent="slowlog", group="server", since="2.2.12",
         summary="Clears all entries from the slow log.")
def slowlog_reset(ctx: Context, args: list[bytes]) -> Any:
    if ctx.server is not None:
        ctx.server.slowlog.reset()
    return OK


@command("help", 2, "loading stale", parent="slowlog", group="server", since="6.2.0",
         summary="Shows helpful text about the different subcommands.")
def slowlog_help(ctx: Context, args: list[bytes]) -> Any:
    return help_reply("SLOWLOG", [
        "GET [<count>]",
        "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
        "    Entries are made of:",
        "    id, timestamp, time in microseconds, arguments array, client IP and port,",
        "    client name",
        "LEN",
        "    Return the length of the slowlog.",
        "RESET",
        "    Reset the slowlog.",
        "HELP",
        "    Print this help.",
    ])


# ---- LATENCY ----
container("latency", "", group="server", since="2.8.13",
          summary="A container for latency diagnostics commands.")


def _history(ctx: Context) -> Any:
    if ctx.server is None:
        return None
    return ctx.server.observability.history


@command("latest", 2, "admin noscript loading stale", parent="latency", group="server", since="2.8.13",
         summary="Returns the latest latency samples for all events.")
def latency_latest(ctx: Context, args: list[bytes]) -> Any:
    history = _history(ctx)
    return history.latest() if history is not None else []


@command("history", 3, "admin noscript loading stale", parent="latency", group="server", since="2.8.13",
         summary="Returns timestamp-latency samples for an event.", syntax="HISTORY event")
def latency_history(ctx: Context, args: list[bytes]) -> Any:
    history = _history(ctx)
    return history.history(args[2].decode(errors="replace").lower()) if history is not None else []


@command("reset", -2, "admin noscript loading stale", parent="latency", group="server", since="2.8.13",
         summary="Resets the latency data for one or more events.", syntax="RESET [event [event ...]]")
def latency_reset(ctx: Context, args: list[bytes]) -> Any:
    history = _history(ctx)
    if history is None:
        return 0
    return history.reset([a.decode(errors="replace").lower() for a in args[2:]])


@command("histogram", -2, "admin noscript loading stale", parent="latency", group="server", since="7.0.0",
         summary="Returns the cumulative distribution of latencies of a subset or all commands.",
         syntax="HISTOGRAM [command [command ...]]")
def latency_histogram(ctx: Context, args: list[bytes]) -> Any:
    if ctx.server is None:
        return {}
    counts = ctx.server.command_counts
    if len(args) > 2:
        specs = []
        for raw in args[2:]:
            name = raw.lower()
            parent, _, sub = name.partition(b"|")
            spec = REGISTRY.get(parent)
            if spec is not None and sub:
                spec = spec.subcommands.get(sub)
            if spec is not None and spec not in specs:
                specs.append(spec)
    else:
        specs = sorted(counts, key=lambda s: s.full_name)
    out: dict[str, Any] = {}
    for spec in specs:
        hist = counts[spec].hist
        timed = sum(hist)
        if not timed:
            continue
        buckets: dict[int, int] = {}
        prev = 0
        for le, n in cumulative_usec(hist):
            if n != prev:
                buckets[le] = n
                prev = n
        out[spec.full_name] = {"calls": timed, "histogram_usec": buckets}
    return out


@command("help", 2, "loading stale", parent="latency", group="server", since="2.8.13",
         summary="Returns helpful text about the different subcommands.")
def latency_help(ctx: Context, args: list[bytes]) -> Any:
    return help_reply("LATENCY", [
        "HISTORY <event>",
        "    Return time-latency samples for the <event> class (a command name).",
        "LATEST",
        "    Return the latest latency samples for all events.",
        "RESET [<event> ...]",
        "    Reset latency data of one or more <event> classes.",
        "    (default: reset all data for all event classes)",
        "HISTOGRAM [COMMAND ...]",
        "    Return a cumulative distribution of latencies in the format of a histogram for the specified",
        "    command names. If no commands are specified then all histograms are replied.",
        "HELP",
        "    Print this help.",
    ])


# ---- MEMORY ----
container("memory", "", group="server", since="4.0.0", summary="A container for memory diagnostics commands.")


def usage_bytes(store: Any, key: bytes) -> int | None:
    """Bytes ``key`` is charged in the tier that holds it; None when it does not exist."""
    entry = store.get(key, touch=False)
    if entry is None:
        return None
    if key in store.dram.entries:
        return int(store.dram.size(key, entry.value))
    from kvstrata.engine.tiers.ssd import HEADER_SIZE, MAX_INLINE_KEY, RECORD_OVERHEAD, data_key

    full_key = len(key) if len(key) > MAX_INLINE_KEY else 0
    return len(data_key(key)) + HEADER_SIZE + full_key + len(entry.value) + RECORD_OVERHEAD


@command("usage", -3, "readonly", parent="memory", group="server", since="4.0.0", keys=(2, 2, 1),
         key_specs=(KeySpec(2, 0, 1, ("RO",)),),
         summary="Estimates the memory usage of a key.", syntax="USAGE key [SAMPLES count]")
def memory_usage(ctx: Context, args: list[bytes]) -> Any:
    if len(args) == 5 and args[3].lower() == b"samples":
        parse_int(args[4])  # accepted for compatibility: a value is one string, measured exactly
    elif len(args) != 3:
        raise syntax_error()
    return usage_bytes(ctx.store, args[2])


def memory_stats_map(ctx: Context) -> dict[str, Any]:
    store = ctx.store
    dram = store.dram
    n = len(dram.entries)
    m = memory.figures(store, ctx.server)
    sample = sample_dram(dram)
    # Redis's names and meanings: allocated is used_memory (the DRAM tier's charge), clients.normal bytes.
    out: dict[str, Any] = {
        "peak.allocated": m.peak,
        "total.allocated": m.used,
        "clients.normal": m.clients,
        "overhead.total": m.overhead,
        "keys.count": count_keys(store, sample)[0],
        "keys.bytes-per-key": m.used // n if n else 0,
        "dataset.bytes": m.dataset,
        "dataset.percentage": f"{100.0 * m.dataset / m.used:.4f}" if m.used else "0",
        "peak.percentage": f"{100.0 * m.used / m.peak:.4f}" if m.peak else "0",
        "rss.bytes": m.rss,
        "fragmentation": f"{m.fragmentation:.4f}",
        "fragmentation.bytes": m.rss - m.used,
        "overhead.per-entry": dram.overhead,
    }
    for tier in store.tier_info():
        name = tier["name"]
        out[f"{name}.used"] = tier["used"]
        out[f"{name}.budget"] = tier["budget"]
        out[f"{name}.keys"] = tier["keys"]
        out[f"{name}.water-level"] = f"{100.0 * tier['used'] / tier['budget']:.2f}" if tier["budget"] else "0"
    out["dram.pinned"] = dram.pinned_bytes
    prefixes = top_prefixes(dram, sample)
    out["prefixes.sampled-keys"] = prefixes["sampled_keys"]
    out["prefixes.top-by-bytes"] = {p["prefix"]: {"keys": p["keys"], "bytes": p["bytes"]} for p in prefixes["top"]}
    return out


@command("stats", 2, "", parent="memory", group="server", since="4.0.0",
         summary="Returns details about memory usage.")
def memory_stats(ctx: Context, args: list[bytes]) -> Any:
    return memory_stats_map(ctx)


@command("doctor", 2, "", parent="memory", group="server", since="4.0.0",
         summary="Outputs a memory problems report.")
def memory_doctor(ctx: Context, args: list[bytes]) -> Any:
    problems = []
    for tier in ctx.store.tier_info():
        if tier["budget"] and tier["used"] > 0.9 * tier["budget"]:
            problems.append(f"* The {tier['name']} tier is at {100.0 * tier['used'] / tier['budget']:.1f}% of its "
                            f"budget: entries are being moved down or evicted to make room.")
        if tier.get("corrupt_reads"):
            problems.append(f"* The {tier['name']} tier has had {tier['corrupt_reads']} corrupt reads (dropped and "
                            f"answered as misses): check the device.")
    dram = ctx.store.dram
    if dram.budget and dram.pinned_bytes > 0.8 * ctx.store.hot_max_fraction * dram.budget:
        problems.append("* Pinned (hot) keys are close to hot-max-fraction of the DRAM budget.")
    if not problems:
        return "Hi Sam, I can't find any memory issue in your instance. I can only account for what occurs on " \
               "this base."
    return "Sam, I detected a few issues in this kvstrata instance memory implants:\n\n" + "\n".join(problems) + "\n"


@command("purge", 2, "", parent="memory", group="server", since="4.0.0",
         summary="Asks the allocator to release memory.")
def memory_purge(ctx: Context, args: list[bytes]) -> Any:
    """The receive-buffer pool's free buffers are dropped (it refills on demand) and glibc's heap is trimmed."""
    pool = getattr(ctx.server, "bufpool", None)
    if isinstance(pool, BufferPool):
        pool.settle()  # buffers of values deleted since the last large request join the free list first
        pool.clear()
    trim_malloc()
    return OK


@command("malloc-stats", 2, "", parent="memory", group="server", since="4.0.0",
         summary="Returns the allocator statistics.")
def memory_malloc_stats(ctx: Context, args: list[bytes]) -> Any:
    """Redis's answer when it is built without jemalloc: CPython's allocators keep no such report."""
    return "Stats not supported for the current allocator"


@command("help", 2, "loading stale", parent="memory", group="server", since="4.0.0",
         summary="Returns helpful text about the different subcommands.")
def memory_help(ctx: Context, args: list[bytes]) -> Any:
    return help_reply("MEMORY", [
        "DOCTOR",
        "    Return memory problems reports.",
        "STATS",
        "    Return information about the memory usage of the server (tiers, overhead, top key prefixes).",
        "USAGE <key> [SAMPLES <count>]",
        "    Return memory in bytes used by <key> and its value, in the tier that holds it.",
        "MALLOC-STATS",
        "    Return internal statistics report from the memory allocator.",
        "PURGE",
        "    Attempt to purge dirty pages for reclamation by the allocator.",
        "HELP",
        "    Print this help.",
    ])


@command("monitor", 1, "admin noscript loading stale", group="server", since="1.0.0",
         summary="Listens for all requests received by the server in real-time.")
def monitor(ctx: Context, args: list[bytes]) -> Any:
    client = ctx.client
    if client.executing:  # Redis's text: inside EXEC a client expects one reply per command
        raise CommandError("MONITOR isn't allowed for DENY BLOCKING client")
    if client.monitor:
        return NO_REPLY  # as Redis: a monitor asking again is ignored
    if ctx.server is None:
        raise CommandError("no server")
    client.monitor = True
    ctx.server.monitors.add(ctx.server.clients[client.id])
    return OK
