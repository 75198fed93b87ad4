"""Destination placement for ``KVCacheClient.retrieve(out=)``: chunks copied, or received, into their slot.

``_Filler`` is the chunk list a retrieve into ``out`` fills: each chunk goes to the next slot along the token
axis, either copied as it is decoded (``append``) or received there directly by a scatter read (``place`` then
``commit``, ``kvstrata.client.scatter``). ``_copy_along``, ``_copied`` and ``_joined_shape`` are the copy
helpers of the arena read path. Every copy here goes through the client's ``CopyPool``
(``kvstrata.client.copypool``) when one is given: a large one is shared by its threads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvstrata.client.codec import DTYPES
from kvstrata.client.copypool import CopyPool, copy_pair
from kvstrata.client.scatter import slot_fits


def _copy_bytes(dst: np.ndarray, src: np.ndarray, copies: CopyPool | None = None) -> None:
    """``src`` into ``dst`` through byte views where possible (``copypool.byte_views``); shared by the threads
    of ``copies`` when it is large."""
    if copies is None:
        copy_pair(dst, src)
    else:
        copies.copy([(dst, src)])


class _Filler(list):  # type: ignore[type-arg]
    """The chunk list of ``retrieve(out=)``: each appended chunk is copied at once into the next slot of ``out``
    along the token axis (the list keeps those filled slots)."""

    def __init__(self, out: np.ndarray | None, axis: int, tokens: int = 0, copies: CopyPool | None = None) -> None:
        """``out=None``: ``out`` is made on the first chunk, ``tokens`` long on the token axis (np.empty: pages
        never written cost nothing). ``copies``: the pool that shares each large chunk's copy."""
        super().__init__()
        self.dest: np.ndarray = out  # type: ignore[assignment]
        self.axis, self.pos, self.tokens = axis, 0, tokens
        self.copies = copies

    def _make(self, shape: tuple[int, ...], dtype: Any) -> None:
        if self.dest is None:
            full = list(shape)
            full[self.axis] = self.tokens
            self.dest = np.empty(tuple(full), dtype)

    def _slot(self, start: int, end: int) -> np.ndarray:
        index: list[Any] = [slice(None)] * self.dest.ndim
        index[self.axis] = slice(start, end)
        return self.dest[tuple(index)]

    def append(self, chunk: np.ndarray) -> None:
        self._make(chunk.shape, chunk.dtype)
        end = self.pos + chunk.shape[self.axis]
        if end > self.dest.shape[self.axis]:
            raise ValueError(f"chunk of {chunk.shape[self.axis]} tokens does not fit at {self.pos} of "
                             f"{self.dest.shape[self.axis]}")
        slot = self._slot(self.pos, end)
        _copy_bytes(slot, chunk.view(self.dest.dtype) if chunk.dtype != self.dest.dtype else chunk, self.copies)
        self.pos = end
        super().append(slot)

    def extend(self, chunks: Any) -> None:
        for chunk in chunks:
            self.append(chunk)

    def place(self, hdr: Any) -> np.ndarray | None:
        """The next slot, for a scatter receive of a value with header ``hdr``; None when it does not fit there
        byte for byte (then the value is decoded and ``append``-ed as usual)."""
        shape = hdr.shape
        if len(shape) <= self.axis:
            return None
        self._make(shape, np.dtype(DTYPES[hdr.dtype][1]))
        if len(shape) != self.dest.ndim or any(
                s != d for k, (s, d) in enumerate(zip(shape, self.dest.shape, strict=True)) if k != self.axis):
            return None
        end = self.pos + shape[self.axis]
        if end > self.dest.shape[self.axis]:
            return None
        slot = self._slot(self.pos, end)
        return slot if slot_fits(slot, hdr) else None

    def commit(self, slot: np.ndarray) -> None:
        """``slot`` (from ``place``) has been filled and verified: it is the next chunk."""
        self.pos += slot.shape[self.axis]
        super().append(slot)

    def filled(self) -> np.ndarray | None:
        return self._slot(0, self.pos) if self.pos else None

    def compact(self) -> np.ndarray | None:
        """The filled part as a C-contiguous array of its own size (a copy only when ``out`` is not all filled)."""
        if not self.pos:
            return None
        if self.pos == self.dest.shape[self.axis]:
            return self.dest
        return np.ascontiguousarray(self.filled())


def _copied(arrays: list[np.ndarray], copies: CopyPool | None = None) -> list[np.ndarray]:
    """Each array copied into a new one of its own (one batch for ``copies``)."""
    out = [np.empty(a.shape, a.dtype) for a in arrays]
    pairs = list(zip(out, arrays, strict=True))
    if copies is None:
        for d, s in pairs:
            copy_pair(d, s)
    else:
        copies.copy(pairs)
    return out


def _copy_along(chunks: list[np.ndarray], out: np.ndarray, axis: int, copies: CopyPool | None = None) -> np.ndarray:
    """``chunks`` one after the other along ``axis`` into ``out`` (chunks of another dtype of the same width are
    viewed as ``out``'s), as one batch for ``copies``; returns the filled part of ``out``."""
    index: list[Any] = [slice(None)] * out.ndim
    pairs = []
    pos = 0
    for c in chunks:
        index[axis] = slice(pos, pos + c.shape[axis])
        pairs.append((out[tuple(index)], c.view(out.dtype) if c.dtype != out.dtype else c))
        pos += c.shape[axis]
    if copies is None:
        for d, s in pairs:
            copy_pair(d, s)
    else:
        copies.copy(pairs)
    index[axis] = slice(0, pos)
    return out[tuple(index)]


def _joined_shape(chunks: list[np.ndarray], axis: int) -> tuple[int, ...]:
    shape = list(chunks[0].shape)
    shape[axis] = sum(c.shape[axis] for c in chunks)
    return tuple(shape)
