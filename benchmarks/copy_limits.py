#!/usr/bin/env python3
"""What a local store can cost at best on this machine: the copies a two-phase write is made of.

    python benchmarks/copy_limits.py [--mb 88] [--repeats 7] [--json]

Medians of ``--repeats`` rounds in alternating order, one process unless said otherwise:

* ``memcpy``: numpy copy into anonymous memory (what ``kvstrata bench restore``'s memcpy does; numpy asks for
  transparent huge pages for large arrays);
* ``memcpy-memfd``: the same copy into a memfd mapping (shared memory: the arena, a staging segment), which
  gets huge pages only where the kernel's shmem THP setting allows;
* ``copy+hash``: a copy into the memfd with each 256 KiB piece hashed (xxh3-64) right after it is copied, as
  a two-phase write does on both sides;
* ``memcpy-fresh-memfd``: the copy into the memfd after its pages were given back (``MADV_REMOVE``): what a
  write into never-touched (or trimmed) shared memory costs, page faults and zero-filling included;
* ``memcpy-2proc``: the same memcpy in two processes at once (does a second core add bandwidth?);
* ``process_vm_readv``: one process copying another's memory with the kernel's cross-memory attach.

The two-phase store (docs/dataplane.md) is two ``copy+hash`` passes, one per process; ``memcpy-2proc`` says
whether they can overlap here.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import sys
import time

import numpy as np
import xxhash

PIECE = 256 * 1024


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _copy_hash(dst: memoryview, src: memoryview) -> int:
    h = xxhash.xxh3_64()
    for o in range(0, len(src), PIECE):
        e = min(o + PIECE, len(src))
        dst[o:e] = src[o:e]
        h.update(dst[o:e])
    return h.intdigest()


def _parallel_memcpy(src: np.ndarray, dst: np.ndarray, repeats: int) -> float:
    """Median memcpy time in this process while a forked child runs the same loop."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child copies too, for as long as the parent measures
        os.close(r)
        os.write(w, b"go")
        for _ in range(repeats + 2):
            np.copyto(dst, src)
        os._exit(0)
    os.close(w)
    os.read(r, 2)
    try:
        return statistics.median(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    finally:
        os.waitpid(pid, 0)
        os.close(r)


def _vm_readv(n: int, repeats: int) -> float | None:
    """Median time for this process to copy ``n`` bytes out of a child's memory (process_vm_readv)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "process_vm_readv", None)
    if fn is None:
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                   ctypes.c_ulong]
    src = np.random.default_rng(1).integers(0, 255, n, dtype=np.uint8)
    dst = np.ones(n, np.uint8)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child only keeps its copy of ``src`` alive until the parent is done
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        local, remote = _Iovec(dst.ctypes.data, n), _Iovec(src.ctypes.data, n)
        times = []
        for _ in range(repeats + 1):
            t = time.perf_counter()
            got = fn(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            times.append(time.perf_counter() - t)
            if got != n:
                return None  # not permitted here (ptrace rules, seccomp)
        return statistics.median(times[1:])
    finally:
        os.write(w, b"x")
        os.waitpid(pid, 0)
        os.close(w)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=88)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    n = args.mb << 20
    src = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
    anon = np.ones(n, np.uint8)
    fd = os.memfd_create("copy-limits")
    os.ftruncate(fd, n)
    mm = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    shm = np.frombuffer(mm, np.uint8)
    shm[:] = 1  # touched: no mode pays page faults
    modes = {
        "memcpy": lambda: np.copyto(anon, src),
        "memcpy-memfd": lambda: np.copyto(shm, src),
        "copy+hash": lambda: _copy_hash(memoryview(shm), memoryview(src)),
        "memcpy-fresh-memfd": lambda: np.copyto(shm, src),
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    for rnd in range(args.repeats + 1):
        order = list(modes) if rnd % 2 else list(modes)[::-1]
        for m in order:
            if m == "memcpy-fresh-memfd":
                mm.madvise(mmap.MADV_REMOVE, 0, n)  # the pages go back; the timed copy touches fresh ones
            dt = _timed(modes[m])
            if rnd:
                times[m].append(dt)
    result = {m: statistics.median(v) for m, v in times.items()}
    result["memcpy-2proc"] = _parallel_memcpy(src, anon, args.repeats)
    vm = _vm_readv(n, args.repeats)
    if vm is not None:
        result["process_vm_readv"] = vm
    base = result["memcpy"]
    out = {"mb": args.mb, "ms": {m: round(t * 1e3, 1) for m, t in result.items()},
           "x_memcpy": {m: round(t / base, 2) for m, t in result.items()}}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for m, t in result.items():
            print(f"{m:18} {t * 1e3:7.1f} ms  {t / base:5.2f}x memcpy")
    shm = None  # type: ignore[assignment]
    mm.close()
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
