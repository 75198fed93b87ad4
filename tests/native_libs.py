"""Test helper: the native copy helper (src/kvstrata/native/ntcopy.c) compiled by the build hook's own function
(hatch_build.compile_library) into a test's directory, loaded with each of its loops."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

from kvstrata.native import ntcopy

REPO = Path(__file__).resolve().parents[1]


def hatch_build() -> Any:
    """The build hook module (hatch_build.py at the top of the tree; hatchling is not needed to import it)."""
    spec = importlib.util.spec_from_file_location("kvstrata_hatch_build", REPO / "hatch_build.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cpu_has_avx2() -> bool:
    with open("/proc/cpuinfo") as f:
        return any(line.startswith("flags") and " avx2" in line for line in f)


def build_libs(directory: Path) -> dict[str, ntcopy.NativeCopy]:
    """{"best": the library with the best loop of this CPU, "sse2": with the SSE2 loop}: two files, so two
    handles with a loop each."""
    hb = hatch_build()
    assert hb.compiler() is not None, "no C compiler: the test environment must have one (scripts/system-deps.sh)"
    best_path = directory / "best.so"
    why = hb.compile_library(REPO / hb.SOURCE, best_path)
    assert why is None, why
    sse2_path = directory / "sse2.so"
    shutil.copy(best_path, sse2_path)
    best, why = ntcopy.load(best_path, "1")
    assert best is not None, why
    sse2, why = ntcopy.load(sse2_path, "sse2")
    assert sse2 is not None, why
    assert sse2.level == "sse2"
    assert best.level == ("avx2" if cpu_has_avx2() else "sse2")
    return {"best": best, "sse2": sse2}
