#!/usr/bin/env python3
"""Restore bandwidth into GPU KV tensors against the GPU's own prefill rate (the break-even), on one GPU.

    python benchmarks/gpu_restore.py [--tokens 4096] [--repeats 5] [--models qwen2.5-7b,llama-3.1-8b] [--json]

For each model shape (Qwen2.5-7B, Llama-3.1-8B: a randomly initialised model built from the real config, so
nothing is downloaded) it measures, in one run:

* prefill tokens/s of the model on this GPU (bf16, one sequence of ``--tokens`` tokens; median of repeats);
* the break-even restore bandwidth = KV bytes per token x prefill tokens/s (a hit pays above it);
* restore bandwidth of the same prefix's KV into GPU tensors by three paths:
  - ``arena+dma``: a local kvstrata server's shared-memory arena mapped read-only, page-locked with
    cudaHostRegister (``ArenaClient.register_cuda``), each leased chunk copied host-to-device by DMA;
  - ``tcp``: ``KVCacheClient(redis://...)`` over loopback into a pinned buffer, then to the GPU;
  - ``pinned``: a plain pinned host tensor copied to the GPU (the PCIe/NVLink-C2C limit);
* the ratio restore / break-even (the issue's target: >= 10x for both shapes).

Without CUDA (or without torch/transformers) it says so and exits 0: nothing to measure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

MODELS: dict[str, dict[str, Any]] = {
    # Published configs (hidden size, layers, heads, kv heads, intermediate size, vocabulary).
    "qwen2.5-7b": {"family": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
                   "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
                   "max_position_embeddings": 32768, "rope_theta": 1_000_000.0},
    "llama-3.1-8b": {"family": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "rope_theta": 500_000.0},
}
CHUNK = 256


def _cuda() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _model(torch: Any, spec: dict[str, Any]) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kw = {k: v for k, v in spec.items() if k != "family"}
    if spec["family"] == "qwen2":
        cfg, cls = Qwen2Config(**kw), Qwen2ForCausalLM
    else:
        cfg, cls = LlamaConfig(**kw), LlamaForCausalLM
    cfg.torch_dtype = torch.bfloat16
    with torch.device("cuda"):
        model = cls(cfg).to(torch.bfloat16)
    return model.eval()


def _prefill_tps(torch: Any, model: Any, tokens: int, repeats: int) -> float:
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), device="cuda")
    times = []
    with torch.inference_mode():
        for i in range(repeats + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(ids, use_cache=True)
            torch.cuda.synchronize()
            if i:
                times.append(time.perf_counter() - t0)
    return tokens / statistics.median(times)


def _serve(sock: str, dram: int) -> tuple[subprocess.Popen[bytes], int]:
    from kvstrata.bench.procs import free_port, wait_ready

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kvstrata", "serve", "--port", str(port), "--http-port", "0",
                             "--loglevel", "warning", "--dram-size", str(dram), "--unixsocket", sock],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait_ready("127.0.0.1", port, 60, proc)
    return proc, port


def _restore(torch: Any, spec: dict[str, Any], tokens: int, repeats: int) -> dict[str, float]:
    import numpy as np

    from kvstrata.client.arena import ArenaClient, Ref
    from kvstrata.client.codec import read_header
    from kvstrata.client.keys import Namespace
    from kvstrata.client.sdk import KVCacheClient

    layers, heads = spec["num_hidden_layers"], spec["num_key_value_heads"]
    dim = spec["hidden_size"] // spec["num_attention_heads"]
    shape = (layers, 2, heads, tokens, dim)
    kv = np.random.default_rng(0).integers(0, 1 << 16, size=shape, dtype=np.uint16)  # bf16 bits
    nbytes = kv.nbytes
    gpu = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    ns = Namespace("gpu-restore", kv_dtype="bfloat16")
    ids = list(range(tokens))
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="kvs-") as d:
        sock = os.path.join(d, "kv.sock")
        proc, port = _serve(sock, 3 * nbytes + (256 << 20))
        try:
            c = KVCacheClient(f"unix://{sock}", ns)
            c.store(ids, kv)
            keys = c.keys(ids)
            ac = ArenaClient(sock)
            registered = ac.register_cuda()
            arena = torch.frombuffer(ac.mm, dtype=torch.uint8) if registered else None

            def arena_dma() -> None:
                lease, refs = ac.mgetref(keys, checksums=False)
                for i, ref in enumerate(refs):
                    assert isinstance(ref, Ref)
                    hdr = read_header(ac.value(ref))
                    src = arena[ref.offset + hdr.size: ref.offset + ref.length].view(torch.bfloat16)
                    gpu[:, :, :, i * CHUNK:(i + 1) * CHUNK].copy_(src.view(layers, 2, heads, CHUNK, dim),
                                                                   non_blocking=True)
                torch.cuda.synchronize()
                ac.release(lease)

            pinned = torch.empty(shape, dtype=torch.bfloat16).pin_memory()
            pinned_np = pinned.view(torch.uint16).numpy()
            tcp = KVCacheClient(f"redis://127.0.0.1:{port}", ns, local_plane=False)

            def over_tcp() -> None:
                tcp.retrieve(ids, out=pinned_np)
                gpu.copy_(pinned, non_blocking=True)
                torch.cuda.synchronize()

            def plain_pinned() -> None:
                gpu.copy_(pinned, non_blocking=True)
                torch.cuda.synchronize()

            modes = {"tcp": over_tcp, "pinned": plain_pinned}
            if registered:
                modes["arena+dma"] = arena_dma
            times: dict[str, list[float]] = {m: [] for m in modes}
            for rnd in range(repeats + 1):
                order = list(modes) if rnd % 2 == 0 else list(modes)[::-1]
                for m in order:
                    t0 = time.perf_counter()
                    modes[m]()
                    if rnd:
                        times[m].append(time.perf_counter() - t0)
            # The restored bytes are the stored ones.
            if registered:
                arena_dma()
                assert torch.equal(gpu.view(torch.uint16).cpu(), torch.from_numpy(kv))
            for m, ts in times.items():
                out[m] = nbytes / statistics.median(ts) / 1e9
            out["cuda_host_register"] = float(registered)
            ac.close()
            c.close()
            tcp.close()
        finally:
            proc.terminate()
            proc.wait(30)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch = _cuda()
    if torch is None:
        print("gpu_restore: no CUDA device (or no torch): nothing to measure", file=sys.stderr)
        return 0
    tokens = args.tokens // CHUNK * CHUNK
    results = []
    for name in args.models.split(","):
        spec = MODELS[name]
        model = _model(torch, spec)
        tps = _prefill_tps(torch, model, tokens, args.repeats)
        del model
        torch.cuda.empty_cache()
        dim = spec["hidden_size"] // spec["num_attention_heads"]
        per_token = 2 * spec["num_hidden_layers"] * spec["num_key_value_heads"] * dim * 2  # bf16 K and V
        need = per_token * tps / 1e9
        bw = _restore(torch, spec, tokens, args.repeats)
        row = {"model": name, "tokens": tokens, "kv_kb_per_token": round(per_token / 1024, 1),
               "prefill_tokens_per_s": round(tps), "break_even_gbps": round(need, 2),
               "restore_gbps": {k: round(v, 2) for k, v in bw.items() if k != "cuda_host_register"},
               "cuda_host_register": bool(bw.get("cuda_host_register"))}
        row["x_break_even"] = {k: round(v / need, 1) for k, v in row["restore_gbps"].items()}
        results.append(row)
        print(json.dumps(row), file=sys.stderr)
    doc = {"benchmark": "gpu_restore", "device": torch.cuda.get_device_name(0), "results": results}
    print(json.dumps(doc, indent=2) if args.json else "\n".join(
        f"{r['model']}: prefill {r['prefill_tokens_per_s']} tok/s, break-even {r['break_even_gbps']} GB/s; "
        + ", ".join(f"{k} {v} GB/s ({r['x_break_even'][k]}x)" for k, v in r["restore_gbps"].items())
        for r in results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
