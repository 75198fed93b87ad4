"""benchmarks/vllm_gpu.sh: shellcheck-clean, and it refuses to run without a GPU (it cannot run on CPU machines)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_gpu.sh"


def test_vllm_gpu_benchmark_script():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is not None:
        proc = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout
    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU machine: the script would run the benchmark")
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 1 and "needs one" in proc.stderr
