"""The build hook (hatch_build.py) through pip, as an install runs it: a wheel carries the native copy helper and
the extension modules (the predictor's, the page-residency check) and is tagged for this Python and platform; with
a compiler that fails, the wheel is still built, pure, without any of them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from tests.native_libs import REPO

pytestmark = pytest.mark.slow

LIB = "kvstrata/native/libkvstrata_ntcopy.so"
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
EXT = "kvstrata/native/_predict" + EXT_SUFFIX
PAGES = "kvstrata/native/_pages" + EXT_SUFFIX


@pytest.fixture(scope="module")
def hatchling_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hatchling (the build backend) installed once into a directory, for builds without isolation (an
    isolated build installs it again for every wheel)."""
    target = tmp_path_factory.mktemp("hatchling")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target",
                           str(target), "hatchling"], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return target


def _wheel(out: Path, hatchling: Path, **env: str) -> tuple[Path, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
         "-v", "-w", str(out), str(REPO)],
        env={**os.environ, "PYTHONPATH": str(hatchling), **env}, capture_output=True, text=True, timeout=600,
        check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels = list(out.glob("kvstrata-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0], proc.stdout + proc.stderr


def _purelib(wheel: zipfile.ZipFile) -> str:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/WHEEL"))
    return next(line for line in wheel.read(meta).decode().splitlines() if line.startswith("Root-Is-Purelib"))


def test_the_wheel_carries_both_libraries_and_a_python_and_platform_tag(tmp_path, hatchling_dir) -> None:
    path, _ = _wheel(tmp_path, hatchling_dir)
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f"-{tag}-{tag}-" in path.name and not path.name.endswith("-any.whl")
    with zipfile.ZipFile(path) as whl:
        assert LIB in whl.namelist() and EXT in whl.namelist() and PAGES in whl.namelist()
        assert _purelib(whl) == "Root-Is-Purelib: false"
        lib = tmp_path / "lib.so"
        lib.write_bytes(whl.read(LIB))
        ext = tmp_path / ("_predict" + EXT_SUFFIX)
        ext.write_bytes(whl.read(EXT))
        pages = tmp_path / ("_pages" + EXT_SUFFIX)
        pages.write_bytes(whl.read(PAGES))
    from kvstrata.native import ntcopy

    native, why = ntcopy.load(lib, "1")
    assert native is not None, why
    # The wheel's extension module imports (under its own name, from the wheel's copy) and predicts.
    spec = importlib.util.spec_from_file_location("kvstrata.native._predict", ext)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.LINK_MIN == 16 and mod.Lane(b"kvs:ns").fam == b"kvs:ns"
    spec = importlib.util.spec_from_file_location("kvstrata.native._pages", pages)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    data = b"x" * 10000
    assert mod.resident(data) is True  # bytes just written are in memory
    assert mod.resident_at(mod.address(data), len(data)) is True and mod.resident_at(0, 4096) is False


def test_a_failed_compile_still_builds_a_pure_wheel(tmp_path, hatchling_dir) -> None:
    path, log = _wheel(tmp_path, hatchling_dir, CC="false")
    assert path.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(path) as whl:
        assert LIB not in whl.namelist() and "kvstrata/native/ntcopy.py" in whl.namelist()
        assert EXT not in whl.namelist() and "kvstrata/native/_predict.c" in whl.namelist()
        assert PAGES not in whl.namelist() and "kvstrata/native/_pages.c" in whl.namelist()
        assert _purelib(whl) == "Root-Is-Purelib: true"
    assert "native copy helper not built" in log  # the hook says so
    assert "native module _predict not built" in log and "the predictor runs in Python" in log
    assert "native module _pages not built" in log
