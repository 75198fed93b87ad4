#!/usr/bin/env bash
# Small-request benchmark: kvstrata vs Redis 7 under redis-benchmark (SET/GET, 100-byte values, -P 1 and 16).
#
#   benchmarks/small.sh                 # full run (~1-5 minutes), table on stdout
#   benchmarks/small.sh --json > r.json # machine-readable result
#   benchmarks/small.sh --quick --kvstrata-cmd "redis-server --save '' --appendonly no"   # harness smoke test
#
# Needs redis-server and redis-benchmark on PATH (or --redis-server / --redis-benchmark). Works from a source
# checkout without installing: src/ is put on PYTHONPATH. Set PYTHON to pick the interpreter.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${root}/src${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python3}" -m kvstrata.bench.small "$@"
