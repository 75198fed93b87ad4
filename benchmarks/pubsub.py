"""Pub/Sub fan-out, the cost of keyspace notifications on writes, and client-side caching (CLIENT TRACKING):
kvstrata against a real redis-server, same run.

Fan-out: ``--subscribers`` raw-socket subscribers of one channel, one publisher pipelining ``--messages`` PUBLISH
of ``--size``-byte messages in batches of 100; timed from the first PUBLISH until every subscriber has received
every message (counted in bytes: each message's frame has a known length). Notifications: ``--writes`` pipelined
SETs of 100-byte values with ``notify-keyspace-events`` off, then ``KEA`` with one subscriber reading
``__keyevent@0__:set``. Tracking: ``--writes`` pipelined GETs (of missing keys) by a client with tracking off, then
on (each read key joins the tracking table); then ``--subscribers`` tracking clients, each redirecting to its own
RESP2 subscriber of ``__redis__:invalidate``, read every key, and one writer pipelines a SET of each: timed until
every subscriber has received every invalidation. Rounds alternate the server order; the first is a warm-up;
medians. Prints messages delivered per second (subscribers x messages / time), SETs and GETs per second and
invalidations delivered per second, with kvstrata/Redis ratios.

    PYTHONPATH=src python benchmarks/pubsub.py [--rounds 7] [--subscribers 4] [--messages 20000] [--json]
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import statistics
import sys
import time
from typing import Any

from kvstrata.bench.procs import describe_machine, start_server
from kvstrata.client.fast import pack as _pack_into

WARMUP = 1
BATCH = 100


def pack(args: list[bytes]) -> bytes:
    parts: list[bytes] = []
    _pack_into(args, parts)
    return b"".join(parts)


def _connect(host: str, port: int) -> socket.socket:
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _read_exactly_lines(s: socket.socket, n: int) -> None:
    """Read the ``n`` replies of simple commands (each one line: +OK, :1)."""
    got = b""
    while got.count(b"\r\n") < n:
        got += s.recv(1 << 16)


def _read_bytes(s: socket.socket, n: int) -> None:
    while n > 0:
        n -= len(s.recv(n))


def _subscribe(s: socket.socket, channel: bytes) -> None:
    s.sendall(pack([b"SUBSCRIBE", channel]))
    _read_bytes(s, len(b"*3\r\n$9\r\nsubscribe\r\n$%d\r\n%s\r\n:1\r\n" % (len(channel), channel)))


def _pipelined(s: socket.socket, batch: bytes, count: int) -> int:
    """Send ``batch`` (BATCH commands of one-line replies) and read its replies until ``count`` commands ran."""
    done = 0
    while done < count:
        s.sendall(batch)
        _read_exactly_lines(s, BATCH)
        done += BATCH
    return done


def _drain(socks: list[socket.socket], want: int, deadline: float) -> None:
    """Read from every socket until each has delivered ``want`` bytes."""
    left = {s: want for s in socks}
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    buf = bytearray(1 << 20)
    while left:
        if time.monotonic() > deadline:
            raise TimeoutError("subscribers did not receive every message")
        for key, _ in sel.select(1.0):
            s = key.fileobj
            n = s.recv_into(buf)  # type: ignore[union-attr]
            if not n:
                raise ConnectionError("a subscriber was closed")
            left[s] -= n  # type: ignore[index]
            if left[s] <= 0:  # type: ignore[index]
                sel.unregister(s)
                del left[s]  # type: ignore[arg-type]
    sel.close()


def fan_out(host: str, port: int, subscribers: int, messages: int, size: int) -> float:
    """Seconds to deliver ``messages`` to each of ``subscribers``."""
    channel = b"bench"
    msg = b"m" * size
    subs = [_connect(host, port) for _ in range(subscribers)]
    for s in subs:
        _subscribe(s, channel)
    frame = len(b"*3\r\n$7\r\nmessage\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(channel), channel, size, msg))
    pub = _connect(host, port)
    t0 = time.perf_counter()
    sent = _pipelined(pub, pack([b"PUBLISH", channel, msg]) * BATCH, messages)
    _drain(subs, frame * sent, time.monotonic() + 120)
    elapsed = time.perf_counter() - t0
    for s in [pub, *subs]:
        s.close()
    return elapsed


def writes(host: str, port: int, count: int, notify: bool) -> float:
    """Seconds for ``count`` pipelined SETs, with keyspace notifications on (one subscriber reading) or off."""
    admin = _connect(host, port)
    admin.sendall(pack([b"CONFIG", b"SET", b"notify-keyspace-events", b"KEA" if notify else b""]))
    _read_exactly_lines(admin, 1)
    sub = None
    if notify:
        sub = _connect(host, port)
        _subscribe(sub, b"__keyevent@0__:set")
    value = b"v" * 100
    batch = b"".join(pack([b"SET", b"key:%d" % i, value]) for i in range(BATCH))
    t0 = time.perf_counter()
    _pipelined(admin, batch, count)
    elapsed = time.perf_counter() - t0
    if sub is not None:
        sub.close()
    admin.sendall(pack([b"CONFIG", b"SET", b"notify-keyspace-events", b""]))
    _read_exactly_lines(admin, 1)
    admin.close()
    return elapsed


def _id_and_subscribe(s: socket.socket) -> int:
    """The connection's client id, then SUBSCRIBE to the tracking channel."""
    s.sendall(pack([b"CLIENT", b"ID"]))
    line = b""
    while not line.endswith(b"\r\n"):
        line += s.recv(64)
    _subscribe(s, b"__redis__:invalidate")
    return int(line[1:-2])


def tracked_reads(host: str, port: int, count: int, tracking: bool) -> float:
    """Seconds for ``count`` pipelined GETs of missing keys (one-line replies), with tracking on or off."""
    c = _connect(host, port)
    c.sendall(pack([b"CLIENT", b"TRACKING", b"on" if tracking else b"off"]))
    _read_exactly_lines(c, 1)
    batch = b"".join(pack([b"GET", b"miss:%d" % i]) for i in range(BATCH))
    t0 = time.perf_counter()
    _pipelined(c, batch, count)
    elapsed = time.perf_counter() - t0
    c.close()
    return elapsed


def invalidations(host: str, port: int, trackers: int, count: int) -> float:
    """Seconds from the first SET until each of ``trackers`` clients (redirecting to a RESP2 subscriber) has been
    told of all ``count`` keys it read."""
    subs = [_connect(host, port) for _ in range(trackers)]
    readers = []
    batch = b"".join(pack([b"STRLEN", b"inv:%d" % i]) for i in range(BATCH))  # one-line replies, tracked
    for sub in subs:
        r = _connect(host, port)
        r.sendall(pack([b"CLIENT", b"TRACKING", b"on", b"REDIRECT", b"%d" % _id_and_subscribe(sub)]))
        _read_exactly_lines(r, 1)
        _pipelined(r, batch, BATCH)  # every key read (tracked) by every client
        readers.append(r)
    want = sum(len(b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*1\r\n$%d\r\ninv:%d\r\n"
                   % (len(b"inv:%d" % i), i)) for i in range(BATCH))
    writer = _connect(host, port)
    sets = b"".join(pack([b"SET", b"inv:%d" % i, b"v"]) for i in range(BATCH))
    done = 0
    t0 = time.perf_counter()
    while done < count:  # rounds of BATCH keys: read again (tracked again), then written
        writer.sendall(sets)
        _read_exactly_lines(writer, BATCH)
        _drain(subs, want, time.monotonic() + 120)
        done += BATCH
        if done < count:
            for r in readers:
                _pipelined(r, batch, BATCH)
    elapsed = time.perf_counter() - t0
    for s in [writer, *readers, *subs]:
        s.close()
    return elapsed


def run(rounds: int, subscribers: int, messages: int, size: int, count: int) -> dict[str, Any]:
    redis_argv = ["redis-server", "--save", "", "--appendonly", "no", "--dir", "/tmp"]
    kv_argv = [sys.executable, "-m", "kvstrata", "serve", "--http-port", "0"]
    times: dict[str, dict[str, list[float]]] = {
        n: {"fanout": [], "set_off": [], "set_on": [], "get_off": [], "get_on": [], "inval": []}
        for n in ("kvstrata", "redis")}
    with start_server("redis-pubsub", redis_argv) as rd, start_server("kvstrata-pubsub", kv_argv) as kv:
        where = {"redis": (rd.host, rd.port), "kvstrata": (kv.host, kv.port)}
        for i in range(rounds + WARMUP):
            for name in (("redis", "kvstrata") if i % 2 else ("kvstrata", "redis")):
                host, port = where[name]
                got = {"fanout": fan_out(host, port, subscribers, messages, size),
                       "set_off": writes(host, port, count, False), "set_on": writes(host, port, count, True),
                       "get_off": tracked_reads(host, port, count, False),
                       "get_on": tracked_reads(host, port, count, True),
                       "inval": invalidations(host, port, subscribers, count // 10)}
                if i >= WARMUP:
                    for k, v in got.items():
                        times[name][k].append(v)
    med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()}
    out: dict[str, Any] = {}
    for n in med:
        out[n] = {"delivered_per_s": round(subscribers * messages / med[n]["fanout"]),
                  "sets_per_s_notify_off": round(count / med[n]["set_off"]),
                  "sets_per_s_notify_on": round(count / med[n]["set_on"]),
                  "notify_cost": round(med[n]["set_on"] / med[n]["set_off"], 2),
                  "gets_per_s_tracking_off": round(count / med[n]["get_off"]),
                  "gets_per_s_tracking_on": round(count / med[n]["get_on"]),
                  "tracking_cost": round(med[n]["get_on"] / med[n]["get_off"], 2),
                  # each round: the readers read again, then the invalidations of a SET batch reach every one
                  "invalidation_rounds_per_s": round(count // 10 // BATCH / med[n]["inval"], 1)}
    out["ratio"] = {"delivered": round(out["kvstrata"]["delivered_per_s"] / out["redis"]["delivered_per_s"], 2),
                    "sets_notify_off": round(out["kvstrata"]["sets_per_s_notify_off"]
                                             / out["redis"]["sets_per_s_notify_off"], 2),
                    "sets_notify_on": round(out["kvstrata"]["sets_per_s_notify_on"]
                                            / out["redis"]["sets_per_s_notify_on"], 2),
                    "gets_tracking_on": round(out["kvstrata"]["gets_per_s_tracking_on"]
                                              / out["redis"]["gets_per_s_tracking_on"], 2),
                    "invalidation_rounds": round(out["kvstrata"]["invalidation_rounds_per_s"]
                                                 / out["redis"]["invalidation_rounds_per_s"], 2)}
    return {"benchmark": "pubsub", "machine": describe_machine(), "rounds": rounds, "subscribers": subscribers,
            "messages": messages, "size": size, "writes": count, "results": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--subscribers", type=int, default=4)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--writes", type=int, default=20000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run(args.rounds, args.subscribers, args.messages, args.size, args.writes)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    r = result["results"]
    print("| server | messages delivered/s | SET/s, notifications off | SET/s, KEA + 1 subscriber | on/off time |")
    print("|---|---|---|---|---|")
    for n in ("kvstrata", "redis"):
        print(f"| {n} | {r[n]['delivered_per_s']:,} | {r[n]['sets_per_s_notify_off']:,} | "
              f"{r[n]['sets_per_s_notify_on']:,} | {r[n]['notify_cost']} |")
    print(f"| kvstrata / Redis | {r['ratio']['delivered']} | {r['ratio']['sets_notify_off']} | "
          f"{r['ratio']['sets_notify_on']} | |")
    print()
    print(f"| server | GET/s, tracking off | GET/s, tracking on | on/off time | rounds/s: {args.subscribers} trackers read "
          f"{BATCH} keys, a SET of each, every invalidation received |")
    print("|---|---|---|---|---|")
    for n in ("kvstrata", "redis"):
        print(f"| {n} | {r[n]['gets_per_s_tracking_off']:,} | {r[n]['gets_per_s_tracking_on']:,} | "
              f"{r[n]['tracking_cost']} | {r[n]['invalidation_rounds_per_s']} |")
    print(f"| kvstrata / Redis | | {r['ratio']['gets_tracking_on']} | | {r['ratio']['invalidation_rounds']} |")


if __name__ == "__main__":
    main()
