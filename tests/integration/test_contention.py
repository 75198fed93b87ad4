"""Contention on SSD-resident keys: several clients read, write, delete, expire and prefetch the same keys through
a DRAM tier far smaller than the working set, for a bounded time (a few seconds), under write-back and
write-through.

What must hold, checked against the recorded history rather than only the absence of errors:
- no error reply and no internal error in the server's log;
- every value read was produced by a write of that key, with the version that write was acknowledged with;
- no read returns a version older than one acknowledged for its key before the read was sent (a load raced by a
  write is redone, never installed);
- each client sees each key's versions in non-decreasing order.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import pytest
from polling import wait_for
from tests.integration.support import tier_info

pytestmark = pytest.mark.kvstrata_only

KEYS = [b"ck%02d" % i for i in range(48)]
VALUE_SIZE = 12 * 1024
DURATION = 5.0  # seconds of load per mode; the whole module stays under ~30 s on two shared cores


@dataclass
class Write:
    key: bytes
    sent: float
    acked: float = 0.0
    version: int = 0


@dataclass
class Read:
    client: int
    key: bytes
    sent: float
    done: float
    write_id: tuple[int, int] | None
    version: int | None  # None: GET (the version is the producing write's)


@dataclass
class History:
    writes: dict[tuple[int, int], Write] = field(default_factory=dict)
    reads: list[Read] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def value_of(key: bytes, wid: tuple[int, int]) -> bytes:
    head = b"%s|%d|%d|" % (key, wid[0], wid[1])
    return head + bytes([wid[1] % 251]) * (VALUE_SIZE - len(head))


def parse(value: bytes) -> tuple[bytes, tuple[int, int]]:
    key, a, b, _ = value.split(b"|", 3)
    assert value == value_of(key, (int(a), int(b))), "a value's bytes do not match its header"
    return key, (int(a), int(b))


def writer(srv, cid: int, hist: History, stop: float) -> None:
    r = srv.client()
    rnd = random.Random(cid)
    seq = 0
    while time.monotonic() < stop:
        key = rnd.choice(KEYS)
        seq += 1
        wid = (cid, seq)
        w = Write(key, time.monotonic())
        with hist.lock:
            hist.writes[wid] = w  # registered before it is sent: a read may see it in flight
        ttl = rnd.choice([0, 0, 0, 0, 200])  # some writes expire while the test runs
        w.version = int(r.execute_command("TAIR.KV.SETEX", key, ttl, value_of(key, wid)))
        w.acked = time.monotonic()


def reader(srv, cid: int, hist: History, stop: float) -> None:
    r = srv.client()
    rnd = random.Random(cid)
    out: list[Read] = []
    while time.monotonic() < stop:
        keys = rnd.sample(KEYS, rnd.choice([1, 1, 3]))
        sent = time.monotonic()
        if len(keys) == 1 and rnd.random() < 0.5:
            got = [(r.get(keys[0]), None)]
        else:
            got = [(None, None) if v is None else (v[0], int(v[1]))
                   for v in r.execute_command("TAIR.KV.MGET", *keys, "CONSISTENCY_LEVEL", "STRONG", "WITHVERSIONS")]
        done = time.monotonic()
        for key, (value, version) in zip(keys, got, strict=True):
            wid = None
            if value is not None:
                vkey, wid = parse(value)
                assert vkey == key, f"read {key!r} returned the value of {vkey!r}"
            out.append(Read(cid, key, sent, done, wid, version))
    with hist.lock:
        hist.reads.extend(out)


def churner(srv, cid: int, hist: History, stop: float) -> None:
    """Deletes, expiries and prefetches of the same keys."""
    r = srv.client()
    rnd = random.Random(cid)
    while time.monotonic() < stop:
        op = rnd.random()
        if op < 0.3:
            r.delete(rnd.choice(KEYS))
        elif op < 0.5:
            r.pexpire(rnd.choice(KEYS), rnd.choice([1, 100, 100000]))
        else:
            r.execute_command("TAIR.KV.PREFETCH", *rnd.sample(KEYS, 8))


def run(fn, srv, cid, hist, stop):
    try:
        fn(srv, cid, hist, stop)
    except BaseException as exc:  # every failure is reported at the end, with its thread
        with hist.lock:
            hist.errors.append(f"{fn.__name__}#{cid}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("durability", ["write-back", "write-through"])
def test_contention_history_is_consistent(make_server, tmp_path, durability):
    srv = make_server({"essd-path": str(tmp_path / "ssd"), "dram-size": "160kb", "promote-hits": "1",
                       "hz": "50", "durability": durability})
    r = srv.client()
    hist = History()
    for i, key in enumerate(KEYS):  # every key starts with an acknowledged value, mostly on SSD
        wid = (0, i)
        w = Write(key, time.monotonic())
        hist.writes[wid] = w
        w.version = int(r.execute_command("TAIR.KV.SETEX", key, 0, value_of(key, wid)))
        w.acked = time.monotonic()
    stop = time.monotonic() + DURATION
    roles = [writer, writer, reader, reader, reader, churner, churner]
    threads = [threading.Thread(target=run, args=(fn, srv, cid, hist, stop)) for cid, fn in enumerate(roles, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DURATION + 60)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert not hist.errors, hist.errors[:5]
    log = srv.log_text()
    assert "internal error" not in log and "failed:" not in log, log[-3000:]

    # Enough happened for the checks to mean something: reads from the SSD tier, writes, both kinds of read.
    assert tier_info(r, "ssd")["hits"] > 100
    assert len(hist.writes) > 200 and len(hist.reads) > 300
    assert sum(1 for rd in hist.reads if rd.write_id is not None) > 200

    acked_by_key: dict[bytes, list[tuple[float, int]]] = {}
    for w in hist.writes.values():
        assert w.acked, "a write was never acknowledged"
        acked_by_key.setdefault(w.key, []).append((w.acked, w.version))
    for lst in acked_by_key.values():
        lst.sort()
    last_seen: dict[tuple[int, bytes], int] = {}
    for rd in sorted(hist.reads, key=lambda x: x.done):
        if rd.write_id is None:
            continue
        w = hist.writes.get(rd.write_id)
        assert w is not None and w.key == rd.key, f"read of {rd.key!r} returned a value nobody wrote"
        assert w.sent <= rd.done, "a read returned a value before its write was sent"
        if rd.version is not None:
            assert rd.version == w.version, f"{rd.key!r}: value of version {w.version} read as {rd.version}"
        # Versions increase per node, so once a write is acknowledged no read may return an older one.
        newest_before = max((v for t, v in acked_by_key[rd.key] if t < rd.sent), default=0)
        assert w.version >= newest_before, (
            f"stale read of {rd.key!r}: version {w.version}, but {newest_before} was acknowledged before it")
        prev = last_seen.get((rd.client, rd.key), 0)
        assert w.version >= prev, f"client {rd.client} saw {rd.key!r} go back from {prev} to {w.version}"
        last_seen[(rd.client, rd.key)] = w.version
    wait_for(lambda: tier_info(r, "ssd")["pending"] == 0, what="the SSD writer to drain")
