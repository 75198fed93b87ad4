"""The build hook (hatch_build.py) through pip, as an install runs it: a wheel carries the native copy helper and
is tagged for its platform; with a compiler that fails, the wheel is still built, pure, without the helper."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tests.native_libs import REPO

pytestmark = pytest.mark.slow

LIB = "kvstrata/native/libkvstrata_ntcopy.so"


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


def test_the_wheel_carries_the_library_and_a_platform_tag(tmp_path, hatchling_dir) -> None:
    path, _ = _wheel(tmp_path, hatchling_dir)
    assert not path.name.endswith("-none-any.whl") and "-py3-none-" in path.name
    with zipfile.ZipFile(path) as whl:
        assert LIB in whl.namelist()
        assert _purelib(whl) == "Root-Is-Purelib: false"
        lib = tmp_path / "lib.so"
        lib.write_bytes(whl.read(LIB))
    from kvstrata.native import ntcopy

    native, why = ntcopy.load(lib, "1")
    assert native is not None, why


def test_a_failed_compile_still_builds_a_pure_wheel(tmp_path, hatchling_dir) -> None:
    path, log = _wheel(tmp_path, hatchling_dir, CC="false")
    assert path.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(path) as whl:
        assert LIB not in whl.namelist() and "kvstrata/native/ntcopy.py" in whl.namelist()
        assert _purelib(whl) == "Root-Is-Purelib: true"
    assert "native copy helper not built" in log  # the hook says so
