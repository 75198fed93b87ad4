#!/usr/bin/env bash
# Set up and start the server on embedded defaults (127.0.0.1:6379, DRAM tier only).
set -euo pipefail
export PIP_BREAK_SYSTEM_PACKAGES=1
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -e .
exec kvstrata serve "$@"
