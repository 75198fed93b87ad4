"""``kvstrata top``: a refreshing terminal view (rich) of the numbers the dashboard shows, for machines without
a browser. It reads ``INFO everything`` and ``MEMORY STATS`` over RESP, so it needs no HTTP endpoint and also
works, with fewer panels, against Redis itself. Rates (ops/s, bytes/s) are differences between two polls.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from kvstrata.client.fast import FastClient, RespError


def parse_info(text: str) -> dict[str, dict[str, str]]:
    """``INFO`` text -> {section (lower case): {field: value}}."""
    sections: dict[str, dict[str, str]] = {}
    current = sections.setdefault("", {})
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            current = sections.setdefault(line[1:].strip().lower(), {})
            continue
        name, sep, value = line.partition(":")
        if sep:
            current[name] = value
    return sections


def parse_fields(value: str) -> dict[str, str]:
    """``calls=3,usec=10`` -> {"calls": "3", "usec": "10"}."""
    out = {}
    for part in value.split(","):
        k, sep, v = part.partition("=")
        if sep:
            out[k] = v
    return out


def as_map(reply: Any) -> Any:
    """A RESP2 flat array of pairs (as MEMORY STATS answers) -> dict, recursively; other values unchanged."""
    if isinstance(reply, list) and len(reply) % 2 == 0 and all(isinstance(k, bytes) for k in reply[::2]):
        return {k.decode(errors="replace"): as_map(v) for k, v in zip(reply[::2], reply[1::2], strict=True)}
    if isinstance(reply, bytes):
        return reply.decode(errors="replace")
    return reply


def _num(value: Any, default: float = 0.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def human_bytes(n: float) -> str:
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.0f} {units[i]}" if i == 0 else f"{n:.1f} {units[i]}"


def human_num(n: float | None) -> str:
    if n is None:
        return "-"
    a = abs(n)
    if a >= 1e9:
        return f"{n / 1e9:.2f}G"
    if a >= 1e6:
        return f"{n / 1e6:.2f}M"
    if a >= 1e4:
        return f"{n / 1e3:.1f}k"
    return f"{n:.0f}" if a >= 100 or float(n).is_integer() else f"{n:.2f}"


def human_usec(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} µs"


def level_style(ratio: float) -> str:
    return "green" if ratio < 0.7 else "yellow" if ratio < 0.9 else "red"


class Poller:
    """Polls one server and keeps the previous sample for rates."""

    def __init__(self, host: str, port: int, password: str | None, timeout: float = 5.0) -> None:
        self.host, self.port, self.password, self.timeout = host, port, password, timeout
        self.client: FastClient | None = None
        self.prev: tuple[float, dict[str, dict[str, str]]] | None = None

    def _connect(self) -> FastClient:
        return FastClient(self.host, self.port, timeout=self.timeout, password=self.password or None)

    def poll(self) -> dict[str, Any]:
        if self.client is None:
            self.client = self._connect()
        try:
            info = parse_info(self.client.call("INFO", "everything").decode(errors="replace"))
            try:
                memory = as_map(self.client.call("MEMORY", "STATS"))
            except RespError:
                memory = {}
        except (OSError, ConnectionError):
            self.client.close()
            self.client = None
            raise
        now = time.monotonic()
        prev, self.prev = self.prev, (now, info)
        return {"info": info, "memory": memory if isinstance(memory, dict) else {}, "prev": prev, "now": now}

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def _rate(sample: dict[str, Any], section: str, field: str) -> float | None:
    prev = sample["prev"]
    if prev is None:
        return None
    dt = sample["now"] - prev[0]
    if dt <= 0:
        return None
    before = prev[1].get(section, {}).get(field)
    after = sample["info"].get(section, {}).get(field)
    if before is None or after is None:
        return None
    return max(0.0, (_num(after) - _num(before)) / dt)


def _bar(ratio: float, width: int = 16) -> Any:
    from rich.text import Text

    filled = max(0, min(width, round(ratio * width)))
    return Text("█" * filled, style=level_style(ratio)) + Text("░" * (width - filled), style="grey35")


def render(sample: dict[str, Any], target: str) -> Any:
    """A rich renderable for one sample."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    info = sample["info"]
    srv = info.get("server", {})
    stats = info.get("stats", {})
    mem = info.get("memory", {})
    clients = info.get("clients", {})
    keyspace = info.get("keyspace", {})
    keys = sum(int(parse_fields(v).get("keys", 0)) for k, v in keyspace.items() if k.startswith("db"))
    hits, misses = _num(stats.get("keyspace_hits")), _num(stats.get("keyspace_misses"))
    ratio = f"{100 * hits / (hits + misses):.1f}%" if hits + misses else "-"
    ops = _rate(sample, "stats", "total_commands_processed")
    net_in = _rate(sample, "stats", "total_net_input_bytes")
    net_out = _rate(sample, "stats", "total_net_output_bytes")
    version = srv.get("kvstrata_version") or srv.get("redis_version", "?")
    head = Text.assemble(
        ("kvstrata top ", "bold cyan"), (f"{target}  v{version}  up {srv.get('uptime_in_seconds', '?')}s\n", "dim"),
        ("keys ", "dim"), (f"{keys:,}", "bold"), ("   ops/s ", "dim"), (human_num(ops), "bold"),
        ("   hit ratio ", "dim"), (ratio, "bold"), ("   clients ", "dim"), (clients.get("connected_clients", "-"), "bold"),
        ("   net in/s ", "dim"), (human_bytes(net_in) if net_in is not None else "-", "bold"),
        ("   out/s ", "dim"), (human_bytes(net_out) if net_out is not None else "-", "bold"),
        ("   version ", "dim"), (stats.get("current_version", "-"), "bold"),
    )

    tiers = Table(title="Tiers", expand=True, title_justify="left", title_style="bold")
    for col in ("tier", "water level", "used", "budget", "keys", "hits", "misses", "promoted", "demoted", "evicted",
                "corrupt"):
        tiers.add_column(col, justify="left" if col in ("tier", "water level") else "right", no_wrap=True)
    tier_sections = [(name[5:], sec) for name, sec in info.items() if name.startswith("tier_")]
    if not tier_sections and mem:  # Redis: one memory "tier"
        tier_sections = [("memory", {"used": mem.get("used_memory", 0), "budget": mem.get("maxmemory", 0)})]
    for name, sec in tier_sections:
        used, budget = _num(sec.get("used")), _num(sec.get("budget"))
        r = used / budget if budget else 0.0
        tiers.add_row(
            Text(name, style="bold"), _bar(r) + Text(f" {100 * r:5.1f}%", style=level_style(r)),
            human_bytes(used), human_bytes(budget) if budget else "-", human_num(_num(sec.get("keys"), 0)),
            human_num(_num(sec.get("hits"))), human_num(_num(sec.get("misses"))),
            human_num(_num(sec.get("promotions"))), human_num(_num(sec.get("demotions"))),
            human_num(_num(sec.get("evictions"))),
            Text(human_num(_num(sec.get("corrupt_reads"))), style="red" if _num(sec.get("corrupt_reads")) else ""),
        )

    cmds = Table(title="Commands", expand=True, title_justify="left", title_style="bold")
    for col in ("command", "calls", "calls/s", "errors", "avg", "p50", "p99", "p99.9"):
        cmds.add_column(col, justify="left" if col == "command" else "right")
    lat = info.get("latencystats", {})
    rows = []
    for field, value in info.get("commandstats", {}).items():
        name = field.removeprefix("cmdstat_")
        f = parse_fields(value)
        rows.append((int(_num(f.get("calls"))), name, f, parse_fields(lat.get(f"latency_percentiles_usec_{name}", ""))))
    rows.sort(key=lambda r: (-r[0], r[1]))
    for calls, name, f, p in rows[:15]:
        rate = None
        prev = sample["prev"]
        if prev is not None:
            before = parse_fields(prev[1].get("commandstats", {}).get(f"cmdstat_{name}", "")).get("calls", "0")
            dt = sample["now"] - prev[0]
            rate = max(0.0, (calls - _num(before)) / dt) if dt > 0 else None
        failed = int(_num(f.get("failed_calls")))
        cmds.add_row(name, f"{calls:,}", human_num(rate), Text(str(failed), style="red" if failed else ""),
                     human_usec(_num(f.get("usec_per_call"))),
                     *(human_usec(_num(p[q])) if q in p else "-" for q in ("p50", "p99", "p99.9")))

    prefetch = Text.assemble(
        ("queue depth ", "dim"), (stats.get("prefetch_queue_depth", "-"), "bold"),
        ("   queued ", "dim"), (stats.get("prefetch_queued", "-"), "bold"),
        ("   promoted ", "dim"), (stats.get("prefetch_done", "-"), "bold"),
        ("   dropped ", "dim"), (stats.get("prefetch_dropped", "-"), "bold"),
        ("   expired ", "dim"), (stats.get("expired_keys", "-"), "bold"),
        ("   evicted ", "dim"), (stats.get("evicted_keys", "-"), "bold"),
    )
    pf = sample["info"].get("prefetch", {})
    if pf:
        prefetch.append_text(Text.assemble(
            ("\nissued ", "dim"), (pf.get("prefetch_issued", "-"), "bold"),
            ("   used ", "dim"), (pf.get("prefetch_used", "-"), "bold"),
            ("   late ", "dim"), (pf.get("prefetch_late", "-"), "bold"),
            ("   wasted ", "dim"), (pf.get("prefetch_wasted", "-"), "bold"),
            ("   accuracy ", "dim"), (pf.get("prefetch_accuracy", "-"), "bold"),
            ("   coverage ", "dim"), (pf.get("prefetch_coverage", "-"), "bold"),
        ))
    parts: list[Any] = [Panel(head, border_style="cyan"), tiers, cmds, Panel(prefetch, title="Prefetch and expiry",
                                                                           title_align="left")]
    top = sample["memory"].get("prefixes.top-by-bytes")
    if isinstance(top, dict) and top:
        pre = Table(title="Top key prefixes by bytes (DRAM, sampled)", expand=True, title_justify="left",
                    title_style="bold")
        pre.add_column("prefix")
        pre.add_column("keys", justify="right")
        pre.add_column("bytes", justify="right")
        for prefix, v in top.items():
            v = v if isinstance(v, dict) else {}
            pre.add_row(prefix if prefix == "(no prefix)" else prefix + "*", human_num(_num(v.get("keys"))),
                        human_bytes(_num(v.get("bytes"))))
        parts.append(pre)
    return Group(*parts)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvstrata top", description="A live terminal view of a kvstrata server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6379)
    parser.add_argument("--password", default=None,
                        help="requirepass of the server (default: $KVSTRATA_PASSWORD or $REDISCLI_AUTH)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    parser.add_argument("--once", action="store_true", help="print one view (after two polls, for rates) and exit")
    args = parser.parse_args(argv)
    password = args.password or os.environ.get("KVSTRATA_PASSWORD") or os.environ.get("REDISCLI_AUTH")
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError:
        print("kvstrata top needs the 'rich' package (pip install rich)", file=sys.stderr)
        return 1
    console = Console()
    target = f"{args.host}:{args.port}"
    poller = Poller(args.host, args.port, password)
    interval = max(0.1, args.interval)
    try:
        if args.once:
            poller.poll()
            time.sleep(min(interval, 1.0))
            console.print(render(poller.poll(), target))
            return 0
        with Live(console=console, auto_refresh=False, screen=console.is_terminal) as live:
            while True:
                try:
                    live.update(render(poller.poll(), target), refresh=True)
                except (OSError, ConnectionError) as exc:
                    from rich.text import Text

                    live.update(Text(f"kvstrata top: {target}: {exc}; retrying", style="red"), refresh=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    except RespError as exc:
        print(f"kvstrata top: {target}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"kvstrata top: cannot connect to {target}: {exc}", file=sys.stderr)
        return 1
    finally:
        poller.close()
