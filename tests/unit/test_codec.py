"""KV codec: header, round trips, error bounds of fp8 and zstd, checksums, refused versions."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kvstrata.client import codec
from kvstrata.client.codec import (
    CODECS,
    HEADER_SIZE,
    ChecksumError,
    CodecError,
    FormatVersionError,
    decode,
    encode,
    read_header,
)

LAYOUT = "LKHTD"


def kv(shape=(3, 2, 4, 32, 16), seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    # heads with very different magnitudes (what per-head scales are for)
    x *= np.array([0.001, 1.0, 10.0, 100.0], dtype=np.float32)[None, None, :, None, None]
    return x.astype(dtype)


def test_header_fields():
    x = kv()
    buf = encode(x, "raw", LAYOUT)
    h = read_header(buf)
    assert buf[:4] == b"KVSC" and h.version == 1 and h.dtype == "float32" and h.shape == x.shape
    assert h.layout == LAYOUT and h.raw_len == x.nbytes and h.codec == "raw"
    assert len(buf) == HEADER_SIZE + 8 * x.ndim + len(LAYOUT) + x.nbytes
    assert b"pickle" not in buf[:64]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8, np.float64])
@pytest.mark.parametrize("name", ["raw", "zstd"])
def test_lossless_round_trip(name, dtype):
    x = (kv(dtype=np.float32) * 3).astype(dtype)
    y, h = decode(encode(x, name, LAYOUT))
    assert y.dtype == x.dtype and y.shape == x.shape
    assert np.array_equal(y, x)
    assert h.codec == name


def test_raw_decode_into_preallocated_buffer():
    x = kv()
    out = np.empty_like(x)
    y, _ = decode(encode(x, "raw", LAYOUT), out=out)
    assert y is out and np.array_equal(out, x)
    with pytest.raises(CodecError):
        decode(encode(x, "raw", LAYOUT), out=np.empty(3, np.float32))


def test_zstd_splits_16_bit_planes_and_compresses_bf16_like_data():
    x = kv().astype(np.float16)
    buf = encode(x, "zstd", LAYOUT)
    assert read_header(buf).planes == 2
    assert len(buf) < x.nbytes  # exponent bytes compress
    y, _ = decode(buf)
    assert np.array_equal(y, x)


@pytest.mark.parametrize("scale", ["tensor", "head"])
@pytest.mark.parametrize("name", ["fp8", "fp8+zstd"])
def test_fp8_error_bound(name, scale):
    x = kv()
    buf = encode(x, name, LAYOUT, fp8_scale=scale)
    h = read_header(buf)
    assert h.nscales == (1 if scale == "tensor" else 3 * 2 * 4)
    y, _ = decode(buf)
    assert y.dtype == np.float32
    # e4m3: 3 mantissa bits -> relative error <= 2^-4 for normal values; the subnormal step is 2^-9 * scale.
    groups = x.reshape(h.nscales, -1)
    scales = np.abs(groups).max(axis=1) / 448.0
    bound = np.abs(groups) * 2.0 ** -4 + (2.0 ** -10) * scales[:, None] + 1e-12
    assert np.all(np.abs(y.reshape(h.nscales, -1) - groups) <= bound)
    assert len(buf) < x.nbytes / 3.5


def test_per_head_scale_is_more_accurate_for_uneven_heads():
    x = kv()
    err = {}
    for scale in ("tensor", "head"):
        y, _ = decode(encode(x, "fp8", LAYOUT, fp8_scale=scale))
        small_head = (slice(None), slice(None), 0)
        err[scale] = float(np.abs(y[small_head] - x[small_head]).mean())
    assert err["head"] < err["tensor"] / 10


def test_fp8_table_is_e4m3fn():
    assert codec._E4M3[0x7E] == 448.0
    assert codec._E4M3[0x08] == 2.0 ** -6
    assert codec._E4M3[0x01] == 2.0 ** -9
    assert np.isnan(codec._E4M3[0x7F])
    values = np.array([0.0, 1.0, -2.5, 448.0, 1000.0, -1000.0, 2.0 ** -9], np.float32)
    back = codec.fp8_dequantize(codec.fp8_quantize(values))
    assert list(back) == [0.0, 1.0, -2.5, 448.0, 448.0, -448.0, 2.0 ** -9]


def test_fp8_matches_torch_when_available():
    torch = pytest.importorskip("torch")
    x = np.linspace(-440, 440, 10001, dtype=np.float32)
    ours = codec.fp8_quantize(x)
    theirs = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    # identical except possibly exact ties (round-half-even vs our rounding)
    assert np.mean(ours == theirs) > 0.999


def test_bfloat16_via_torch():
    torch = pytest.importorskip("torch")
    t = torch.randn(2, 2, 3, 8, 4).to(torch.bfloat16)
    for name in ("raw", "zstd"):
        arr, h = decode(encode(t, name, LAYOUT))
        assert h.dtype == "bfloat16"
        assert torch.equal(codec.to_torch(arr, "bfloat16"), t)
    arr, h = decode(encode(t, "fp8", LAYOUT))
    back = codec.to_torch(arr, "bfloat16").float()
    assert torch.allclose(back, t.float(), rtol=0.08, atol=float(t.float().abs().max()) / 448 / 8)


def test_checksum_detects_corruption():
    buf = bytearray(encode(kv(), "raw", LAYOUT))
    for pos in (HEADER_SIZE + 2, len(buf) // 2, len(buf) - 1):
        bad = bytearray(buf)
        bad[pos] ^= 0x01
        with pytest.raises(ChecksumError):
            decode(bytes(bad))
    with pytest.raises(CodecError):
        decode(bytes(buf[:-1]))
    with pytest.raises(CodecError):
        decode(b"GARBAGE" * 10)


def test_newer_format_version_refused_with_clear_error():
    buf = bytearray(encode(kv(), "raw", LAYOUT))
    buf[4] = 2
    with pytest.raises(FormatVersionError, match="format version 2.*upgrade"):
        decode(bytes(buf))


def test_codec_choice_from_environment(monkeypatch):
    monkeypatch.setenv("KVSTRATA_COMPRESSION", "zstd")
    assert codec.default_codec() == "zstd"
    monkeypatch.setenv("KVSTRATA_COMPRESSION", "nope")
    with pytest.raises(ValueError, match="unknown codec"):
        codec.default_codec()
    monkeypatch.delenv("KVSTRATA_COMPRESSION")
    assert codec.default_codec() == "raw"
    assert set(CODECS) == {"raw", "zstd", "fp8", "fp8+zstd"}


def test_empty_and_scalar_shapes():
    for x in (np.zeros((0, 4), np.float32), np.float32(3.5).reshape(())):
        for name in ("raw", "zstd"):
            y, _ = decode(encode(np.asarray(x), name))
            assert y.shape == x.shape and np.array_equal(y, x)
    assert struct.calcsize("<4sBBBBBBHQQIQ") == HEADER_SIZE


def test_strided_chunk_is_sent_as_its_contiguous_runs_with_identical_bytes():
    kv = np.random.default_rng(3).standard_normal((4, 2, 3, 1024, 64)).astype(np.float32)
    chunk = kv[:, :, :, 256:512]  # a chunk sliced along the token axis: not contiguous
    parts = codec.encode_parts(chunk, "raw", "LKHTD")
    assert len(parts) == 1 + 4 * 2 * 3  # header, then one run per (layer, K/V, head), none of them copied
    assert all(np.shares_memory(np.frombuffer(p, np.uint8), kv) for p in parts[1:])
    assert b"".join(bytes(p) for p in parts) == codec.encode(np.ascontiguousarray(chunk), "raw", "LKHTD")
    arr, _ = codec.decode(b"".join(bytes(p) for p in parts))
    assert np.array_equal(arr, chunk)


def test_small_or_many_runs_fall_back_to_one_copy():
    kv = np.zeros((2, 2, 2, 64, 4), np.float32)  # runs of 1 KiB: gathered into one buffer instead
    assert codec.contiguous_runs(kv[:, :, :, :32]) is None
    assert len(codec.encode_parts(kv[:, :, :, :32], "raw")) == 2


def test_decode_without_checksum_still_checks_lengths():
    value = codec.encode(np.ones((4, 4), np.float32))
    corrupt = bytearray(value)
    corrupt[-1] ^= 0xFF
    arr, _ = codec.decode(corrupt, check=False)  # the caller vouches for the bytes (a leased arena slot)
    assert arr.shape == (4, 4)
    with pytest.raises(codec.CodecError):
        codec.decode(bytes(corrupt)[:-1], check=False)


def test_encode_parts_of_a_strided_chunk_allocates_no_copy():
    """A chunk sliced along T is sent as its runs: encode_parts must not gather (or reshape-copy) it."""
    import tracemalloc

    kv = np.arange(2 * 2 * 4 * 1024 * 64, dtype=np.float32).reshape(2, 2, 4, 1024, 64)
    chunk = kv[:, :, :, 256:512]  # 1 MiB, strided
    tracemalloc.start()
    try:
        parts = codec.encode_parts(chunk, "raw", "LKHTD")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < chunk.nbytes // 4, f"encode_parts allocated {peak} bytes for a {chunk.nbytes}-byte chunk"
    assert b"".join(bytes(p) for p in parts) == codec.encode(np.ascontiguousarray(chunk), "raw", "LKHTD")
