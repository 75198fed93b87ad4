"""Pieces of benchmark reports shared by the benchmarks: the PASS/MISS lines and table of their targets."""

from __future__ import annotations

from collections.abc import Mapping


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def target_lines(targets: Mapping[str, bool]) -> list[str]:
    """``name: PASS`` lines for a terminal table."""
    return [f"{name}: {verdict(ok)}" for name, ok in targets.items()]


def target_table(targets: Mapping[str, bool], labels: Mapping[str, str], heading: str = "target") -> list[str]:
    """A Markdown table of the targets, each under its human label."""
    out = [f"| {heading} | result |", "|---|---|"]
    out += [f"| {labels.get(name, name)} | {verdict(ok)} |" for name, ok in targets.items()]
    return out
