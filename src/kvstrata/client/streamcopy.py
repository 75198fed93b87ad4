"""Large array copies with streaming (non-temporal) stores where the native helper is built; numpy otherwise.

A restore copies tens to hundreds of MB that the copying thread does not read again soon (the staged store's copy
stays on numpy: measured no gain, its server-side copy bounds it).
numpy's ``copyto`` (memmove: ordinary stores, or ``rep movsb``) reads every destination line before writing it,
three memory passes in all; glibc's memcpy streams only for one copy of at least its non-temporal threshold
(3/4 of the last-level cache: tens of MB), never for the 64 KB runs a restore into an LKHTD array is made of.
``copy`` hands a copy of at least ``NT_MIN_BYTES`` whose runs are contiguous in both arrays to
``kvstrata.native.ntcopy`` (one call for the whole strided copy: the run loop is in C), two passes.
Below that size the destination is likely read again while still in cache, which streaming would throw away.

The result is the same bytes as ``np.copyto(dst, src, casting="no")`` in every case: anything the helper does
not take (no library, ``KVSTRATA_NATIVE_COPY=0``, other dtypes, overlap, broadcasting, runs under ``MIN_RUN``,
a read-only destination, object arrays) goes to numpy, which also raises numpy's errors.
"""

from __future__ import annotations

import numpy as np

from kvstrata.native import ntcopy

MiB = 1024 * 1024
NT_MIN_BYTES = 1 * MiB
MIN_RUN = 1024  # each run pays an unaligned head and tail of ordinary stores; short runs stay with numpy

Layout = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]


def available() -> bool:
    """Whether copies can stream here (the library loaded and not switched off)."""
    return ntcopy.NATIVE is not None


def layout(dst: np.ndarray, src: np.ndarray) -> Layout | None:
    """A copy of ``src`` into ``dst`` (same shape and item size, C order) as (outer shape, dst byte strides, src
    byte strides, run bytes): the inner axes contiguous in both merged into one run, adjacent outer axes merged
    where both arrays allow. None when the last axis is not contiguous in both."""
    if dst.shape != src.shape or dst.itemsize != src.itemsize:
        return None
    dims = [(n, d, s) for n, d, s in zip(dst.shape, dst.strides, src.strides, strict=True) if n != 1]
    run = dst.itemsize
    inner = 0
    while dims and dims[-1][1] == run and dims[-1][2] == run:
        run *= dims.pop()[0]
        inner += 1
    if dims and not inner:
        return None
    merged: list[tuple[int, int, int]] = []
    for n, d, s in dims:
        if merged and merged[-1][1] == d * n and merged[-1][2] == s * n:
            merged[-1] = (merged[-1][0] * n, d, s)
        else:
            merged.append((n, d, s))
    return (tuple(m[0] for m in merged), tuple(m[1] for m in merged), tuple(m[2] for m in merged), run)


def stream(dst: np.ndarray, src: np.ndarray) -> bool:
    """Copy ``src`` into ``dst`` with streaming stores, whatever the size; False (nothing copied) when the
    helper cannot take this copy (module docstring)."""
    native = ntcopy.NATIVE
    if (native is None or dst.dtype != src.dtype or dst.dtype.hasobject or not dst.flags.writeable
            or not dst.size):
        return False
    lay = layout(dst, src)
    if lay is None or lay[3] < MIN_RUN or np.may_share_memory(dst, src):
        return False
    shape, dst_strides, src_strides, run = lay
    d = dst.__array_interface__["data"][0]
    s = src.__array_interface__["data"][0]
    if shape:
        native.copy_strided(d, s, shape, dst_strides, src_strides, run)
    else:
        native.copy(d, s, run)
    return True


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src, casting="no")``, streamed when it moves at least ``NT_MIN_BYTES``."""
    if dst.nbytes < NT_MIN_BYTES or not stream(dst, src):
        np.copyto(dst, src, casting="no")
