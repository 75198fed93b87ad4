"""Build hook: compiles kvstrata's native copy helper (src/kvstrata/native/ntcopy.c) at install time.

A plain shared library (no Python headers), loaded with ctypes by ``kvstrata.native.ntcopy``. Editable installs
(``pip install -e .``: scripts/test.sh, scripts/serve.sh) build it next to its source, where the package is
imported from; a wheel carries it and is then tagged for its platform (``py3-none-<platform>``: one library for
every Python version). No compiler, or a failed build: the install still succeeds, without the library (the
client then copies with numpy), and the hook says so. ``KVSTRATA_BUILD_NATIVE=0`` skips the build.

``python3 hatch_build.py`` builds it in place without installing anything (a source tree run with
``PYTHONPATH=src``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run as a script, or imported by the tests: only compile_library is used then
    BuildHookInterface = object  # type: ignore[assignment,misc]

ROOT = Path(__file__).resolve().parent
SOURCE = Path("src", "kvstrata", "native", "ntcopy.c")
LIB_NAME = "libkvstrata_ntcopy.so"
WHEEL_PATH = "kvstrata/native/" + LIB_NAME
# Portable flags only (no -march=native): the AVX2 loop carries its own target attribute and is chosen on load.
CFLAGS = ["-O2", "-fPIC", "-shared", "-Wall"]


def compiler() -> list[str] | None:
    """The C compiler command: $CC, Python's own CC, or cc / gcc / clang on PATH; None when there is none."""
    for cand in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if cand:
            words = shlex.split(cand)
            if words and shutil.which(words[0]):
                return words
    return None


def compile_library(source: Path, out: Path) -> str | None:
    """Compile ``source`` into the shared library ``out``; None when built, else why not. The library is written
    beside ``out`` and renamed over it, so a process that has the old one loaded keeps its mapping intact."""
    cc = compiler()
    if cc is None:
        return "no C compiler found (set CC, or install gcc)"
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ntcopy-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run([*cc, *CFLAGS, "-o", tmp, str(source)], capture_output=True, text=True,
                              timeout=300, check=False)
        if proc.returncode != 0:
            return (f"{' '.join(cc)} failed (exit status {proc.returncode})"
                    + (f": {(proc.stderr or proc.stdout).strip()[-2000:]}" if (proc.stderr or proc.stdout).strip() else ""))
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
        tmp = ""
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{' '.join(cc)} failed: {exc}"
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def platform_tag() -> str:
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


class NativeBuildHook(BuildHookInterface):  # type: ignore[misc,valid-type]
    """hatchling's custom build hook (``[tool.hatch.build.hooks.custom]`` in pyproject.toml)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        if os.environ.get("KVSTRATA_BUILD_NATIVE", "1").strip().lower() in ("0", "no", "off", "false"):
            self.app.display_warning("kvstrata: KVSTRATA_BUILD_NATIVE=0: native copy helper not built; "
                                     "the client copies with numpy")
            return
        source = Path(self.root, SOURCE)
        if version == "editable":  # imported from src/: the library goes next to its source
            out = source.with_name(LIB_NAME)
        else:
            self._tmp = tempfile.mkdtemp(prefix="kvstrata-native-")
            out = Path(self._tmp, LIB_NAME)
        why = compile_library(source, out)
        if why is not None:
            self.app.display_warning(f"kvstrata: native copy helper not built ({why}); installing without it: "
                                     "the client copies with numpy")
            return
        self.app.display_info(f"kvstrata: built the native copy helper {out}")
        if version != "editable":
            build_data["force_include"][str(out)] = WHEEL_PATH
            build_data["pure_python"] = False
            build_data["tag"] = f"py3-none-{platform_tag()}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    problem = compile_library(ROOT / SOURCE, (ROOT / SOURCE).with_name(LIB_NAME))
    print(problem or f"built {(ROOT / SOURCE).with_name(LIB_NAME)}", file=sys.stderr)
    sys.exit(1 if problem else 0)
