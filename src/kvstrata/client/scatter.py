"""Scatter receive of KV values: a value's RESP bulk reply read straight into the caller's tensor memory.

Over a socket, a restore used to be three passes over every byte on the client: the kernel copy into a receive
buffer, the checksum over that buffer, and the copy out into the caller's array. Here the value's header is read
first (a few dozen bytes); when it is a raw-codec tensor whose shape fits the destination slot, its payload is
received with ``recvmsg_into`` straight into the slot's contiguous runs (one per layer, K/V and head of a chunk
sliced along the token axis), and each piece is hashed as soon as the kernel has written it, while it is still
in cache. So the only pass over memory is the kernel's copy; the xxh3 over warm bytes costs no memory traffic.

The checksum is known only once the last byte has landed, so a corrupted value has already been written into
its slot when it is detected: ``read_value`` then raises ``ChecksumError`` after consuming the whole value (the
connection stays usable) and the caller must treat the slot as unfilled. A value that cannot be placed
(compressed, another shape, a destination with runs too small to be worth a syscall each) is received whole into
a buffer of its own and decoded as before; the caller copies it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

from kvstrata.client.codec import (
    _CHECKSUM_OFFSET,
    _FIXED,
    DTYPES,
    HEADER_SIZE,
    ChecksumError,
    CodecError,
    Header,
    contiguous_runs,
    decode,
    read_header,
)
from kvstrata.client.fast import FastClient, RespError

# Runs shorter than this are not received one by one (a syscall's iovec slot per few bytes): such a destination
# gets the whole value in a buffer and one copy instead.
MIN_RUN = 4096
MAX_RUNS = 1 << 16

Place = Callable[[Header], "np.ndarray | None"]


def dest_runs(dest: np.ndarray) -> list[memoryview] | None:
    """Writable byte views of ``dest``'s contiguous runs in C order, or None when there are too many small ones."""
    if dest.size == 0 or not dest.flags.writeable:
        return None
    if dest.flags.c_contiguous:
        return [memoryview(dest.reshape(-1).view(np.uint8))]
    run = dest.itemsize
    k = dest.ndim
    while k > 0 and (dest.shape[k - 1] == 1 or dest.strides[k - 1] == run):
        run *= dest.shape[k - 1]
        k -= 1
    outer, strides = dest.shape[:k], dest.strides[:k]
    count = int(np.prod(outer))
    if run < MIN_RUN or count > MAX_RUNS:
        return None
    if any(st < 0 for st in strides) or k == dest.ndim:
        return contiguous_runs(dest, min_run=MIN_RUN, max_runs=MAX_RUNS)
    # Byte offsets of the runs (C order), sliced out of one byte view spanning them: numpy indexing per run
    # costs more than receiving a 64 KB run.
    offsets = np.zeros(1, dtype=np.int64)
    for n, st in zip(outer, strides, strict=True):
        offsets = (offsets[:, None] + np.arange(n, dtype=np.int64) * st).reshape(-1)
    span = int(offsets.max()) + run
    flat = np.lib.stride_tricks.as_strided(dest.view(np.uint8), shape=(span,), strides=(1,))
    mv = memoryview(flat)
    return [mv[o:o + run] for o in offsets.tolist()]


def placeable(hdr: Header, n: int) -> bool:
    """Whether a value's payload is the tensor's bytes as they are (raw codec, no scales, no planes)."""
    return (hdr.flags == 0 and hdr.planes == 1 and hdr.nscales == 0 and hdr.payload_len == hdr.raw_len
            and n == hdr.size + hdr.payload_len)


def read_value(fc: FastClient, n: int, place: Place) -> tuple[Header | None, np.ndarray, bool]:
    """Read one ``n``-byte KV value (its bulk length already read) and the CRLF after it.

    ``place(header)`` returns the array the tensor should land in (same shape, same item size) or None.
    Returns ``(header, array, placed)``: ``placed`` means the bytes are in the array ``place`` gave and their
    checksum matched; otherwise ``array`` is the value decoded from a buffer of its own (verified), to be copied
    by the caller. Raises ``CodecError`` (``ChecksumError``, ``FormatVersionError``) for a bad value, after
    consuming all of it; ``ConnectionError``/``OSError`` when the connection fails mid-value (the destination
    is then partly written and must be treated as unfilled)."""
    fixed = bytearray(min(n, HEADER_SIZE))
    fc.recv_scatter([memoryview(fixed)])
    if n < HEADER_SIZE:
        return _whole(fc, n, fixed)
    size = _header_size(fixed)
    if size is None or size > n:
        return _whole(fc, n, fixed)
    head = fixed + bytearray(size - HEADER_SIZE)
    if size > HEADER_SIZE:
        fc.recv_scatter([memoryview(head)[HEADER_SIZE:]])
    try:
        hdr = read_header(head)
    except CodecError:
        return _whole(fc, n, head)
    slot = place(hdr) if placeable(hdr, n) else None
    runs = None if slot is None else dest_runs(slot)
    if runs is None or sum(r.nbytes for r in runs) != hdr.payload_len:
        return _whole(fc, n, head)
    h = xxhash.xxh3_64()
    struct.pack_into("<Q", head, _CHECKSUM_OFFSET, 0)
    h.update(head)
    fc.recv_scatter(runs, h.update)
    fc.end_bulk()
    if h.intdigest() != hdr.checksum:
        raise ChecksumError("KV value checksum mismatch (corrupted value)")
    assert slot is not None
    return hdr, slot, True


def _header_size(fixed: bytearray) -> int | None:
    """Header bytes (fixed part, shape, layout) that the fixed part announces; None if it is no header."""
    if len(fixed) < HEADER_SIZE:
        return None
    fields = _FIXED.unpack_from(fixed, 0)
    ndim, layout_len = fields[5], fields[6]
    return HEADER_SIZE + 8 * ndim + layout_len


def _whole(fc: FastClient, n: int, start: bytearray) -> tuple[Header | None, np.ndarray, bool]:
    """The rest of the value into a buffer with ``start`` (bytes already read), then a normal decode."""
    buf = start
    if n > len(start):
        buf = bytearray(n)
        buf[:len(start)] = start
        fc.recv_scatter([memoryview(buf)[len(start):]])
    fc.end_bulk()
    arr, hdr = decode(buf)
    return hdr, arr, False


def item_size(hdr: Header) -> int:
    return int(np.dtype(DTYPES[hdr.dtype][1]).itemsize)


def slot_fits(slot: np.ndarray, hdr: Header) -> bool:
    """A value of ``hdr``'s shape and item size can be received into ``slot`` byte for byte."""
    return tuple(slot.shape) == tuple(hdr.shape) and slot.itemsize == item_size(hdr)


OnValue = Callable[[int, "Header | None", np.ndarray, bool, int], bool]


def mget_scatter(fc: FastClient, keys: list[bytes], place: Place, before: list[Any] | None = None,
                 command: bytes = b"TAIR.KV.MGET", on_value: OnValue | None = None,
                 on_error: Callable[[int, CodecError], None] | None = None,
                 on_before_error: Callable[[RespError], None] | None = None) -> int:
    """One MGET read as a prefix: each value with ``read_value``, then ``on_value(index, header, array,
    placed, nbytes)``, which returns whether the caller wants the next ones. The prefix ends at the first
    missing key, bad value (``on_error(index, error)``; without ``on_error`` the error is raised once the whole
    reply has been read) or refusal; the rest of the reply is read and dropped, so the connection stays in
    step. Returns how many values were accepted. ``before``: a command sent in the same write ahead of the
    MGET (its reply is read and dropped; an error reply raises ``RespError``, or goes to ``on_before_error``
    and the MGET is read all the same)."""
    if before:
        fc.send_many((before, (command, *keys)))
        fc.read_before(on_before_error)
    else:
        fc.send(command, *keys)
    count = fc.read_array_len() or 0
    wanted = True
    accepted = 0
    error: CodecError | None = None
    for i in range(count):
        n = fc.read_bulk_len()
        if n is None:
            wanted = False
            continue
        if not wanted:
            fc.skip(n)
            fc.end_bulk()
            continue
        try:
            hdr, arr, placed = read_value(fc, n, place)
        except CodecError as exc:
            wanted = False
            if on_error is None:
                error = exc
            else:
                on_error(i, exc)
            continue
        if on_value is not None and not on_value(i, hdr, arr, placed, n):
            wanted = False
            continue
        accepted += 1
    if error is not None:
        raise error
    return accepted
