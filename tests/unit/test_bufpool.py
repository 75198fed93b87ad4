"""The buffer pool: size classes, in-place length changes, leases, and never handing out a referenced buffer."""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstrata.engine.bufpool import MIN_SIZE, BufferPool, class_size, set_length
from kvstrata.engine.store import Store

MB = 1024 * 1024


def _addr(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * 1).from_buffer(buf))


@given(st.integers(min_value=MIN_SIZE, max_value=1 << 31))
def test_class_holds_the_value_and_wastes_under_a_quarter(n: int) -> None:
    c = class_size(n)
    assert n <= c
    assert (c - n) * 4 <= c
    assert n * 2 > c  # more than half: CPython shrinks/grows in place
    assert class_size(c) == c


def test_powers_of_two_waste_nothing() -> None:
    for n in (MIN_SIZE, MB, 4 * MB, 16 * MB, 64 * MB):
        assert class_size(n) == n


def test_length_changes_in_place() -> None:
    n = 3 * MB + 17
    c = class_size(n)
    buf = bytearray(c)
    a = _addr(buf)
    set_length(buf, n)
    assert len(buf) == n and _addr(buf) == a
    set_length(buf, c)
    assert len(buf) == c and _addr(buf) == a
    set_length(buf, c // 2 + 1)
    assert _addr(buf) == a


def test_export_blocks_resize() -> None:
    buf = bytearray(MB)
    view = memoryview(buf)
    with pytest.raises(BufferError):
        set_length(buf, MB - 1)
    view.release()
    set_length(buf, MB - 1)


def test_acquire_exact_length_and_reuse_same_memory() -> None:
    pool = BufferPool(64 * MB)
    buf = pool.acquire(3 * MB)
    assert len(buf) == 3 * MB and pool.leases(buf) == 1
    a = _addr(buf)
    pool.release(buf)
    again = pool.acquire(3 * MB - 100)  # same class
    assert again is buf and len(again) == 3 * MB - 100 and _addr(again) == a
    assert pool.hits == 1 and pool.misses == 1


def test_small_values_are_not_pooled() -> None:
    pool = BufferPool(64 * MB)
    buf = pool.acquire(100)
    assert len(buf) == 100 and not pool.tracked(buf)
    pool.release(buf)  # no-op
    assert pool.free_bytes == 0


def test_buffer_returns_only_when_every_lease_is_given_back() -> None:
    pool = BufferPool(64 * MB)
    buf = pool.acquire(MB)
    assert pool.retain(buf)
    pool.release(buf)
    other = pool.acquire(MB)
    assert other is not buf
    pool.release(buf)
    assert pool.acquire(MB) is buf


def test_zero_leases_waits_in_limbo_until_next_acquire() -> None:
    # GETSET: the store drops the old value, then the reply takes a lease on it.
    pool = BufferPool(64 * MB)
    buf = pool.acquire(MB)
    pool.release(buf)
    assert pool.retain(buf)  # revived before anything else was handed out
    assert pool.acquire(MB) is not buf
    pool.release(buf)
    assert pool.acquire(MB) is buf


def test_exported_buffer_is_quarantined_not_handed_out() -> None:
    pool = BufferPool(64 * MB)
    buf = pool.acquire(MB)
    view = memoryview(buf)  # e.g. a pending transport write
    pool.release(buf)
    other = pool.acquire(MB)
    assert other is not buf and pool.quarantined == 1
    view.release()
    pool.release(other)
    got = {id(pool.acquire(MB)), id(pool.acquire(MB))}
    assert id(buf) in got


def test_free_list_bounded_by_max_bytes_and_dram_room() -> None:
    pool = BufferPool(3 * MB)
    bufs = [pool.acquire(MB) for _ in range(5)]
    for b in bufs:
        pool.release(b)
    pool.acquire(MB)  # reclaims the limbo
    assert pool.free_bytes <= 3 * MB
    room = [10 * MB]
    pool = BufferPool(64 * MB, room=lambda: room[0])
    bufs = [pool.acquire(MB) for _ in range(8)]
    for b in bufs:
        pool.release(b)
    room[0] = 2 * MB
    pool.settle()
    assert pool.free_bytes <= 2 * MB
    room[0] = 0
    pool.trim()
    assert pool.free_bytes == 0


def test_forfeit_stops_tracking() -> None:
    pool = BufferPool(64 * MB)
    buf = pool.acquire(MB)
    pool.forfeit(buf)
    assert not pool.tracked(buf)
    pool.release(buf)
    assert pool.acquire(MB) is not buf


def test_store_entries_hold_leases() -> None:
    store = Store(512 * MB)
    pool = BufferPool(64 * MB)
    store.dram.bufpool = pool
    store.dram.bufpool_min = pool.min_size
    v1 = pool.acquire(MB)
    v1[:3] = b"abc"
    store.put(b"k", v1)
    pool.release(v1)  # the parser's lease
    assert pool.leases(v1) == 1
    store.put(b"k2", v1)  # another entry shares it (e.g. COPY)
    assert pool.leases(v1) == 2
    store.put(b"k", b"small")  # overwrite
    assert pool.leases(v1) == 1
    assert pool.acquire(MB) is not v1
    store.delete(b"k2")
    assert pool.leases(v1) == 0
    assert pool.acquire(MB) is v1
    v2 = pool.acquire(2 * MB)
    store.put(b"x", v2)
    pool.release(v2)
    store.flush()
    assert pool.acquire(2 * MB) is v2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["acquire", "retain", "release", "view", "unview", "settle"]),
                          st.integers(0, 7), st.integers(MIN_SIZE, 4 * MB)), max_size=80))
def test_pool_never_hands_out_a_referenced_buffer(ops: list[tuple[str, int, int]]) -> None:
    """Model every holder: a buffer handed out must have no lease and no export in the model."""
    pool = BufferPool(16 * MB)
    leases: dict[int, int] = {}  # id -> leases the model holds
    views: dict[int, list[memoryview]] = {}
    live: list[bytearray] = []
    for op, pick, size in ops:
        if op == "acquire" or not live:
            buf = pool.acquire(size)
            assert len(buf) == size
            assert leases.get(id(buf), 0) == 0, "handed out a buffer that still has a lease"
            assert not views.get(id(buf)), "handed out a buffer that is still exported"
            if all(b is not buf for b in live):
                live.append(buf)
            leases[id(buf)] = 1
            continue
        buf = live[pick % len(live)]
        if op == "retain" and leases.get(id(buf), 0) > 0:
            assert pool.retain(buf)
            leases[id(buf)] += 1
        elif op == "release" and leases.get(id(buf), 0) > 0:
            pool.release(buf)
            leases[id(buf)] -= 1
        elif op == "view":
            views.setdefault(id(buf), []).append(memoryview(buf))
        elif op == "unview" and views.get(id(buf)):
            views[id(buf)].pop().release()
        elif op == "settle":
            pool.settle()
        assert pool.leases(buf) == leases.get(id(buf), 0)
    for vs in views.values():
        for v in vs:
            v.release()


def test_classes_nobody_asks_for_make_room_for_new_ones() -> None:
    pool = BufferPool(8 * MB)
    small = [pool.acquire(MB) for _ in range(8)]
    for b in small:
        pool.release(b)
    big = [pool.acquire(4 * MB) for _ in range(2)]  # reclaims the 1 MB buffers: the pool is full of them
    assert pool.free_bytes == 8 * MB
    for b in big:
        pool.release(b)
    pool.settle()
    assert pool.free_bytes <= 8 * MB
    again = pool.acquire(4 * MB)
    assert any(again is b for b in big)
