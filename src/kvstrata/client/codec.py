"""KV values: a self-describing header followed by the tensor bytes. No pickle.

Header (little-endian, 40 bytes, then the shape and the layout)::

    offset size  field
    0      4     magic b"KVSC"
    4      1     format version (1)
    5      1     flags: bit 0 fp8 e4m3, bit 1 zstd, bit 2 per-head fp8 scales
    6      1     dtype code of the tensor as given to encode (DTYPES)
    7      1     byte planes used by zstd (1 = none; 2 or 4 = bytes of each element split into planes)
    8      1     ndim
    9      1     layout length in bytes (ASCII, e.g. "LKHTD")
    10     2     reserved (0)
    12     8     raw length: bytes of the decoded tensor
    20     8     payload length: bytes that follow the header
    28     4     number of float32 fp8 scales at the start of the (decompressed) payload
    32     8     xxh3-64 of the header with this field zeroed, then of the payload
    40     8*nd  shape
    ..     len   layout

Codecs: ``raw``; ``zstd`` (the bytes of 16- and 32-bit elements split into planes first: exponent bytes
compress, mantissa bytes barely do); ``fp8`` (e4m3fn with a per-tensor or per-head float32 scale); ``fp8+zstd``.
Decoding verifies the checksum and refuses a format version it does not know.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

MAGIC = b"KVSC"
FORMAT_VERSION = 1
_FIXED = struct.Struct("<4sBBBBBBHQQIQ")
HEADER_SIZE = _FIXED.size  # 40
CHECKSUM_OFFSET = 32  # the 8-byte xxh3-64, computed with this field zeroed
_CHECKSUM_OFFSET = CHECKSUM_OFFSET  # the former private name
FLAGS_OFFSET = 5  # magic (4), format version, then the flags byte

FLAG_FP8 = 1
FLAG_ZSTD = 2
FLAG_PER_HEAD = 4

# dtype name -> (code, numpy storage dtype). bfloat16 is carried as uint16 in numpy.
DTYPES: dict[str, tuple[int, str]] = {
    "float32": (1, "<f4"), "float16": (2, "<f2"), "bfloat16": (3, "<u2"), "float64": (4, "<f8"),
    "int8": (5, "i1"), "uint8": (6, "u1"), "float8_e4m3fn": (7, "u1"), "int32": (8, "<i4"),
    "int64": (9, "<i8"), "uint16": (10, "<u2"),
}
_BY_CODE = {code: name for name, (code, _) in DTYPES.items()}
CODECS = ("raw", "zstd", "fp8", "fp8+zstd")
FP8_MAX = 448.0


class CodecError(ValueError):
    """A value that cannot be decoded (bad magic, truncated, unsupported)."""


class ChecksumError(CodecError):
    """The value's checksum does not match: it was corrupted in storage or transit."""


class FormatVersionError(CodecError):
    """The value was written by a newer kvstrata (or is not a kvstrata value)."""


def default_codec() -> str:
    """The codec from ``KVSTRATA_COMPRESSION`` (raw, zstd, fp8, fp8+zstd), or raw."""
    name = os.environ.get("KVSTRATA_COMPRESSION", "raw").strip().lower() or "raw"
    return check_codec(name)


def check_codec(name: str) -> str:
    name = {"none": "raw", "zstd+fp8": "fp8+zstd"}.get(name, name)
    if name not in CODECS:
        raise ValueError(f"unknown codec {name!r}; known: {', '.join(CODECS)}")
    return name


# ---------------------------------------------------------------------------------------------------------------
# fp8 e4m3fn (no NaN/inf except 0x7F/0xFF as NaN; max 448), implemented with numpy tables
# ---------------------------------------------------------------------------------------------------------------


def _e4m3_table() -> np.ndarray:
    vals = np.zeros(256, dtype=np.float32)
    for b in range(128):
        exp, mant = (b >> 3) & 0xF, b & 7
        v = (mant / 8.0) * 2.0 ** -6 if exp == 0 else (1.0 + mant / 8.0) * 2.0 ** (exp - 7)
        vals[b] = v
        vals[b | 0x80] = -v
    vals[0x7F] = np.nan
    vals[0xFF] = np.nan
    return vals


_E4M3 = _e4m3_table()
_E4M3_POS = _E4M3[:127]  # 0 .. 448, increasing
_E4M3_MID = (_E4M3_POS[:-1] + _E4M3_POS[1:]) / 2


def fp8_quantize(x: np.ndarray) -> np.ndarray:
    """float32 values already scaled into [-448, 448] -> e4m3fn bytes (round to nearest)."""
    a = np.abs(x)
    np.minimum(a, FP8_MAX, out=a)
    code = np.searchsorted(_E4M3_MID, a, side="left").astype(np.uint8)
    code |= (np.signbit(x).astype(np.uint8) << 7)
    return code


def fp8_dequantize(codes: np.ndarray) -> np.ndarray:
    return _E4M3[codes]


def _to_float32(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32, copy=False)


def _from_float32(f: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        u = f.view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return f.astype(DTYPES[dtype][1], copy=False)


def _scale_groups(shape: tuple[int, ...], layout: str, per_head: bool) -> int:
    """How many leading elements of ``shape`` get separate scales (the product of dims up to the head axis)."""
    if not per_head or "H" not in layout or len(layout) != len(shape):
        return 1
    return int(np.prod(shape[: layout.index("H") + 1]))


# ---------------------------------------------------------------------------------------------------------------
# encode / decode
# ---------------------------------------------------------------------------------------------------------------


def as_array(value: Any) -> tuple[np.ndarray, str]:
    """(numpy array, dtype name) of a numpy array or a torch tensor (bfloat16 tensors as uint16 views)."""
    if isinstance(value, np.ndarray):
        name = value.dtype.name
        if name not in DTYPES:
            raise CodecError(f"unsupported dtype {name}")
        return value, name
    mod = type(value).__module__
    if mod.startswith("torch"):
        import torch

        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        name = str(t.dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise CodecError(f"unsupported dtype {name}")
        if name in ("bfloat16", "float8_e4m3fn"):
            if not t.is_contiguous() and t.stride(-1) != 1:
                t = t.contiguous()  # view() to another dtype needs a unit last stride
            t = t.view(torch.uint16 if name == "bfloat16" else torch.uint8)
        return t.numpy(), name  # strided tensors stay strided: encode_parts sends their contiguous runs
    raise CodecError(f"cannot encode a {type(value).__name__}; give a numpy array or a torch tensor")


def encode_parts(value: Any, codec: str = "raw", layout: str = "", *, fp8_scale: str = "head",
                 zstd_level: int = 3) -> list[Any]:
    """Encode a tensor; returns ``[header, payload...]`` buffers to send without joining them."""
    return seal_parts(prepare_parts(value, codec, layout, fp8_scale=fp8_scale, zstd_level=zstd_level))


def seal_parts(parts: list[Any]) -> list[Any]:
    """Fill in the checksum of ``prepare_parts``' header (one pass over the payload). A strided array among the
    parts (``prepare_parts(strided=True)``) is given back as its contiguous runs."""
    parts = [parts[0], *payload_buffers(parts[1:])]
    header = bytearray(parts[0])
    header[CHECKSUM_OFFSET:CHECKSUM_OFFSET + 8] = bytes(8)
    h = xxhash.xxh3_64(header)
    for p in parts[1:]:
        h.update(p)
    struct.pack_into("<Q", header, CHECKSUM_OFFSET, h.intdigest())
    return [bytes(header), *parts[1:]]


def payload_buffers(parts: list[Any]) -> list[Any]:
    """``parts`` with each numpy array among them (``prepare_parts(strided=True)``) replaced by byte views of its
    contiguous runs (a copy when they are too small to be worth it)."""
    out: list[Any] = []
    for p in parts:
        if isinstance(p, np.ndarray):
            runs = contiguous_runs(p) if not p.flags.c_contiguous else None
            out += runs if runs is not None else [memoryview(np.ascontiguousarray(p).reshape(-1).view(np.uint8))]
        else:
            out.append(p)
    return out


def raw_header(shape: tuple[int, ...], dtype: str, layout: str = "") -> bytes:
    """The header of a raw value of ``shape`` and dtype name ``dtype`` (DTYPES), its checksum field zero: what
    ``prepare_parts`` puts before a C-ordered payload, for a writer that places the payload itself
    (``kvstrata.client.stage``: an engine filling a reservation)."""
    if dtype not in DTYPES:
        raise CodecError(f"unsupported dtype {dtype}")
    shape = tuple(int(s) for s in shape)
    layout_b = layout.encode("ascii")
    if len(layout_b) > 255 or len(shape) > 255:
        raise CodecError("layout or ndim too long")
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(DTYPES[dtype][1]).itemsize
    fixed = _FIXED.pack(MAGIC, FORMAT_VERSION, 0, DTYPES[dtype][0], 1, len(shape), len(layout_b), 0, n, n, 0, 0)
    return fixed + struct.pack(f"<{len(shape)}Q", *shape) + layout_b


def parts_nbytes(parts: Any) -> int:
    """Bytes in a value given as parts (bytes, memoryviews, numpy arrays)."""
    return sum(p.nbytes if isinstance(p, (memoryview, np.ndarray)) else len(p) for p in parts)


def prepare_parts(value: Any, codec: str = "raw", layout: str = "", *, fp8_scale: str = "head",
                  zstd_level: int = 3, strided: bool = False) -> list[Any]:
    """``[header, payload...]`` with the header's checksum field still zero: the value's xxh3-64 over these
    bytes is that checksum. ``seal_parts`` fills it in; a two-phase write (kvstrata.client.stage) computes it
    while copying the parts into place, saving a pass over the tensor. ``strided``: a raw non-contiguous
    array whose last axis is contiguous is given as the array itself, ``[header, array]``, for a writer that
    copies it with numpy (``seal_parts`` and ``payload_buffers`` turn it into runs)."""
    codec = check_codec(codec)
    arr, dtype = as_array(value)
    runs = None
    if strided and codec == "raw" and not arr.flags.c_contiguous and arr.size and arr.strides[-1] == arr.itemsize:
        runs = [arr]  # the payload is the array's bytes in C order: copied block by block by the writer
    elif not arr.flags.c_contiguous:
        # A chunk sliced out of a larger KV tensor along its token axis: send its contiguous runs (one per
        # layer, K/V and head) as they are instead of gathering them into a copy first.
        runs = contiguous_runs(arr) if codec == "raw" else None
        if runs is None:
            arr = arr.copy(order="C")
    shape = tuple(int(s) for s in arr.shape)
    layout_b = layout.encode("ascii")
    if len(layout_b) > 255 or len(shape) > 255:
        raise CodecError("layout or ndim too long")
    raw_len = arr.nbytes
    flags = 0
    planes = 1
    scales = b""
    nscales = 0
    # Not for runs: reshape(-1) of a strided array is a copy of the whole chunk (the one encode avoids).
    data: Any = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size and runs is None else b""
    if codec.startswith("fp8"):
        if dtype not in ("float32", "float16", "bfloat16", "float64"):
            raise CodecError(f"fp8 needs a floating-point tensor, not {dtype}")
        flags |= FLAG_FP8
        groups = _scale_groups(shape, layout, fp8_scale == "head")
        if groups > 1:
            flags |= FLAG_PER_HEAD
        f = _to_float32(arr, dtype).reshape(groups, -1)
        amax = np.abs(f).max(axis=1) if f.size else np.zeros(groups, np.float32)
        sc = np.where(amax > 0, amax / FP8_MAX, 1.0).astype(np.float32)
        q = fp8_quantize(f / sc[:, None])
        scales = sc.astype("<f4").tobytes()
        nscales = groups
        data = memoryview(q.reshape(-1))
    if codec.endswith("zstd"):
        flags |= FLAG_ZSTD
        itemsize = 1 if flags & FLAG_FP8 else arr.dtype.itemsize
        body = np.frombuffer(data, dtype=np.uint8) if len(data) else np.zeros(0, np.uint8)
        if itemsize in (2, 4) and body.size:
            planes = itemsize
            body = np.ascontiguousarray(body.reshape(-1, itemsize).T)
        payload = _zstd_compressor(zstd_level).compress(scales + body.tobytes())
        parts_payload: list[Any] = [payload]
        scales = b""
    elif runs is not None:
        parts_payload = runs
    else:
        parts_payload = [scales, data] if scales else [data]
    payload_len = parts_nbytes(parts_payload)
    dtype_code = DTYPES[dtype][0]
    fixed = _FIXED.pack(MAGIC, FORMAT_VERSION, flags, dtype_code, planes, len(shape), len(layout_b), 0,
                        raw_len, payload_len, nscales, 0)
    tail = struct.pack(f"<{len(shape)}Q", *shape) + layout_b
    return [fixed + tail, *parts_payload]


def contiguous_runs(arr: np.ndarray, min_run: int = 16 * 1024, max_runs: int = 4096) -> list[memoryview] | None:
    """Byte views of ``arr``'s C-contiguous blocks in order (its trailing axes that are laid out contiguously),
    or None when they are too small or too many to be worth sending one by one."""
    expected = arr.itemsize
    k = arr.ndim
    while k > 0 and (arr.shape[k - 1] == 1 or arr.strides[k - 1] == expected):
        expected *= arr.shape[k - 1]
        k -= 1
    outer = arr.shape[:k]
    count = int(np.prod(outer)) if outer else 1
    if expected < min_run or count > max_runs or arr.size == 0:
        return None
    return [memoryview(arr[idx].reshape(-1).view(np.uint8)) for idx in np.ndindex(*outer)]


def encode(value: Any, codec: str = "raw", layout: str = "", **kw: Any) -> bytes:
    """Encode a tensor into one bytes object (joins the parts; see ``encode_parts`` to avoid the copy)."""
    return b"".join(bytes(p) if isinstance(p, memoryview) else p for p in encode_parts(value, codec, layout, **kw))


@dataclass
class Header:
    version: int
    flags: int
    dtype: str
    planes: int
    shape: tuple[int, ...]
    layout: str
    raw_len: int
    payload_len: int
    nscales: int
    checksum: int
    size: int  # header bytes including shape and layout

    @property
    def codec(self) -> str:
        fp8, zstd = self.flags & FLAG_FP8, self.flags & FLAG_ZSTD
        return "fp8+zstd" if fp8 and zstd else "fp8" if fp8 else "zstd" if zstd else "raw"


def read_header(buf: Any) -> Header:
    mv = memoryview(buf)
    if mv.nbytes < HEADER_SIZE:
        raise CodecError(f"value too short for a kvstrata header ({mv.nbytes} bytes)")
    (magic, version, flags, dtype_code, planes, ndim, layout_len, _res, raw_len, payload_len, nscales,
     checksum) = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise CodecError(f"not a kvstrata KV value (magic {bytes(magic)!r})")
    if version != FORMAT_VERSION:
        raise FormatVersionError(
            f"KV value has format version {version}; this kvstrata reads version {FORMAT_VERSION} only"
            + (" (written by a newer kvstrata: upgrade this client)" if version > FORMAT_VERSION else ""))
    if dtype_code not in _BY_CODE:
        raise CodecError(f"unknown dtype code {dtype_code}")
    size = HEADER_SIZE + 8 * ndim + layout_len
    if mv.nbytes < size:
        raise CodecError("truncated header")
    shape = struct.unpack_from(f"<{ndim}Q", mv, HEADER_SIZE)
    layout = bytes(mv[HEADER_SIZE + 8 * ndim: size]).decode("ascii")
    return Header(version, flags, _BY_CODE[dtype_code], planes, tuple(shape), layout, raw_len, payload_len,
                  nscales, checksum, size)


# zstd contexts cost more to make than a small chunk costs to (de)compress; one per thread, as they are not
# safe to share between threads (the transformers integration stores from a thread of its own).
_zstd = threading.local()


def _zstd_compressor(level: int) -> Any:
    cache = _zstd.__dict__.setdefault("compressors", {})
    cctx = cache.get(level)
    if cctx is None:
        import zstandard

        cctx = cache[level] = zstandard.ZstdCompressor(level=level)
    return cctx


def _zstd_decompressor() -> Any:
    dctx = getattr(_zstd, "decompressor", None)
    if dctx is None:
        import zstandard

        dctx = _zstd.decompressor = zstandard.ZstdDecompressor()
    return dctx


def verify(buf: Any, check: bool = True) -> Header:
    """Check length and (unless ``check`` is false) checksum; returns the header."""
    mv = memoryview(buf)
    hdr = read_header(mv)
    if mv.nbytes != hdr.size + hdr.payload_len:
        raise CodecError(f"value length {mv.nbytes} != header {hdr.size} + payload {hdr.payload_len}")
    if not check:
        return hdr
    h = xxhash.xxh3_64()
    h.update(mv[:CHECKSUM_OFFSET])
    h.update(b"\0" * 8)
    h.update(mv[CHECKSUM_OFFSET + 8:])
    if h.intdigest() != hdr.checksum:
        raise ChecksumError("KV value checksum mismatch (corrupted value)")
    return hdr


def decode(buf: Any, out: np.ndarray | None = None, check: bool = True) -> tuple[np.ndarray, Header]:
    """Verify and decode a value: (numpy array in the original dtype and shape, header).

    ``check=False`` skips the checksum (lengths are still checked): for bytes that cannot have changed since
    they were verified or written, such as a leased value read in place from the server's arena.

    bfloat16 comes back as a uint16 array (``to_torch`` views it as bfloat16). For the raw codec without
    ``out`` the array is a zero-copy view of ``buf``; with ``out`` (a preallocated array of the right size) the
    bytes are written there.
    """
    mv = memoryview(buf)
    hdr = verify(mv, check)
    np_dtype = np.dtype(DTYPES[hdr.dtype][1])
    payload = mv[hdr.size:]
    if hdr.flags & FLAG_ZSTD:
        payload = memoryview(_zstd_decompressor().decompress(payload))
    scales = None
    if hdr.nscales:
        scales = np.frombuffer(payload[: 4 * hdr.nscales], dtype="<f4")
        payload = payload[4 * hdr.nscales:]
    n_elem = int(np.prod(hdr.shape)) if hdr.shape else 1
    if hdr.flags & FLAG_FP8:
        body = np.frombuffer(payload, dtype=np.uint8)
        if hdr.planes > 1:
            body = body.reshape(hdr.planes, -1).T.reshape(-1)
        if body.size != n_elem:
            raise CodecError("fp8 payload size does not match the shape")
        groups = max(hdr.nscales, 1)
        f = fp8_dequantize(body.reshape(groups, -1)) * (scales[:, None] if scales is not None else 1.0)
        arr = _from_float32(f.astype(np.float32, copy=False), hdr.dtype)
    else:
        body = np.frombuffer(payload, dtype=np.uint8)
        if body.size != hdr.raw_len:
            raise CodecError("payload size does not match the raw length")
        if hdr.planes > 1:
            body = np.ascontiguousarray(body.reshape(hdr.planes, -1).T)
        arr = body.reshape(-1).view(np_dtype)
    arr = arr.reshape(hdr.shape)
    if out is not None:
        if out.nbytes != hdr.raw_len:
            raise CodecError(f"output buffer has {out.nbytes} bytes, value needs {hdr.raw_len}")
        np.copyto(out.reshape(hdr.shape).view(np_dtype), arr.view(np_dtype), casting="no")
        return out, hdr
    return arr, hdr


def to_torch(arr: np.ndarray, dtype: str) -> Any:
    """A torch tensor sharing memory with ``arr`` (bfloat16 / fp8 reinterpreted from their integer storage)."""
    import torch

    if not arr.flags.writeable:  # torch warns on read-only buffers; copy so tensors own writable memory
        arr = arr.copy()
    t = torch.from_numpy(arr)
    if dtype == "bfloat16":
        t = t.view(torch.bfloat16)
    elif dtype == "float8_e4m3fn":
        t = t.view(torch.float8_e4m3fn)
    return t
