"""Where streaming stores pay: the native copy (kvstrata.native.ntcopy) against numpy's copy, by size, with the
destination read right after the copy (as a caller that uses what it restored) and without.

For each size a buffer pair is copied many times round-robin over enough distinct buffers that the source is not
in cache at the start of each copy (a restore reads memory, not cache); ``copy+read`` then sums the destination
(one read pass: a streamed destination comes back from memory, an ordinary one may still be in cache). Timed
interleaved, alternating order, medians; ratios > 1 mean the native copy is faster.

    PYTHONPATH=src python3 benchmarks/ntcopy_threshold.py --sizes 64k,256k,1m,4m,16m
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from kvstrata.client import streamcopy
from kvstrata.native import ntcopy

UNITS = {"k": 1024, "m": 1024 * 1024}
SPAN = 256 * 1024 * 1024  # bytes of sources cycled through: larger than any last-level cache here


def _size(text: str) -> int:
    text = text.strip().lower()
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def _copies(kind: str, read: bool, srcs: np.ndarray, dsts: np.ndarray, batch: range) -> None:
    for i in batch:
        if kind == "numpy":
            np.copyto(dsts[i], srcs[i])
        elif not streamcopy.stream(dsts[i], srcs[i]):
            raise RuntimeError("the native copy did not take a contiguous copy")
        if read:
            int(dsts[i].sum(dtype=np.uint64))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64k,256k,1m,4m,16m")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    native = ntcopy.NATIVE
    if native is None:
        sys.exit(f"no native copy here: {ntcopy.WHY}")
    print(f"native loop {native.level}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'size':>8} {'copy native/numpy':>18} {'copy+read native/numpy':>23}")
    for size in (_size(s) for s in args.sizes.split(",")):
        count = max(2, SPAN // size)
        srcs = np.random.default_rng(0).integers(0, 256, (count, size), dtype=np.uint8)
        dsts = np.ones((count, size), np.uint8)
        step = max(1, count // max(1, (64 * 1024 * 1024) // size))  # about 64 MB moved per timing
        batch = range(0, count, step)

        modes = [(kind, read) for read in (False, True) for kind in ("numpy", "native")]
        times: dict[tuple[str, bool], list[float]] = {m: [] for m in modes}
        for rnd in range(args.rounds + 1):
            for m in (modes if rnd % 2 == 0 else modes[::-1]):
                t0 = time.perf_counter()
                _copies(*m, srcs, dsts, batch)
                if rnd:
                    times[m].append(time.perf_counter() - t0)
        if not np.array_equal(dsts[batch[-1]], srcs[batch[-1]]):
            sys.exit("the copy is wrong")
        med = {m: statistics.median(v) for m, v in times.items()}
        print(f"{size // 1024:>7}K {med['numpy', False] / med['native', False]:>18.2f} "
              f"{med['numpy', True] / med['native', True]:>23.2f}")


if __name__ == "__main__":
    main()
