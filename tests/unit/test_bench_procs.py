"""Tests for kvstrata.bench.procs: /proc/PID/stat parsing, CPU time, machine description, PING readiness.

They read the real /proc of the test process and use a throwaway in-process PONG server; all fast.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from kvstrata.bench import procs
from kvstrata.bench.small import evaluate_targets, parse_benchmark_csv

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")


def test_parse_stat_handles_spaces_and_parens_in_comm():
    # Fields from proc(5): pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority nice num_threads itrealvalue starttime ...
    line = "4242 (my (odd) proc) S 1 4242 4242 0 -1 4194560 1234 0 7 0 300 45 0 0 20 0 5 0 99 1000 200\n"
    stat = procs.parse_proc_stat(line)
    assert stat.pid == 4242
    assert stat.comm == "my (odd) proc"
    assert stat.state == "S"
    assert stat.ppid == 1
    assert (stat.minflt, stat.majflt) == (1234, 7)
    assert (stat.utime_ticks, stat.stime_ticks) == (300, 45)
    assert stat.num_threads == 5
    assert stat.cpu_ticks == 345
    assert stat.cpu_us == 345 * 1_000_000 // procs.CLK_TCK


def test_parse_stat_rejects_garbage():
    with pytest.raises(ValueError):
        procs.parse_proc_stat("not a stat line")
    with pytest.raises(ValueError):
        procs.parse_proc_stat("1 (x) S 0 0")


def test_ticks_to_us():
    assert procs.ticks_to_us(100, clk_tck=100) == 1_000_000
    assert procs.ticks_to_us(1, clk_tck=100) == 10_000
    assert procs.ticks_to_us(3, clk_tck=1000) == 3_000


def test_read_own_stat_and_cpu_grows():
    me = procs.read_proc_stat(os.getpid())
    assert me.pid == os.getpid()
    assert me.ppid == os.getppid()
    assert me.comm  # e.g. "python" or "pytest"
    assert me.num_threads >= 1
    assert me.minflt > 0  # a Python interpreter has touched plenty of pages

    # Burn CPU until the kernel accounts at least two more ticks (with a generous cap).
    before = procs.cpu_time_us(os.getpid())
    deadline = time.monotonic() + 5.0
    x = 0
    while procs.cpu_time_us(os.getpid()) < before + 2 * procs.ticks_to_us(1) and time.monotonic() < deadline:
        for i in range(20_000):
            x += i * i
    after = procs.cpu_time_us(os.getpid())
    assert after >= before + 2 * procs.ticks_to_us(1)

    # Agrees with what the process reports about itself (os.times, in seconds) to within a few ticks.
    t = os.times()
    own = (t.user + t.system) * 1_000_000
    assert abs(procs.cpu_time_us(os.getpid()) - own) <= 5 * procs.ticks_to_us(1) + 50_000


def test_usage_delta_and_tree_include_children():
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        stdin=subprocess.DEVNULL,
    )
    try:
        assert child.pid in procs.descendant_pids(os.getpid())
        mine = procs.process_usage(os.getpid())
        tree = procs.tree_usage(os.getpid())
        assert tree.cpu_us >= mine.cpu_us
        assert tree.minflt > mine.minflt  # the child's faults are added
        delta = tree - mine
        assert delta.cpu_us >= 0 and delta.minflt > 0 and delta.majflt >= 0
    finally:
        child.kill()
        child.wait()


def test_read_stat_of_missing_process():
    with pytest.raises(ProcessLookupError):
        procs.read_proc_stat(2**22 + 12345)  # above the default pid_max


def test_parse_cpuinfo_x86_and_arm_shapes():
    x86 = (
        "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nphysical id\t: 0\ncore id\t\t: 0\nflags\t\t: fpu hypervisor\n\n"
        "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nphysical id\t: 0\ncore id\t\t: 0\nflags\t\t: fpu hypervisor\n\n"
        "processor\t: 2\nmodel name\t: AMD EPYC 7B13\nphysical id\t: 0\ncore id\t\t: 1\nflags\t\t: fpu hypervisor\n"
    )
    info = procs.parse_cpuinfo(x86)
    assert info == {"cpu_model": "AMD EPYC 7B13", "cores_logical": 3, "cores_physical": 2, "hypervisor": True}
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\n\nprocessor\t: 1\nBogoMIPS\t: 50.00\n\nHardware\t: BCM2835\n"
    info = procs.parse_cpuinfo(arm)
    assert info["cores_logical"] == 2
    assert info["cores_physical"] is None
    assert info["hypervisor"] is False


def test_parse_meminfo_total():
    assert procs.parse_meminfo_total("MemTotal:       24684084 kB\nMemFree: 1 kB\n") == 24684084 * 1024
    with pytest.raises(ValueError):
        procs.parse_meminfo_total("MemFree: 1 kB\n")


def test_describe_machine_real():
    m = procs.describe_machine()
    assert isinstance(m["cpu_model"], str) and m["cpu_model"]
    assert isinstance(m["cores"], int) and m["cores"] >= 1
    assert isinstance(m["cores_usable"], int) and 1 <= m["cores_usable"] <= m["cores"]
    assert isinstance(m["ram_bytes"], int) and m["ram_bytes"] > 64 * 1024**2
    assert m["kernel"] == platform.release()
    assert m["python"] == platform.python_version()
    assert m["os"] == "Linux"
    summary = procs.machine_summary(m)
    assert m["cpu_model"] in summary and platform.python_version() in summary


# --------------------------------------------------------------------------------------------------
# Readiness


@pytest.fixture
def pong_server() -> Iterator[int]:
    """A loopback listener that answers every read with +PONG."""
    listener = socket.socket()
    listener.bind((procs.LOOPBACK, 0))
    listener.listen()
    listener.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                if conn.recv(64):
                    conn.sendall(b"+PONG\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        listener.close()


def test_ping_and_wait_ready(pong_server):
    assert procs.ping(procs.LOOPBACK, pong_server)
    assert procs.wait_ready(procs.LOOPBACK, pong_server, deadline_s=2.0) < 2.0


def test_wait_ready_times_out_on_closed_port():
    port = procs.free_port()
    assert not procs.ping(procs.LOOPBACK, port, timeout=0.2)
    start = time.monotonic()
    with pytest.raises(procs.ServerStartError, match="no PONG"):
        procs.wait_ready(procs.LOOPBACK, port, deadline_s=0.3)
    assert time.monotonic() - start < 2.0


def test_start_server_reports_early_exit(tmp_path):
    with pytest.raises(procs.ServerStartError, match="exited with status 3") as info:
        procs.start_server(
            "dummy",
            [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
            ready_timeout_s=5.0,
            log_dir=tmp_path,
            attempts=2,
        )
    assert "boom" in str(info.value)


# --------------------------------------------------------------------------------------------------
# Pure helpers of kvstrata.bench.small (no servers)


def test_parse_benchmark_csv_skips_warnings():
    out = (
        "WARNING: Could not fetch server CONFIG\n"
        '"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms",'
        '"max_latency_ms"\n'
        '"SET","75471.70","0.366","0.112","0.343","0.519","1.031","1.855"\n'
    )
    assert parse_benchmark_csv(out) == {"SET": 75471.70}
    assert parse_benchmark_csv("") == {}


def test_evaluate_targets():
    def row(test: str, p: int, ratio: float) -> dict[str, object]:
        return {"test": test, "pipeline": p, "ratio": {"cpu_per_request": ratio, "rps": 1.0}}

    ok = evaluate_targets([row("SET", 1, 1.19), row("GET", 16, 1.99), row("GET", 4, 9.0)])
    assert ok["met"] is True and len(ok["checks"]) == 2
    miss = evaluate_targets([row("SET", 1, 1.21), row("GET", 16, 1.0)])
    assert miss["met"] is False
    assert [c["pass"] for c in miss["checks"]] == [False, True]
    assert evaluate_targets([row("SET", 4, 1.0)])["met"] is False  # nothing with a target measured


def test_table_and_markdown_render():
    from kvstrata.bench.small import format_table, write_markdown

    side = {"rps": 80000.0, "cpu_us_per_request": 9.0}
    results = [
        {
            "test": "SET",
            "pipeline": 1,
            "kvstrata": side,
            "redis": side,
            "ratio": {"cpu_per_request": 1.0, "rps": 1.0},
        },
        {
            "test": "GET",
            "pipeline": 16,
            "kvstrata": side,
            "redis": side,
            "ratio": {"cpu_per_request": 2.5, "rps": 1.0},
        },
    ]
    result = {
        "benchmark": "small",
        "machine": procs.describe_machine(),
        "command": "kvstrata bench small --quick",
        "peers": ["redis 7.0.15"],
        "settings": {
            "kvstrata_cmd": ["python", "-m", "kvstrata", "serve"],
            "requests": 20000,
            "clients": 50,
            "value_size": 100,
            "repeats": 1,
            "keyspace": 100000,
            "one_at_a_time": False,
        },
        "results": results,
        "targets": evaluate_targets(results),
    }
    table = format_table(result)
    assert "PASS  kvstrata CPU/request, SET -P 1" in table
    assert "MISS  kvstrata CPU/request, GET -P 16" in table
    md = write_markdown(result)
    assert md.startswith("## Small requests")
    assert "kvstrata bench small --quick" in md
    assert "| SET | 1 | 80,000 | 80,000 | 1.00x | 9.00 | 9.00 | 1.00x |" in md
    assert "**MISS** GET `-P 16`: 2.50x" in md
    assert "Overall: **missed**" in md
