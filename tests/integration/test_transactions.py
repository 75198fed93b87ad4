"""MULTI/EXEC/DISCARD/WATCH/UNWATCH: Redis's replies (run against real Redis too), redis-py's default pipeline,
and histories of concurrent clients: optimistic increments under WATCH and transactions no reader sees half
of, on a DRAM-only and on a tiered server whose keys are demoted to the SSD tier between transactions."""

from __future__ import annotations

import threading

import pytest
import redis
from tests.conftest import ServerProc
from tests.integration.support import tier_info

EXECABORT = "EXECABORT Transaction discarded because of previous errors."


def test_queue_exec_discard_and_their_errors(raw, resp):
    c = raw()
    assert c.cmd("EXEC") == resp.Error("ERR EXEC without MULTI")
    assert c.cmd("DISCARD") == resp.Error("ERR DISCARD without MULTI")
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("MULTI") == resp.Error("ERR MULTI calls can not be nested")
    assert c.cmd("WATCH", "k") == resp.Error("ERR WATCH inside MULTI is not allowed")
    assert c.cmd("SET", "a", "1") == "QUEUED"
    assert c.cmd("INCR", "a") == "QUEUED"
    assert c.cmd("SET", "s", "x") == "QUEUED"
    assert c.cmd("INCR", "s") == "QUEUED"  # fails when it runs: its error is its reply, the rest still run
    assert c.cmd("GET", "a") == "QUEUED"
    assert c.cmd("EXEC") == ["OK", 2, "OK", resp.Error("ERR value is not an integer or out of range"), b"2"]
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("SET", "b") == resp.Error("ERR wrong number of arguments for 'set' command")
    assert c.cmd("SET", "b", "1") == "QUEUED"
    assert c.cmd("EXEC") == resp.Error(EXECABORT)
    assert c.cmd("GET", "b") is None  # nothing of an aborted transaction ran
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("NOSUCH") == resp.Error("ERR unknown command 'NOSUCH', with args beginning with: ")
    assert c.cmd("EXEC") == resp.Error(EXECABORT)
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("SET", "c", "1") == "QUEUED"
    assert c.cmd("EXEC", "extra") == resp.Error(  # a refused EXEC discards the transaction
        "EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command")
    assert c.cmd("EXEC", "extra") == resp.Error(  # outside MULTI too, as Redis 7
        "EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command")
    assert c.cmd("GET", "c") is None
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("SET", "c", "1") == "QUEUED"
    assert c.cmd("DISCARD") == "OK"
    assert c.cmd("GET", "c") is None
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("SET", "c", "1") == "QUEUED"
    assert c.cmd("RESET") == "RESET"  # RESET ends the transaction too
    assert c.cmd("EXEC") == resp.Error("ERR EXEC without MULTI")


def test_watch_aborts_on_every_kind_of_change(raw):
    c, other = raw(), raw()
    changes = [("SET", "w", "2"), ("EXPIRE", "w", "100"), ("PERSIST", "w"), ("DEL", "w"), ("SET", "w", "3"),
               ("APPEND", "w", "x"), ("FLUSHALL",)]
    for change in changes:
        assert other.cmd("SET", "w", "1", "EX", "50") == "OK"
        assert c.cmd("WATCH", "w") == "OK"
        assert other.cmd(*change) in ("OK", 1, 2)
        assert c.cmd("MULTI") == "OK"
        assert c.cmd("SET", "x", change[0]) == "QUEUED"
        assert c.cmd("EXEC") is None, change
    other.cmd("SET", "w", "1")
    assert c.cmd("GET", "x") is None  # none of them ran
    assert c.cmd("WATCH", "gone") == "OK"  # created and deleted again: still a change
    assert other.cmd("SET", "gone", "1") == "OK"
    assert other.cmd("DEL", "gone") == 1
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("SET", "x", "aba") == "QUEUED"
    assert c.cmd("EXEC") is None
    assert c.cmd("WATCH", "never") == "OK"
    assert other.cmd("FLUSHALL") == "OK"  # it was not there: FLUSHALL changes nothing watched, as in Redis
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("EXEC") == []
    other.cmd("SET", "w", "1")
    assert c.cmd("WATCH", "w", "never") == "OK"
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("SET", "x", "ran") == "QUEUED"
    assert c.cmd("EXEC") == ["OK"]  # untouched keys, a missing one staying missing: it runs
    assert c.cmd("WATCH", "w") == "OK"
    assert other.cmd("SET", "w", "2") == "OK"
    assert c.cmd("UNWATCH") == "OK"
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("GET", "x") == "QUEUED"
    assert c.cmd("EXEC") == [b"ran"]


def test_redis_py_pipeline_is_a_transaction(r):
    with r.pipeline() as p:  # transaction=True: MULTI ... EXEC
        p.set("a", 1).incrby("a", 5).get("a").expire("a", 100).ttl("a")
        assert p.execute() == [True, 6, b"6", True, 100]
    r.set("n", 0)
    with r.pipeline() as p:
        p.watch("n")
        value = int(p.get("n"))
        p.multi()
        p.set("n", value + 1)
        assert p.execute() == [True]
    assert r.get("n") == b"1"


@pytest.mark.kvstrata_only
def test_kv_cache_commands_are_not_queued(raw, resp):
    c = raw()
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("TAIR.KV.SETEX", "k", "0", "v") == resp.Error(
        "ERR Command not allowed inside a transaction: 'tair.kv.setex'")
    assert c.cmd("EXEC") == resp.Error(EXECABORT)


def _servers(make_server, tmp_path) -> list[ServerProc]:
    """The shared-default server and, on kvstrata, a tiered one whose DRAM holds a few values."""
    out = [make_server()]
    if out[0].target == "kvstrata":
        out.append(make_server({"essd-path": str(tmp_path / "ssd"), "dram-size": "256kb"}))
    return out


def test_watch_increments_are_linearizable(make_server, tmp_path):
    """Four clients increment one counter by WATCH, GET, MULTI, SET, EXEC, retrying when EXEC aborts: every
    committed transaction read the value the previous one wrote, so the values they wrote are exactly 1..N."""
    for srv in _servers(make_server, tmp_path):
        _increments(srv)


def _increments(srv: ServerProc) -> None:
    admin = srv.client()
    admin.set("counter", 0)
    written: list[int] = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        c = srv.client()
        pad = bytes([seed]) * 60_000  # on the tiered server, pushes the counter out of DRAM now and then
        for i in range(25):
            while True:
                with c.pipeline() as p:
                    try:
                        p.watch("counter")
                        value = int(p.get("counter")) + 1
                        p.multi()
                        p.set("counter", value)
                        p.set(f"pad:{seed}:{i}", pad)
                        p.execute()
                    except redis.WatchError:
                        continue
                with lock:
                    written.append(value)
                break
        c.close()

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert sorted(written) == list(range(1, 101))
    assert admin.get("counter") == b"100"
    if "essd-path" in srv.config:  # the transactions ran over values demoted meanwhile
        assert tier_info(admin, "ssd")["keys"] > 0
    admin.close()


def test_no_reader_sees_half_a_transaction(make_server, tmp_path):
    """A writer moves 1 from one key to the other in MULTI/EXEC while readers read both keys (MGET, and GET
    pairs in MULTI): the sum they see is always the same."""
    for srv in _servers(make_server, tmp_path):
        _transfers(srv)


def _transfers(srv: ServerProc) -> None:
    admin = srv.client()
    admin.mset({"x": 1000, "y": 0})
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def reader() -> None:
        c = srv.client()
        try:
            while not stop.is_set():
                x, y = c.mget("x", "y")
                seen.append(int(x) + int(y))
                with c.pipeline() as p:
                    x, y = p.get("x").get("y").execute()
                seen.append(int(x) + int(y))
        except BaseException as exc:  # reported below, with the sums
            errors.append(exc)
        finally:
            c.close()

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    w = srv.client()
    for i in range(150):
        with w.pipeline() as p:
            p.decrby("x", 1).incrby("y", 1).set(f"pad:{i}", b"p" * 30_000).execute()
    stop.set()
    for t in readers:
        t.join(60)
    w.close()
    assert not errors, errors
    assert seen and set(seen) == {1000}
    assert admin.mget("x", "y") == [b"850", b"150"]
    admin.close()


@pytest.mark.kvstrata_only
def test_exec_over_the_memory_budget_is_discarded(make_server, raw, resp):
    """A queued write when DRAM is over budget with nowhere to evict to (the budget lowered under what is held):
    EXEC is refused with the reason, as Redis's 'EXECABORT Transaction discarded because of: OOM ...', and
    nothing of it runs."""
    srv = make_server({"maxmemory": "4mb", "maxmemory-policy": "noeviction"})
    c, admin = raw(srv), raw(srv)
    for i in range(8):
        assert admin.cmd("SET", f"fill:{i}", "x" * 200_000) == "OK"
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("SET", "queued", "v") == "QUEUED"
    assert admin.cmd("CONFIG", "SET", "maxmemory", "1mb") == "OK"
    assert c.cmd("EXEC") == resp.Error(
        "EXECABORT Transaction discarded because of: OOM command not allowed when used memory > 'maxmemory'.")
    assert c.cmd("EXEC") == resp.Error("ERR EXEC without MULTI")
    assert c.cmd("EXISTS", "queued") == 0


@pytest.mark.kvstrata_only
def test_the_queue_is_bounded(make_server, raw, resp):
    """Queued commands are client memory outside every budget: past client-query-buffer-limit the transaction
    is discarded (its queue freed) and EXEC aborts."""
    srv = make_server({"client-query-buffer-limit": "1mb"})
    c, admin = raw(srv), raw(srv)
    assert c.cmd("MULTI") == "OK"
    for i in range(3):
        assert c.cmd("SET", f"k{i}", "x" * 300_000) == "QUEUED"
    assert b" flags=x " in admin.cmd("CLIENT", "LIST") and b" multi=3 " in admin.cmd("CLIENT", "LIST")
    assert c.cmd("SET", "k3", "x" * 300_000) == resp.Error(
        "ERR the transaction's queued commands exceed client-query-buffer-limit; it is discarded")
    line = admin.cmd("CLIENT", "LIST")
    assert b" multi=0 " in line and b" multi-mem=0 " in line  # the queue is freed
    assert c.cmd("EXEC") == resp.Error(EXECABORT)
    assert c.cmd("EXISTS", "k0") == 0


def test_acl_category_transaction_covers_the_transaction_commands(server, raw):
    """A user allowed ``+@read +@transaction`` (a rule written for Redis) may run MULTI, WATCH, EXEC, DISCARD and
    UNWATCH, and nothing that writes; the same on both targets."""
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "txuser", "on", ">pw", "~*", "+@read", "+@transaction", "+auth")
    try:
        c = raw()
        assert c.cmd_raw("AUTH", "txuser", "pw") == b"+OK\r\n"
        assert c.cmd_raw("WATCH", "k") == b"+OK\r\n"
        assert c.cmd_raw("UNWATCH") == b"+OK\r\n"
        assert c.cmd_raw("MULTI") == b"+OK\r\n"
        assert c.cmd_raw("GET", "k") == b"+QUEUED\r\n"
        assert c.cmd_raw("EXEC") == b"*1\r\n$-1\r\n"
        assert c.cmd_raw("MULTI") == b"+OK\r\n"
        assert c.cmd_raw("DISCARD") == b"+OK\r\n"
        assert c.cmd_raw("SET", "k", "v").startswith(b"-NOPERM")
    finally:
        admin.execute_command("ACL", "DELUSER", "txuser")
        admin.close()
