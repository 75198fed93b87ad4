"""``server-cpulist``: every thread of the server runs on the CPUs given (the event loop, and the loader and SSD
writer threads, including those started after startup), CONFIG GET shows the list, CONFIG SET refuses it, and a
list the machine cannot honour stops the server at startup with the parameter named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from tests.integration.polling import wait_for

pytestmark = pytest.mark.kvstrata_only

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _masks(pid: int) -> dict[str, str]:
    """Each thread's name and CPU list, from /proc."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        cpus = next(line.split(":", 1)[1].strip() for line in status.splitlines()
                    if line.startswith("Cpus_allowed_list"))
        out[f"{name}/{tid}"] = cpus
    return out


def test_every_server_thread_runs_on_the_listed_cpu(make_server, tmp_path) -> None:
    cpu = str(max(os.sched_getaffinity(0)))
    srv = make_server({"server-cpulist": cpu, "essd-path": str(tmp_path / "ssd"), "dram-size": "1mb",
                       "http-port": "0"})
    r = srv.client()
    value = os.urandom(64 * 1024)
    for i in range(64):  # 4 MB through a 1 MB DRAM tier: demotions (the SSD writer), then loads (loader threads)
        r.set(f"k{i}", value)
    assert all(r.get(f"k{i}") == value for i in range(64))
    assert wait_for(lambda: len(_masks(srv.proc.pid)) >= 3, timeout=10)  # the loop and threads started later
    masks = _masks(srv.proc.pid)
    assert set(masks.values()) == {cpu}, masks
    assert r.config_get("server-cpulist") == {"server-cpulist": cpu}
    assert r.config_get("server_cpulist") == {"server_cpulist": cpu}
    with pytest.raises(redis.ResponseError, match="immutable"):
        r.config_set("server-cpulist", "0")


@pytest.mark.parametrize(("value", "message"), [
    ("4095", "cannot run on CPUs 4095"),
    ("0-x", "bad CPU list item '0-x'"),
])
def test_a_list_the_machine_cannot_honour_stops_the_server(value: str, message: str) -> None:
    if value == "4095" and 4095 in os.sched_getaffinity(0):
        pytest.skip("this machine has CPU 4095")
    proc = subprocess.run([sys.executable, "-m", "kvstrata", "serve", "--port", "0", "--http-port", "0",
                           "--server-cpulist", value], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": SRC})
    assert proc.returncode == 2
    assert "bad configuration" in proc.stderr and "server-cpulist" in proc.stderr and message in proc.stderr
