"""The client side of two-phase writes: write values into this client's own staging segment, then commit.

``StageWriter`` is a ``FastClient`` on the server's Unix socket. On connect (after AUTH) it sends
``TAIR.KV.STAGE``; the reply carries a writable descriptor of a segment the server made for this client alone
(SCM_RIGHTS), which it maps. ``put_many`` then stores values without sending their bytes through the socket:
``TAIR.KV.RESERVE`` (one round trip per wave of values that fits the segment), one copy of each value's parts
into its reservation (each piece hashed right after it is copied, while it is in cache), and a pipelined
``TAIR.KV.COMMIT key ttl reservation xxh3`` per value, sent as soon as that value is written, so the server
verifies and stores one value while this client writes the next. Design and security model:
docs/dataplane.md.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import xxhash

from kvstrata.client.codec import CHECKSUM_OFFSET, parts_nbytes
from kvstrata.client.fast import FastClient, RespError

PAGE = 4096
PIECE = 256 * 1024  # copied then hashed at once: the hash reads the piece from (L2) cache
ALIGN = 64  # a reserved value's payload starts this aligned (its header is placed before it: COMMIT ... SKIP)


class StageUnavailable(Exception):
    """The server gives this client no staging segment (not kvstrata, arena or staging off, not Unix)."""


def _span(n: int) -> int:
    return -(-n // PAGE) * PAGE


def _byte_view(p: Any) -> memoryview:
    mv = p if isinstance(p, memoryview) else memoryview(p)
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


def _blocks(shape: tuple[int, ...], piece: int) -> Iterator[tuple[Any, ...]]:
    """Indexes that cut a C-ordered array of bytes with ``shape`` into consecutive blocks of about ``piece``
    bytes (whole rows of one axis; a row larger than ``piece`` is cut along the next axis): each block is
    contiguous in a C-contiguous array of that shape."""
    row = 1
    for n in shape[1:]:
        row *= n
    if len(shape) > 1 and row > piece:
        for i in range(shape[0]):
            for idx in _blocks(shape[1:], piece):
                yield (i, *idx)
        return
    step = max(1, piece // max(row, 1))
    for a in range(0, shape[0], step):
        yield (slice(a, a + step),)


class StagedValue:
    """A value reserved for its writer to fill in place: ``array`` is a writable numpy view of its payload in the
    segment (``ALIGN``-aligned, C-ordered), placed right after ``header`` (the codec header, checksum zero).
    Valid until committed or given back: the segment's room is reused after that."""

    __slots__ = ("array", "header", "key", "off", "rid", "skip", "ttl_ms")

    def __init__(self, key: Any, ttl_ms: int, rid: int, off: int, skip: int, header: bytes,
                 array: np.ndarray) -> None:
        self.key, self.ttl_ms, self.rid, self.off, self.skip = key, ttl_ms, rid, off, skip
        self.header, self.array = header, array

    @property
    def nbytes(self) -> int:
        return len(self.header) + self.array.nbytes


class StageWriter(FastClient):
    """A Unix-socket client with its own staging segment mapped writable (module docstring)."""

    def __init__(self, unix_path: str, *, password: str | None = None, username: str | None = None,
                 timeout: float | None = 60.0) -> None:
        super().__init__(unix_path=unix_path, timeout=timeout, password=password, username=username)
        try:
            self.mm, self.size = self._attach()
        except BaseException:
            self.sock.close()
            raise
        self.view = memoryview(self.mm)
        # Values reserved at once; halved when the server's DRAM budget cannot hold a whole wave.
        self.max_wave = 16

    def _attach(self) -> tuple[mmap.mmap, int]:
        return self.map_passed_fd(b"TAIR.KV.STAGE", mmap.PROT_READ | mmap.PROT_WRITE, StageUnavailable, "staging")

    def fits(self, n: int) -> bool:
        """Whether a value of ``n`` bytes can be staged at all (it must fit the segment)."""
        return 0 < n and _span(n) <= self.size

    def reserve(self, lengths: Sequence[int]) -> list[tuple[int, int]]:
        """(reservation id, offset in the segment) per length, all or none (RespError when refused)."""
        return [(int(r), int(o)) for r, o in self.call(b"TAIR.KV.RESERVE", *lengths)]

    def write(self, offset: int, parts: Sequence[Any], sum_at: int | None = None) -> int:
        """Copy ``parts`` one after another into the segment at ``offset``, hashing each piece right after
        copying it; returns the xxh3-64 of the bytes. ``sum_at``: the bytes carry their own checksum there
        (8 bytes, zero in ``parts``, as in ``codec.prepare_parts``' header), which is filled in afterwards."""
        view = self.view
        h = xxhash.xxh3_64()
        pos = offset
        for p in parts:
            if isinstance(p, np.ndarray):  # a strided chunk (codec.prepare_parts(strided=True)): numpy copies it
                self._copy_array(pos, p, h)
                pos += p.nbytes
                continue
            src = _byte_view(p)
            n = src.nbytes
            for o in range(0, n, PIECE):
                e = min(o + PIECE, n)
                dst = view[pos + o:pos + e]
                dst[:] = src[o:e]
                h.update(dst)
            pos += n
        digest = h.intdigest()
        if sum_at is not None:
            view[offset + sum_at:offset + sum_at + 8] = digest.to_bytes(8, "little")
        return digest

    def _copy_array(self, pos: int, arr: np.ndarray, h: Any) -> None:
        """Copy ``arr`` (any strides, last axis contiguous) in C order into the segment at ``pos``, block by
        block (numpy copies each block's strided runs in one call), hashing each block right after it is
        copied, while it is in cache."""
        src = arr.view(np.uint8)  # bytes: the payload may sit at any alignment after the codec header
        dst = np.frombuffer(self.mm, np.uint8, src.size, pos).reshape(src.shape)
        for idx in _blocks(src.shape, PIECE):
            d = dst[idx]
            np.copyto(d, src[idx])
            h.update(d)

    def put_many(self, items: Sequence[tuple[Any, int, Sequence[Any]]], sum_at: int | None = None) -> list[Any]:
        """Store each (key, ttl_ms, parts) through the segment; one reply per item (the new version, or a
        RespError). Every value must ``fit``. ``sum_at``: each value carries its own checksum there (see
        ``write``; the SDK codec's header, ``codec.prepare_parts``): the client then hashes each value once."""
        sizes = [parts_nbytes(parts) for _, _, parts in items]
        out: list[Any] = []
        i = 0
        while i < len(items):
            # A wave: as many values as the segment holds at once (at most ``max_wave``).
            j, room = i, self.size
            while j < len(items) and j - i < self.max_wave and _span(sizes[j]) <= room:
                room -= _span(sizes[j])
                j += 1
            if j == i:
                raise ValueError(f"a value of {sizes[i]} bytes does not fit the staging segment ({self.size})")
            try:
                slots = self.reserve(sizes[i:j])
            except RespError as exc:
                # Reserved bytes are charged to the server's DRAM budget, and their number is bounded per client:
                # a wave refused whole is halved; a single value the budget cannot hold gets the refusal as its
                # answer (as SETEX would); any other refusal of a single value is raised.
                if j - i > 1:
                    self.max_wave = max(1, (j - i) // 2)
                elif str(exc).startswith("OOM"):
                    out.append(exc)
                    i = j
                else:
                    raise
                continue
            out += self._write_wave(items[i:j], slots, sum_at)
            i = j
        return out

    def _write_wave(self, items: Sequence[tuple[Any, int, Sequence[Any]]], slots: list[tuple[int, int]],
                    sum_at: int | None) -> list[Any]:
        """Write each value into its reservation and send its COMMIT at once (the server verifies and stores
        it while the next one is written); then read the replies."""
        out: list[Any] = []
        sent = 0
        failed: list[int] = []
        try:
            for (key, ttl_ms, parts), (rid, off) in zip(items, slots, strict=True):
                digest = self.write(off, parts, sum_at)
                opts = () if sum_at is None else (b"SUMAT", sum_at)
                self.send(b"TAIR.KV.COMMIT", key, ttl_ms, rid, b"%016x" % digest, *opts)
                sent += 1
        finally:
            if sent < len(slots):  # a write failed: give the rest back
                self.send(b"TAIR.KV.UNRESERVE", *[rid for rid, _ in slots[sent:]])
            for rid, _ in slots[:sent]:
                try:
                    out.append(self.read_reply())
                except RespError as exc:
                    out.append(exc)
                    failed.append(rid)
            if sent < len(slots):
                self.read_reply()
        if failed:
            # A commit refused before it ran (ACL, a full pipeline of errors) left its reservation: give it back
            # (a commit that ran ended it already; UNRESERVE then counts nothing).
            self.call(b"TAIR.KV.UNRESERVE", *failed)
        return out

    # ---- values written in place by the caller (an engine's own copy lands in the segment) ----
    def stage_values(self, items: Sequence[tuple[Any, int, bytes, tuple[int, ...], Any]]) -> list[StagedValue]:
        """Reserve room for each (key, ttl_ms, header, shape, numpy dtype) (all or none: RespError when refused):
        the header (``codec.raw_header``, checksum zero) is written, and the payload is left for the caller to
        fill through ``StagedValue.array``. Commit with ``commit_values``, or give back with ``unreserve_values``."""
        pads = [-len(h) % ALIGN for _, _, h, _, _ in items]
        lengths = [pad + len(h) + int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
                   for pad, (_, _, h, shape, dt) in zip(pads, items, strict=True)]
        if sum(_span(n) for n in lengths) > self.size:
            raise ValueError(f"{sum(lengths)} bytes do not fit the staging segment ({self.size})")
        out = []
        for pad, (key, ttl_ms, header, shape, dt), (rid, off) in zip(pads, items, self.reserve(lengths),
                                                                     strict=True):
            start = off + pad
            self.view[start:start + len(header)] = header
            count = int(np.prod(shape, dtype=np.int64))
            arr = np.frombuffer(self.mm, np.dtype(dt), count, start + len(header)).reshape(shape)
            out.append(StagedValue(key, ttl_ms, rid, off, pad, bytes(header), arr))
        return out

    def send_commit(self, v: StagedValue) -> None:
        """Hash a filled value in the segment (one pass: its header's checksum field is zero there), fill in its
        checksum and send its COMMIT without waiting (``commit_values`` reads the reply)."""
        start = v.off + v.skip
        digest = xxhash.xxh3_64_intdigest(self.view[start:start + v.nbytes])
        self.view[start + CHECKSUM_OFFSET:start + CHECKSUM_OFFSET + 8] = digest.to_bytes(8, "little")
        self.send(b"TAIR.KV.COMMIT", v.key, v.ttl_ms, v.rid, b"%016x" % digest, b"SUMAT", CHECKSUM_OFFSET,
                  b"SKIP", v.skip)

    def commit_values(self, values: Sequence[StagedValue], sent: Sequence[StagedValue] = ()) -> list[Any]:
        """Commit ``values`` (``sent``: those whose COMMIT ``send_commit`` sent already, in that order); each
        COMMIT goes out as soon as its value is hashed (the server verifies and stores one value while this
        client hashes the next). One reply per value of ``values``, in their order (the new version, or a
        RespError)."""
        order = list(sent)
        try:
            done = {id(v) for v in order}
            for v in values:
                if id(v) not in done:
                    self.send_commit(v)
                    order.append(v)
        finally:
            replies: dict[int, Any] = {}
            for v in order:
                try:
                    replies[id(v)] = self.read_reply()
                except RespError as exc:
                    replies[id(v)] = exc
            rest = [v for v in values if id(v) not in replies]
            if rest:
                self.unreserve_values(rest)
        out = [replies[id(v)] for v in values]
        failed = [v for v, r in zip(values, out, strict=True) if isinstance(r, RespError)]
        if failed:  # refused before it ran (ACL...): its reservation is still held
            self.unreserve_values(failed)
        return out

    def unreserve_values(self, values: Sequence[StagedValue]) -> None:
        if values:
            self.call(b"TAIR.KV.UNRESERVE", *[v.rid for v in values])

    def close(self) -> None:
        self.view.release()
        try:
            self.mm.close()
        except BufferError:  # a caller still holds a view of the mapping: the GC unmaps it later
            pass
        super().close()
