"""Durability of the SSD tier through the server: clean restarts (SIGTERM flushes write-back DRAM data), TTLs and
versions across restarts, kill -9 under write-through + fsync always with several writing clients, and record
integrity (a corrupted LMDB record is never returned).

Waits on the server are polls with a deadline, never fixed sleeps.
"""

import hashlib
import random
import signal
import struct
import threading
import time

import lmdb
import pytest
import redis
from polling import wait_for
from tests.integration.support import tier

pytestmark = pytest.mark.kvstrata_only

KB = 1024
HEADER = 40  # bytes of the SSD record header (magic .. full-key length)
LONG_KEY = b"L" * 450 + b"\x00\xffend"  # over the 400-byte inline limit: stored under its hash


# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture
def ssd_path(tmp_path):
    return str(tmp_path / "ssd")


@pytest.fixture
def tiered(make_server, ssd_path):
    """``tiered({...}) -> ServerProc``: every server of a test shares the same ``--essd-path``."""

    def start(config=None):
        cfg = {"essd-path": ssd_path, "dram-size": "32kb"}
        cfg.update(config or {})
        return make_server(cfg)

    return start


def kill9(srv):
    """SIGKILL the server and reap it (so the fixture does not report it as having died on its own)."""
    proc = srv.proc
    proc.kill()
    proc.wait(10)
    srv.proc = None


def version(r, key):
    return r.execute_command("TAIR.KV.VERSION", key)


def server_ms(r):
    sec, usec = r.time()
    return sec * 1000 + usec // 1000




def value_for(key, size):
    head = key if isinstance(key, bytes) else key.encode()
    return (hashlib.sha256(head).digest() * (size // 32 + 1))[:size]


def snapshot(r, keys):
    """{key: (value, version, pexpiretime)} as the server reports them now."""
    out = {}
    for key in keys:
        out[key] = (r.get(key), version(r, key), r.pexpiretime(key))
    return out


def record_location(env, data_db, key):
    """(LMDB key, record bytes, offset of the value in the record) of ``key``'s SSD record."""
    with env.begin() as txn:
        for lkey, rec in txn.cursor(db=data_db):
            if lkey[2:3] == b"k" and lkey[3:] == key:
                return lkey, rec, HEADER
            if lkey[2:3] == b"h":
                klen = struct.unpack_from("<I", rec, 36)[0]
                if rec[HEADER : HEADER + klen] == key:
                    return lkey, rec, HEADER + klen
    raise AssertionError(f"no SSD record for {key!r}")


def corrupt(path, key, where="value"):
    """Flip one byte of ``key``'s SSD record (server stopped): in its value, or in the header's version field."""
    env = lmdb.open(path, max_dbs=4)
    try:
        data_db = env.open_db(b"data")
        lkey, rec, value_at = record_location(env, data_db, key)
        assert len(rec) > value_at, "the record has no value bytes to corrupt"
        at = value_at + (len(rec) - value_at) // 2 if where == "value" else 4
        damaged = bytearray(rec)
        damaged[at] ^= 0x5A
        with env.begin(write=True) as txn:
            txn.put(lkey, bytes(damaged), db=data_db)
        env.sync(True)
    finally:
        env.close()


# --------------------------------------------------------------------------------------------------------------
# Clean restarts
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("durability", ["write-back", "write-through"])
def test_clean_restart_finds_every_key_with_ttls_and_versions(tiered, durability):
    cfg = {"durability": durability, "promote-hits": 100}
    srv = tiered(cfg)
    r = srv.client()
    keys = []
    for i in range(80):  # ~2.5x the DRAM budget: the first ones are demoted, the last stay in DRAM
        key = f"k{i}".encode()
        if i % 3 == 0:
            r.set(key, value_for(key, 1000), px=3_600_000 + i)
        else:
            r.set(key, value_for(key, 1000))
        keys.append(key)
    r.execute_command("TAIR.KV.SETEX", "cold", 7_200_000, b"cold value", "COLD_STORAGE")
    r.execute_command("TAIR.KV.SETEX", "cold-no-ttl", 0, b"", "COLD_STORAGE")
    r.set(LONG_KEY, b"long key value")
    r.set(b"bin\x00\xff\r\nkey", b"\x00\x01\xff\r\n")
    keys += [b"cold", b"cold-no-ttl", LONG_KEY, b"bin\x00\xff\r\nkey"]
    r.set("k79", value_for(b"k79", 1000))  # a fresh version for a DRAM key
    tiers = {tier(r, k) for k in keys}
    assert tiers == {"dram", "ssd"}, "the data set must span both tiers"
    before = snapshot(r, keys)
    dbsize = r.dbsize()
    assert dbsize == len(keys)
    top = max(v for _, v, _ in before.values())

    srv.stop()  # SIGTERM: write-back DRAM data is flushed to the SSD tier
    r = tiered(cfg).client()
    assert r.dbsize() == dbsize
    assert snapshot(r, keys) == before
    assert set(r.keys("*")) == set(keys)
    assert 0 < r.pttl("k0") <= 3_600_000
    new = r.execute_command("TAIR.KV.SETEX", "after", 0, "x")
    assert new > top
    r.set("k1", "changed")
    assert version(r, "k1") > new


def test_versions_keep_increasing_over_many_restarts(tiered):
    seen = []
    for _ in range(3):
        srv = tiered()
        r = srv.client()
        for i in range(3):
            seen.append(r.execute_command("TAIR.KV.SETEX", f"v{i}", 0, str(len(seen))))
        assert r.get("v2") == str(len(seen) - 1).encode()
        srv.stop()
    assert seen == sorted(seen) and len(set(seen)) == len(seen), seen


def test_key_that_expires_while_the_server_is_down(tiered):
    srv = tiered()
    r = srv.client()
    when = server_ms(r) + 300
    r.set("dram", "d")
    r.pexpireat("dram", when)
    r.execute_command("TAIR.KV.SETEX", "ssd", 0, "s", "COLD_STORAGE")
    r.pexpireat("ssd", when)
    r.set("stays", "here")
    srv.stop()
    wait_for(lambda: time.time() * 1000 > when + 50, what="the expiry time to pass")
    r = tiered().client()
    assert r.get("dram") is None
    assert r.get("ssd") is None
    assert r.get("stays") == b"here"
    assert r.keys("*") == [b"stays"]


def test_restart_after_overwrites_and_deletes_across_tiers(tiered):
    srv = tiered({"promote-hits": 1})
    r = srv.client()
    rnd = random.Random(3)
    model = {}
    for step in range(600):
        key = f"k{rnd.randrange(60)}"
        op = rnd.random()
        if op < 0.6:
            model[key] = value_for(f"{key}:{step}", rnd.choice([10, 500, 1500]))
            r.set(key, model[key])
        elif op < 0.75:
            r.delete(key)
            model.pop(key, None)
        else:
            assert r.get(key) == model.get(key)
    assert r.dbsize() == len(model)
    srv.stop()
    r = tiered({"promote-hits": 1}).client()
    assert r.dbsize() == len(model)
    assert {k.decode() for k in r.keys("*")} == set(model)
    for key, value in model.items():
        assert r.get(key) == value, key


def test_sigterm_during_a_write_load_keeps_every_acknowledged_write(tiered):
    """Write-back: whatever was acknowledged before SIGTERM is on the SSD tier after the restart."""
    srv = tiered({"dram-size": "64kb"})
    stop = threading.Event()
    results = {}

    def worker(c):
        client = srv.client(socket_timeout=10)
        acked = {}
        inflight = {}
        i = 0
        try:
            while not stop.is_set():
                key = f"w{c}:{i % 400}"
                value = value_for(f"{key}:{i}", 100 + (i * 131) % 2000)
                inflight = {key: value}
                client.set(key, value)
                acked[key] = value
                inflight = {}
                i += 1
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            pass
        finally:
            results[c] = (acked, inflight)
            client.close()

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(3)]
    for t in threads:
        t.start()
    probe = srv.client()
    wait_for(lambda: probe.info("tier_dram")["demotions"] > 300, timeout=30, what="write load")
    probe.close()
    srv.stop()  # SIGTERM while the clients keep writing
    stop.set()
    for t in threads:
        t.join(30)
    assert len(results) == 3
    r = tiered({"dram-size": "64kb"}).client()
    wrong = []
    for acked, inflight in results.values():
        for key, value in acked.items():
            got = r.get(key)
            # The write in flight at shutdown may or may not have been applied.
            if got != value and not (key in inflight and got == inflight[key]):
                wrong.append(key)
    assert not wrong, f"acknowledged writes lost over a clean shutdown: {wrong[:5]}"
    assert sum(len(a) for a, _ in results.values()) > 300


def test_a_hang_up_does_not_stop_the_server_nor_lose_write_back_data(tiered):
    """SIGHUP (the terminal that started the server closed) is ignored, as by Redis: it used to end the process on
    the spot, with no checkpoint, losing every write-back value that was only in DRAM."""
    srv = tiered({"dram-size": "8mb"})
    r = srv.client()
    r.set(b"only-in-dram", b"v")
    assert tier(r, b"only-in-dram") == "dram"
    srv.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "SIGHUP received and ignored" in srv.log_text(), what="the server to see the hang-up")
    assert r.ping() and srv.alive()
    srv.stop()  # SIGTERM: the checkpoint
    assert tiered({"dram-size": "8mb"}).client().get(b"only-in-dram") == b"v"


def test_save_is_durable_before_it_replies(tiered):
    cfg = {"dram-size": "8mb", "fsync": "always"}
    srv = tiered(cfg)
    r = srv.client()
    pipe = r.pipeline(transaction=False)
    for i in range(5000):
        pipe.set(f"k{i}", b"v" * 100)
    pipe.execute()
    assert r.save()
    kill9(srv)
    r = tiered(cfg).client()
    assert r.dbsize() == 5000


# --------------------------------------------------------------------------------------------------------------
# kill -9 under write-through + fsync always
# --------------------------------------------------------------------------------------------------------------


def test_kill9_keeps_every_acknowledged_write_through_write(tiered):
    cfg = {"durability": "write-through", "fsync": "always", "dram-size": "64kb"}
    srv = tiered(cfg)
    stop = threading.Event()
    n_clients = 4
    results = {}

    def worker(c):
        client = srv.client(socket_timeout=10)
        rnd = random.Random(c)
        acked = {}  # key -> value (None: deleted) as last acknowledged
        inflight = {}  # the one command sent but not acknowledged when the server died
        top = 0
        i = 0
        try:
            while not stop.is_set():
                key = f"w{c}:{rnd.randrange(250)}"
                if rnd.random() < 0.15:
                    inflight = {key: None}
                    client.delete(key)
                    acked[key] = None
                else:
                    value = value_for(f"{key}:{i}", rnd.randrange(1, 3000))
                    inflight = {key: value}
                    if rnd.random() < 0.5:
                        top = max(top, client.execute_command("TAIR.KV.SETEX", key, 0, value))
                    else:
                        client.set(key, value)
                    acked[key] = value
                inflight = {}
                i += 1
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            pass
        finally:
            results[c] = (acked, inflight, top)
            client.close()

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(n_clients)]
    for t in threads:
        t.start()
    probe = srv.client()
    # Let the load run until a good number of writes went through (and demotions happened), then kill -9.
    wait_for(lambda: probe.info("stats")["total_commands_processed"] > 1500, timeout=30, what="write load")
    assert probe.info("tier_dram")["demotions"] > 0
    probe.close()
    kill9(srv)
    stop.set()
    for t in threads:
        t.join(30)
    assert len(results) == n_clients

    r = tiered(cfg).client()
    checked, wrong = 0, []
    top = 0
    for acked, inflight, client_top in results.values():
        top = max(top, client_top)
        for key, value in acked.items():
            got = r.get(key)
            checked += 1
            if got != value and not (key in inflight and got == inflight[key]):
                wrong.append(key)
    assert checked > 300
    assert not wrong, f"{len(wrong)} acknowledged writes not found intact after kill -9, e.g. {wrong[:5]}"
    assert r.execute_command("TAIR.KV.SETEX", "after", 0, "x") > top, "versions must keep increasing"


# --------------------------------------------------------------------------------------------------------------
# Integrity: corrupted SSD records
# --------------------------------------------------------------------------------------------------------------


def test_corrupted_record_is_a_miss_and_is_dropped(tiered, ssd_path):
    srv = tiered()
    r = srv.client()
    names = ["bad-get", "bad-mget", "bad-keys", "good"]
    for name in names:
        r.execute_command("TAIR.KV.SETEX", name, 0, value_for(name, 200), "COLD_STORAGE")
    assert r.dbsize() == 4
    srv.stop()
    for name in names[:3]:
        corrupt(ssd_path, name.encode())

    srv = tiered()
    r = srv.client()
    assert r.get("good") == value_for("good", 200)
    assert r.get("bad-get") is None
    assert r.execute_command("TAIR.KV.MGET", "bad-mget", "good", "WITHVERSIONS")[0] is None
    assert r.keys("*") == [b"good"]  # KEYS reads the record of every key and drops the corrupted one
    ssd = r.info("tier_ssd")
    assert ssd["corrupt_reads"] == 3
    # Dropped, not just hidden: gone from the tier and from the keyspace count.
    assert r.dbsize() == 1
    assert r.execute_command("TAIR.KV.TIER", "bad-get") is None
    assert r.exists("bad-get", "bad-mget", "bad-keys") == 0
    assert r.info("tier_ssd")["corrupt_reads"] == 3
    # The key can be written again.
    r.set("bad-get", "fresh")
    assert r.get("bad-get") == b"fresh"
    srv.stop()
    r = tiered().client()
    assert sorted(r.keys("*")) == [b"bad-get", b"good"]
    assert r.get("bad-get") == b"fresh"


@pytest.mark.parametrize("where", ["value", "header"])
def test_corruption_anywhere_in_the_record_is_detected(tiered, ssd_path, where):
    srv = tiered()
    r = srv.client()
    r.execute_command("TAIR.KV.SETEX", "victim", 0, b"x" * 100, "COLD_STORAGE")
    r.execute_command("TAIR.KV.SETEX", LONG_KEY, 0, b"y" * 100, "COLD_STORAGE")
    srv.stop()
    corrupt(ssd_path, b"victim", where)
    corrupt(ssd_path, LONG_KEY, where)
    r = tiered().client()
    assert r.get("victim") is None
    assert r.get(LONG_KEY) is None
    assert r.info("tier_ssd")["corrupt_reads"] == 2
    assert r.dbsize() == 0


def test_corrupted_record_is_not_promoted_or_demoted_back(tiered, ssd_path):
    cfg = {"promote-hits": 1}
    srv = tiered(cfg)
    r = srv.client()
    r.execute_command("TAIR.KV.SETEX", "victim", 0, b"x" * 100, "COLD_STORAGE")
    srv.stop()
    corrupt(ssd_path, b"victim")
    r = tiered(cfg).client()
    assert r.execute_command("TAIR.KV.PREFETCH", "victim") in (0, 1)
    wait_for(lambda: r.info("tier_ssd")["corrupt_reads"] == 1, what="the prefetcher to read the record")
    assert r.get("victim") is None
    assert r.execute_command("TAIR.KV.TIER", "victim") is None
    assert r.info("tier_dram")["keys"] == 0
