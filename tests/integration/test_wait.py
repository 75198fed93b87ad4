"""WAIT as a Redis master without replicas answers it: 0 at once when no acknowledgement is asked for or inside
MULTI, else 0 after the timeout; Redis's argument errors. Run against both targets."""

import threading
import time

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
