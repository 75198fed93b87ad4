"""Saves of write-back DRAM to the SSD tier: SAVE, BGSAVE [SCHEDULE], save points, LASTSAVE, INFO persistence
and ROLE. Replies and errors are checked against real Redis too; what a save promises (every write acknowledged
before it started survives a kill -9) is checked on kvstrata, with histories of concurrent writers."""

from __future__ import annotations

import http.client
import threading

import pytest
import redis
from polling import wait_for
from prometheus_client.parser import text_string_to_metric_families
from tests.conftest import TARGET
from tests.integration.support import tier_info

from kvstrata.bench.procs import free_port

NOT_IN_MULTI = "ERR Command not allowed inside a transaction"


def persistence(r: redis.Redis) -> dict:
    return r.info("persistence")


def metrics(port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples if not s.labels}


def kill9(srv) -> None:
    srv.proc.kill()
    srv.proc.wait(10)
    srv.proc = None


def saved_server(make_server, tmp_path, **config):
    """A server that can save: kvstrata with an SSD tier, redis-server with a directory for its RDB file."""
    if TARGET == "redis":
        return make_server({"dir": str(tmp_path), **config})
    return make_server({"essd-path": str(tmp_path / "ssd"), "dram-size": "8mb", **config})


def test_save_commands_answer_as_redis(make_server, tmp_path, raw, resp):
    srv = saved_server(make_server, tmp_path)
    c = raw(srv)
    r = srv.client()
    assert c.cmd("BGSAVE", "NOW") == resp.Error("ERR syntax error")
    assert c.cmd("BGSAVE", "SCHEDULE", "x") == resp.Error("ERR syntax error")
    assert c.cmd("SAVE", "x") == resp.Error("ERR wrong number of arguments for 'save' command")
    assert c.cmd("ROLE") == [b"master", 0, []]
    info = r.info("replication")
    assert info["role"] == "master" and info["connected_slaves"] == 0
    for name in ("SAVE", "SHUTDOWN"):  # refused inside MULTI with Redis's text; the transaction is discarded
        assert c.cmd("MULTI") == "OK"
        assert c.cmd(name) == resp.Error(NOT_IN_MULTI)
        assert c.cmd("EXEC") == resp.Error("EXECABORT Transaction discarded because of previous errors.")
    assert srv.alive()

    r.set("k", "v")
    r.set("j", "w")
    assert persistence(r)["rdb_changes_since_last_save"] >= 2
    saves = persistence(r)["rdb_saves"]
    before = r.lastsave()
    assert c.cmd("SAVE") == "OK"
    info = persistence(r)
    assert info["rdb_changes_since_last_save"] == 0 and info["rdb_saves"] == saves + 1
    assert info["rdb_last_bgsave_status"] == "ok"
    assert r.lastsave() >= before

    r.set("k", "v2")
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("BGSAVE") == "QUEUED"
    assert c.cmd("EXEC") == ["Background saving scheduled"]  # inside EXEC a BGSAVE is scheduled, as Redis
    wait_for(lambda: persistence(r)["rdb_saves"] == saves + 2 and not persistence(r)["rdb_bgsave_in_progress"],
             timeout=15, what="the scheduled background save to complete")
    r.set("k", "v3")
    assert c.cmd("BGSAVE", "SCHEDULE") == "Background saving started"  # nothing runs: it starts at once
    wait_for(lambda: persistence(r)["rdb_saves"] == saves + 3 and not persistence(r)["rdb_bgsave_in_progress"],
             timeout=15, what="the background save")
    assert persistence(r)["rdb_changes_since_last_save"] == 0

    for bad in ("1", "0 1", "1 -1", "5_0 1", "a b", "1 1 2"):
        assert c.cmd("CONFIG", "SET", "save", bad) == resp.Error(
            "ERR CONFIG SET failed (possibly related to argument 'save') - Invalid save parameters"), bad
    assert c.cmd("CONFIG", "SET", "save", "3600 1 300 100") == "OK"
    assert r.config_get("save") == {"save": "3600 1 300 100"}
    assert c.cmd("CONFIG", "SET", "save", "") == "OK"
    assert r.config_get("save") == {"save": ""}


@pytest.mark.kvstrata_only
def test_save_points_make_write_back_data_survive_kill9(make_server, tmp_path):
    """Without a save, write-back data lives only in DRAM; a save point writes it to the SSD tier, so a kill -9
    loses only what came after the last save (as Redis's snapshots)."""
    cfg = {"essd-path": str(tmp_path / "ssd"), "dram-size": "8mb", "promote-hits": 100}
    srv = make_server(cfg)
    r = srv.client()
    values = {f"key:{i}".encode(): (b"%d-" % i) * 100 for i in range(300)}
    for i, (key, value) in enumerate(values.items()):
        r.set(key, value, ex=3600 if i % 3 == 0 else None)
    assert tier_info(r, "ssd")["keys"] == 0, "the data reached the SSD tier without a save: nothing is tested"
    assert r.config_set("save", "1 300") is True  # 300 changes and a second since the last save
    wait_for(lambda: persistence(r)["rdb_saves"] >= 1, timeout=15, what="the save point to fire")
    info = persistence(r)
    assert info["rdb_changes_since_last_save"] == 0 and info["rdb_last_bgsave_status"] == "ok"
    assert tier_info(r, "ssd")["keys"] == len(values)
    writes = tier_info(r, "ssd")["writes"]
    r.set(b"key:0", b"changed")
    r.delete(b"key:1")
    values[b"key:0"] = b"changed"
    del values[b"key:1"]
    assert r.save() is True
    # Each save writes what changed since the last one, not every key again.
    wait_for(lambda: tier_info(r, "ssd")["pending"] == 0, timeout=15, what="the SSD writer to drain")
    assert tier_info(r, "ssd")["writes"] - writes <= 2
    late = {f"late:{i}".encode(): b"x" * 100 for i in range(50)}  # 50 changes: under the save point's 300
    for key, value in late.items():
        r.set(key, value)
    assert persistence(r)["rdb_changes_since_last_save"] == 50
    kill9(srv)

    srv2 = make_server(cfg)
    r2 = srv2.client()
    for key, value in values.items():
        assert r2.get(key) == value, key
    assert r2.get(b"key:1") is None  # deleted after the first save, and the delete was saved
    assert all(r2.ttl(f"key:{i}") > 3000 for i in range(3, 300, 3))
    assert r2.ttl(b"key:2") == -1
    # What came after the last save was only in DRAM: gone, as from Redis after a crash.
    assert not any(r2.exists(key) for key in late)


@pytest.mark.kvstrata_only
@pytest.mark.parametrize("saved", [True, False])
def test_saved_keys_stay_saved_when_read_back_and_rewritten(make_server, tmp_path, saved):
    """Once saves are asked for, a key that reached the SSD tier keeps its copy there: read back into DRAM (a
    promotion) and written again (written through), it survives a kill -9 with its last value. Without saves the
    write-back tiers are exclusive: the keys in DRAM at the crash, read back or rewritten, are lost."""
    cfg = {"essd-path": str(tmp_path / "ssd"), "dram-size": "64kb", "promote-hits": 1}
    if saved:
        cfg["save"] = "3600 1000000"  # asked for, never reached in this test
    srv = make_server(cfg)
    r = srv.client()
    values = {b"k%03d" % i: bytes([i]) * 1000 for i in range(200)}  # 200 KB through a 64 KB DRAM: most demoted
    for key, value in values.items():
        r.set(key, value)
    if saved:
        assert r.save() is True
    else:
        wait_for(lambda: tier_info(r, "ssd")["pending"] == 0, timeout=15, what="the demotions to commit")
    for key in values:  # read back: promoted, demoting others
        assert r.get(key) == values[key]
    for i, key in enumerate(list(values)[::5]):
        values[key] = b"new%d" % i
        r.set(key, values[key])
    wait_for(lambda: tier_info(r, "ssd")["pending"] == 0, timeout=15, what="the SSD writes to commit")
    kill9(srv)
    r2 = make_server(cfg).client()
    got = dict(zip(values, r2.mget(list(values)), strict=True))
    missing = [k for k, v in got.items() if v is None]
    assert all(v == values[k] for k, v in got.items() if v is not None), "a key came back with an old value"
    if saved:
        assert not missing, f"{len(missing)} saved keys lost, e.g. {missing[:3]}"
    else:
        assert missing, "exclusive tiers lost nothing: the DRAM held nothing at the crash, nothing was tested"


@pytest.mark.kvstrata_only
def test_bgsave_under_concurrent_writes_keeps_every_acknowledged_value(make_server, tmp_path):
    """A background save of more keys than one slice while a client overwrites some of them, during the save and
    after it: after a kill -9 every key is there, each with its value from before or one the writer had
    acknowledged (a key saved and then written is written through to the SSD: Store.keep_below), never missing,
    never a value nobody wrote."""
    cfg = {"essd-path": str(tmp_path / "ssd"), "dram-size": "64mb", "promote-hits": 100}
    srv = make_server(cfg)
    r = srv.client()
    n = 12_000  # about three slices of the background save
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.set(b"k%d" % i, b"v0-%d" % i)
    pipe.execute()
    acked: dict[bytes, set[bytes]] = {b"k%d" % i: {b"v0-%d" % i} for i in range(n)}
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        w = srv.client()
        round_ = 0
        try:
            while not stop.is_set():
                round_ += 1
                for i in range(0, n, 7):
                    key, value = b"k%d" % i, b"v%d-%d" % (round_, i)
                    w.set(key, value)
                    acked[key].add(value)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    saves = persistence(r)["rdb_saves"]
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert r.bgsave() is True
        wait_for(lambda: persistence(r)["rdb_saves"] > saves, timeout=30, what="the background save")
        after = len(acked[b"k0"])
        wait_for(lambda: len(acked[b"k0"]) >= after + 2, timeout=30, what="overwrites after the save")
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors
    assert persistence(r)["rdb_last_bgsave_status"] == "ok"
    kill9(srv)

    r2 = make_server(cfg).client()
    got = dict(zip(acked, r2.mget(list(acked)), strict=True))
    wrong = [(k, v) for k, v in got.items() if v not in acked[k]]
    assert not wrong, f"{len(wrong)} keys lost or holding a value never written, e.g. {wrong[:3]}"
    assert any(v != b"v0-" + k[1:] for k, v in got.items()), "no overwrite survived: nothing was tested"


@pytest.mark.kvstrata_only
def test_a_save_the_ssd_tier_cannot_hold_fails(make_server, tmp_path):
    """An SSD budget below the data: the tier evicts what it was saving, and the save says so instead of OK."""
    port = free_port()
    srv = make_server({"essd-path": str(tmp_path / "ssd"), "dram-size": "32mb", "essd-size": "2mb",
                       "promote-hits": 100, "http-port": port})
    r = srv.client()
    for i in range(40):
        r.set(f"big:{i}", bytes([i]) * 100_000)  # 4 MB in DRAM
    before = r.lastsave()
    with pytest.raises(redis.ResponseError, match="SAVE failed: the SSD tier evicted .* values"):
        r.save()
    info = persistence(r)
    assert info["rdb_last_bgsave_status"] == "err" and info["rdb_changes_since_last_save"] >= 40
    assert r.lastsave() == before
    assert all(r.get(f"big:{i}") == bytes([i]) * 100_000 for i in range(40))  # nothing lost in DRAM
    saves = info["rdb_saves"]
    assert r.bgsave() is True
    wait_for(lambda: not persistence(r)["rdb_bgsave_in_progress"], timeout=15, what="the background save")
    assert persistence(r)["rdb_last_bgsave_status"] == "err" and persistence(r)["rdb_saves"] == saves
    m = metrics(port)
    assert m["kvstrata_last_save_ok"] == 0 and m["kvstrata_saves_total"] == saves
    assert m["kvstrata_changes_since_last_save"] >= 40
    assert m["kvstrata_last_save_timestamp_seconds"] == persistence(r)["rdb_last_save_time"]


@pytest.mark.kvstrata_only
def test_saves_need_the_ssd_tier(make_server):
    srv = make_server({"dram-size": "8mb"})
    r = srv.client()
    for call in (r.save, r.bgsave):
        with pytest.raises(redis.ResponseError, match="no SSD tier configured"):
            call()
    with pytest.raises(redis.ResponseError, match="argument 'save'.*persists only through its SSD tier"):
        r.config_set("save", "60 1")
    assert r.config_get("save") == {"save": ""}
    assert r.config_set("save", "") is True
    assert persistence(r)["rdb_bgsave_in_progress"] == 0


@pytest.mark.kvstrata_only
def test_write_through_has_nothing_unsaved(make_server, tmp_path):
    srv = make_server({"essd-path": str(tmp_path / "ssd"), "durability": "write-through"})
    r = srv.client()
    for i in range(20):
        r.set(f"k{i}", "v")
    assert persistence(r)["rdb_changes_since_last_save"] == 0
    assert r.save() is True
