"""Destination placement for ``KVCacheClient.retrieve(out=)``: chunks copied, or received, into their slot.

``_Filler`` is the chunk list a retrieve into ``out`` fills: each chunk goes to the next slot along the token
axis, either copied as it is decoded (``append``) or received there directly by a scatter read (``place`` then
``commit``, ``kvstrata.client.scatter``). ``_copy_bytes``, ``_copied`` and ``_joined_shape`` are the copy
helpers of the arena read path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvstrata.client.codec import DTYPES
from kvstrata.client.scatter import slot_fits


def _copy_bytes(dst: np.ndarray, src: np.ndarray) -> None:
    """np.copyto through byte views: a value's payload in the arena follows its header at an odd offset, and
    numpy copies misaligned arrays of wider types several times slower than bytes."""
    if dst.ndim and dst.strides[-1] == dst.itemsize and src.flags.c_contiguous and src.dtype == dst.dtype:
        np.copyto(dst.view(np.uint8), src.view(np.uint8))
    else:
        np.copyto(dst, src, casting="no")


class _Filler(list):  # type: ignore[type-arg]
    """The chunk list of ``retrieve(out=)``: each appended chunk is copied at once into the next slot of ``out``
    along the token axis (the list keeps those filled slots)."""

    def __init__(self, out: np.ndarray | None, axis: int, tokens: int = 0) -> None:
        """``out=None``: ``out`` is made on the first chunk, ``tokens`` long on the token axis (np.empty: pages
        never written cost nothing)."""
        super().__init__()
        self.dest: np.ndarray = out  # type: ignore[assignment]
        self.axis, self.pos, self.tokens = axis, 0, tokens

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
        _copy_bytes(slot, chunk.view(self.dest.dtype) if chunk.dtype != self.dest.dtype else chunk)
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


def _copied(a: np.ndarray) -> np.ndarray:
    out = np.empty(a.shape, a.dtype)
    _copy_bytes(out, a)
    return out


def _joined_shape(chunks: list[np.ndarray], axis: int) -> tuple[int, ...]:
    shape = list(chunks[0].shape)
    shape[axis] = sum(c.shape[axis] for c in chunks)
    return tuple(shape)
