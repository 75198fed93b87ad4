"""SsdTier.read_resident: reads on the event loop only of records whose pages are in memory (resident.py)."""

import ctypes
import mmap
import os

import pytest

from kvstrata.engine.entry import Entry, Meta
from kvstrata.engine.tiers import resident as res
from kvstrata.engine.tiers import ssd as ssd_module
from kvstrata.engine.tiers.ssd import SsdTier, data_key

MB = 1024 * 1024
# Larger than an LMDB page, so that each value lives on overflow pages of its own that a B-tree lookup never touches.
VALUE = 64 * 1024


def values(n: int) -> dict[bytes, bytes]:
    return {f"k{i}".encode(): bytes([i + 1]) * VALUE for i in range(n)}


@pytest.fixture
def tier(tmp_path):
    """``tier(records) -> SsdTier`` holding the records, committed (``tier()``: the same files reopened); every
    tier is closed at the end."""
    opened: list[SsdTier] = []

    def make(records: dict[bytes, bytes] | None = None) -> SsdTier:
        for t in opened:
            t.close()
        t = SsdTier(str(tmp_path / "ssd"), 64 * MB, threaded=False)
        opened.append(t)
        for i, (key, value) in enumerate((records or {}).items()):
            t.put(key, Entry(value, i + 1, 0))
        return t

    yield make
    for t in opened:
        t.close()


def drop_cached(path: str, ranges: tuple[tuple[int, int], ...] = ()) -> None:
    """Put a file's pages back on the disk: ``ranges`` ((address, length) of this process's mapping of it) are
    unmapped from this process first (``MADV_DONTNEED``: the kernel keeps pages a process maps), then the clean
    cached pages are dropped (``POSIX_FADV_DONTNEED``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for start, n in ranges:
        first = start - start % res.PAGE
        if libc.madvise(first, start + n - first, mmap.MADV_DONTNEED) != 0:
            raise OSError(ctypes.get_errno(), "madvise(MADV_DONTNEED) failed")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict(t: SsdTier) -> None:
    """Put every record whose place the tier knows back on the disk: unmapped from this process, then dropped
    from the page cache."""
    ranges = tuple((loc >> 32, loc & 0xFFFFFFFF) for loc in t._where.values())
    drop_cached(os.path.join(t.path, "data.mdb"), ranges)


def test_the_writer_finds_the_records_it_wrote(tier) -> None:
    records = values(2)
    t = tier(records)
    keys = list(records)
    found = t.read_resident(keys, MB)  # never read, but the writer looked them up after its commit
    assert found is not None and [bytes(found[k].value) for k in keys] == list(records.values())
    assert t.inline_declined == 0 and t.inline_reads == 2


def test_a_record_no_one_has_found_goes_to_a_thread(tier) -> None:
    records = values(2)
    tier(records)
    t = tier()  # reopened: where the records lie is unknown
    keys = list(records)
    assert t.read_resident(keys, MB) is None
    assert t.inline_declined == 1 and t.inline_reads == 0
    t.read_many(keys[:1])
    assert t.read_resident(keys, MB) is None  # one of the two still unknown
    t.read_many(keys[1:])
    assert t.read_resident(keys, MB) is not None


def test_records_on_the_disk_are_declined_then_read_inline_once_cached(tier) -> None:
    records = values(4)
    t = tier(records)
    keys = list(records)
    t.read_many(keys)
    evict(t)
    assert all(not res.resident_at(loc >> 32, loc & 0xFFFFFFFF) for loc in t._where.values())
    declined = t.inline_declined
    assert t.read_resident(keys, 4 * MB) is None
    assert t.inline_declined == declined + 1 and t.inline_reads == 0
    # The check touched nothing: the records are still on the disk.
    assert all(not res.resident_at(loc >> 32, loc & 0xFFFFFFFF) for loc in t._where.values())
    # The loader thread's read brings the pages in; the same load on the loop then succeeds, with the same answer.
    threaded = t.read_many(keys)
    inline = t.read_resident(keys, 4 * MB)
    assert inline is not None and t.inline_reads == len(keys) and t.inline_moved == 0
    for key, value in records.items():
        assert isinstance(inline[key], Entry) and bytes(inline[key].value) == value
        assert inline[key].version == threaded[key].version
    info = t.info()
    assert info["reads_inline"] == len(keys) and info["inline_declined"] == declined + 1


def test_a_load_larger_than_the_cap_goes_to_a_thread(tier) -> None:
    records = values(3)
    t = tier(records)
    keys = list(records)
    t.read_many(keys)
    assert t.read_resident(keys, 3 * VALUE - 1) is None
    assert t.inline_declined == 1
    assert t.read_resident(keys, 3 * VALUE + 3 * 64) is not None


def test_a_rewritten_or_deleted_record_is_found_or_forgotten_by_the_writer(tier) -> None:
    records = values(2)
    t = tier(records)
    t.read_many(list(records))
    t.put(b"k0", Entry(b"new" * 30000, 9, 0))
    found = t.read_resident([b"k0"], MB)
    assert found is not None and bytes(found[b"k0"].value) == b"new" * 30000 and found[b"k0"].version == 9
    assert t.inline_moved == 0  # the place checked was the new record's
    t.delete(b"k1")
    assert data_key(b"k1") not in t._where
    assert t.read_resident([b"k1"], MB) is None  # unknown: a thread reads it (and finds nothing)
    assert t.read_many([b"k1"]) == {b"k1": None}


def test_a_probe_needs_only_the_records_header_in_memory(tier) -> None:
    records = values(2)
    t = tier(records)
    keys = list(records)
    metas = t.probe_many(keys)
    evict(t)
    assert t.read_resident(keys, MB, probe=True) is None
    t.probe_many(keys)  # the loader thread's probe brings the pages in
    found = t.read_resident(keys, 1024, probe=True)
    assert found is not None
    for key in keys:
        assert isinstance(found[key], Meta) and found[key].version == metas[key].version
        assert found[key].value_len == VALUE
    assert t.probes == 3 * len(keys)
    assert t.read_resident(keys, 1024) is None  # a read of the values is over that cap


def test_native_and_numpy_checks_agree(tmp_path) -> None:
    assert res.resident(b"x" * 10000) and res.resident_numpy(b"x" * 10000) and res.resident(b"")
    path = tmp_path / "f"
    path.write_bytes(b"\1" * (8 * res.PAGE))
    drop_cached(str(path))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        mmap_random = getattr(mmap, "MADV_RANDOM", None)
        if mmap_random is not None:
            m.madvise(mmap_random)  # no readahead: the touch below faults in one page alone
        view = memoryview(m)
        assert res.resident(view) is False and res.resident_numpy(view) is False
        assert view[3 * res.PAGE] == 1
        page = view[3 * res.PAGE:4 * res.PAGE]
        assert res.resident(page) is True and res.resident_numpy(page) is True
        assert res.resident(view[3 * res.PAGE:5 * res.PAGE]) is False
        del view, page


def test_the_places_remembered_are_bounded_to_the_most_recent_reads(tier, monkeypatch) -> None:
    monkeypatch.setattr(ssd_module, "LOCATIONS", 4)
    records = values(10)
    t = tier(records)
    keys = list(records)
    for key in keys:
        t.read_many([key])
    t.read_many(keys[6:7])  # read again: now the most recent
    assert list(t._where) == [data_key(k) for k in (keys[7], keys[8], keys[9], keys[6])]
    assert t.read_resident(keys[6:], MB) is not None and t.read_resident(keys[5:6], MB) is None
