"""Two-phase writes, the faster paths: strided chunks copied by numpy block by block, segments reused across
stores (populated pages give byte-identical values), ``KVCacheClient.reserve`` (the engine writes its KV straight
into the reservation; strided sources included), ``COMMIT ... SKIP``, and refusals (a wrong checksum, a
reservation given back when the block raises). Real server, real Unix socket.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest
import xxhash
from tests.integration.support import memory_info as _info
from tests.integration.support import unix_server as _start

from kvstrata.client.codec import CHECKSUM_OFFSET, decode, prepare_parts, raw_header, seal_parts
from kvstrata.client.fast import RespError
from kvstrata.client.keys import Namespace
from kvstrata.client.sdk import KVCacheClient
from kvstrata.client.stage import StageWriter

pytestmark = pytest.mark.kvstrata_only

MB = 1024 * 1024
SHAPE = (6, 2, 3, 512, 32)  # layers, K/V, heads, tokens, head dim: 2 chunks of 256 tokens, 768 KB each in fp32


def _kv(seed: int, dtype: str = "float32") -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return rng.standard_normal(SHAPE, dtype=np.float32)
    return rng.integers(0, 1 << 16, size=SHAPE, dtype=np.uint16)


def _client(path: str, dtype: str = "float32") -> KVCacheClient:
    return KVCacheClient(f"unix://{path}", Namespace("inplace", kv_dtype=dtype), stage_writes=True)


def test_strided_chunks_staged_by_numpy_are_byte_identical_to_the_socket_store(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tcp = srv.client()
    staged, plain = _client(path), KVCacheClient(f"unix://{path}", Namespace("inplace-plain", kv_dtype="float32"),
                                                 local_plane=False)
    try:
        kv = _kv(1)
        tokens = list(range(512))
        # The same segment is reused by every store (its pages stay populated): each store's bytes are exact.
        for rnd in range(3):
            kv += 1.0
            assert staged.store(tokens, kv, skip_existing=False) == 2
            assert plain.store(tokens, kv, skip_existing=False) == 2
            for a, b in zip(staged.keys(tokens), plain.keys(tokens), strict=True):
                va, vb = tcp.get(a), tcp.get(b)
                assert va == vb, f"round {rnd}: staged and socket values differ"
            n, got = staged.retrieve(tokens)
            assert n == 512 and np.array_equal(got, kv)
        info = _info(tcp)
        assert info["stage_commits"] == 6 and info["stage_segments"] == 1
        assert info["stage_checksum_failures"] == 0
    finally:
        staged.close()
        plain.close()


def test_writer_copies_a_strided_array_part_exactly() -> None:
    # The writer's block copy of a strided array (any shape, rows larger and smaller than a piece) gives the same
    # bytes and checksum as the codec's sealed value.
    import mmap
    import os

    fd = os.memfd_create("stage-test")
    os.ftruncate(fd, 8 * MB)
    w = StageWriter.__new__(StageWriter)
    w.mm = mmap.mmap(fd, 8 * MB)
    w.view = memoryview(w.mm)
    os.close(fd)
    try:
        rng = np.random.default_rng(7)
        for shape, cut in (((4, 2, 5, 600, 64), 256), ((3, 700, 128), 300), ((2, 2, 2, 9, 8), 3)):
            full = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
            chunk = full[..., 1:cut, :] if len(shape) > 3 else full[:, 1:cut]
            parts = prepare_parts(chunk, layout="", strided=True)
            assert isinstance(parts[1], np.ndarray)
            digest = w.write(64, parts, CHECKSUM_OFFSET)
            n = len(parts[0]) + chunk.nbytes
            expect = b"".join(bytes(p) for p in seal_parts(prepare_parts(chunk, layout="")))
            assert bytes(w.view[64:64 + n]) == expect
            assert digest == xxhash.xxh3_64_intdigest(expect[:CHECKSUM_OFFSET] + bytes(8) + expect[CHECKSUM_OFFSET + 8:])
            assert np.array_equal(decode(expect)[0], chunk)
    finally:
        w.view.release()
        w.mm.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reserve_lets_the_caller_write_in_place_strided_sources_included(make_server, sockdir, dtype) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tcp = srv.client()
    c = _client(path, dtype)
    try:
        kv = _kv(2, dtype)
        tokens = list(range(1000, 1512))
        chunk_shape = (*SHAPE[:3], 256, SHAPE[4])
        with c.reserve(tokens, chunk_shape) as slots:
            assert len(slots) == 2
            for i, slot in enumerate(slots):
                # Views of the staging segment: C-contiguous, writable, the payload 64-byte aligned.
                assert slot.flags.c_contiguous and slot.flags.writeable and slot.ctypes.data % 64 == 0
                np.copyto(slot, kv[:, :, :, i * 256:(i + 1) * 256])  # a strided source
        n, got = c.retrieve(tokens)
        assert n == 512 and np.array_equal(got, kv)
        # What the socket store writes for the same tensor, byte for byte (dtype name included: bfloat16).
        if dtype == "bfloat16":
            import torch

            ref_kv = torch.from_numpy(kv).view(torch.bfloat16)
        else:
            ref_kv = kv
        for i, key in enumerate(c.keys(tokens)):
            expect = b"".join(bytes(p) for p in c.encode_chunk(c._chunk_value(ref_kv, i * 256, (i + 1) * 256)))
            assert tcp.get(key) == expect
        assert decode(tcp.get(c.keys(tokens)[0]))[1].dtype == dtype
        info = _info(tcp)
        assert info["stage_commits"] == 2 and info["stage_reservations"] == 0
    finally:
        c.close()


def test_reserve_stores_nothing_when_the_block_raises_and_gives_the_room_back(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tcp = srv.client()
    c = _client(path)
    try:
        tokens = list(range(512))
        with pytest.raises(RuntimeError, match="engine failed"):
            with c.reserve(tokens, (*SHAPE[:3], 256, SHAPE[4])) as slots:
                slots[0][...] = 1.0
                raise RuntimeError("engine failed")
        assert all(tcp.get(k) is None for k in c.keys(tokens))
        info = _info(tcp)
        assert info["stage_reservations"] == 0 and info["stage_reserved_bytes"] == 0
    finally:
        c.close()


def test_slots_marked_done_are_committed_at_once_and_survive_an_exception(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tcp = srv.client()
    c = _client(path)
    try:
        kv = _kv(6)
        tokens = list(range(768))  # 3 chunks
        keys = c.keys(tokens)
        with pytest.raises(RuntimeError, match="engine failed"):
            with c.reserve(tokens, (*SHAPE[:3], 256, SHAPE[4])) as slots:
                assert len(slots) == 3
                for i in (1, 0):  # any order
                    slots[i][...] = (kv[:, :, :, i * 256:(i + 1) * 256] if i < 2 else 0)
                    slots.done(i)
                    slots.done(i)  # twice: once
                raise RuntimeError("engine failed")
        # The two slots marked done were stored exactly; the third was given back.
        for i in (0, 1):
            assert np.array_equal(decode(tcp.get(keys[i]))[0], kv[:, :, :, i * 256:(i + 1) * 256])
        assert tcp.get(keys[2]) is None
        info = _info(tcp)
        assert info["stage_commits"] == 2 and info["stage_reservations"] == 0 and info["stage_reserved_bytes"] == 0
        # Without an exception: done() for some, the rest committed when the block ends.
        with c.reserve(tokens[:512], (*SHAPE[:3], 256, SHAPE[4])) as slots:
            for i, slot in enumerate(slots):
                np.copyto(slot, kv[:, :, :, i * 256:(i + 1) * 256] + 1.0)
            slots.done(1)
        n, got = c.retrieve(tokens[:512])
        assert n == 512 and np.array_equal(got, kv[:, :, :, :512] + 1.0)
    finally:
        c.close()


def test_reserve_without_a_local_server_stores_ordinary_arrays(make_server) -> None:
    srv = make_server({"dram-size": "64mb", "http-port": "0"})
    c = KVCacheClient(f"redis://127.0.0.1:{srv.port}", Namespace("inplace-tcp", kv_dtype="float32"),
                      stage_writes=True)
    try:
        kv = _kv(3)
        tokens = list(range(512))
        with c.reserve(tokens, (*SHAPE[:3], 256, SHAPE[4])) as slots:
            for i, slot in enumerate(slots):
                slot[...] = kv[:, :, :, i * 256:(i + 1) * 256]
                slots.done(i)  # ordinary arrays: stored when the block ends
        n, got = c.retrieve(tokens)
        assert n == 512 and np.array_equal(got, kv)
    finally:
        c.close()


def test_commit_skip_and_a_wrong_checksum(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tcp = srv.client()
    w = StageWriter(path)
    try:
        arr = np.arange(300_000, dtype=np.float32).reshape(3, 100_000)
        header = raw_header(arr.shape, "float32", "LD")
        (v,) = w.stage_values([(b"k", 0, header, arr.shape, np.float32)])
        assert v.skip == -len(header) % 64 and v.array.ctypes.data % 64 == 0
        v.array[...] = arr
        assert isinstance(w.commit_values([v])[0], int)
        assert np.array_equal(decode(tcp.get(b"k"))[0], arr)
        # A checksum that is not the bytes': refused, nothing stored, the old value kept.
        (v2,) = w.stage_values([(b"k", 0, header, arr.shape, np.float32)])
        v2.array[...] = 7.0
        w.send(b"TAIR.KV.COMMIT", b"k", 0, v2.rid, b"%016x" % 12345, b"SUMAT", CHECKSUM_OFFSET, b"SKIP", v2.skip)
        with pytest.raises(RespError, match="checksum mismatch"):
            w.read_reply()
        assert np.array_equal(decode(tcp.get(b"k"))[0], arr)
        # SKIP must leave a value inside the reservation.
        (rid, _off), = w.reserve([4096])
        with pytest.raises(RespError, match="SKIP 4096 leaves no value"):
            w.call(b"TAIR.KV.COMMIT", b"x", 0, rid, b"0" * 16, b"SKIP", 4096)
        assert _info(tcp)["stage_checksum_failures"] == 1
    finally:
        w.close()


def test_strided_chunks_larger_than_the_segment_go_over_the_socket_exactly(make_server, sockdir) -> None:
    # Chunks of 4.5 MB and a segment of 1 MB (the server rounds it up to at most 2 MB): the strided arrays go
    # over the socket, turned back into their runs; the bytes are the same.
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb", "stage-size": "1mb"})
    tcp = srv.client()
    kv = np.random.default_rng(4).standard_normal((6, 2, 3, 512, 192), dtype=np.float32)
    tokens = list(range(512))
    small = _client(path)
    try:
        assert small.store(tokens, kv, skip_existing=False) == 2
        assert _info(tcp)["stage_commits"] == 0  # did not fit: the socket
        n, got = small.retrieve(tokens)
        assert n == 512 and np.array_equal(got, kv)
    finally:
        small.close()


def test_staged_store_with_a_local_tier_keeps_sealed_exact_values_there(make_server, sockdir) -> None:
    from kvstrata.client import LocalTier

    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tcp = srv.client()
    kv = _kv(5)
    tokens = list(range(512))
    tier = LocalTier(8 * MB)
    c = KVCacheClient(f"unix://{path}", Namespace("inplace-local", kv_dtype="float32"), local_tier=tier)
    try:
        assert c.store(tokens, kv, skip_existing=False) == 2
        assert _info(tcp)["stage_commits"] == 2  # staged (the default with a local server)
        for key in c.keys(tokens):
            local = c._local_get(key)
            assert local is not None and bytes(local) == tcp.get(key)
        n, got = c.retrieve(tokens)
        assert n == 512 and np.array_equal(got, kv)
    finally:
        c.close()


def test_a_commit_that_loses_its_connection_stores_over_the_socket_and_closes_the_writer(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tcp = srv.client()
    c = _client(path)
    try:
        kv = _kv(8)
        tokens = list(range(512))
        sw = c._segment_writer()
        assert sw is not None
        with c.reserve(tokens, (*SHAPE[:3], 256, SHAPE[4])) as slots:
            for i, slot in enumerate(slots):
                np.copyto(slot, kv[:, :, :, i * 256:(i + 1) * 256])
            sw.sock.shutdown(socket.SHUT_RDWR)  # the staging connection dies before the COMMITs go out
        # Stored over the socket from the mapping, byte for byte what the staged store would have written...
        for i, key in enumerate(c.keys(tokens)):
            assert np.array_equal(decode(tcp.get(key))[0], kv[:, :, :, i * 256:(i + 1) * 256])
        # ...and the dead writer is closed (its descriptor not leaked), not kept for the next store.
        assert sw.sock.fileno() == -1
        assert sw not in c._fast_clients
        n, got = c.retrieve(tokens)
        assert n == 512 and np.array_equal(got, kv)
    finally:
        c.close()
