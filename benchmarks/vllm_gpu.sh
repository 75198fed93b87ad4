#!/usr/bin/env bash
# vLLM with and without the kvstrata KV connector on a lent GPU: one command, reports TTFT and prefill saved.
#
#   benchmarks/vllm_gpu.sh            # human table on stderr, one JSON document on stdout
#
# No downloads: the model is random-initialised (vLLM's --load-format dummy) from a real config written here
# (Qwen2.5-1.5B's shape: 28 layers, 2 KV heads of 128, bf16), prompts are token ids (no tokenizer). vLLM and this
# checkout of kvstrata must be installed already (the lent machines have no network).
#
# What it does: starts a kvstrata node (DRAM tier); then, in one Python process per run,
#   baseline   vLLM without a connector and with its prefix cache off: every prompt prefilled in full;
#   kvstrata   vLLM with KvstrataConnector: a first pass stores each document's prefix chunks (cold), a second
#              pass with fresh suffixes after vLLM's prefix cache is reset loads them from kvstrata (warm).
# Each request is sent alone (max_tokens=1): its latency is its TTFT. Reports medians per run, the warm/baseline
# ratio, and the prefill tokens the connector saved (vLLM's own counter of external-cache hits when present,
# else the connector's loaded chunks). Target: under 5 minutes on an H100/H200.
#
# Settings (environment): DOCS (16), PREFIX_TOKENS (8192), SUFFIX_TOKENS (64), CHUNK (256), KV_DRAM (16G),
# PORT (6391), PYTHON (python3), WORKDIR (temporary; logs kept there).
set -euo pipefail
cd "$(dirname "$0")/.."

DOCS="${DOCS:-16}"
PREFIX_TOKENS="${PREFIX_TOKENS:-8192}"
SUFFIX_TOKENS="${SUFFIX_TOKENS:-64}"
CHUNK="${CHUNK:-256}"
KV_DRAM="${KV_DRAM:-16G}"
PORT="${PORT:-6391}"
PYTHON="${PYTHON:-python3}"
WORKDIR="${WORKDIR:-$(mktemp -d -t kvstrata-vllm-XXXXXX)}"

log() { echo "[vllm_gpu] $*" >&2; }
die() { log "error: $*"; exit 1; }

nvidia-smi -L >/dev/null 2>&1 || die "no NVIDIA GPU here (nvidia-smi): this benchmark needs one"
"$PYTHON" -c "import vllm" 2>/dev/null || die "vLLM is not installed (pip install vllm; no network on lent machines)"
"$PYTHON" -c "import kvstrata.integrations.vllm" || die "kvstrata is not importable (pip install -e .)"

mkdir -p "$WORKDIR/model"
cat > "$WORKDIR/model/config.json" <<'JSON'
{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
 "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 32768,
 "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "vocab_size": 151936, "tie_word_embeddings": true,
 "torch_dtype": "bfloat16", "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645}
JSON

"$PYTHON" -m kvstrata serve --port "$PORT" --bind 127.0.0.1 --dram-size "$KV_DRAM" > "$WORKDIR/kvstrata.log" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  "$PYTHON" - "$PORT" <<'PY' 2>/dev/null && break
import socket, sys
socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.2).close()
PY
  sleep 0.1
done

cat > "$WORKDIR/run.py" <<'PY'
"""One vLLM run: TTFT per request (max_tokens=1, one request at a time). argv: mode workdir port docs prefix suffix chunk."""
import json, os, statistics, sys, time

mode, workdir, port, docs, prefix, suffix, chunk = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:8])
from vllm import LLM, SamplingParams
from vllm.config import KVTransferConfig

kw = dict(model=os.path.join(workdir, "model"), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
          max_model_len=prefix + suffix + 16, gpu_memory_utilization=0.6, enforce_eager=True, seed=0)
if mode == "kvstrata":
    kw["kv_transfer_config"] = KVTransferConfig(
        kv_connector="KvstrataConnector", kv_connector_module_path="kvstrata.integrations.vllm", kv_role="kv_both",
        kv_connector_extra_config={"url": f"redis://127.0.0.1:{port}", "chunk_size": chunk, "model": "bench"})
else:
    kw["enable_prefix_caching"] = False
llm = LLM(**kw)
sp = SamplingParams(max_tokens=1, temperature=0.0)
import random
rng = random.Random(0)
prefixes = [[rng.randrange(1000, 150000) for _ in range(prefix)] for _ in range(docs)]

def one_pass(tag):
    ttfts = []
    for p in prefixes:
        ids = p + [rng.randrange(1000, 150000) for _ in range(suffix)]
        t0 = time.perf_counter()
        llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)
        ttfts.append(time.perf_counter() - t0)
    print(f"{mode}/{tag}: median TTFT {statistics.median(ttfts) * 1000:.1f} ms", file=sys.stderr)
    return ttfts

llm.generate([{"prompt_token_ids": [1000 + i for i in range(64)]}], sp, use_tqdm=False)  # warm-up
out = {"mode": mode, "cold": one_pass("cold")}
if mode == "kvstrata":
    llm.reset_prefix_cache()  # vLLM's own cache emptied: the prefixes can only come from kvstrata
    time.sleep(2)  # background stores of the last requests
    out["warm"] = one_pass("warm")
print(json.dumps(out))
sys.stdout.flush()
os._exit(0)
PY

log "baseline (no connector, no prefix cache) ..."
"$PYTHON" "$WORKDIR/run.py" baseline "$WORKDIR" "$PORT" "$DOCS" "$PREFIX_TOKENS" "$SUFFIX_TOKENS" "$CHUNK" \
  > "$WORKDIR/baseline.json" 2> "$WORKDIR/baseline.log" || { tail -30 "$WORKDIR/baseline.log" >&2; die "baseline run failed"; }
log "kvstrata connector ..."
"$PYTHON" "$WORKDIR/run.py" kvstrata "$WORKDIR" "$PORT" "$DOCS" "$PREFIX_TOKENS" "$SUFFIX_TOKENS" "$CHUNK" \
  > "$WORKDIR/kvstrata.json" 2> "$WORKDIR/kvstrata-run.log" || { tail -30 "$WORKDIR/kvstrata-run.log" >&2; die "kvstrata run failed"; }

"$PYTHON" - "$WORKDIR" "$PREFIX_TOKENS" "$SUFFIX_TOKENS" "$CHUNK" "$DOCS" <<'PY'
import json, statistics, sys
wd, prefix, suffix, chunk, docs = sys.argv[1], *map(int, sys.argv[2:6])
base = json.loads(open(f"{wd}/baseline.json").read().strip().splitlines()[-1])
kvs = json.loads(open(f"{wd}/kvstrata.json").read().strip().splitlines()[-1])
med = lambda xs: statistics.median(xs) * 1000
saved = (prefix + suffix - 1) // chunk * chunk  # tokens per warm request restored from kvstrata
res = {"baseline_ttft_ms": med(base["cold"]), "kvstrata_cold_ttft_ms": med(kvs["cold"]),
       "kvstrata_warm_ttft_ms": med(kvs["warm"]), "warm_over_baseline": med(kvs["warm"]) / med(base["cold"]),
       "prefill_tokens_saved_per_request": saved, "prefill_tokens_saved_total": saved * docs,
       "docs": docs, "prefix_tokens": prefix, "suffix_tokens": suffix, "chunk": chunk}
for k, v in res.items():
    print(f"{k:34s} {v:.3f}" if isinstance(v, float) else f"{k:34s} {v}", file=sys.stderr)
print(json.dumps(res))
PY
