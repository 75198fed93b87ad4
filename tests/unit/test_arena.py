"""The shared-memory arena: extent allocator, sealed read-only region, holds, leases and DRAM accounting."""

from __future__ import annotations

import mmap
import os
from pickle import PickleBuffer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstrata.clock import ManualClock
from kvstrata.engine.arena import ArenaPool, LeaseError, Region
from kvstrata.engine.entry import Entry
from kvstrata.engine.extents import Extents
from kvstrata.engine.store import Store
from kvstrata.engine.tiers.ssd import SsdTier

KB = 1024
MB = 1024 * KB


# ---- extents ----
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=80))
def test_extents_never_overlap_and_coalesce_back(ops: list[tuple[bool, int]]) -> None:
    ext = Extents(64 * 4096, 4096)
    live: dict[int, int] = {}
    for free_one, pages in ops:
        if free_one and live:
            start = sorted(live)[pages % len(live)]
            ext.free(start, live.pop(start))
        else:
            start = ext.alloc(pages * 4096 - 7)
            if start is None:
                assert ext.largest < pages * 4096
                continue
            live[start] = pages * 4096
        spans = sorted(live.items())
        for (a, n), (b, _) in zip(spans, spans[1:], strict=False):
            assert a + n <= b
        assert all(s % 4096 == 0 and s + n <= ext.size for s, n in spans)
        assert ext.free_bytes + sum(live.values()) == ext.size
    for start, n in list(live.items()):
        ext.free(start, n)
    assert ext.extents() == [(0, ext.size)]


def test_extents_refuse_a_double_free() -> None:
    ext = Extents(16 * 4096)
    a = ext.alloc(4096)
    assert a is not None
    ext.free(a, 4096)
    with pytest.raises(ValueError):
        ext.free(a, 4096)


# ---- region ----
def test_region_reader_fd_maps_read_only_and_cannot_resize() -> None:
    r = Region(4 * MB)
    r.view[100:105] = b"hello"
    fd = r.reader_fd()
    try:
        with pytest.raises(PermissionError):
            mmap.mmap(fd, r.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        ro = mmap.mmap(fd, r.size, mmap.MAP_SHARED, mmap.PROT_READ)
        assert ro[100:105] == b"hello"
        r.view[100:105] = b"world"  # one memory: the reader sees the writer's bytes
        assert ro[100:105] == b"world"
        ro.close()
        with pytest.raises(OSError):
            os.ftruncate(r.fd, r.size // 2)  # sealed, even for the read-write descriptor
    finally:
        os.close(fd)


# ---- holds and gates ----
def test_slot_is_reused_only_after_the_last_hold_and_the_next_allocation() -> None:
    pool = ArenaPool(4 * MB, min_size=64 * KB)
    a = pool.acquire(100 * KB)
    assert isinstance(a, memoryview) and len(a) == 100 * KB
    off = pool.slot(a).off
    pool.retain(a)
    pool.release(a)
    pool.release(a)  # holds now 0: in limbo, not free yet
    assert pool.info()["arena_slots"] == 1
    b = pool.acquire(100 * KB)  # the limbo is collected first, so the slot is reused
    assert pool.slot(b).off == off
    with pytest.raises(ValueError):
        a[0]  # the stale view was released: it cannot read the new value's bytes


def test_a_forfeited_value_is_freed_and_its_pages_go_back() -> None:
    """A client that disconnects mid-value: the connection forfeits the slot (its only hold); the slot is freed
    at the next collect and its pages are punched out of the memfd (zeros afterwards, not the old bytes)."""
    pool = ArenaPool(4 * MB, min_size=64 * KB)
    a = pool.acquire(1 * MB)
    off = pool.slot(a).off
    a[:] = b"x" * MB
    pool.forfeit(a)
    pool.collect()
    info = pool.info()
    assert info["arena_slots"] == 0 and info["arena_allocated_bytes"] == 0
    assert bytes(pool.region.view[off:off + 16]) == bytes(16)


def test_small_values_and_a_full_arena_fall_back_to_bytearrays() -> None:
    pool = ArenaPool(2 * MB, min_size=64 * KB)
    assert isinstance(pool.acquire(10), bytearray)
    big = pool.acquire(2 * MB)
    assert isinstance(big, memoryview)
    assert isinstance(pool.acquire(64 * KB), bytearray)
    assert pool.info()["arena_misses"] == 1


class _Writer:
    def __init__(self) -> None:
        self.enqueued_seq = 0
        self.committed_seq = 0
        self.stuck: dict[bytes, object] = {}


def test_a_value_queued_to_a_writer_is_not_reused_before_the_writer_committed() -> None:
    pool = ArenaPool(4 * MB, min_size=64 * KB)
    writer = _Writer()
    pool.gates.append(writer)
    a = pool.acquire(64 * KB)
    off = pool.slot(a).off
    writer.enqueued_seq = 5  # the demotion queued the value to the writer thread
    pool.release(a)
    b = pool.acquire(64 * KB)
    assert pool.slot(b).off != off
    writer.committed_seq = 5
    c = pool.acquire(64 * KB)
    assert pool.slot(c).off == off


def test_a_failed_write_queued_again_keeps_its_slot_until_the_retry_committed(tmp_path) -> None:
    # The disk-full path: a demoted value's write fails (it stays in ``pending``, kept in ``stuck``), the
    # slot is dropped, then retry_stuck() queues it again. The retry's sequence number is newer than the ones
    # the slot waits for, so before the fix the slot was freed while the retry was queued: a GET answered from
    # ``pending`` read a released view ("internal error: ValueError") and the writer thread failed on it.
    ssd = SsdTier(str(tmp_path / "ssd"), 1 << 30, fsync="no", threaded=False)
    try:
        completions: list = []
        ssd.set_delivery(completions.append)  # commits reach the owner's thread later, as in the server
        pool = ArenaPool(4 * MB, min_size=64 * KB)
        pool.gates.append(ssd)
        a = pool.acquire(64 * KB)
        a[:] = b"v" * len(a)
        off = pool.slot(a).off
        apply = ssd._apply_with_room

        def disk_full(batch, evicted):
            raise OSError(28, "No space left on device")

        ssd._apply_with_room = disk_full
        ssd.put(b"k", Entry(a, 1, 0))
        pool.release(a)  # demoted: DRAM dropped the value, only the SSD tier's pending write has it
        completions.pop()()
        assert b"k" in ssd.stuck
        pool.acquire(64 * KB)
        assert pool.slot(a) is not None and ssd.get(b"k").value == a

        ssd._apply_with_room = apply
        assert ssd.retry_stuck() == 1  # written; its commit not yet delivered
        b = pool.acquire(64 * KB)
        assert pool.slot(b).off != off
        assert bytes(ssd.get(b"k").value) == b"v" * 64 * KB  # raised ValueError before the fix
        completions.pop()()
        assert not ssd.stuck and not ssd.retrying and not ssd.pending
        c = pool.acquire(64 * KB)
        assert pool.slot(c).off == off
        assert ssd.get(b"k").value == b"v" * 64 * KB
    finally:
        ssd.close()


def test_an_exported_view_is_quarantined_until_the_export_ends() -> None:
    pool = ArenaPool(4 * MB, min_size=64 * KB)
    a = pool.acquire(64 * KB)
    off = pool.slot(a).off
    # A direct buffer export of the view, as uvloop takes one for a write still in progress (PickleBuffer is
    # only used here as an object that holds a Py_buffer; nothing is pickled).
    export = PickleBuffer(a)
    pool.release(a)
    b = pool.acquire(64 * KB)
    assert pool.slot(b).off != off and pool.info()["arena_quarantined"] == 1
    del export
    pool.settle()
    c = pool.acquire(64 * KB)
    assert pool.slot(c).off == off


# ---- leases ----
def test_leases_are_bounded_per_client_and_in_time() -> None:
    pool = ArenaPool(4 * MB, min_size=64 * KB, max_leases=2, max_lease_ms=1000)
    a = pool.acquire(64 * KB)
    l1 = pool.lease(7, [a], 5000, now_ms=0)
    pool.lease(7, [a], 10, now_ms=0)
    with pytest.raises(LeaseError):
        pool.lease(7, [a], 10, now_ms=0)
    pool.lease(8, [a], 10, now_ms=0)  # another client has its own bound
    assert not pool.release_lease(l1, client=8)  # only the owner releases
    assert pool.expire(now_ms=999) == 2  # the 10 ms leases
    assert pool.expire(now_ms=1000) == 1  # 5000 ms was capped at max_lease_ms
    assert pool.lease_table == {}
    pool.lease(9, [a], 10, now_ms=0)
    assert pool.drop_clients(lambda c: c != 9) == 1


def _store(budget: int, clock: ManualClock) -> tuple[Store, ArenaPool]:
    store = Store(budget, clock=clock, entry_overhead=64)
    pool = ArenaPool(budget + budget // 2, min_size=16 * KB, room=lambda: store.dram.budget)
    store.dram.attach_arena(pool)
    return store, pool


def _receive(pool: ArenaPool, n: int, fill: int) -> memoryview | bytearray:
    buf = pool.acquire(n)
    buf[:] = bytes([fill]) * n
    return buf


def test_leased_value_survives_overwrite_and_stays_charged() -> None:
    clock = ManualClock()
    store, pool = _store(1 * MB, clock)
    v1 = _receive(pool, 100 * KB, 1)
    store.put(b"k", v1)
    pool.release(v1)  # the parser's hold
    slot = pool.slot(v1)
    lid = pool.lease(1, [v1], 5000, clock.now_ms())
    used_before = store.dram.used
    v2 = _receive(pool, 100 * KB, 2)
    store.put(b"k", v2)
    pool.release(v2)
    assert store.dram.used == used_before + slot.cls  # both values charged: v1 is leased
    assert pool.info()["arena_leased_dropped_bytes"] == slot.cls
    pool.acquire(200 * KB)
    assert bytes(pool.region.view[slot.off:slot.off + 4]) == b"\x01" * 4
    pool.release_lease(lid)
    pool.collect()
    assert store.dram.used == used_before
    assert pool.info()["arena_leased_dropped_bytes"] == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["set", "del", "lease", "release", "tick", "flush"]),
                          st.integers(0, 5), st.integers(16, 300)), max_size=60))
def test_no_leased_slot_is_reused_and_the_budget_holds(ops: list[tuple[str, int, int]]) -> None:
    clock = ManualClock()
    store, pool = _store(1 * MB, clock)
    dram = store.dram
    leases: dict[int, list[tuple[int, int, int]]] = {}  # lease -> (offset, length, fill) it promised
    fill = 0
    for op, k, kb in ops:
        key = b"k%d" % k
        if op == "set":
            fill = fill % 250 + 1
            buf = _receive(pool, kb * KB, fill)
            try:
                store.put(key, buf)
            except Exception as exc:  # -OOM: the value does not fit beside what is leased
                assert "OOM" in type(exc).__name__ or "memory" in str(exc).lower()
            pool.release(buf)
        elif op == "del":
            store.delete(key)
        elif op == "lease":
            entry = dram.get(key)
            if entry is not None and pool.slot(entry.value) is not None:
                s = pool.slot(entry.value)
                try:
                    lid = pool.lease(k, [entry.value], 1000, clock.now_ms())
                except LeaseError:
                    continue
                leases[lid] = [(s.off, s.length, entry.value[0])]
        elif op == "release" and leases:
            lid = sorted(leases)[k % len(leases)]
            pool.release_lease(lid)
            del leases[lid]
        elif op == "tick":
            clock.advance(0.4)
            pool.expire(clock.now_ms())
            leases = {lid: v for lid, v in leases.items() if lid in pool.lease_table}
        elif op == "flush":
            store.flush()
        # Every promise a live lease made still holds, byte for byte.
        for promised in leases.values():
            for off, n, byte in promised:
                assert pool.region.view[off] == byte and pool.region.view[off + n - 1] == byte
        assert dram.used <= dram.budget
        charged = sum(dram.charge(key, e.value) for key, e in dram.entries.items())
        assert dram.used == charged + pool.deferred_bytes
        live = sorted((s.off, s.cls) for s in pool._slots.values())
        for (a, n), (b, _) in zip(live, live[1:], strict=False):
            assert a + n <= b
