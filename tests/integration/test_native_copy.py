"""Restores through a real server with the native streaming-store copy (kvstrata.client.streamcopy) in use, and
with it off: every restore copy out of the arena gives the bytes stored (by a staged store), which a socket read
(no client copy at all) confirms; the streamed path is really taken."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from tests.integration.support import unix_server as _start
from tests.native_libs import build_libs

from kvstrata.client.keys import Namespace
from kvstrata.client.sdk import KVCacheClient
from kvstrata.native import ntcopy

pytestmark = pytest.mark.kvstrata_only

TOKENS = 768
SHAPE = (4, 2, 4, TOKENS, 128)  # LKHTD: a 256-token chunk is 2 MiB in bf16 (over streamcopy.NT_MIN_BYTES)


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ntcopy.NativeCopy]:
    return build_libs(tmp_path_factory.mktemp("native"))


def _counting(native: ntcopy.NativeCopy) -> tuple[ntcopy.NativeCopy, dict[str, int]]:
    """The real library, its calls counted (to see that the copies did stream)."""
    calls = {"copy": 0, "strided": 0}

    def copy(*args: Any) -> None:
        calls["copy"] += 1
        native.copy(*args)

    def strided(*args: Any) -> None:
        calls["strided"] += 1
        native.copy_strided(*args)

    return dataclasses.replace(native, copy=copy, copy_strided=strided), calls


def _kv(dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bfloat16":  # bf16 bits in uint16 storage, as the codec carries them
        return rng.integers(0, 1 << 16, size=SHAPE, dtype=np.uint16)
    return rng.standard_normal(SHAPE).astype(dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("mode", ["best", "sse2", "off"])
def test_arena_restores_are_byte_exact(make_server, sockdir, libs, monkeypatch, dtype: str,
                                                        mode: str) -> None:
    calls: dict[str, int] = {}
    if mode == "off":
        monkeypatch.setattr(ntcopy, "NATIVE", None)
    else:
        native, calls = _counting(libs[mode])
        monkeypatch.setattr(ntcopy, "NATIVE", native)
    srv, path = _start(make_server, sockdir, **{"dram-size": "96mb"})
    ns = Namespace(f"nt-{dtype}-{mode}", kv_dtype=dtype)
    kv = _kv(dtype, seed=len(dtype))
    whole = np.ascontiguousarray(kv[:, :, :, :256])  # a contiguous value: its payload is one buffer
    tokens = list(range(TOKENS))
    want = kv.tobytes()
    with KVCacheClient(f"unix://{path}", ns, copy_threads=1) as c:
        assert c.store(tokens, kv) == TOKENS // 256  # staged: strided chunks copied into the segment
        assert c._tls.stage is not None
        dst = np.zeros_like(kv)
        n, view = c.retrieve(tokens, out=dst)
        assert n == TOKENS and view.base is dst and dst.tobytes() == want
        assert c._tls.arena is not None  # out of the arena
        roomy = np.zeros((4, 2, 4, TOKENS + 256, 128), kv.dtype)
        n, view = c.retrieve(tokens, out=roomy[:, :, :, 128:])
        assert n == TOKENS and view.tobytes() == want
        assert not roomy[:, :, :, :128].any() and not roomy[:, :, :, 128 + TOKENS:].any()
        n, fresh = c.retrieve(tokens)
        assert n == TOKENS and fresh.tobytes() == want
        n, chunks = c.retrieve_chunks(tokens)
        assert n == TOKENS and np.concatenate(chunks, axis=3).tobytes() == want
        c.namespace = Namespace(f"nt-{dtype}-{mode}-whole", kv_dtype=dtype)
        assert c.store(tokens[:256], whole) == 1
        n, back = c.retrieve(tokens[:256])
        assert n == 256 and back.tobytes() == whole.tobytes()
    # what the server holds, read over the socket (no client-side copy): the bytes stored
    with KVCacheClient(f"unix://{path}", ns, local_plane=False) as plain:
        n, got = plain.retrieve(tokens)
        assert n == TOKENS and got.tobytes() == want
    if mode != "off":
        assert calls["strided"] >= 2 * TOKENS // 256  # each chunk into its slot of ``out``: one call
        assert calls["copy"] > 0  # whole contiguous values (retrieve_chunks)
    assert srv.client().info("memory")["arena_leases"] == 0


@pytest.mark.parametrize("verify", [False, True])
def test_arena_read_into_streams_whole_values(make_server, sockdir, libs, monkeypatch, verify: bool) -> None:
    """``ArenaClient.read_into``: each value copied out of the read-only mapping into the caller's buffer."""
    from kvstrata.client.arena import ArenaClient

    native, calls = _counting(libs["best"])
    monkeypatch.setattr(ntcopy, "NATIVE", native)
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    kv = _kv("bfloat16", seed=7)
    tokens = list(range(TOKENS))
    with KVCacheClient(f"unix://{path}", Namespace("nt-read-into", kv_dtype="bfloat16")) as c:
        assert c.store(tokens, kv) == TOKENS // 256
        keys = c.keys(tokens)
    values = [srv.client().get(k) for k in keys]  # the stored values, over TCP
    bufs = [bytearray(len(v) + 100) for v in values]
    ac = ArenaClient(path)
    try:
        lengths = ac.read_into([*keys, b"no-such-key"], [*bufs, bytearray(10)], verify=verify)
    finally:
        ac.close()
    assert lengths == [len(v) for v in values] + [None]
    assert all(bytes(b[:len(v)]) == v and not any(b[len(v):]) for b, v in zip(bufs, values, strict=True))
    assert calls["copy"] == len(values)  # each value (2 MiB) streamed in one call
