"""A history test of the pool as a distributed system: several clients on two kvstrata nodes (DRAM + pool) do
TAIR.KV.SETEX, SETEX ... VER (compare-and-set), DEL, STRONG MGET and TAIR.KV.VERSION ... STRONG on three keys of a
real 3-master Redis Cluster while the master of one key is SIGSTOPped (hung) and resumed. Every invocation and
completion is recorded; each key's history must be linearizable (tests/integration/linearizability.py), and the
figures docs/pool.md reports are counted directly too: double CAS successes, stale STRONG reads, resurrected
deletes. An error reply whose effect is unknown (-TRYAGAIN) is an operation that may or may not have happened.

Bounded: about 12 s of load, then the check.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import threading
import time

import pytest
import redis
from polling import wait_for
from tests.integration.linearizability import Op, check

from kvstrata.bench.cluster import LocalCluster

pytestmark = [
    pytest.mark.kvstrata_only,
    pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                       reason="needs redis-server and redis-cli (.ci/run installs them)"),
]

KEYS = ["hist:a", "hist:b", "hist:c"]
CLIENTS = 4
LOAD_SECONDS = 2.5  # before, during and after the pause: each phase runs at least this long


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: dict[str, list[Op]] = {k: [] for k in KEYS}
        self.versions: dict[int, str] = {}  # version -> value, from every reply that pairs them
        self.version_reads: list[tuple[str, float, float, int | None, int]] = []
        self.count = 0
        self.unknown = 0
        self.errors: list[str] = []
        self.error_kinds: dict[str, int] = {}

    def add(self, key: str, op: Op) -> None:
        with self.lock:
            self.ops[key].append(op)
            self.count += 1
            self.unknown += op.ret == math.inf


def _client_loop(cid: int, port: int, rec: Recorder, stop: threading.Event, seed: int) -> None:
    rnd = random.Random(seed)
    r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
    seen: dict[str, tuple[int, str]] = {}  # key -> (version, value) this client last saw
    n = 0
    try:
        while not stop.is_set():
            key = rnd.choice(KEYS)
            kind = rnd.choices(["write", "cas", "delete", "read", "version"], [3, 2, 1, 3, 1])[0]
            n += 1
            value = f"c{cid}-{n}"
            t0 = time.monotonic()
            try:
                if kind == "write":
                    v = r.execute_command("TAIR.KV.SETEX", key, 0, value)
                    rec.versions[v] = value
                    rec.add(key, Op(t0, time.monotonic(), "write", value, client=cid))
                    seen[key] = (v, value)
                elif kind == "cas":
                    if key not in seen:
                        continue
                    ev, eval_ = seen[key]
                    try:
                        v = r.execute_command("TAIR.KV.SETEX", key, 0, value, "VER", ev)
                        rec.versions[v] = value
                        rec.add(key, Op(t0, time.monotonic(), "cas", (eval_, value), True, client=cid))
                        seen[key] = (v, value)
                    except redis.ResponseError as exc:
                        if "version mismatch" not in str(exc):
                            raise
                        rec.add(key, Op(t0, time.monotonic(), "cas", (eval_, value), False, client=cid))
                elif kind == "delete":
                    r.delete(key)
                    rec.add(key, Op(t0, time.monotonic(), "delete", client=cid))
                elif kind == "read":
                    got = r.execute_command("TAIR.KV.MGET", key, "CONSISTENCY_LEVEL", "STRONG", "WITHVERSIONS")[0]
                    out = None if got is None else got[0].decode()
                    if got is not None:
                        rec.versions[int(got[1])] = out
                        seen[key] = (int(got[1]), out)
                    rec.add(key, Op(t0, time.monotonic(), "read", out=out, client=cid))
                else:
                    v = r.execute_command("TAIR.KV.VERSION", key, "CONSISTENCY_LEVEL", "STRONG")
                    with rec.lock:
                        rec.version_reads.append((key, t0, time.monotonic(), v, cid))
            except (redis.ResponseError, redis.TimeoutError, redis.ConnectionError) as exc:
                text = str(exc)
                with rec.lock:
                    short = f"{kind}: {text[:60]}"
                    rec.error_kinds[short] = rec.error_kinds.get(short, 0) + 1
                if kind in ("read", "version"):
                    continue  # a read that failed had no effect
                if "version mismatch" in text:
                    rec.errors.append(f"unexpected: {kind}: {text}")
                    continue
                stop.wait(0.02)  # pace the retries of a client that got an error (not a synchronisation)
                if "needs it" in text or "kept on this node only" in text and "did not take" not in text:
                    continue  # refused before anything was sent to the pool: no effect

                # -TRYAGAIN and transport errors: the effect is unknown (it may still happen: replayed deletes).
                arg = value if kind == "write" else ((seen[key][1], value) if kind == "cas" else None)
                rec.add(key, Op(t0, math.inf, kind, arg, None if kind == "cas" else None, client=cid))
    except Exception as exc:  # reported by the test
        rec.errors.append(f"client {cid}: {type(exc).__name__}: {exc}")
    finally:
        r.close()


def test_history_is_linearizable_per_key_with_a_hung_master(make_server, tmp_path):
    cluster = LocalCluster(masters=3, node_timeout_ms=2000).start()
    stop = threading.Event()
    try:
        cfg = {"dram-size": "1mb", "pool": cluster.url, "pool-timeout": 300, "pool-connect-timeout": 200,
               "pool-backoff-max": 300, "http-port": 0, "pool-ack": "pool"}
        nodes = [make_server(dict(cfg)) for _ in range(2)]
        rec = Recorder()
        threads = [threading.Thread(target=_client_loop, args=(i, nodes[i % 2].port, rec, stop, 1000 + i),
                                    daemon=True) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        # The pool key is the node's prefix + the key: its slot decides which master holds KEYS[0].
        victim = cluster.index_of_port(cluster.master_of_slot(cluster.keyslot("kvs:" + KEYS[0])))
        t_start = time.monotonic()
        wait_for(lambda: time.monotonic() - t_start >= LOAD_SECONDS and rec.count >= 50, timeout=30,
                 what="load before the fault")
        errors_before = sum(n.client().info("tier_pool")["errors"] for n in nodes)
        cluster.pause(victim)
        t_pause = time.monotonic()
        try:
            # Hung until the nodes have seen it (pool errors) and the load has run a while against it.
            wait_for(lambda: sum(n.client().info("tier_pool")["errors"] for n in nodes) > errors_before
                     and time.monotonic() - t_pause >= LOAD_SECONDS, timeout=30, what="the nodes to see the hang")
        finally:
            cluster.resume(victim)
        t_resume = time.monotonic()
        count_at_resume = rec.count
        wait_for(lambda: time.monotonic() - t_resume >= LOAD_SECONDS and rec.count >= count_at_resume + 50,
                 timeout=30, what="load after the fault")
        stop.set()
        for t in threads:
            t.join(30)
        assert not rec.errors, rec.errors[:5]

        # Direct counts (the figures in docs/pool.md).
        doubles = 0
        for ops in rec.ops.values():
            wins: dict[object, int] = {}
            for op in ops:
                if op.kind == "cas" and op.out is True:
                    wins[op.arg[0]] = wins.get(op.arg[0], 0) + 1
            doubles += sum(1 for _, c in wins.items() if c > 1)
        stale = resurrected = 0
        value_version = {v: k for k, v in rec.versions.items()}
        for ops in rec.ops.values():
            done = [o for o in ops if o.ret != math.inf and o.kind in ("write", "cas") and
                    (o.kind == "write" or o.out)]
            dels = [o for o in ops if o.ret != math.inf and o.kind == "delete"]
            for r_op in (o for o in ops if o.kind == "read"):
                got_v = value_version.get(r_op.out, 0) if r_op.out is not None else 0
                newest = max((value_version.get(o.arg if o.kind == "write" else o.arg[1], 0)
                              for o in done if o.ret < r_op.call), default=0)
                if r_op.out is not None and got_v < newest:
                    stale += 1
                if r_op.out is not None:
                    w = next((o for o in done if (o.arg if o.kind == "write" else o.arg[1]) == r_op.out), None)
                    if w is not None and any(d.call > w.ret and d.ret < r_op.call for d in dels):
                        resurrected += 1
        # VERSION ... STRONG: as reads of the value with that version.
        for key, call, ret, v, cid in rec.version_reads:
            if v is None:
                rec.ops[key].append(Op(call, ret, "read", out=None, client=cid))
            elif v in rec.versions:
                rec.ops[key].append(Op(call, ret, "read", out=rec.versions[v], client=cid))
        (tmp_path / "history.json").write_text(json.dumps(
            {k: [[o.call, o.ret if o.ret != math.inf else None, o.kind, o.arg, o.out, o.client] for o in ops]
             for k, ops in rec.ops.items()}))
        verdicts = {key: check(ops) for key, ops in rec.ops.items()}
        total = sum(len(o) for o in rec.ops.values())
        print(f"history: {total} ops ({rec.unknown} with unknown outcome) on {len(KEYS)} keys, "
              f"master of {KEYS[0]} paused {t_resume - t_pause:.1f}s; double CAS successes {doubles}, "
              f"stale STRONG reads {stale}, resurrected deletes {resurrected}; "
              f"linearizable: {all(v is None for v in verdicts.values())}")
        print("errors by kind:", sorted(rec.error_kinds.items(), key=lambda kv: -kv[1])[:8])
        assert doubles == 0
        assert stale == 0
        assert resurrected == 0
        assert all(v is None for v in verdicts.values()), verdicts
        # The fault was real: some operations on the hung master's key failed or were refused.
        assert rec.unknown > 0 or any(n.client().info("tier_pool")["timeouts"] for n in nodes)
    finally:
        stop.set()
        cluster.stop()
