"""CPU lists (kvstrata.cpulist): Redis's server_cpulist syntax parsed and written back, the server/client split of
``bench restore --pin``, the ``server-cpulist`` parameter, and pinning a process's threads (in a child process,
so the test run keeps its own CPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvstrata.config import build_config
from kvstrata.cpulist import MAX_CPU, format_cpus, parse_cpulist, split_cpus

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.mark.parametrize(("text", "cpus"), [
    ("", ()),
    ("3", (3,)),
    ("0-3", (0, 1, 2, 3)),
    ("0-7:2", (0, 2, 4, 6)),
    ("8, 0-2 ,1", (0, 1, 2, 8)),
    ("5-5", (5,)),
    (f"{MAX_CPU}", (MAX_CPU,)),
])
def test_lists_in_redis_syntax(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "0-4:0", "2:2", "1-2-3", f"0-{MAX_CPU + 1}", "0x1",
                                  "1.5", "0-999999999999"])
def test_malformed_lists_name_the_bad_item(text: str) -> None:
    with pytest.raises(ValueError, match="bad CPU list item"):
        parse_cpulist(text)


def test_compact_form_round_trips() -> None:
    for cpus in [(0,), (0, 1, 2, 5), (1, 3, 5), tuple(range(64)), (0, 2, 3, 4, 9, 10)]:
        text = format_cpus(cpus)
        assert parse_cpulist(text) == cpus
    assert format_cpus((0, 1, 2, 5)) == "0-2,5" and format_cpus(()) == ""


def test_split_gives_the_server_the_upper_half() -> None:
    assert split_cpus({0, 1}) == ((1,), (0,))
    assert split_cpus({4, 0, 2, 6, 1}) == ((2, 4, 6), (0, 1))
    with pytest.raises(ValueError, match="two CPUs"):
        split_cpus({3})


def test_server_cpulist_parameter_keeps_the_users_spelling() -> None:
    assert build_config({}, {}, None).get("server-cpulist") == ""
    assert build_config({"server-cpulist": "0-7:2"}, {}, None).get("server-cpulist") == "0-7:2"
    assert build_config({}, {"KVSTRATA_SERVER_CPULIST": " 1,3 "}, None).get("server-cpulist") == "1,3"
    with pytest.raises(ValueError, match="server-cpulist"):
        build_config({"server-cpulist": "x"}, {}, None)


_CHILD = """
import os, threading, time
from kvstrata.cpulist import pin_process
started = threading.Event(); stop = threading.Event()
def idle():
    started.set(); stop.wait()
before = threading.Thread(target=idle); before.start(); started.wait()
pin_process(({cpu},))
started.clear()
after = threading.Thread(target=idle); after.start(); started.wait()
masks = {{t: os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")}}
stop.set(); before.join(); after.join()
print(len(masks), sorted({{c for m in masks.values() for c in m}}))
"""


def test_pinning_covers_running_threads_and_later_ones() -> None:
    cpu = max(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", _CHILD.format(cpu=cpu)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": SRC}, timeout=60, check=True).stdout.split(maxsplit=1)
    assert out == ["3", f"[{cpu}]\n"]  # the main thread, one started before pinning and one after: all on cpu


def test_pinning_to_a_cpu_that_does_not_exist_is_an_error() -> None:
    code = f"from kvstrata.cpulist import pin_process\npin_process(({MAX_CPU},))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC}, timeout=60, check=False)
    if MAX_CPU in range(os.cpu_count() or 1):
        pytest.skip(f"this machine has CPU {MAX_CPU}")
    assert proc.returncode != 0 and f"cannot run on CPUs {MAX_CPU}" in proc.stderr
