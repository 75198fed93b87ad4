"""`kvstrata bench ssd`: GET/SET throughput of large values (4 MB by default) served from the SSD tier vs from DRAM.

Two kvstrata servers in one run: one whose DRAM holds every value, one whose DRAM is far smaller than the data
so values are demoted to the SSD tier (LMDB) and read back from it (promotion disabled, so every GET is an SSD
read). The same zero-copy client drives both. On a machine with spare RAM the LMDB file is in the page cache,
so "SSD" reads measure the tier's software path (LMDB lookup, checksum, copy) rather than the device; the
report says so.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from kvstrata.bench.procs import describe_machine, machine_summary, start_server
from kvstrata.bench.rawclient import RawClient


def _server_argv(mode: str, data_bytes: int, ssd_dir: str) -> list[str]:
    base = [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning"]
    if mode == "dram":
        return [*base, "--dram-size", str(data_bytes * 2 + 256 * 1024**2)]
    return [*base, "--dram-size", str(max(data_bytes // 16, 16 * 1024**2)), "--essd-path", ssd_dir,
            "--essd-size", str(data_bytes * 4), "--promote-hits", "1000000", "--fsync", "no"]


def _run_mode(mode: str, value_size: int, count: int, seed: int) -> dict[str, Any]:
    ssd_dir = tempfile.mkdtemp(prefix="kvstrata-bench-ssd-")
    value = os.urandom(value_size)
    buf = memoryview(bytearray(value_size))
    keys = [b"bench:chunk:%06d" % i for i in range(count)]
    try:
        with start_server(f"kvstrata-{mode}", _server_argv(mode, value_size * count, ssd_dir)) as srv:
            with RawClient(srv.host, srv.port) as c:
                u0 = srv.usage()
                t0 = time.perf_counter()
                for key in keys:
                    c.call(b"SET", key, value)
                c.call(b"DBSIZE")  # waits for the SSD writer to drain
                set_s = time.perf_counter() - t0
                u1 = srv.usage()
                order = keys[:]
                random.Random(seed).shuffle(order)
                in_ssd = sum(1 for k in order[:16] if c.call(b"TAIR.KV.TIER", k) == b"ssd")
                u2 = srv.usage()
                t0 = time.perf_counter()
                for key in order:
                    n = c.get_into(key, buf)
                    if n != value_size:
                        raise RuntimeError(f"{mode}: GET {key!r} returned {n} bytes")
                get_s = time.perf_counter() - t0
                u3 = srv.usage()
                if bytes(buf) != value:
                    raise RuntimeError(f"{mode}: value read back differs")
        gb = value_size * count / 1e9
        return {
            "mode": mode,
            "set_gbps": gb / set_s,
            "get_gbps": gb / get_s,
            "set_cpu_s_per_gb": (u1 - u0).cpu_us / 1e6 / gb,
            "get_cpu_s_per_gb": (u3 - u2).cpu_us / 1e6 / gb,
            "sampled_keys_on_ssd": in_ssd,
        }
    finally:
        shutil.rmtree(ssd_dir, ignore_errors=True)


def run(value_mb: float, count: int, repeats: int) -> dict[str, Any]:
    value_size = int(value_mb * 1024 * 1024)
    rows: dict[str, list[dict[str, Any]]] = {"dram": [], "ssd": []}
    for r in range(repeats):
        for mode in ("dram", "ssd"):
            print(f"[{r + 1}/{repeats}] {mode} ...", file=sys.stderr)
            rows[mode].append(_run_mode(mode, value_size, count, seed=r))
    med = {
        mode: {k: statistics.median(x[k] for x in runs) for k in runs[0] if k != "mode"}
        for mode, runs in rows.items()
    }
    return {
        "benchmark": "ssd",
        "machine": describe_machine(),
        "command": f"kvstrata bench ssd --value-mb {value_mb:g} --count {count} --repeats {repeats}",
        "value_bytes": value_size,
        "count": count,
        "repeats": repeats,
        "median": med,
        "ratio_ssd_over_dram": {
            "set_gbps": med["ssd"]["set_gbps"] / med["dram"]["set_gbps"],
            "get_gbps": med["ssd"]["get_gbps"] / med["dram"]["get_gbps"],
        },
        "runs": rows,
    }


def render(result: dict[str, Any]) -> str:
    med = result["median"]
    lines = [
        f"value {result['value_bytes'] / 2**20:g} MiB x {result['count']}, median of {result['repeats']}",
        f"{'tier':<6} {'SET GB/s':>9} {'GET GB/s':>9} {'SET CPU s/GB':>13} {'GET CPU s/GB':>13}",
    ]
    for mode in ("dram", "ssd"):
        m = med[mode]
        lines.append(f"{mode:<6} {m['set_gbps']:>9.2f} {m['get_gbps']:>9.2f} {m['set_cpu_s_per_gb']:>13.2f} "
                     f"{m['get_cpu_s_per_gb']:>13.2f}")
    ratio = result["ratio_ssd_over_dram"]
    lines.append(f"SSD / DRAM: SET {ratio['set_gbps']:.2f}x, GET {ratio['get_gbps']:.2f}x")
    return "\n".join(lines)


def write_markdown(result: dict[str, Any]) -> str:
    med = result["median"]
    rows = "\n".join(
        f"| {mode} | {med[mode]['set_gbps']:.2f} | {med[mode]['get_gbps']:.2f} | "
        f"{med[mode]['set_cpu_s_per_gb']:.2f} | {med[mode]['get_cpu_s_per_gb']:.2f} |"
        for mode in ("dram", "ssd")
    )
    ratio = result["ratio_ssd_over_dram"]
    return (
        "## SSD tier: large values from SSD vs DRAM\n\n"
        f"Command: `{result['command']}`  \nMachine: {machine_summary(result['machine'])}\n\n"
        "Same server code, same zero-copy client; the SSD server's DRAM is 1/16 of the data and promotion is "
        "off, so every GET is served by the SSD tier (LMDB, checksum verified). The LMDB file fits in the page "
        "cache here, so this measures the tier's software path, not the device.\n\n"
        "| tier | SET GB/s | GET GB/s | server CPU s/GB (SET) | server CPU s/GB (GET) |\n|---|---|---|---|---|\n"
        f"{rows}\n\nSSD / DRAM throughput: SET {ratio['set_gbps']:.2f}x, GET {ratio['get_gbps']:.2f}x.\n"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvstrata bench ssd", description=__doc__.splitlines()[0])
    parser.add_argument("--value-mb", type=float, default=4.0)
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.value_mb, args.count, args.repeats)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render(result))
    return 0
