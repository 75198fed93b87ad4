#!/usr/bin/env bash
# Set up and start the server on embedded defaults (127.0.0.1:6379, DRAM tier only), installed into the
# project-local virtual environment .venv (created on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
python -m pip install -q --disable-pip-version-check -e .
exec kvstrata serve "$@"
