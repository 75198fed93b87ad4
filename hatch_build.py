"""Build hook: compiles kvstrata's native parts at install time.

* The copy helper (src/kvstrata/native/ntcopy.c): a plain shared library (no Python headers), loaded with ctypes
  by ``kvstrata.native.ntcopy``.
* CPython extension modules (``EXTENSIONS``): the predictor's hot path (src/kvstrata/native/_predict.c,
  ``kvstrata.native._predict``, which ``kvstrata.engine.predict`` uses when it imports) and the page-residency
  check of the SSD tier's reads on the event loop (``_pages.c``, used by ``kvstrata.engine.tiers.resident``), and
  the DUMP payload's CRC-64 and LZF loops (``_rdb.c``, used by ``kvstrata.protocol.dump_payload``).

Editable installs (``pip install -e .``: scripts/test.sh, scripts/serve.sh) build them next to their sources,
where the package is imported from; a wheel carries them and is then tagged for its platform
(``py3-none-<platform>`` with the copy helper alone; ``cpXY-cpXY-<platform>`` with the extension, which is built
for one Python). No compiler, no Python headers, or a failed build: the install still succeeds without that part
(the client then copies with numpy; the predictor runs in Python; residency is checked with numpy), and the hook
says so. ``KVSTRATA_BUILD_NATIVE=0`` skips them all.

``python3 hatch_build.py`` builds them in place without installing anything (a source tree run with
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
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
# Extension module -> what runs in Python without it (the hook's warning).
EXTENSIONS = {
    "_predict": "the predictor runs in Python",
    "_pages": "the SSD tier's residency checks run in numpy",
    "_rdb": "DUMP and RESTORE checksum and expand payloads in Python (slow for values of megabytes)",
}


def ext_source(name: str) -> Path:
    return Path("src", "kvstrata", "native", name + ".c")


def ext_name(name: str) -> str:
    return name + EXT_SUFFIX


def compiler() -> list[str] | None:
    """The C compiler command: $CC, Python's own CC, or cc / gcc / clang on PATH; None when there is none."""
    for cand in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if cand:
            words = shlex.split(cand)
            if words and shutil.which(words[0]):
                return words
    return None


def python_include() -> str | None:
    """The directory of this Python's headers (Python.h), or None when they are not installed."""
    for key in ("include", "platinclude"):
        path = sysconfig.get_paths().get(key)
        if path and Path(path, "Python.h").exists():
            return path
    return None


def compile_extension(source: Path, out: Path) -> str | None:
    """Compile the CPython extension ``source`` into ``out`` (as compile_library); None when built, else why not."""
    include = python_include()
    if include is None:
        return "no Python.h for this Python (install python3-dev)"
    return compile_library(source, out, ["-I", include, "-fno-strict-aliasing"])


def compile_library(source: Path, out: Path, extra: list[str] | None = None) -> str | None:
    """Compile ``source`` into the shared library ``out``; None when built, else why not. The library is written
    beside ``out`` and renamed over it, so a process that has the old one loaded keeps its mapping intact."""
    cc = compiler()
    if cc is None:
        return "no C compiler found (set CC, or install gcc)"
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run([*cc, *CFLAGS, *(extra or []), "-o", tmp, str(source)], capture_output=True, text=True,
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


def python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


class NativeBuildHook(BuildHookInterface):  # type: ignore[misc,valid-type]
    """hatchling's custom build hook (``[tool.hatch.build.hooks.custom]`` in pyproject.toml)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        if os.environ.get("KVSTRATA_BUILD_NATIVE", "1").strip().lower() in ("0", "no", "off", "false"):
            self.app.display_warning("kvstrata: KVSTRATA_BUILD_NATIVE=0: native copy helper, predictor and "
                                     "residency check not built; the client copies with numpy, the predictor "
                                     "runs in Python")
            return
        source = Path(self.root, SOURCE)
        if version == "editable":  # imported from src/: the libraries go next to their sources
            out = source.with_name(LIB_NAME)
        else:
            self._tmp = tempfile.mkdtemp(prefix="kvstrata-native-")
            out = Path(self._tmp, LIB_NAME)
        built_ext = False
        for name, without in EXTENSIONS.items():
            src = Path(self.root, ext_source(name))
            ext_out = src.with_name(ext_name(name)) if version == "editable" else Path(self._tmp, ext_name(name))
            why = compile_extension(src, ext_out)
            if why is not None:
                self.app.display_warning(f"kvstrata: native module {name} not built ({why}); installing without "
                                         f"it: {without}")
                continue
            built_ext = True
            self.app.display_info(f"kvstrata: built the native module {ext_out}")
            if version != "editable":
                build_data["force_include"][str(ext_out)] = "kvstrata/native/" + ext_name(name)
                build_data["pure_python"] = False
                build_data["tag"] = f"{python_tag()}-{python_tag()}-{platform_tag()}"
        why = compile_library(source, out)
        if why is not None:
            self.app.display_warning(f"kvstrata: native copy helper not built ({why}); installing without it: "
                                     "the client copies with numpy")
            return
        self.app.display_info(f"kvstrata: built the native copy helper {out}")
        if version != "editable":
            build_data["force_include"][str(out)] = WHEEL_PATH
            build_data["pure_python"] = False
            if not built_ext:
                build_data["tag"] = f"py3-none-{platform_tag()}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    problem = compile_library(ROOT / SOURCE, (ROOT / SOURCE).with_name(LIB_NAME))
    print(problem or f"built {(ROOT / SOURCE).with_name(LIB_NAME)}", file=sys.stderr)
    failed = bool(problem)
    for ext in EXTENSIONS:
        target = (ROOT / ext_source(ext)).with_name(ext_name(ext))
        ext_problem = compile_extension(ROOT / ext_source(ext), target)
        print(ext_problem or f"built {target}", file=sys.stderr)
        failed = failed or bool(ext_problem)
    sys.exit(1 if failed else 0)
