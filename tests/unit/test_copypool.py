"""CopyPool (kvstrata.client.copypool): parallel copies byte-identical to numpy's own for any shape, dtype,
stride and thread count; errors raised on a helper thread reach the caller; helpers end with close() (and with
a pool dropped without it), and a forked child copies without its parent's helpers."""

from __future__ import annotations

import gc
import os
import signal
import threading
import warnings

import numpy as np
import pytest
from tests.integration.polling import wait_for

from kvstrata.client import copypool
from kvstrata.client.copypool import CopyPool, _Job, copy_threads, split
from kvstrata.client.filler import _copied, _copy_along, _Filler

THREADS = (1, 2, 3, 4)


def _helpers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kvstrata-copy-")]


def _chunks(rng: np.random.Generator, dtype: str, shape: tuple[int, ...], n: int) -> list[np.ndarray]:
    """``n`` chunks of ``shape`` (token axis 3), the first at an odd byte offset as an arena payload is."""
    out = []
    for k in range(n):
        a = rng.integers(0, 255, size=int(np.prod(shape)) * np.dtype(dtype).itemsize + 85, dtype=np.uint8)
        out.append(a[85 if k == 0 else 0:][:int(np.prod(shape)) * np.dtype(dtype).itemsize]
                   .view(dtype).reshape(shape))
    return out


@pytest.fixture
def pools():
    made: list[CopyPool] = []

    def make(threads: int) -> CopyPool:
        pool = CopyPool(threads, min_bytes=0, min_piece=1024)  # every copy shared, however small
        made.append(pool)
        return pool

    yield make
    for p in made:
        p.close()


@pytest.mark.parametrize("dtype", ["float32", "uint16", "float16", "int8", "float64"])
@pytest.mark.parametrize("threads", THREADS)
def test_restored_bytes_equal_the_stored_ones(pools, monkeypatch, dtype: str, threads: int) -> None:
    rng = np.random.default_rng(threads)
    pool = pools(threads)
    shape = (5, 2, 3, 64, 48)
    chunks = _chunks(rng, dtype, shape, 3)
    want = np.concatenate(chunks, axis=3)
    # a fresh destination; one with room to spare (a strided slice of it); last axis strided (no byte views)
    fresh = np.empty(want.shape, dtype)
    roomy = np.zeros((5, 2, 3, 250, 48), dtype)
    wide = np.zeros((5, 2, 3, 192, 96), dtype)
    for out in (fresh, roomy, wide[..., ::2]):
        for piece in (1024, 50_000):  # pieces cut along inner axes too, and along the outer ones only
            monkeypatch.setattr(copypool, "MAX_PIECE", piece)
            out[...] = 0
            got = _copy_along(chunks, out, 3, pool)
            assert got.shape == want.shape and np.shares_memory(got, out)
            assert got.tobytes() == want.tobytes()
    assert not roomy[:, :, :, 192:].any() and not wide[..., 1::2].any()  # nothing written outside


def test_one_and_several_threads_give_identical_results(pools) -> None:
    rng = np.random.default_rng(7)
    chunks = _chunks(rng, "uint16", (8, 2, 4, 128, 64), 6)
    results = []
    for threads in THREADS:
        out = np.empty((8, 2, 4, 768, 64), np.uint16)
        _copy_along(chunks, out, 3, pools(threads))
        copies = _copied(chunks, pools(threads))
        results.append((out.tobytes(), [c.tobytes() for c in copies]))
        assert all(not np.shares_memory(c, s) for c, s in zip(copies, chunks, strict=True))
    assert all(r == results[0] for r in results[1:])
    assert results[0][0] == np.concatenate(chunks, axis=3).tobytes()


def test_the_filler_shares_each_chunk_copy(pools) -> None:
    rng = np.random.default_rng(3)
    chunks = _chunks(rng, "float32", (4, 2, 2, 32, 16), 4)
    out = np.zeros((4, 2, 2, 160, 16), np.float32)
    filler = _Filler(out, 3, copies=pools(3))
    filler.extend(chunks)
    assert filler.filled().tobytes() == np.concatenate(chunks, axis=3).tobytes() and not out[:, :, :, 128:].any()
    assert len(_helpers()) >= 2  # the copies were shared, not made on the caller alone


def test_overlapping_and_broadcast_pairs_copy_as_numpy_does(pools) -> None:
    pool = pools(4)
    a = np.arange(4096, dtype=np.int32)
    b = a.copy()
    pool.copy([(a[1:], a[:-1])])
    np.copyto(b[1:], b[:-1])
    assert np.array_equal(a, b)
    dst = np.zeros((64, 64), np.float32)
    pool.copy([(dst, np.arange(64, dtype=np.float32))])
    assert np.array_equal(dst, np.broadcast_to(np.arange(64, dtype=np.float32), (64, 64)))


def test_split_covers_every_byte_once() -> None:
    a = np.zeros((3, 2, 5, 7, 11), np.uint8)
    for piece in (1, 7, 100, 500, 10_000):
        parts = split(a, a, piece)
        for d, _ in parts:
            d += 1
        assert (a == 1).all(), piece
        a[...] = 0
        assert max(d.nbytes for d, _ in parts) <= 2 * piece  # a part: up to a piece and one row of its axis


def test_an_error_on_a_helper_reaches_the_caller_and_the_helper_lives_on(pools) -> None:
    pool = pools(2)
    pool.copy([(np.empty(1 << 16, np.uint8), np.ones(1 << 16, np.uint8))])  # helpers running
    ro = np.zeros((4, 1024), np.uint8)
    ro.flags.writeable = False
    job = _Job([(ro[k], np.ones(1024, np.uint8)) for k in range(4)])
    pool._start().put(job)  # only the helper works on it
    wait_for(lambda: job.error is not None and not job.busy, what="the helper's piece to fail")
    assert job.next == 1  # after a failed piece no other is started
    with pytest.raises(ValueError, match="read-only"):
        job.wait()
    assert not ro.any()
    src = np.arange(1 << 20, dtype=np.uint8)
    dst = np.empty_like(src)
    pool.copy([(dst, src)])  # the helper still serves copies
    assert np.array_equal(dst, src)


def test_an_error_in_a_shared_copy_is_raised_after_every_piece_stopped(pools) -> None:
    pool = pools(4)
    dst = np.zeros((16, 4096), np.float32)
    with pytest.raises(TypeError):  # casting="no": a float64 source is refused, whichever thread hits it
        pool.copy([(dst, np.ones((16, 4096), np.float64))])
    ro = np.zeros((16, 4096), np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        pool.copy([(ro, np.ones_like(ro))])
    src = np.ones((16, 4096), np.float32)
    pool.copy([(dst, src)])
    assert np.array_equal(dst, src)


def test_helpers_end_with_close_and_with_a_dropped_pool() -> None:
    before = set(_helpers())
    pool = CopyPool(3, min_bytes=0, min_piece=1024)
    src = np.ones(1 << 20, np.uint8)
    pool.copy([(np.empty_like(src), src)])
    mine = set(_helpers()) - before
    assert len(mine) == 2
    pool.close()
    assert not any(t.is_alive() for t in mine)
    dst = np.empty_like(src)
    pool.copy([(dst, src)])  # a closed pool still copies (helpers started again, then ended again)
    assert np.array_equal(dst, src)
    again = set(_helpers()) - before
    pool.close()
    assert not any(t.is_alive() for t in again)

    dropped = CopyPool(2, min_bytes=0, min_piece=1024)
    dropped.copy([(np.empty_like(src), src)])
    orphans = set(_helpers()) - before
    assert len(orphans) == 1
    del dropped
    gc.collect()
    wait_for(lambda: not any(t.is_alive() for t in orphans), what="a dropped pool's helper to end")


def test_below_min_bytes_or_one_thread_no_helper_starts() -> None:
    before = set(_helpers())
    src = np.ones(1 << 20, np.uint8)
    for pool in (CopyPool(4, min_bytes=2 << 20, min_piece=1024), CopyPool(1, min_bytes=0, min_piece=1024)):
        dst = np.empty_like(src)
        pool.copy([(dst, src)])
        assert np.array_equal(dst, src) and set(_helpers()) == before
        pool.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_copies_without_its_parents_helpers(pools) -> None:
    pool = pools(3)
    src = np.arange(1 << 20, dtype=np.uint8)
    pool.copy([(np.empty_like(src), src)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a threaded process: the point here
        pid = os.fork()
    if pid == 0:
        try:
            dst = np.empty_like(src)
            pool.copy([(dst, src)])
            helpers = len(_helpers())
            pool.close()
            os._exit(0 if np.array_equal(dst, src) and helpers == 2 else 1)
        finally:
            os._exit(2)
    status = None
    try:
        _, status = wait_for(lambda: (r := os.waitpid(pid, os.WNOHANG))[0] and r, timeout=30,
                             what="the forked child to exit")
    finally:
        if status is None:  # hung: do not leave it behind
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_copy_threads_option(monkeypatch) -> None:
    monkeypatch.delenv("KVSTRATA_COPY_THREADS", raising=False)
    assert copy_threads(None) == max(1, min(4, copypool.usable_cpus()))
    assert copy_threads(3) == 3
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="copy_threads"):
            copy_threads(bad)  # type: ignore[arg-type]
    monkeypatch.setenv("KVSTRATA_COPY_THREADS", "3")
    assert copy_threads(None) == 3 and copy_threads(1) == 1  # the argument wins over the environment
    for bad in ("0", "two", "-4"):
        monkeypatch.setenv("KVSTRATA_COPY_THREADS", bad)
        with pytest.raises(ValueError, match="KVSTRATA_COPY_THREADS"):
            copy_threads(None)
