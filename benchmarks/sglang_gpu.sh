#!/usr/bin/env bash
# SGLang with HiCache and kvstrata as its L3, on a GPU machine: one command, reports L3 hits and TTFT.
#
#   benchmarks/sglang_gpu.sh                 # human table on stderr, one JSON document on stdout
#
# What it does: installs SGLang (unless it is installed already) and this checkout of kvstrata; starts a kvstrata
# node (DRAM + SSD tier) and an SGLang server with --enable-hierarchical-cache and kvstrata as the dynamic storage
# backend (zero-copy interface_v1); then sends DOCS long prompts three times, streaming, and measures the time to
# the first token of each:
#   cold   nothing cached: SGLang computes the prefill and writes the pages through to kvstrata (the baseline);
#   l3     after /flush_cache (GPU and host caches emptied): the prefixes come back from kvstrata;
#   gpu    the same prompts again without a flush: L1 (GPU) hits, for reference.
# L3 hits are counted on both sides: SGLang's cached_tokens per request, and kvstrata's keyspace_hits (objects).
#
# Settings (environment): MODEL (Qwen/Qwen3-0.6B), DOCS (8), PREFIX_TOKENS (8192), SUFFIX_TOKENS (32),
# PAGE_SIZE (64), KV_DRAM (8G), SGLANG_VERSION (0.5.23), SKIP_INSTALL=1 (use what is installed), WORKDIR (a
# temporary directory; logs are kept there), MEM_FRACTION (0.6). Needs a CUDA GPU and the model (from the Hugging
# Face hub or a local path in MODEL). It cannot run on the project's CPU-only machines.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="${MODEL:-Qwen/Qwen3-0.6B}"
DOCS="${DOCS:-8}"
PREFIX_TOKENS="${PREFIX_TOKENS:-8192}"
SUFFIX_TOKENS="${SUFFIX_TOKENS:-32}"
PAGE_SIZE="${PAGE_SIZE:-64}"
KV_DRAM="${KV_DRAM:-8G}"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
MEM_FRACTION="${MEM_FRACTION:-0.6}"
WORKDIR="${WORKDIR:-$(mktemp -d -t kvstrata-sglang-XXXXXX)}"
PYTHON="${PYTHON:-python3}"

log() { echo "[sglang_gpu] $*" >&2; }
die() { log "error: $*"; exit 1; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  die "no NVIDIA GPU here (nvidia-smi): this benchmark needs one"
fi

if [[ -z "${SKIP_INSTALL:-}" ]]; then
  if ! "$PYTHON" -c "import sglang, sys; sys.exit(sglang.__version__ != '$SGLANG_VERSION')" 2>/dev/null; then
    log "installing sglang==$SGLANG_VERSION (with its CUDA dependencies)"
    "$PYTHON" -m pip install -q "sglang[all]==$SGLANG_VERSION"
  fi
  log "installing kvstrata from $(pwd)"
  "$PYTHON" -m pip install -q -e .
fi

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
KV_PORT="$(free_port)"
SGL_PORT="$(free_port)"
mkdir -p "$WORKDIR/essd"
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]+"${PIDS[@]}"}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]+"${PIDS[@]}"}"; do wait "$pid" 2>/dev/null || true; done
  log "logs: $WORKDIR"
}
trap cleanup EXIT

log "kvstrata on 127.0.0.1:$KV_PORT (DRAM $KV_DRAM, SSD tier in $WORKDIR/essd)"
"$PYTHON" -m kvstrata serve --port "$KV_PORT" --dram-size "$KV_DRAM" --essd-path "$WORKDIR/essd" --http-port 0 \
  >"$WORKDIR/kvstrata.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
  "$PYTHON" -c "import socket; socket.create_connection(('127.0.0.1', $KV_PORT), 0.2)" 2>/dev/null && break
  sleep 0.2
done

EXTRA="$(printf '{"backend_name": "kvstrata", "module_path": "kvstrata.integrations.sglang", "class_name": "KvstrataHiCacheStorage", "url": "redis://127.0.0.1:%s", "interface_v1": 1}' "$KV_PORT")"
log "SGLang $MODEL on 127.0.0.1:$SGL_PORT with HiCache (page size $PAGE_SIZE) and kvstrata as L3"
"$PYTHON" -m sglang.launch_server --model-path "$MODEL" --host 127.0.0.1 --port "$SGL_PORT" \
  --page-size "$PAGE_SIZE" --mem-fraction-static "$MEM_FRACTION" \
  --enable-hierarchical-cache --hicache-ratio 2 --hicache-write-policy write_through \
  --hicache-mem-layout page_first --hicache-storage-backend dynamic \
  --hicache-storage-prefetch-policy wait_complete \
  --hicache-storage-backend-extra-config "$EXTRA" \
  >"$WORKDIR/sglang.log" 2>&1 &
PIDS+=($!)

"$PYTHON" - "$SGL_PORT" "$KV_PORT" "$MODEL" "$DOCS" "$PREFIX_TOKENS" "$SUFFIX_TOKENS" "$PAGE_SIZE" <<'PY'
import json
import random
import socket
import statistics
import sys
import time
import urllib.request

sgl_port, kv_port, model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
docs, prefix_tokens, suffix_tokens, page_size = (int(a) for a in sys.argv[4:8])
base = f"http://127.0.0.1:{sgl_port}"


def log(msg):
    print(f"[sglang_gpu] {msg}", file=sys.stderr, flush=True)


def http(path, body=None, timeout=600):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"},
                                 method="POST" if body is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def kv(*args):
    """One command to kvstrata over RESP (stdlib only)."""
    out = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in (x.encode() for x in args))
    with socket.create_connection(("127.0.0.1", kv_port), timeout=10) as s:
        s.sendall(out)
        data = b""
        while True:
            chunk = s.recv(1 << 20)
            data += chunk
            if not chunk or (data[:1] in b"+-:" and data.endswith(b"\r\n")):
                break
            if data[:1] == b"$" and b"\r\n" in data:
                n = int(data[1:data.index(b"\r\n")])
                if n < 0 or len(data) >= data.index(b"\r\n") + 4 + n:
                    break
    if data[:1] == b":":
        return int(data[1:])
    if data.startswith(b"$-1"):
        return None
    if data[:1] == b"$":
        return data[data.index(b"\r\n") + 2:-2].decode()
    return data.decode(errors="replace").strip()


def kv_stats():
    info = kv("INFO", "stats")
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    return {"hits": int(fields.get("keyspace_hits", 0)), "misses": int(fields.get("keyspace_misses", 0)),
            "objects": kv("DBSIZE")}


deadline = time.monotonic() + 1800
while True:
    try:
        http("/health_generate", timeout=60)
        break
    except Exception:
        if time.monotonic() > deadline:
            sys.exit("SGLang did not become ready (see sglang.log)")
        time.sleep(2)
log("SGLang is ready")

rng = random.Random(1234)
prefixes = [[rng.randrange(1000, 30000) for _ in range(prefix_tokens)] for _ in range(docs)]


def request(ids):
    """Stream one request; returns (ttft seconds, cached_tokens)."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0}, "stream": True}
    req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    start = time.perf_counter()
    ttft = None
    meta = {}
    with urllib.request.urlopen(req, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            if ttft is None:
                ttft = time.perf_counter() - start
            meta = json.loads(line[5:]).get("meta_info", meta)
    return ttft, int(meta.get("cached_tokens", 0))


def run_pass(name, seed):
    r = random.Random(seed)
    before = kv_stats()
    ttfts, cached = [], []
    for p in prefixes:
        ttft, c = request(p + [r.randrange(1000, 30000) for _ in range(suffix_tokens)])
        ttfts.append(ttft)
        cached.append(c)
    after = kv_stats()
    result = {"pass": name, "ttft_median_ms": 1000 * statistics.median(ttfts),
              "ttft_ms": [round(1000 * t, 1) for t in ttfts], "cached_tokens_total": sum(cached),
              "prompt_tokens_total": docs * (prefix_tokens + suffix_tokens),
              "l3_object_hits": after["hits"] - before["hits"], "l3_object_misses": after["misses"] - before["misses"],
              "l3_objects_stored": after["objects"]}
    log(f"{name:5s} TTFT median {result['ttft_median_ms']:8.1f} ms  cached tokens {sum(cached):7d}  "
        f"kvstrata hits {result['l3_object_hits']:6d}  objects stored {after['objects']}")
    return result


results = [run_pass("cold", 1)]
# Wait until the write-through backups have reached kvstrata (object count stable for 3 s).
last, stable_since = -1, time.monotonic()
while time.monotonic() - stable_since < 3:
    n = kv("DBSIZE")
    if n != last:
        last, stable_since = n, time.monotonic()
    time.sleep(0.5)
expected_pages = docs * (prefix_tokens // page_size)
log(f"kvstrata holds {last} objects ({expected_pages} full prefix pages sent)")
http("/flush_cache", {})
time.sleep(2)
results.append(run_pass("l3", 2))
results.append(run_pass("gpu", 3))
cold, l3 = results[0]["ttft_median_ms"], results[1]["ttft_median_ms"]
summary = {"benchmark": "sglang_gpu", "model": model, "docs": docs, "prefix_tokens": prefix_tokens,
           "suffix_tokens": suffix_tokens, "page_size": page_size, "passes": results,
           "ttft_speedup_l3_vs_cold": round(cold / l3, 2) if l3 else None,
           "l3_hit_tokens": results[1]["cached_tokens_total"]}
log(f"TTFT with the prefix from kvstrata (L3): {l3:.1f} ms vs {cold:.1f} ms cold "
    f"({summary['ttft_speedup_l3_vs_cold']}x); {summary['l3_hit_tokens']} prompt tokens restored after the flush")
print(json.dumps(summary, indent=2))
PY
