"""``kvstrata bench restore`` end to end on a small case: every mode asked for reports a bandwidth and the ratios
built from them, and ``--pin`` reports the servers on the upper half of the CPUs and the bench's clients on the
rest (that ``server-cpulist`` really pins every server thread: test_server_cpulist.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvstrata.cpulist import format_cpus, split_cpus

pytestmark = pytest.mark.kvstrata_only

SRC = str(Path(__file__).resolve().parents[2] / "src")
MODES = "memcpy,arena,tcp,loopback"


def _bench(*extra: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "kvstrata", "bench", "restore", "--cases",
                           "smollm2-135m:float32:512", "--repeats", "1", "--modes", MODES, "--json", *extra],
                          capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "PYTHONPATH": SRC})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_restore_bench_reports_every_mode_and_its_ratios() -> None:
    res = _bench()
    (case,) = res["cases"]
    assert res["pinned"] is None
    for mode in (*MODES.split(","), "store-stage", "store-pull", "store-unix", "store-tcp"):
        assert case["gbps"][mode] > 0, mode
    assert case["ratios"]["tcp/loopback"] == pytest.approx(case["gbps"]["tcp"] / case["gbps"]["loopback"], rel=0.01)
    assert "arena restore >= 0.8x memcpy" in res["targets"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning a server and its clients apart needs 2 CPUs")
def test_pinned_restore_bench_keeps_server_and_clients_apart() -> None:
    server, client = split_cpus(os.sched_getaffinity(0))
    res = _bench("--pin")
    assert res["pinned"] == {"server": format_cpus(server), "client": format_cpus(client)}
    assert not set(server) & set(client)
    assert res["cases"][0]["gbps"]["tcp"] > 0
