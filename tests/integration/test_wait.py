"""WAIT as a Redis master without replicas answers it: 0 at once when no acknowledgement is asked for or inside
MULTI, else 0 after the timeout; Redis's argument errors. Run against both targets."""

import threading
import time


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
