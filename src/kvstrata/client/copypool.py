"""Parallel copies for restores: the chunk copies of a large restore shared by a few persistent threads.

numpy's ``copyto`` releases the GIL while it moves bytes, so several threads copy at once. One core's copy is
bound by the cache misses it can keep in flight, while a host's memory serves several cores at once: on a
2-vCPU Intel Xeon VM two threads restored 1.6-1.8x as fast as one (11-15 GB/s against 8), past a one-thread
memcpy and LMCache's two-thread copy (BENCHMARKS.md, "Restore on an Intel host"). A host whose memory one core
already saturates gains nothing: on a 2-vCPU AMD EPYC VM two or four threads measured within noise of one
(BENCHMARKS.md, "Restore: parallel copy").

``CopyPool.copy(pairs)`` copies each ``(dst, src)`` pair: on the calling thread alone when the pool has one
thread or the pairs hold less than ``min_bytes`` (a hand-off costs tens of microseconds), else cut into
pieces that the caller and ``threads - 1`` helper threads take from one list until none is left. Work is
taken, not assigned, so a helper the OS does not schedule in time (a loaded host) delays the copy by at most
the one piece it holds, never by its share. The call returns only when every piece is done, and raises the
first error any of them raised. Helpers start on the first parallel copy and end with ``close()``. Each copy,
whole or piece, is ``kvstrata.client.streamcopy.copy``: streaming stores where the native helper is built (its
ctypes call releases the GIL too), numpy otherwise.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from kvstrata.client.streamcopy import copy as copy_into
from kvstrata.cpulist import usable_cpus

MiB = 1024 * 1024
DEFAULT_MIN_BYTES = 16 * MiB  # below this a copy runs on the calling thread
# Pieces: about four per thread, so that a late or slow thread leaves little for the others to wait on, but
# not smaller than 1 MiB (each piece costs a lock and a few slices, ~5 us) nor larger than 8 MiB.
MIN_PIECE = 1 * MiB
MAX_PIECE = 8 * MiB
PIECES_PER_THREAD = 4
MAX_THREADS = 4  # the default's cap


def copy_threads(value: int | None) -> int:
    """A ``copy_threads`` option checked: a positive integer; None for ``$KVSTRATA_COPY_THREADS`` when set, else
    the usable CPUs, at most 4. All of them: while a restore copies, the engine waits for that KV and the server
    has nothing to do for it (the lease was one small request); two threads measured 1.6-1.8x one on an Intel
    VM and within noise of one on an AMD one (BENCHMARKS.md), so using them costs nothing where they do not pay."""
    if value is None:
        env = os.environ.get("KVSTRATA_COPY_THREADS", "").strip()
        if not env:
            return max(1, min(MAX_THREADS, usable_cpus()))
        try:
            value = int(env)
        except ValueError:
            raise ValueError(f"KVSTRATA_COPY_THREADS must be a positive integer, not {env!r}") from None
        if value < 1:
            raise ValueError(f"KVSTRATA_COPY_THREADS must be a positive integer, not {env!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"copy_threads must be a positive integer, not {value!r}")
    return value


def byte_views(dst: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``dst`` and ``src`` as uint8 views when they allow it: a value's payload in the arena follows its header
    at an odd offset, and numpy copies misaligned arrays of wider types several times slower than bytes."""
    if (dst.ndim and src.ndim and dst.strides[-1] == dst.itemsize and src.flags.c_contiguous
            and src.dtype == dst.dtype):
        return dst.view(np.uint8), src.view(np.uint8)
    return dst, src


def copy_pair(dst: np.ndarray, src: np.ndarray) -> None:
    """One copy on this thread, through byte views where possible (``byte_views``); dtypes must match."""
    d, s = byte_views(dst, src)
    copy_into(d, s)


def split(dst: np.ndarray, src: np.ndarray, piece: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(dst, src)`` cut into parts of about ``piece`` bytes, along the outermost axes first (each part keeps
    the inner axes whole, so the runs numpy copies stay as long as they were)."""
    if dst.nbytes <= piece + piece // 2:
        return [(dst, src)]
    axis = next((k for k, n in enumerate(dst.shape) if n > 1), None)
    if axis is None:
        return [(dst, src)]
    n = dst.shape[axis]
    parts = min(n, -(-dst.nbytes // piece))
    lead = (slice(None),) * axis
    out: list[tuple[np.ndarray, np.ndarray]] = []
    for j in range(parts):
        index = (*lead, slice(j * n // parts, (j + 1) * n // parts))
        d, s = dst[index], src[index]
        if parts == n:  # one row of this axis each and still too large: cut along the next axis
            out.extend(split(d, s, piece))
        else:
            out.append((d, s))
    return out


class _Job:
    """One ``copy`` call's pieces, taken one at a time by the caller and the helpers."""

    __slots__ = ("busy", "done", "error", "lock", "next", "pieces")

    def __init__(self, pieces: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.pieces = pieces
        self.next = 0
        self.busy = 0  # pieces taken and not finished
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)

    def work(self) -> None:
        """Copy pieces until none is left (or one has failed: the rest are not started)."""
        while True:
            with self.lock:
                if self.error is not None or self.next >= len(self.pieces):
                    return
                dst, src = self.pieces[self.next]
                self.next += 1
                self.busy += 1
            try:
                copy_into(dst, src)
            except BaseException as exc:  # handed to the caller, which re-raises it
                with self.lock:
                    if self.error is None:
                        self.error = exc
            finally:
                with self.lock:
                    self.busy -= 1
                    if not self.busy:
                        self.done.notify_all()
            del dst, src

    def wait(self) -> None:
        """Until no piece is being copied (after ``work`` returned on the caller: the copy is over); raises
        the first error."""
        with self.lock:
            while self.busy:
                self.done.wait()
            self.pieces = []  # a helper that takes this job later finds nothing, and holds no caller array
            error, self.error = self.error, None
        if error is not None:
            try:
                raise error
            finally:
                del error


class CopyPool:
    """A few threads that share large copies (module docstring). ``threads``: 1 copies on the caller only."""

    def __init__(self, threads: int | None = None, min_bytes: int = DEFAULT_MIN_BYTES,
                 min_piece: int = MIN_PIECE) -> None:
        threads = copy_threads(threads)
        if min_bytes < 0 or min_piece < 1:
            raise ValueError("min_bytes must be >= 0 and min_piece >= 1")
        self.threads = threads
        self.min_bytes = min_bytes
        self.min_piece = min_piece
        self._lock = threading.Lock()
        self._helpers: list[threading.Thread] = []
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._pid = os.getpid()
        self._finalizer: weakref.finalize | None = None

    def copy(self, pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Copy every ``src`` into its ``dst`` (same dtypes; a pair whose arrays overlap, or whose shapes
        differ, is copied on this thread); returns when all are copied, raises the first error."""
        views = [byte_views(d, s) for d, s in pairs]
        if self.threads == 1 or sum(d.nbytes for d, _ in views) < self.min_bytes:
            for d, s in views:
                copy_into(d, s)
            return
        # Pairs whose pieces could not be copied apart: broadcasting (or a numpy error, raised here), or arrays
        # that overlap (a piece would read what another wrote): each as one copy, on this thread.
        apart = [d.shape == s.shape and not np.may_share_memory(d, s) for d, s in views]
        for (d, s), ok in zip(views, apart, strict=True):
            if not ok:
                copy_into(d, s)
        total = sum(d.nbytes for (d, _), ok in zip(views, apart, strict=True) if ok)
        piece = min(MAX_PIECE, max(self.min_piece, total // (self.threads * PIECES_PER_THREAD)))
        pieces = [p for (d, s), ok in zip(views, apart, strict=True) if ok for p in split(d, s, piece)]
        job = _Job(pieces)
        jobs = self._start() if len(pieces) > 1 else None
        if jobs is not None:
            for _ in range(min(self.threads - 1, len(pieces) - 1)):
                jobs.put(job)
        try:
            job.work()
        finally:
            job.wait()

    def _start(self) -> queue.SimpleQueue[_Job | None]:
        """The helpers' job queue, starting them if they are not running."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's helpers do not exist here
                self._helpers, self._jobs, self._pid = [], queue.SimpleQueue(), os.getpid()
                self._finalizer = None
            if not self._helpers:
                for k in range(self.threads - 1):
                    t = threading.Thread(target=_serve, args=(self._jobs,), name=f"kvstrata-copy-{k}",
                                         daemon=True)
                    t.start()
                    self._helpers.append(t)
                # A pool dropped without close() still ends its helpers (they hold the queue, not the pool).
                self._finalizer = weakref.finalize(self, _stop, self._jobs, len(self._helpers))
            return self._jobs

    def close(self) -> None:
        """End the helpers (each after the piece it is copying) and wait for them. A later parallel copy starts
        them again."""
        with self._lock:
            helpers, self._helpers = self._helpers, []
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            if self._pid == os.getpid():
                _stop(self._jobs, len(helpers))
            else:
                helpers = []
        for t in helpers:
            if t is not threading.current_thread():
                t.join()


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    """A helper: the jobs of its pool until told to stop (None)."""
    while True:
        job = jobs.get()
        if job is None:
            return
        job.work()
        del job  # hold no caller array while idle


def _stop(jobs: queue.SimpleQueue[_Job | None], helpers: int) -> None:
    for _ in range(helpers):
        jobs.put(None)
