"""The pieces of pull stores without a server: ``pull_hash`` reading this very process with ``process_vm_readv``
(ranges cut into pieces and iovec batches, the self-checksum field, short reads; alone and with a helper thread
copying pieces alongside), range parsing, and the client's ranges of strided arrays (``pull_store.value_ranges``)
against the codec's bytes."""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np
import pytest
import xxhash

from kvstrata.client.codec import CHECKSUM_OFFSET, prepare_parts, seal_parts
from kvstrata.client.pull_store import address, array_ranges, value_ranges
from kvstrata.engine.pull import PullError, _pieces, parse_packed, parse_ranges, pull_hash


def _joined(parts: list) -> bytes:
    return b"".join(bytes(p) for p in parts)


@pytest.mark.parametrize("piece", [4096, 100_000, 1 << 20])
@pytest.mark.parametrize("with_helper", [False, True])
def test_pull_hash_of_strided_chunks_gives_the_sealed_codec_value(piece: int, with_helper: bool, helper) -> None:
    rng = np.random.default_rng(1)
    for shape, cut in (((4, 2, 3, 600, 64), (10, 266)), ((2, 700, 128), (1, 301)), ((3, 2, 2, 9, 8), (2, 5))):
        full = rng.standard_normal(shape, dtype=np.float32)
        chunk = full[..., cut[0]:cut[1], :] if len(shape) > 3 else full[:, cut[0]:cut[1]]
        parts = prepare_parts(chunk, "raw", "LKHTD", strided=True)
        head, ranges, keep = value_ranges(parts)
        assert not keep and len(head) >= CHECKSUM_OFFSET + 8
        n = len(head) + sum(k for _, k in ranges)
        dst = bytearray(n)
        digest = pull_hash(os.getpid(), head, ranges, dst, CHECKSUM_OFFSET, piece=piece,
                           helper=helper if with_helper else None)
        sealed = _joined(seal_parts(prepare_parts(np.ascontiguousarray(chunk), "raw", "LKHTD")))
        assert bytes(dst) == sealed
        assert int.from_bytes(sealed[CHECKSUM_OFFSET:CHECKSUM_OFFSET + 8], "little") == digest


@pytest.mark.parametrize("with_helper", [False, True])
def test_pull_hash_without_sum_at_is_the_hash_of_the_bytes_and_more_ranges_than_one_call_takes(
        with_helper: bool, helper) -> None:
    data = np.arange(9000 * 16, dtype=np.uint8)
    ranges = [(address(data) + 16 * i, 16) for i in range(0, 9000, 2)]  # 4,500 ranges: five iovec batches
    dst = bytearray(4 + 4500 * 16)
    digest = pull_hash(os.getpid(), b"head", ranges, dst, helper=helper if with_helper else None)
    want = b"head" + b"".join(data[16 * i:16 * i + 16].tobytes() for i in range(0, 9000, 2))
    assert bytes(dst) == want and digest == xxhash.xxh3_64_intdigest(want)


def test_a_helper_copies_pieces_alongside_and_the_hash_stays_in_order(monkeypatch, helper) -> None:
    from kvstrata.engine import pull

    copied: dict[int, list[int]] = {}
    helper_took, caller_copied = threading.Event(), threading.Event()
    real = pull._read_piece
    main = threading.get_ident()

    def recording(readv, pid, base, off, size, batch):
        # Each thread's first piece waits for the other thread to be at work, so both take some whatever the
        # scheduler does (otherwise either may take them all: work is taken, not assigned).
        me = threading.get_ident()
        if me != main and me not in copied:
            helper_took.set()
            assert caller_copied.wait(10)
        if me == main and me not in copied:
            assert helper_took.wait(10), "the helper thread never took a piece"
        real(readv, pid, base, off, size, batch)
        copied.setdefault(me, []).append(off)
        if me == main:
            caller_copied.set()

    monkeypatch.setattr(pull, "_read_piece", recording)
    data = np.random.default_rng(3).integers(0, 256, 64 * 4096, dtype=np.uint8)
    dst = bytearray(3 + data.nbytes)
    digest = pull_hash(os.getpid(), b"abc", [(address(data), data.nbytes)], dst, piece=4096, helper=helper)
    assert bytes(dst) == b"abc" + data.tobytes() and digest == xxhash.xxh3_64_intdigest(bytes(dst))
    assert len(copied) == 2 and all(copied.values())  # both threads copied
    assert sorted(o for offs in copied.values() for o in offs) == [3 + 4096 * i for i in range(64)]  # each once


def test_a_helper_that_never_starts_leaves_the_whole_copy_to_the_caller(helper) -> None:
    release = threading.Event()
    busy = helper.submit(release.wait, 10)  # the helper's only thread is taken
    try:
        data = np.arange(50 * 4096, dtype=np.uint32).view(np.uint8)
        dst = bytearray(data.nbytes)
        digest = pull_hash(os.getpid(), b"", [(address(data), data.nbytes)], dst, piece=4096, helper=helper)
        assert bytes(dst) == data.tobytes() and digest == xxhash.xxh3_64_intdigest(data.tobytes())
        assert not busy.done()  # it returned without waiting for the helper
    finally:
        release.set()


@pytest.mark.parametrize("with_helper", [False, True])
def test_pull_hash_refuses_unreadable_ranges_with_the_address(with_helper: bool, helper) -> None:
    good = np.ones(3 << 20, np.uint8)
    # Mapped but unreadable (PROT_NONE) while the call runs: an address unmapped before it could be reused by
    # another thread's allocation meanwhile.
    m = mmap.mmap(-1, 1 << 20, prot=0)
    hole = np.frombuffer(m, np.uint8).ctypes.data
    dst = bytearray(good.nbytes + 4096)
    with pytest.raises(PullError, match="EFAULT") as err:
        pull_hash(os.getpid(), b"", [(address(good), good.nbytes), (hole, 4096)], dst, piece=256 * 1024,
                  helper=helper if with_helper else None)
    assert str(err.value).startswith("ERR") and f"{hole:#x}" in str(err.value)
    with pytest.raises(PullError, match="gone"):
        pull_hash(2**22 + 12345, b"", [(address(good), 10)], bytearray(10))  # no such process


def test_parse_packed_bounds_and_the_same_pieces_as_decimals() -> None:
    def pack(*pairs: int) -> bytes:
        return np.array(pairs, "<u8").tobytes()

    assert parse_packed(pack(10, 5, 20, 0, 30, 7), 4).tolist() == [[10, 5], [30, 7]]  # empty ranges left out
    with pytest.raises(PullError, match="16 bytes a range"):
        parse_packed(pack(10, 5)[:-1], 4)
    with pytest.raises(PullError, match="invalid PULL range"):
        parse_packed(pack(2**64 - 10, 11), 4)  # ends past the address space
    with pytest.raises(PullError, match="invalid PULL range"):
        parse_packed(pack(4096, 2**48), 4)
    with pytest.raises(PullError, match="too many"):
        parse_packed(pack(*([1, 1] * 3)), 2)
    listed = [(1000 + 300 * i, 100 + i) for i in range(40)]
    packed = parse_packed(pack(*[x for r in listed for x in r]), 64)
    for at, piece in ((0, 512), (7, 1000), (3, 1 << 20)):
        a, b = _pieces(at, listed, piece), _pieces(at, packed, piece)
        assert [(o, n, r.tolist()) for o, n, r in a] == [(o, n, r.tolist()) for o, n, r in b]
        assert sum(n for _, n, _ in a) == sum(n for _, n in listed)
        assert all(n <= piece for _, n, _ in a)
        assert [o for o, _, _ in a] == [at + sum(n for _, n, _ in a[:k]) for k in range(len(a))]


def test_parse_ranges_bounds() -> None:
    assert parse_ranges([b"10", b"5", b"20", b"0"], 4) == [(10, 5)]  # empty ranges are left out
    with pytest.raises(PullError, match="invalid"):
        parse_ranges([b"-1", b"5"], 4)
    with pytest.raises(PullError, match="decimal"):
        parse_ranges([b"0x10", b"5"], 4)
    with pytest.raises(PullError, match="too many"):
        parse_ranges([b"1", b"1"] * 3, 2)


def test_array_ranges_merge_and_cover_the_c_order_bytes() -> None:
    a = np.arange(2 * 3 * 10 * 4, dtype=np.int16).reshape(2, 3, 10, 4)
    assert array_ranges(a).tolist() == [[a.ctypes.data, a.nbytes]]
    s = a[:, :, 2:7]
    r = array_ranges(s).tolist()
    assert len(r) == 6 and all(n == 5 * 4 * 2 for _, n in r)
    got = b"".join(bytes(np.ctypeslib.as_array((np.ctypeslib.ctypes.c_ubyte * n).from_address(p))) for p, n in r)
    assert got == np.ascontiguousarray(s).tobytes()
    # Parts that follow each other in memory become one range.
    buf = np.zeros(100, np.uint8)
    _, ranges, _ = value_ranges([b"h", memoryview(buf[:40]), memoryview(buf[40:])])
    assert ranges.tolist() == [[buf.ctypes.data, 100]]
    # Merged runs of several parts, a gap between two of them kept: rows of (address, length) in order.
    _, ranges, _ = value_ranges([b"h", memoryview(buf[:10]), memoryview(buf[10:30]), memoryview(buf[50:60]),
                                 memoryview(buf[60:61])])
    assert ranges.tolist() == [[buf.ctypes.data, 30], [buf.ctypes.data + 50, 11]]


@pytest.mark.parametrize("pidfd_option", [True, False])
def test_peer_of_a_unix_socket_is_the_connecting_process(monkeypatch, pidfd_option: bool) -> None:
    import socket
    import time

    from kvstrata.engine import pull

    if not pidfd_option:  # an older kernel: SO_PEERCRED's pid, opened with pidfd_open, checked against reuse
        monkeypatch.setattr(pull, "SO_PEERPIDFD", 0x7FFF)
    a, b = socket.socketpair(socket.AF_UNIX)
    try:
        peer = pull.peer_of(a, 0.0)
        try:
            assert peer.pid == os.getpid() and peer.alive()
        finally:
            peer.close()
        if not pidfd_option:
            # A process found under the pid that started after the connection was made is not the one that made it.
            started = pull._started_s(os.getpid())
            age = time.clock_gettime(time.CLOCK_BOOTTIME) - started + 10
            with pytest.raises(PullError, match="gone"):
                pull.peer_of(a, age)
    finally:
        a.close()
        b.close()


def test_a_dead_process_pidfd_is_not_alive() -> None:
    from kvstrata.engine.pull import Peer

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    peer = Peer(pid, os.pidfd_open(pid))  # opened before the child is reaped: it is this child for good
    try:
        os.waitpid(pid, 0)
        assert not peer.alive()
    finally:
        peer.close()
