"""``kvstrata check --essd-path DIR [--repair]``: verify every record of an SSD tier, optionally salvage it."""

from __future__ import annotations

import argparse
import sys

from kvstrata.config import PARAMS_BY_NAME
from kvstrata.sizes import parse_size


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="kvstrata check",
        description="Read and verify every record of an SSD tier (exit status 0: clean, 1: damage found). "
                    "With --repair, copy every readable record into a fresh tier that replaces it (the damaged "
                    "one is kept beside it). Stop the server first.")
    parser.add_argument("--essd-path", required=True, metavar="DIR")
    parser.add_argument("--repair", action="store_true")
    parser.add_argument("--essd-size", default=None, metavar="SIZE",
                        help="budget of the repaired tier (default: the server's default)")
    args = parser.parse_args(argv)
    from kvstrata.engine.tiers.ssd_check import check, repair

    try:
        if args.repair:
            size = parse_size(args.essd_size) if args.essd_size else PARAMS_BY_NAME["essd-size"].default
            report = repair(args.essd_path, int(size))
        else:
            report = check(args.essd_path)[0]
    except (OSError, ValueError) as exc:
        print(f"kvstrata check: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    return 0 if report.clean or args.repair else 1
