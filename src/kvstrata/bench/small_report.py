"""The report of ``kvstrata bench small``: per-cell medians, kvstrata/redis ratios, the targets, and the terminal
table and BENCHMARKS.md section that show them."""

from __future__ import annotations

import shlex
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvstrata.bench.procs import machine_summary
from kvstrata.bench.report import verdict

if TYPE_CHECKING:
    from kvstrata.bench.small import Sample, Settings

KVSTRATA = "kvstrata"
REDIS = "redis"
SERVERS = (KVSTRATA, REDIS)
TESTS = ("set", "get")

TARGETS: dict[int, float] = {1: 1.2, 16: 2.0}
"""Pipeline depth -> the most kvstrata's CPU per request may be, as a multiple of Redis's."""


def summarize(samples: Sequence[Sample], settings: Settings) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-cell medians with kvstrata/redis ratios, and the targets verdict."""
    results: list[dict[str, Any]] = []
    for pipeline in settings.pipelines:
        for test in TESTS:
            row: dict[str, Any] = {"test": test.upper(), "pipeline": pipeline}
            for name in SERVERS:
                runs = [s for s in samples if s.server == name and s.test == test and s.pipeline == pipeline]
                row[name] = {
                    "rps": statistics.median(s.rps for s in runs),
                    "cpu_us_per_request": statistics.median(s.cpu_us_per_request for s in runs),
                    "minflt_per_request": statistics.median(s.minflt / s.requests for s in runs),
                    "majflt": statistics.median(s.majflt for s in runs),
                    "rps_runs": [round(s.rps, 2) for s in runs],
                    "cpu_us_per_request_runs": [round(s.cpu_us_per_request, 4) for s in runs],
                    "wall_s_runs": [round(s.wall_s, 3) for s in runs],
                }
            kv, rd = row[KVSTRATA], row[REDIS]
            row["ratio"] = {
                "cpu_per_request": _ratio(kv["cpu_us_per_request"], rd["cpu_us_per_request"]),
                "rps": _ratio(kv["rps"], rd["rps"]),
            }
            results.append(row)
    return results, evaluate_targets(results)


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 else None


def evaluate_targets(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Check kvstrata's CPU per request against Redis's for every measured pipeline that has a target.

    ``met`` is true when at least one target was measured and all measured ones pass.
    """
    checks: list[dict[str, Any]] = []
    for row in results:
        limit = TARGETS.get(row["pipeline"])
        if limit is None:
            continue
        ratio = row["ratio"]["cpu_per_request"]
        checks.append(
            {
                "name": f"cpu_per_request {row['test']} -P {row['pipeline']}",
                "test": row["test"],
                "pipeline": row["pipeline"],
                "limit": limit,
                "ratio": ratio,
                "pass": ratio is not None and ratio <= limit,
            }
        )
    return {
        "cpu_per_request_limits": {f"P{p}": limit for p, limit in TARGETS.items()},
        "checks": checks,
        "met": bool(checks) and all(c["pass"] for c in checks),
    }


def _fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


_HEADERS = (
    "test", "-P", "kvstrata req/s", "redis req/s", "req/s ratio",
    "kvstrata µs CPU/req", "redis µs CPU/req", "CPU ratio",
)  # fmt: skip


def _table_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for row in result["results"]:
        kv, rd = row[KVSTRATA], row[REDIS]
        rows.append(
            [
                row["test"],
                str(row["pipeline"]),
                f"{kv['rps']:,.0f}",
                f"{rd['rps']:,.0f}",
                _fmt_ratio(row["ratio"]["rps"]),
                f"{kv['cpu_us_per_request']:.2f}",
                f"{rd['cpu_us_per_request']:.2f}",
                _fmt_ratio(row["ratio"]["cpu_per_request"]),
            ]
        )
    return rows


def _target_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    for check in result["targets"]["checks"]:
        lines.append(
            f"{verdict(check['pass'])}  kvstrata CPU/request, {check['test']} -P {check['pipeline']}: "
            f"{_fmt_ratio(check['ratio'])} redis (target <= {check['limit']:g}x)"
        )
    if not lines:
        lines.append("MISS  no pipeline with a target (-P 1 or -P 16) was measured")
    return lines


def _method(result: dict[str, Any]) -> tuple[str, str]:
    """(the redis-benchmark command template, how the runs were done)."""
    s = result["settings"]
    mode = "one server alive at a time" if s["one_at_a_time"] else "both servers alive"
    command = (
        f"redis-benchmark -t <set|get> -d {s['value_size']} -n {s['requests']} -c {s['clients']} "
        f"-P <p> -r {s['keyspace']} -q --csv"
    )
    notes = (
        f"median of {s['repeats']} run(s) per cell, servers interleaved, {mode}; "
        "server CPU = utime+stime from /proc/PID/stat over the run / requests"
    )
    return command, notes


def format_table(result: dict[str, Any]) -> str:
    """The human report: table, then one PASS/MISS line per target."""
    rows = [list(_HEADERS), *_table_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADERS))]
    lines = [
        f"kvstrata bench small — {machine_summary(result['machine'])}",
        f"peers: {', '.join(result['peers'])}; kvstrata side: {shlex.join(result['settings']['kvstrata_cmd'])}",
        "; ".join(_method(result)),
        "",
    ]
    for i, r in enumerate(rows):
        cells = [c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(cells))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.extend(_target_lines(result))
    lines.append(f"targets {'met' if result['targets']['met'] else 'MISSED'}")
    return "\n".join(lines) + "\n"


def write_markdown(result: dict[str, Any]) -> str:
    """A BENCHMARKS.md section for one ``kvstrata bench small --json`` result: command, machine, table, targets."""
    m = result["machine"]
    lines = [
        "## Small requests (`kvstrata bench small`)",
        "",
        "```sh",
        result["command"],
        "```",
        "",
        f"- Machine: {machine_summary(m)}",
        f"- Peers: {', '.join(result['peers'])}; kvstrata side: `{shlex.join(result['settings']['kvstrata_cmd'])}`",
        f"- Method: `{_method(result)[0]}`; {_method(result)[1]}",
        "",
        "| " + " | ".join(_HEADERS) + " |",
        "|" + "|".join(["---", "--:"] + ["--:"] * (len(_HEADERS) - 2)) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in _table_rows(result)]
    lines += ["", "Targets (kvstrata server CPU per request relative to Redis):", ""]
    for check in result["targets"]["checks"]:
        lines.append(
            f"- **{verdict(check['pass'])}** {check['test']} `-P {check['pipeline']}`: {_fmt_ratio(check['ratio'])} "
            f"(target ≤ {check['limit']:g}x)"
        )
    if not result["targets"]["checks"]:
        lines.append("- **MISS** no pipeline with a target was measured")
    lines += ["", f"Overall: **{'met' if result['targets']['met'] else 'missed'}**.", ""]
    return "\n".join(lines)
