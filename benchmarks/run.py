#!/usr/bin/env python3
"""Run benchmarks and write their sections of BENCHMARKS.md (one command for all of them).

    python benchmarks/run.py                 # every benchmark
    python benchmarks/run.py small ssd       # some; other sections of BENCHMARKS.md are kept

Each benchmark is `kvstrata bench NAME --json` (extra arguments per benchmark below); its module's
`write_markdown(result)` renders the section, which replaces the one between `<!-- bench:NAME -->` markers.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "BENCHMARKS.md"
ARGS: dict[str, list[str]] = {
    "small": ["--repeats", "3"],
    "hitrate": ["--trace", "all"],
    "ssd": [],
    "chat": ["--model", "smollm2"],
    "large": [],
    "pool": [],
    "prefetch": ["--slow-ssd-ms", "16", "--live"],
}
HEADER = (
    "# Benchmarks\n\n"
    "Written by `python benchmarks/run.py [NAME ...]`; each section names its command and machine. The machines\n"
    "here are shared and noisy: every figure is a median over repeats, and comparisons are ratios against a peer\n"
    "measured in the same run.\n"
)


def run_one(name: str) -> str:
    cmd = [sys.executable, "-m", "kvstrata", "bench", name, "--json", *ARGS.get(name, [])]
    print("running:", " ".join(cmd), file=sys.stderr)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, cwd=ROOT).stdout
    result = json.loads(out)
    module = importlib.import_module(f"kvstrata.bench.{name}")
    return module.write_markdown(result).strip() + "\n"


def update(text: str, name: str, section: str) -> str:
    block = f"<!-- bench:{name} -->\n{section}<!-- /bench:{name} -->\n"
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->\n.*?<!-- /bench:{re.escape(name)} -->\n", re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text)
    return text.rstrip("\n") + "\n\n" + block


def main(argv: list[str]) -> int:
    names = argv or list(ARGS)
    text = TARGET.read_text() if TARGET.exists() else HEADER
    for name in names:
        text = update(text, name, run_one(name))
        TARGET.write_text(text)
    print(f"updated {TARGET}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
