#!/usr/bin/env bash
# Set up and run the whole test suite: the second command at the top of the README.
set -euo pipefail
export PIP_BREAK_SYSTEM_PACKAGES=1
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -e ".[test]"
ruff check src tests benchmarks
python3 -m pytest -q "$@"
