"""``kvstrata bench small``: small-request throughput and server CPU per request, kvstrata against Redis.

Both servers run on free loopback ports and the real ``redis-benchmark`` binary drives them, one test at a
time (``-t set`` then ``-t get``, so that server CPU can be attributed to each), with ``-d 100 -c 50
-r 100000`` and each pipeline depth. For every (server, test, pipeline) cell the harness records

* requests/s, from ``redis-benchmark --csv``;
* server CPU microseconds per request: the growth of the server's ``utime + stime`` (``/proc/PID/stat``,
  including any worker processes) over the run, divided by the number of requests;

repeats each cell ``--repeats`` times with the servers interleaved (kvstrata, redis, kvstrata, redis, ...)
so that machine noise hits both alike, and reports medians and the kvstrata/redis ratios. Targets:
kvstrata's CPU per request at most 1.2x Redis's at ``-P 1`` and at most 2x at ``-P 16``.

A human table goes to stdout and progress to stderr; ``--json`` prints one JSON document instead, and
``write_markdown`` renders a result as a section of BENCHMARKS.md.

To try the harness without a kvstrata server, make both sides Redis (the ratios should come out near 1)::

    kvstrata bench small --quick --kvstrata-cmd "redis-server --save '' --appendonly no"
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvstrata.bench.procs import (
    LOOPBACK,
    ServerProcess,
    ServerStartError,
    describe_machine,
    start_server,
)
from kvstrata.bench.small_report import (  # noqa: F401 - re-exported: the report's functions
    KVSTRATA,
    REDIS,
    SERVERS,
    TARGETS,
    TESTS,
    evaluate_targets,
    format_table,
    summarize,
    write_markdown,
)

KEYSPACE = 100_000
"""``-r``: keys are drawn at random from this many."""

QUICK_REQUESTS = 20_000
SETTLE_S = 0.05
"""Pause after a run before reading the server's CPU time, so that it finishes closing the connections."""

REDIS_ARGS = ["--save", "", "--appendonly", "no"]


class BenchError(RuntimeError):
    """A benchmark run failed (redis-benchmark error, server died, unreadable output)."""


# --------------------------------------------------------------------------------------------------
# One redis-benchmark run


@dataclass(frozen=True)
class Sample:
    """One run of one test against one server."""

    server: str
    test: str
    pipeline: int
    repeat: int
    requests: int
    rps: float
    wall_s: float
    cpu_us: int
    minflt: int
    majflt: int

    @property
    def cpu_us_per_request(self) -> float:
        return self.cpu_us / self.requests


def parse_benchmark_csv(text: str) -> dict[str, float]:
    """``{"SET": requests_per_second, ...}`` from ``redis-benchmark -q --csv`` output.

    Lines that are not CSV rows with a numeric rps (warnings, blank lines) are skipped.
    """
    rows = [line for line in text.splitlines() if line.startswith('"')]
    result: dict[str, float] = {}
    for row in csv.DictReader(io.StringIO("\n".join(rows))):
        name, rps = row.get("test"), row.get("rps")
        if not name or rps is None:
            continue
        try:
            result[name.upper()] = float(rps)
        except ValueError:
            continue
    return result


def benchmark_argv(
    binary: str,
    port: int,
    test: str,
    *,
    requests: int,
    clients: int,
    value_size: int,
    pipeline: int,
    keyspace: int = KEYSPACE,
    host: str = LOOPBACK,
) -> list[str]:
    """The redis-benchmark command line for one run."""
    return [
        binary, "-h", host, "-p", str(port), "-t", test, "-d", str(value_size), "-n", str(requests),
        "-c", str(clients), "-P", str(pipeline), "-r", str(keyspace), "-q", "--csv",
    ]  # fmt: skip


def run_benchmark(argv: Sequence[str], test: str, timeout_s: float) -> tuple[float, float]:
    """Run redis-benchmark; return (requests/s, wall seconds)."""
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"redis-benchmark ran past {timeout_s:g}s: {shlex.join(argv)}") from exc
    wall = time.monotonic() - start
    rps = parse_benchmark_csv(done.stdout).get(test.upper())
    if done.returncode != 0 or rps is None or rps <= 0:
        raise BenchError(
            f"redis-benchmark failed (status {done.returncode}): {shlex.join(argv)}\n"
            f"stdout: {done.stdout.strip()[-2000:]}\nstderr: {done.stderr.strip()[-2000:]}"
        )
    return rps, wall


def measure(
    server: ServerProcess,
    binary: str,
    test: str,
    pipeline: int,
    repeat: int,
    *,
    requests: int,
    clients: int,
    value_size: int,
    timeout_s: float,
) -> Sample:
    """One measured run: server usage before, redis-benchmark, server usage after."""
    argv = benchmark_argv(
        binary,
        server.port,
        test,
        requests=requests,
        clients=clients,
        value_size=value_size,
        pipeline=pipeline,
    )
    before = server.usage()
    rps, wall = run_benchmark(argv, test, timeout_s)
    time.sleep(SETTLE_S)
    if not server.alive():
        raise BenchError(f"{server.name} exited during the run\n{server.log_tail()}")
    delta = server.usage() - before
    return Sample(
        server.name, test, pipeline, repeat, requests, rps, wall, delta.cpu_us, delta.minflt, delta.majflt
    )


# --------------------------------------------------------------------------------------------------
# Settings, servers, the run plan


@dataclass(frozen=True)
class Settings:
    requests: int
    clients: int
    value_size: int
    pipelines: tuple[int, ...]
    repeats: int
    kvstrata_cmd: tuple[str, ...]
    redis_server: str
    redis_benchmark: str
    one_at_a_time: bool
    warmup: bool
    run_timeout_s: float
    ready_timeout_s: float


def _child_env() -> dict[str, str]:
    """The environment for servers: this process's, with kvstrata's source root on PYTHONPATH.

    That lets the default ``python -m kvstrata serve`` work from a source checkout that is not installed.
    """
    env = dict(os.environ)
    src_root = str(Path(__file__).resolve().parents[2])
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if src_root not in parts:
        env["PYTHONPATH"] = os.pathsep.join([src_root, *parts])
    return env


def server_argv(settings: Settings, name: str) -> list[str]:
    if name == KVSTRATA:
        return list(settings.kvstrata_cmd)
    return [settings.redis_server, *REDIS_ARGS]


def redis_version(redis_server: str) -> str:
    """``7.0.15`` from ``redis-server --version``, or ``unknown``."""
    try:
        out = subprocess.run([redis_server, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    m = re.search(r"v=(\S+)", out)
    return m.group(1) if m else "unknown"


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _warm_up(server: ServerProcess, settings: Settings) -> None:
    """Fill the keyspace (unmeasured), so that the first SETs overwrite and the GETs hit, as in later runs."""
    argv = benchmark_argv(
        settings.redis_benchmark, server.port, "set",
        requests=2 * KEYSPACE, clients=settings.clients, value_size=settings.value_size, pipeline=16,
    )  # fmt: skip
    run_benchmark(argv, "set", settings.run_timeout_s)


@contextmanager
def _started(name: str, settings: Settings, workdir: str) -> Iterator[ServerProcess]:
    server = start_server(
        name,
        server_argv(settings, name),
        env=_child_env(),
        cwd=workdir,
        log_dir=workdir,
        ready_timeout_s=settings.ready_timeout_s,
    )
    try:
        _progress(f"started {name} pid {server.pid} on port {server.port} ({server.ready_s:.2f}s to PONG)")
        if settings.warmup:
            _warm_up(server, settings)
        yield server
    finally:
        server.stop()


def run_plan(settings: Settings) -> list[Sample]:
    """Run every cell ``repeats`` times, servers interleaved; return all samples in run order."""
    cells = [(p, t) for p in settings.pipelines for t in TESTS]
    total = len(cells) * len(SERVERS) * settings.repeats
    samples: list[Sample] = []

    def one(server: ServerProcess, pipeline: int, test: str, repeat: int) -> None:
        sample = measure(
            server, settings.redis_benchmark, test, pipeline, repeat,
            requests=settings.requests, clients=settings.clients, value_size=settings.value_size,
            timeout_s=settings.run_timeout_s,
        )  # fmt: skip
        samples.append(sample)
        _progress(
            f"[{len(samples):>3}/{total}] {sample.server:<8} {test.upper():<3} -P {pipeline:<3} "
            f"{sample.rps:>12,.0f} req/s  {sample.cpu_us_per_request:7.2f} µs CPU/req"
        )

    with tempfile.TemporaryDirectory(prefix="kvstrata-bench-small-") as workdir:
        if settings.one_at_a_time:
            for repeat in range(settings.repeats):
                for name in SERVERS:
                    with _started(name, settings, workdir) as server:
                        for pipeline, test in cells:
                            one(server, pipeline, test, repeat)
        else:
            with ExitStack() as stack:
                servers = {name: stack.enter_context(_started(name, settings, workdir)) for name in SERVERS}
                for repeat in range(settings.repeats):
                    for pipeline, test in cells:
                        for name in SERVERS:
                            one(servers[name], pipeline, test, repeat)
    return samples


# --------------------------------------------------------------------------------------------------
# Command line


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer: {text}")
    return value


def _pipelines(text: str) -> tuple[int, ...]:
    try:
        values = tuple(dict.fromkeys(int(p) for p in text.split(",") if p.strip()))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"comma-separated positive integers expected: {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"comma-separated positive integers expected: {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    default_cmd = shlex.join([sys.executable, "-m", "kvstrata", "serve"])
    p = argparse.ArgumentParser(
        prog="kvstrata bench small",
        description="Small-request throughput and server CPU per request: kvstrata vs Redis, via redis-benchmark.",
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON document on stdout instead of the table"
    )
    p.add_argument("--requests", type=_positive_int, default=None, help="requests per run (default 200000)")
    p.add_argument("--clients", type=_positive_int, default=50, help="parallel connections (default 50)")
    p.add_argument(
        "--value-size", type=_positive_int, default=100, help="SET value size in bytes (default 100)"
    )
    p.add_argument("--pipelines", type=_pipelines, default=(1, 16), help='pipeline depths (default "1,16")')
    p.add_argument(
        "--repeats", type=_positive_int, default=None, help="runs per cell; medians reported (default 3)"
    )
    p.add_argument(
        "--quick", action="store_true",
        help=f"smoke test: {QUICK_REQUESTS} requests and 1 repeat unless given explicitly",
    )  # fmt: skip
    p.add_argument(
        "--kvstrata-cmd", default=default_cmd,
        help="kvstrata server command, shell-split; '--port N --bind 127.0.0.1' is appended "
        f"(default: {default_cmd})",
    )  # fmt: skip
    p.add_argument("--redis-server", default=None, help="redis-server binary (default: from PATH)")
    p.add_argument("--redis-benchmark", default=None, help="redis-benchmark binary (default: from PATH)")
    p.add_argument(
        "--one-at-a-time", action="store_true",
        help="start each server only for its own block of runs instead of keeping both alive",
    )  # fmt: skip
    p.add_argument("--no-warmup", action="store_true", help="skip filling the keyspace before measuring")
    p.add_argument("--run-timeout", type=float, default=300.0, help="seconds allowed per redis-benchmark run")
    p.add_argument(
        "--ready-timeout", type=float, default=30.0, help="seconds allowed for a server to answer PING"
    )
    p.add_argument("--fail-on-miss", action="store_true", help="exit with status 1 when a target is missed")
    return p


def _shell_join(argv: Sequence[str]) -> str:
    """Like ``shlex.join``, but quotes an argument holding a single quote with double quotes when it can.

    ``--kvstrata-cmd "redis-server --save ''"`` then reads back as written, not as ``'"'"'`` soup.
    """
    parts = []
    for arg in argv:
        quoted = shlex.quote(arg)
        if "'" in arg and not any(c in arg for c in '"$`\\!'):
            quoted = f'"{arg}"'
        parts.append(quoted)
    return " ".join(parts)


def _find_binary(given: str | None, name: str) -> str | None:
    if given:
        return given if (os.path.sep in given and os.access(given, os.X_OK)) else shutil.which(given)
    return shutil.which(name)


def main(argv: list[str]) -> int:
    """Entry point of ``kvstrata bench small``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    redis_server = _find_binary(args.redis_server, "redis-server")
    redis_benchmark = _find_binary(args.redis_benchmark, "redis-benchmark")
    for binary, name in ((redis_server, "redis-server"), (redis_benchmark, "redis-benchmark")):
        if binary is None:
            print(
                f"kvstrata bench small: {name} not found (install Redis 7 or pass --{name})", file=sys.stderr
            )
            return 2
    assert redis_server is not None and redis_benchmark is not None
    kvstrata_cmd = tuple(shlex.split(args.kvstrata_cmd))
    if not kvstrata_cmd:
        parser.error("--kvstrata-cmd is empty")
    settings = Settings(
        requests=args.requests or (QUICK_REQUESTS if args.quick else 200_000),
        clients=args.clients,
        value_size=args.value_size,
        pipelines=args.pipelines,
        repeats=args.repeats or (1 if args.quick else 3),
        kvstrata_cmd=kvstrata_cmd,
        redis_server=redis_server,
        redis_benchmark=redis_benchmark,
        one_at_a_time=args.one_at_a_time,
        warmup=not args.no_warmup,
        run_timeout_s=args.run_timeout,
        ready_timeout_s=args.ready_timeout,
    )

    # Turn SIGTERM into an exception so that the servers are stopped on the way out.
    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()
    try:
        samples = run_plan(settings)
    except (BenchError, ServerStartError) as exc:
        print(f"kvstrata bench small: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kvstrata bench small: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)

    results, targets = summarize(samples, settings)
    settings_json = asdict(settings)
    settings_json["keyspace"] = KEYSPACE
    result: dict[str, Any] = {
        "benchmark": "small",
        "machine": describe_machine(),
        "command": _shell_join(["kvstrata", "bench", "small", *argv]),
        "peers": [f"redis {redis_version(redis_server)}"],
        "settings": settings_json,
        "elapsed_s": round(time.monotonic() - started, 1),
        "results": results,
        "targets": targets,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        sys.stdout.write(format_table(result))
    return 1 if args.fail_on_miss and not targets["met"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
