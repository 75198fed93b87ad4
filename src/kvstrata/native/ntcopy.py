"""Loads the native streaming-store copy (``libkvstrata_ntcopy.so``, built from ``ntcopy.c`` at install time).

``nt_copy(dst, src, nbytes)`` (addresses as ints) is the copy, or None when it is not there: no library (installed
without a C compiler, or a source tree nobody built: ``pip install -e .`` or ``python3 hatch_build.py`` builds it),
a CPU without streaming stores in the library (not x86-64), or ``KVSTRATA_NATIVE_COPY=0``. ``NATIVE`` carries
the strided form too and the loop in use; ``WHY`` says why there is none. ctypes releases the GIL for each call,
so copies on several threads (``kvstrata.client.copypool``) run at once. Array-level use:
``kvstrata.client.streamcopy``.

``KVSTRATA_NATIVE_COPY``: unset or ``1``: the best loop the CPU has (AVX2, else SSE2); ``sse2``: the SSE2 loop;
``0`` (or ``off``, ``no``, ``false``): not used, numpy copies everything.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("kvstrata.client")

LIB_NAME = "libkvstrata_ntcopy.so"
ENV = "KVSTRATA_NATIVE_COPY"
LEVELS = {1: "sse2", 2: "avx2"}
_WANT = {"": -1, "1": -1, "on": -1, "yes": -1, "true": -1, "avx2": -1, "sse2": 1}
_OFF = ("0", "off", "no", "false")
_Sizes = ctypes.c_ssize_t * 32  # kvs_nt_copy_strided takes at most 32 outer axes


@dataclass(frozen=True)
class NativeCopy:
    """The loaded library: ``copy(dst, src, nbytes)``, ``copy_strided(dst, src, shape, dst_strides, src_strides,
    run_bytes)`` (outer axes of runs contiguous in both; addresses and byte strides as ints), ``level``."""

    level: str
    path: str
    copy: Callable[[int, int, int], None]
    copy_strided: Callable[[int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...], int], None]


def load(path: str | os.PathLike[str] | None = None, setting: str | None = None) -> tuple[NativeCopy | None, str]:
    """(the library at ``path``, default the one next to this module, set up as ``setting`` asks (default
    ``$KVSTRATA_NATIVE_COPY``), or None; why not, or "")."""
    setting = (os.environ.get(ENV, "") if setting is None else setting).strip().lower()
    if setting in _OFF:
        return None, f"{ENV}={setting}"
    if setting not in _WANT:  # not raised: this runs on import; a mistyped switch must not break the client
        log.warning("kvstrata: %s=%r is not 0, 1 or sse2; copying with numpy", ENV, setting)
        return None, f"{ENV}={setting!r} is not 0, 1 or sse2"
    lib_path = Path(path) if path is not None else Path(__file__).with_name(LIB_NAME)
    if not lib_path.exists():
        return None, f"{lib_path.name} not built (no C compiler at install time?)"
    try:
        lib = ctypes.CDLL(str(lib_path))
    except OSError as exc:
        return None, f"{lib_path.name} does not load: {exc}"
    lib.kvs_nt_select.argtypes = [ctypes.c_int]
    lib.kvs_nt_select.restype = ctypes.c_int
    level = lib.kvs_nt_select(_WANT[setting])
    if level not in LEVELS:
        return None, "no streaming-store loop for this CPU"
    lib.kvs_nt_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    lib.kvs_nt_copy.restype = None
    strided = lib.kvs_nt_copy_strided
    strided.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, _Sizes, _Sizes, _Sizes, ctypes.c_size_t]
    strided.restype = ctypes.c_int

    def copy_strided(dst: int, src: int, shape: tuple[int, ...], dst_strides: tuple[int, ...],
                     src_strides: tuple[int, ...], run_bytes: int) -> None:
        if len(shape) > len(_Sizes()):
            raise ValueError(f"at most {len(_Sizes())} outer axes, not {len(shape)}")
        strided(dst, src, len(shape), _Sizes(*shape), _Sizes(*dst_strides), _Sizes(*src_strides), run_bytes)

    return NativeCopy(LEVELS[level], str(lib_path), lib.kvs_nt_copy, copy_strided), ""


NATIVE, WHY = load()
nt_copy: Callable[[int, int, int], None] | None = NATIVE.copy if NATIVE is not None else None
