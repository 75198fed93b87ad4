"""WAIT as a Redis master without replicas answers it: 0 at once when no acknowledgement is asked for or inside
MULTI, else 0 after the timeout; Redis's argument errors. Run against both targets."""

import threading
import time

import pytest

from integration.polling import wait_for


def test_wait_without_replicas(r, expect_error):
    assert r.execute_command("WAIT", 0, 0) == 0
    assert r.execute_command("WAIT", -3, 0) == 0
    assert r.execute_command("WAIT", 1, 50) == 0  # blocks until its timeout: nobody acknowledges
    with expect_error("ERR value is not an integer or out of range"):
        r.execute_command("WAIT", "x", 0)
    with expect_error("ERR timeout is not an integer or out of range"):
        r.execute_command("WAIT", 1, "1.5")
    with expect_error("ERR timeout is negative"):
        r.execute_command("WAIT", 1, -1)
    pipe = r.pipeline(transaction=True)
    pipe.set("k", "v")
    pipe.execute_command("WAIT", 1, 0)  # inside EXEC: never blocks
    assert pipe.execute() == [True, 0]


def test_wait_blocks_only_its_own_client(server):
    waiting, other = server.client(), server.client()
    done = threading.Event()
    result = {}

    def run():
        start = time.monotonic()
        result["reply"] = waiting.execute_command("WAIT", 1, 1500)
        result["blocked_s"] = time.monotonic() - start
        done.set()

    t = threading.Thread(target=run)
    t.start()
    assert other.ping()  # served while the WAIT blocks
    assert not done.is_set()
    t.join(10)
    assert result["reply"] == 0 and result["blocked_s"] >= 1.4  # a lower bound: the server waits to its deadline


def test_a_wait_whose_client_left_ends(server, raw):
    """WAIT 1 0 blocks until its client disconnects: then it is no longer counted as blocked (INFO), as in Redis
    (kvstrata reads nothing from a blocked connection, so it looks for the hang-up itself)."""
    r = server.client()
    conn = raw()
    conn.send(b"*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$1\r\n0\r\n")
    wait_for(lambda: int(r.info("clients")["blocked_clients"]) == 1, what="the WAIT to block")
    conn.close()
    wait_for(lambda: int(r.info("clients")["blocked_clients"]) == 0, what="the WAIT to end with its client")


def test_client_unblock_ends_a_wait(server, raw, expect_error):
    """CLIENT UNBLOCK: TIMEOUT answers as the timeout would (0), ERROR with -UNBLOCKED; 1 when the client was
    blocked, 0 when it is not (or does not exist). Redis's argument errors."""
    r = server.client()
    conn = raw()
    cid = conn.cmd("CLIENT", "ID")
    for reason, reply in ((None, 0), ("ERROR", "UNBLOCKED client unblocked via CLIENT UNBLOCK")):
        conn.send(b"*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$1\r\n0\r\n")
        wait_for(lambda: int(r.info("clients")["blocked_clients"]) == 1, what="the WAIT to block")
        assert r.execute_command("CLIENT", "UNBLOCK", cid, *([reason] if reason else [])) == 1
        got = conn.read_reply()
        assert getattr(got, "message", got) == reply  # an error reply's text, or the integer
    assert int(r.info("clients")["blocked_clients"]) == 0
    assert r.execute_command("CLIENT", "UNBLOCK", cid) == 0  # not blocked
    assert r.execute_command("CLIENT", "UNBLOCK", 999_999, "TIMEOUT") == 0  # no such client
    assert conn.cmd("PING") == "PONG"
    with expect_error("ERR value is not an integer or out of range"):
        r.execute_command("CLIENT", "UNBLOCK", "x")
    with expect_error("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"):
        r.execute_command("CLIENT", "UNBLOCK", cid, "later")
    with expect_error("ERR unknown subcommand or wrong number of arguments for 'UNBLOCK'. Try CLIENT HELP."):
        r.execute_command("CLIENT", "UNBLOCK", cid, "TIMEOUT", "x")


@pytest.mark.kvstrata_only
def test_client_unblock_leaves_a_paused_client_held(server, raw):
    """A client held by CLIENT PAUSE is not blocked in a command: UNBLOCK answers 0 and it stays held
    (redis-server 7.0.15 crashes on it; see client_unblock for later versions)."""
    r = server.client()
    conn = raw()
    cid = conn.cmd("CLIENT", "ID")
    r.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    try:
        conn.send(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n")
        wait_for(lambda: int(r.info("clients")["blocked_clients"]) == 1, what="the SET to be held")
        assert r.execute_command("CLIENT", "UNBLOCK", cid, "ERROR") == 0
        assert r.exists("k") == 0
    finally:
        r.execute_command("CLIENT", "UNPAUSE")
    assert conn.read_reply() == "OK"


def test_a_blocked_client_shows_flag_b(server, raw):
    """CLIENT LIST's flag b while a client waits in WAIT, gone when it is unblocked, as in Redis."""
    r = server.client()
    conn = raw()
    cid = conn.cmd("CLIENT", "ID")

    def flags() -> str:
        return next(c["flags"] for c in r.client_list() if int(c["id"]) == cid)

    assert flags() == "N"
    conn.send(b"*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$1\r\n0\r\n")
    wait_for(lambda: flags() == "b", what="the WAIT to block")
    assert r.execute_command("CLIENT", "UNBLOCK", cid) == 1
    assert conn.read_reply() == 0
    assert flags() == "N"
