"""The native streaming-store copy (src/kvstrata/native/ntcopy.c, built by hatch_build.py) and its array layer
(kvstrata.client.streamcopy): byte-exact against numpy for every destination alignment and sizes around the
loop's block and the thresholds, both loops (AVX2 where the CPU has it, SSE2), strided copies, a read-only mapped
source, the switch that turns it off, and the library this tree installs."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.native_libs import REPO, build_libs, cpu_has_avx2, hatch_build

from kvstrata.client import copypool, streamcopy
from kvstrata.native import ntcopy


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ntcopy.NativeCopy]:
    return build_libs(tmp_path_factory.mktemp("native"))


def _addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


SIZES = [0, 1, 31, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 1000, 4095, 4096, 4097, 65536 + 37]


@pytest.mark.parametrize("loop", ["best", "sse2"])
def test_contiguous_copy_is_exact_for_every_alignment_and_size(libs, loop: str) -> None:
    lib = libs[loop]
    rng = np.random.default_rng(1)
    big = max(SIZES) + 256
    src_buf = rng.integers(0, 256, big, dtype=np.uint8)
    dst_buf = np.empty(big + 128, np.uint8)
    for n in SIZES:
        for dst_off in range(64):  # every position of the destination in its cache line
            for src_off in (0, 1, 7, 32, 63):
                dst_buf.fill(0xA5)
                src = src_buf[src_off:src_off + n]
                lib.copy(_addr(dst_buf) + 64 + dst_off, _addr(src), n)
                got = dst_buf[64 + dst_off:64 + dst_off + n]
                assert np.array_equal(got, src), (n, dst_off, src_off)
                # nothing written outside the destination
                assert (dst_buf[:64 + dst_off] == 0xA5).all() and (dst_buf[64 + dst_off + n:] == 0xA5).all()


@pytest.mark.parametrize("loop", ["best", "sse2"])
def test_copies_around_the_threshold_are_exact(libs, loop: str, monkeypatch) -> None:
    monkeypatch.setattr(ntcopy, "NATIVE", libs[loop])
    rng = np.random.default_rng(2)
    for n in (streamcopy.NT_MIN_BYTES - 1, streamcopy.NT_MIN_BYTES, streamcopy.NT_MIN_BYTES + 1,
              3 * streamcopy.NT_MIN_BYTES + 77):
        src = rng.integers(0, 256, n + 64, dtype=np.uint8)[13:13 + n]
        dst = np.zeros(n + 64, np.uint8)[5:5 + n]
        streamcopy.copy(dst, src)
        assert np.array_equal(dst, src)


def _strided_cases(rng: np.random.Generator) -> list[tuple[np.ndarray, Any, np.ndarray]]:
    """(destination base, index of the destination in it, source), shaped like restores and stores: a chunk into
    its slot of the caller's LKHTD array, a strided chunk into a contiguous place, reversed outer axes, a source
    85 bytes into its buffer (as a payload in the arena), several dtypes."""
    cases = []
    for dtype in (np.uint8, np.uint16, np.float32, np.float64):
        kv = rng.integers(0, 250, (3, 2, 5, 64, 40)).astype(dtype)
        whole = rng.integers(0, 250, (3, 2, 5, 200, 40)).astype(dtype)
        cases.append((np.zeros((3, 2, 5, 200, 40), dtype), np.s_[:, :, :, 17:81], kv))
        cases.append((np.zeros_like(kv), np.s_[...], whole[:, :, :, 17:81]))
        cases.append((np.zeros((3, 2, 5, 200, 40), dtype), np.s_[::-1, :, ::-1, 100:164], kv))
        raw = np.zeros(kv.nbytes + 85, np.uint8)
        raw[85:] = kv.view(np.uint8).reshape(-1)
        cases.append((np.zeros((3, 2, 5, 200, 40), dtype), np.s_[:, :, :, 0:64],
                      raw[85:].view(dtype).reshape(kv.shape)))
    return cases


@pytest.mark.parametrize("loop", ["best", "sse2"])
def test_strided_copies_are_exact(libs, loop: str, monkeypatch) -> None:
    monkeypatch.setattr(ntcopy, "NATIVE", libs[loop])
    rng = np.random.default_rng(3)
    for base, index, src in _strided_cases(rng):
        want = base.copy()
        want[index] = src
        assert streamcopy.stream(base[index], src)
        assert np.array_equal(base, want)  # the destination's elements, and nothing around them


def test_layout_merges_runs_and_axes() -> None:
    out = np.zeros((4, 2, 8, 1024, 128), np.uint16)
    chunk = np.zeros((4, 2, 8, 256, 128), np.uint16)
    slot = out[:, :, :, 256:512]
    # one 64 KB run per (layer, K/V, head), the outer axes merged into one
    assert streamcopy.layout(slot, chunk) == ((64,), (1024 * 256,), (256 * 256,), 256 * 256)
    assert streamcopy.layout(chunk, np.zeros_like(chunk)) == ((), (), (), chunk.nbytes)
    assert streamcopy.layout(out[..., ::2], out[..., 1::2]) is None  # last axis not contiguous
    assert streamcopy.layout(chunk, chunk[:2]) is None  # shapes differ


def test_what_the_helper_does_not_take_goes_to_numpy(libs, monkeypatch) -> None:
    monkeypatch.setattr(ntcopy, "NATIVE", libs["best"])
    a = np.arange(1 << 20, dtype=np.uint32)
    assert not streamcopy.stream(a[1:], a[:-1])  # overlapping
    want = np.concatenate([a[:1], a[:-1]])
    streamcopy.copy(a[1:], a[:-1])
    assert np.array_equal(a, want)
    assert not streamcopy.stream(np.zeros((4, 1 << 18), np.uint32), a[: 1 << 18])  # broadcasting
    ro = np.zeros(1 << 20, np.uint32)
    ro.flags.writeable = False
    assert not streamcopy.stream(ro, a)
    with pytest.raises(ValueError):
        streamcopy.copy(ro, a)  # numpy's own error
    with pytest.raises(TypeError):
        streamcopy.copy(np.zeros(1 << 20, np.float32), a)  # casting="no"
    objs = np.empty(4, object)
    assert not streamcopy.stream(objs, np.array([1, 2, 3, 4], object))
    # runs under MIN_RUN in a strided copy stay with numpy
    wide = np.ones((4096, 128), np.uint8)
    assert not streamcopy.stream(np.zeros((4096, 64), np.uint8), wide[:, :64])


@pytest.mark.parametrize("loop", ["best", "sse2"])
def test_read_only_mapped_source(libs, loop: str, monkeypatch) -> None:
    """The arena is mapped PROT_READ in the client: the copy reads it, never writes it."""
    monkeypatch.setattr(ntcopy, "NATIVE", libs[loop])
    n = 3 * (1 << 20) + 4096
    fd = os.memfd_create("kvstrata-ntcopy-test")
    try:
        data = np.random.default_rng(4).integers(0, 256, n, dtype=np.uint8)
        os.write(fd, data.tobytes())
        mm = mmap.mmap(fd, n, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    src = np.frombuffer(mm, np.uint8)
    assert not src.flags.writeable
    dst = np.zeros(n + 64, np.uint8)[3:3 + n - 85]
    streamcopy.copy(dst, src[85:])
    assert np.array_equal(dst, data[85:])
    # through the client's copy helpers too: as restores copy chunks out of the arena
    chunk = src[85:85 + 2 * 4 * 8 * 64 * 128 * 2].view(np.uint16).reshape(2, 4, 8, 64, 128)
    out = np.zeros((2, 4, 8, 256, 128), np.uint16)
    pool = copypool.CopyPool(2, min_bytes=0, min_piece=1 << 16)
    try:
        pool.copy([(out[:, :, :, 64:128], chunk)])
    finally:
        pool.close()
    copypool.copy_pair(out[:, :, :, 192:], chunk)
    assert np.array_equal(out[:, :, :, 64:128], chunk) and np.array_equal(out[:, :, :, 192:], chunk)
    assert not out[:, :, :, :64].any() and not out[:, :, :, 128:192].any()


def test_switched_off_and_bad_settings(libs, tmp_path) -> None:
    path = libs["best"].path
    assert ntcopy.load(path, "0") == (None, "KVSTRATA_NATIVE_COPY=0")
    assert ntcopy.load(path, "off")[0] is None
    native, why = ntcopy.load(path, "fast")
    assert native is None and "not 0, 1 or sse2" in why
    native, why = ntcopy.load(tmp_path / "missing.so", "1")
    assert native is None and "not built" in why


def test_env_switch_off_copies_the_same_bytes_with_numpy() -> None:
    """KVSTRATA_NATIVE_COPY=0 in a fresh interpreter: no native copy, and the client's copies give the same
    bytes."""
    code = (
        "import numpy as np\n"
        "from kvstrata.native import ntcopy\n"
        "from kvstrata.client import copypool, streamcopy\n"
        "assert ntcopy.nt_copy is None and ntcopy.NATIVE is None and not streamcopy.available(), ntcopy.WHY\n"
        "rng = np.random.default_rng(5)\n"
        "kv = rng.integers(0, 1 << 16, (4, 2, 8, 256, 128), dtype=np.uint16)\n"
        "out = np.zeros((4, 2, 8, 512, 128), np.uint16)\n"
        "assert not streamcopy.stream(out[:, :, :, 256:], kv)\n"
        "copypool.copy_pair(out[:, :, :, 256:], kv)\n"
        "pool = copypool.CopyPool(2, min_bytes=0)\n"
        "pool.copy([(out[:, :, :, :256], kv[:, :, :, ::-1])])\n"
        "pool.close()\n"
        "assert np.array_equal(out[:, :, :, 256:], kv) and np.array_equal(out[:, :, :, :256], kv[:, :, :, ::-1])\n"
        "print('ok', ntcopy.WHY)\n"
    )
    env = {**os.environ, "KVSTRATA_NATIVE_COPY": "0", "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok KVSTRATA_NATIVE_COPY=0"


def test_a_failed_build_says_why_and_leaves_nothing(tmp_path) -> None:
    hb = hatch_build()
    bad = tmp_path / "bad.c"
    bad.write_text("this is not C\n")
    out = tmp_path / "lib" / "libbad.so"
    why = hb.compile_library(bad, out)
    assert why is not None and "failed" in why
    assert not out.exists() and not list(out.parent.iterdir())  # no temporary file left either


def test_the_package_loads_the_library_this_tree_installed() -> None:
    """``pip install -e .`` (scripts/test.sh, CI) builds the library next to its source; the package must load it
    and use it unless switched off. A source tree nobody installed (PYTHONPATH=src) has none: then only the
    build above is checked, outside CI."""
    lib = Path(ntcopy.__file__).with_name(ntcopy.LIB_NAME)
    if os.environ.get("KVSTRATA_NATIVE_COPY", "").strip() in ("0", "off", "no", "false"):
        assert ntcopy.NATIVE is None
        return
    if not lib.exists():
        assert not os.environ.get("CI"), "CI installed the package, but the native copy helper was not built"
        pytest.skip(f"{lib} not built in this source tree (pip install -e . or python3 hatch_build.py)")
    assert ntcopy.NATIVE is not None, ntcopy.WHY
    assert ntcopy.nt_copy is ntcopy.NATIVE.copy and streamcopy.available()
    assert ntcopy.NATIVE.level == ("avx2" if cpu_has_avx2() else "sse2")
