"""CLIENT PAUSE and UNPAUSE as Redis 7.0 has them: WRITE holds writes (and an EXEC with queued writes, and a write
being queued in MULTI) while reads are served, ALL holds every command (UNPAUSE included), held commands run in
order once the pause ends, a client that leaves while held has its command dropped, keys do not expire actively
while paused; Redis's argument errors. Run against both targets; a held client is seen through INFO's
blocked_clients, never assumed after a sleep."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from integration.polling import wait_for


def _blocked(r: redis.Redis) -> int:
    return int(r.info("clients")["blocked_clients"])


class Call:
    """A command run on its own client in a thread: whether it has answered, and what."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.result = fn()
            except BaseException as exc:
                self.error = exc
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def value(self, timeout: float = 10.0) -> Any:
        assert self.done.wait(timeout), "the held command never answered"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture(autouse=True)
def _unpaused(server):
    yield
    server.client().execute_command("CLIENT", "UNPAUSE")


def test_pause_write_holds_writes_and_serves_reads(server, r):
    r.set("k", "before")
    writer = server.client()
    assert r.execute_command("CLIENT", "PAUSE", 60_000, "WRITE") == b"OK"
    held = Call(lambda: writer.set("k", "during"))
    wait_for(lambda: _blocked(r) == 1, what="the SET to be held")
    assert r.get("k") == b"before"  # reads are served during the pause
    assert r.exists("k") == 1 and r.strlen("k") == 6
    assert not held.done.is_set()
    assert r.execute_command("CLIENT", "UNPAUSE") == b"OK"
    assert held.value() is True
    assert r.get("k") == b"during"
    assert _blocked(r) == 0


def test_held_pipeline_runs_in_order_after_the_pause(server, r):
    writer = server.client()
    r.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")

    def pipeline() -> list[Any]:
        p = writer.pipeline(transaction=False)
        p.set("p", "1").incr("p").get("p").append("p", "x").get("p")
        return p.execute()

    held = Call(pipeline)
    wait_for(lambda: _blocked(r) == 1, what="the pipeline to be held")
    assert r.get("p") is None
    r.execute_command("CLIENT", "UNPAUSE")
    assert held.value() == [True, 2, b"2", 2, b"2x"]


def test_pause_all_holds_every_command_until_its_end(server, r):
    other, third = server.client(), server.client()
    start = time.monotonic()
    r.execute_command("CLIENT", "PAUSE", 700, "ALL")
    ping = Call(other.ping)
    unpause = Call(lambda: third.execute_command("CLIENT", "UNPAUSE"))  # held too, in Redis 7.0
    assert ping.value() is True and unpause.value() == b"OK"
    assert time.monotonic() - start >= 0.6  # a lower bound: neither could answer before the pause's end


def test_pauses_combine_the_stronger_kind_and_the_later_end(server, r):
    other = server.client()
    start = time.monotonic()
    r.execute_command("CLIENT", "PAUSE", 700, "WRITE")
    r.execute_command("CLIENT", "PAUSE", 0, "ALL")  # ALL, until the WRITE pause's end
    assert other.ping() is True
    assert time.monotonic() - start >= 0.6  # a lower bound: the PING was held as under ALL


def test_multi_under_pause_write(server, r):
    tx = server.client()
    r.set("m", "0")
    # EXEC of reads only goes through during the pause.
    p = tx.pipeline(transaction=True)
    p.get("m")
    r.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    assert p.execute() == [b"0"]
    # A transaction with a write: its SET is held before it is even queued.
    p = tx.pipeline(transaction=True)
    p.incr("m").get("m")
    held = Call(p.execute)
    wait_for(lambda: _blocked(r) == 1, what="the transaction to be held")
    assert r.get("m") == b"0"
    r.execute_command("CLIENT", "UNPAUSE")
    assert held.value() == [1, b"1"]


def test_exec_with_queued_writes_is_held(server, r, raw):
    conn = raw()
    assert conn.cmd("MULTI") == "OK"
    assert conn.cmd("SET", "q", "v") == "QUEUED"
    r.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    conn.send(b"*1\r\n$4\r\nEXEC\r\n")
    wait_for(lambda: _blocked(r) == 1, what="the EXEC to be held")
    assert r.exists("q") == 0
    r.execute_command("CLIENT", "UNPAUSE")
    assert conn.read_reply() == ["OK"]
    assert r.get("q") == b"v"


def test_a_client_that_leaves_while_held_writes_nothing(server, r, raw):
    conn = raw()
    cid = conn.cmd("CLIENT", "ID")
    r.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    conn.send(b"*3\r\n$3\r\nSET\r\n$4\r\ngone\r\n$1\r\nv\r\n")
    wait_for(lambda: _blocked(r) == 1, what="the SET to be held")
    conn.close()
    wait_for(lambda: f"id={cid} ".encode() not in r.execute_command("CLIENT", "LIST"), what="the client to be gone")
    r.execute_command("CLIENT", "UNPAUSE")
    assert r.ping()
    assert r.exists("gone") == 0


def test_keys_do_not_expire_actively_while_paused(server, r):
    r.config_set("hz", 100)
    try:
        r.flushall()
        r.set("e", "v", px=50)
        r.set("stay", "v")
        r.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
        past = time.monotonic() + 0.3  # the TTL's own end is the condition: nothing to poll on the server
        while time.monotonic() < past:
            time.sleep(0.05)
        assert r.dbsize() == 2  # due, but not reclaimed while paused
        r.execute_command("CLIENT", "UNPAUSE")
        wait_for(lambda: r.dbsize() == 1, what="the key to expire after the pause")
    finally:
        r.config_set("hz", 10)


def test_pause_errors_as_redis(r, raw, expect_error):
    with expect_error("ERR timeout is negative"):
        r.execute_command("CLIENT", "PAUSE", -1)
    for bad in ("abc", "1.5", "99999999999999999999"):
        with expect_error("ERR timeout is not an integer or out of range"):
            r.execute_command("CLIENT", "PAUSE", bad)
    with expect_error("ERR CLIENT PAUSE mode must be WRITE or ALL"):
        r.execute_command("CLIENT", "PAUSE", 10, "READ")
    with expect_error("ERR unknown subcommand or wrong number of arguments for 'PAUSE'. Try CLIENT HELP."):
        r.execute_command("CLIENT", "PAUSE", 10, "WRITE", "extra")
    with expect_error("ERR wrong number of arguments for 'client|pause' command"):
        r.execute_command("CLIENT", "PAUSE")
    with expect_error("ERR wrong number of arguments for 'client|unpause' command"):
        r.execute_command("CLIENT", "UNPAUSE", "x")
    assert r.execute_command("CLIENT", "PAUSE", 0) == b"OK"  # ends at once
    assert r.ping()
    assert r.execute_command("CLIENT", "UNPAUSE") == b"OK"  # nothing paused: fine
    info = raw().cmd("COMMAND", "INFO", "client|pause", "client|unpause")
    assert [(i[0], i[1]) for i in info] == [(b"client|pause", -3), (b"client|unpause", 2)]
    assert all({"@admin", "@dangerous", "@connection"} <= set(i[6]) for i in info)
