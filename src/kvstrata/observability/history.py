"""The once-a-second sampler: short time series for the dashboard's charts and the LATENCY monitor's events.

It runs as a background task on the server's loop and reads the same plain counters as a snapshot, so the
per-command path does nothing for it. Each sample costs O(number of commands).

The LATENCY monitor is kvstrata's equivalent of Redis's: an *event* is a command name, and each second in
which some call of that command took at least ``latency-monitor-threshold`` milliseconds records one point.
A point's latency is the upper bound (in ms, rounded down) of the slowest power-of-two bucket that grew in
that second, so it is within a factor of two above the slowest call.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from kvstrata.observability.snapshot import hits_misses

HISTORY_POINTS = 300  # five minutes of one-second samples for the charts
LATENCY_POINTS = 160  # per event, as Redis keeps


class LatencyEvent:
    __slots__ = ("max_ms", "points")

    def __init__(self) -> None:
        self.points: deque[tuple[int, int]] = deque(maxlen=LATENCY_POINTS)
        self.max_ms = 0


class History:
    def __init__(self, server: Any, capacity: int = HISTORY_POINTS) -> None:
        self.server = server
        self.series: dict[str, deque[Any]] = {
            name: deque(maxlen=capacity)
            for name in ("t", "ops", "hit_ratio", "net_in", "net_out", "prefetch_promoted", "clients")
        }
        self.tier_used: dict[str, deque[int]] = {}
        self._prev: dict[str, float] | None = None
        self._prev_mono = 0.0
        self._prev_hist: dict[Any, list[int]] = {}
        self.events: dict[str, LatencyEvent] = {}

    # ---- sampling ----
    def _counters(self) -> dict[str, float]:
        srv = self.server
        hits, misses = hits_misses(srv.store)
        return {
            "commands": srv.commands_processed,
            "hits": hits,
            "misses": misses,
            "net_in": srv.stats.net_in,
            "net_out": srv.stats.net_out,
            "promoted": srv.store.stats.prefetch_done,
        }

    def sample(self, now: float | None = None, mono: float | None = None) -> None:
        """Take one sample; ``now`` (wall seconds) and ``mono`` (monotonic seconds) are for tests."""
        now = time.time() if now is None else now
        mono = time.monotonic() if mono is None else mono
        cur = self._counters()
        prev, self._prev = self._prev, cur
        dt, self._prev_mono = mono - self._prev_mono, mono
        self._sample_latency(int(now))
        if prev is None or dt <= 0:
            return
        delta = {k: cur[k] - prev[k] for k in cur}
        if any(v < 0 for v in delta.values()):  # CONFIG RESETSTAT: start over from here
            return
        s = self.series
        s["t"].append(round(now, 3))
        s["ops"].append(round(delta["commands"] / dt, 2))
        lookups = delta["hits"] + delta["misses"]
        s["hit_ratio"].append(round(delta["hits"] / lookups, 4) if lookups else None)
        s["net_in"].append(round(delta["net_in"] / dt, 1))
        s["net_out"].append(round(delta["net_out"] / dt, 1))
        s["prefetch_promoted"].append(round(delta["promoted"] / dt, 2))
        s["clients"].append(len(self.server.clients))
        store = self.server.store
        tiers = [("dram", store.dram.used)] + ([("ssd", store.ssd.used)] if store.ssd is not None else [])
        for name, used in tiers:
            series = self.tier_used.get(name)
            if series is None:
                series = self.tier_used[name] = deque([None] * (len(s["t"]) - 1), maxlen=s["t"].maxlen)
            series.append(used)

    def _sample_latency(self, now: int) -> None:
        threshold_ms = int(self.server.config.get("latency-monitor-threshold"))
        prev_hist = self._prev_hist
        for spec, st in self.server.command_counts.items():
            hist = st.hist
            old = prev_hist.get(spec)
            if old == hist:
                continue
            prev_hist[spec] = list(hist)
            if old is None or threshold_ms <= 0:
                continue
            top = -1
            for i in range(len(hist) - 1, -1, -1):
                if hist[i] > old[i]:
                    top = i
                    break
            if top < 0:
                continue  # only shrank: a reset
            ms = 2**top // 1000
            if ms >= threshold_ms:
                event = self.events.get(spec.full_name)
                if event is None:
                    event = self.events[spec.full_name] = LatencyEvent()
                event.points.append((now, ms))
                event.max_ms = max(event.max_ms, ms)

    # ---- LATENCY commands ----
    def instantaneous(self) -> tuple[float, float, float]:
        """(commands/s, KiB/s received, KiB/s sent) over the last second sampled, for INFO stats' instantaneous_*
        fields (Redis averages 1.6 s of samples); zeros before the first second."""
        s = self.series
        if not s["ops"]:
            return 0.0, 0.0, 0.0
        return s["ops"][-1], s["net_in"][-1] / 1024, s["net_out"][-1] / 1024

    def latest(self) -> list[list[Any]]:
        """LATENCY LATEST: ``[event, time of latest point, latest ms, all-time max ms]`` per event."""
        out = []
        for name, ev in sorted(self.events.items()):
            if ev.points:
                t, ms = ev.points[-1]
                out.append([name, t, ms, ev.max_ms])
        return out

    def history(self, name: str) -> list[list[int]]:
        ev = self.events.get(name)
        return [[t, ms] for t, ms in ev.points] if ev is not None else []

    def reset(self, names: list[str] | None = None) -> int:
        if not names:
            n = len(self.events)
            self.events.clear()
            return n
        return sum(1 for name in set(names) if self.events.pop(name, None) is not None)

    # ---- for /stats.json ----
    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"interval_seconds": 1}
        for name, series in self.series.items():
            out[name] = list(series)
        out["tier_used_bytes"] = {name: list(series) for name, series in self.tier_used.items()}
        return out
