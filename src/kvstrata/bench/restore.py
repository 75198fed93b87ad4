"""`kvstrata bench restore`: how fast a KV-cache prefix comes back (and goes in), against the physical limits.

KV payloads shaped like SmolLM2-135M, Qwen2.5-7B and Llama-3.1-8B (layers x K/V x kv-heads x tokens x head-dim,
layout LKHTD, float32 or bfloat16, 256-token chunks) are stored once, then restored into an existing buffer of
the caller (no page faults in any mode) by:

* ``memcpy``: a copy of the same bytes into the same buffer (the limit);
* ``arena``: ``KVCacheClient("unix://...").retrieve(out=)``: leases by ``TAIR.KV.MGETREF`` and one copy out of
  the server's shared-memory arena, mapped read-only;
* ``arena-copy``: the copy part of ``arena`` alone (the chunks leased before the clock starts): what the
  request round trip adds on top of moving the bytes;
* ``unix``: the same client with ``local_plane=False``: values over the Unix socket into reused buffers;
* ``tcp``: the same over TCP loopback (each raw value received straight into its slot of the buffer);
* ``tcp-buffered``: the TCP path before scatter receive, kept for comparison: values received into reused buffers,
  verified there, then copied into the caller's buffer (``retrieve_chunks(reuse_buffers=True)`` into it);
* ``tcp-new``: ``retrieve(tokens)`` over TCP into a new array (page faults included), received in place; and
  ``tcp-new-concat``, the previous ``retrieve(tokens)``: decoded chunks concatenated into a new array;
* ``loopback``: single-stream TCP loopback moving the case's bytes (``kvstrata.bench.large.loopback_gbps``) from a
  buffer as large as the case into another, timed in the same rounds: the reference of ``tcp/loopback`` (a
  server's values, like the restored KV, are larger than the CPU cache, so the sender's buffer is too);
* ``redis-py``: redis-py ``MGET`` of the same chunk values from a real Redis 7, decoded and copied;
* ``lmcache``: LMCache 0.5.6's in-process ``local_cpu`` backend, run in its own virtual environment
  (``--lmcache-python``, default /tmp/lmc/bin/python) by ``kvstrata.bench.lmcache_worker``.

Stores are timed the same way: ``store-stage`` (the SDK with ``stage_writes=True`` and a local server: a two-phase write,
each chunk copied once into the client's own staging segment, then committed with its checksum, which the
server verifies on its own copy), ``store-reserve`` (the same client's ``reserve``: the caller copies each chunk
into its reservation itself, as an engine's device-to-host copy would, and marks it ``done``, which hashes and
commits it at once; waves of up to ``STAGE_WAVE`` bytes), ``store-pull`` (the same store pulled by the server out of
the client's tensors with ``process_vm_readv``: ``TAIR.KV.PULL``, no copy on the client), ``store-unix`` and ``store-tcp`` (the same store with
``local_plane=False``: over the Unix socket each value is received straight into its arena slot),
``store-lmcache``.

``--pin`` runs the servers on the upper half of the CPUs and this process (its clients, memcpy, loopback's
receiver) on the rest, loopback's sender with the servers, LMCache's worker on every CPU (``kvstrata.cpulist``):
no scheduler co-location of a client with its server (docs/deploy.md, "CPU placement").

Method: one warm-up round, then ``--repeats`` rounds; in each round every case runs every mode, in an order that
alternates between rounds (forward, then reversed). Figures are medians. The same run also measures single-stream
TCP loopback and memcpy with 64 MB messages once, after the rounds (``loopback_gbps``, ``memcpy_64mb_gbps``). The break-even table turns KB per token into the restore bandwidth
at which a cache hit beats recomputing the prefix on a GPU (prefill rates from the issue: 15k-30k tokens/s for
7-8B models on an H100/H200 class GPU) and sets the measured arena bandwidth next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kvstrata.bench.large import loopback_gbps, memcpy_gbps
from kvstrata.bench.procs import ServerProcess, describe_machine, machine_summary, start_server
from kvstrata.bench.report import target_lines, target_table
from kvstrata.client.codec import decode
from kvstrata.cpulist import format_cpus, pin_process, split_cpus

MB = 1024 * 1024
CHUNK = 256
MODELS: dict[str, tuple[int, int, int]] = {  # layers, kv heads, head dim (from the models' configs)
    "smollm2-135m": (30, 3, 64),
    "qwen2.5-7b": (28, 4, 128),
    "llama-3.1-8b": (32, 8, 128),
}
DEFAULT_CASES = "smollm2-135m:float32:1536,smollm2-135m:bfloat16:4096,qwen2.5-7b:bfloat16:1536,llama-3.1-8b:bfloat16:1536"
PREFILL_RATES = (15_000, 30_000)  # tokens/s of a 7-8B model on one Hopper GPU (the figures)
RESTORE_MODES = ("memcpy", "arena", "arena-copy", "unix", "tcp", "tcp-buffered", "tcp-new", "tcp-new-concat",
                 "loopback", "redis-py", "lmcache")
STORE_MODES = ("store-memcpy", "store-stage", "store-pull", "store-reserve", "store-unix", "store-tcp",
               "store-lmcache")
_STORE_CLIENT = {"store-stage": "arena", "store-pull": "pull", "store-reserve": "arena", "store-unix": "unix",
                 "store-tcp": "tcp"}
STAGE_WAVE = 96 * MB  # chunks reserved at once by store-reserve (the server's staging segment is 128 MB)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Case:
    def __init__(self, spec: str, seed: int) -> None:
        model, dtype, tokens = spec.split(":")
        if model not in MODELS:
            raise SystemExit(f"unknown model {model!r}; known: {', '.join(MODELS)}")
        layers, heads, dim = MODELS[model]
        self.model, self.dtype, self.tokens = model, dtype, int(tokens) // CHUNK * CHUNK
        shape = (layers, 2, heads, self.tokens, dim)
        rng = np.random.default_rng(seed)
        if dtype == "float32":
            self.kv = rng.standard_normal(shape, dtype=np.float32)
        elif dtype == "bfloat16":  # bf16 bits in uint16 storage, as the codec carries them
            self.kv = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
        else:
            raise SystemExit(f"dtype must be float32 or bfloat16, not {dtype!r}")
        self.token_ids = [int(x) for x in rng.integers(0, 50_000, self.tokens)]
        self.out = np.empty_like(self.kv)
        self.out[...] = 0  # touched: every mode restores into resident memory
        self.name = f"{model} {dtype} {self.tokens} tok"
        self.kb_per_token = self.kv.nbytes / self.tokens / 1024

    @property
    def nbytes(self) -> int:
        return int(self.kv.nbytes)

    def namespace(self) -> Any:
        from kvstrata.client.keys import Namespace

        return Namespace(self.model, kv_dtype=self.dtype)


class LMCacheWorker:
    """LMCache 0.5.6 in its own interpreter (kvstrata.bench.lmcache_worker), driven over stdin/stdout."""

    def __init__(self, python: str, cases: list[Case]) -> None:
        worker = Path(__file__).with_name("lmcache_worker.py")
        self.proc = subprocess.Popen([python, str(worker)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.version = self._ask({"op": "setup", "cases": [
            {"model": c.model, "dtype": c.dtype, "tokens": c.tokens, "shape": list(c.kv.shape)} for c in cases]})

    def _ask(self, msg: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the LMCache worker exited")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply["result"]

    def time(self, op: str, i: int) -> float:
        return float(self._ask({"op": op, "case": i}))

    def close(self) -> None:
        try:
            self._ask({"op": "quit"})
        except (RuntimeError, OSError, ValueError):
            pass
        self.proc.kill()
        self.proc.wait()


def _redis_mget_restore(r: Any, keys: list[bytes], case: Case, client: Any) -> None:
    """redis-py MGET of the chunk values, each decoded (checksum verified) and copied into the case's buffer."""
    chunks = [decode(v)[0] for v in r.mget(keys)]
    client._into(chunks, case.out)


def _leased_copy(client: Any, case: Case) -> float:
    """Time only the copy of a retrieve from the arena: lease first, then decode and copy into the buffer."""
    client.namespace = case.namespace()
    ac = client._arena()
    lease, refs = ac.mgetref(client.keys(case.token_ids), checksums=False)  # as the SDK asks
    try:
        t0 = time.perf_counter()
        chunks = [decode(ac.value(ref), check=False)[0] for ref in refs]
        client._into(chunks, case.out)
        return time.perf_counter() - t0
    finally:
        ac.release(lease)


def _reserve_store(client: Any, case: Case) -> None:
    """Store the case through ``client.reserve``: each chunk copied by the caller into its slot (LKHTD: T is
    axis 3), in waves of chunks that fit ``STAGE_WAVE`` bytes."""
    kv = case.kv
    shape = (*kv.shape[:3], CHUNK, kv.shape[4])
    per_wave = max(1, STAGE_WAVE // (kv.nbytes // (case.tokens // CHUNK)))
    for first in range(0, case.tokens // CHUNK, per_wave):
        end = min(case.tokens, (first + per_wave) * CHUNK)
        with client.reserve(case.token_ids[:end], shape, start=first * CHUNK) as slots:
            for j, slot in enumerate(slots):
                t = (first + j) * CHUNK
                np.copyto(slot, kv[:, :, :, t:t + CHUNK])
                slots.done(j)  # hashed and committed while still in cache; verified while the next is copied


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(specs: list[str], repeats: int, lmcache_python: str, modes: tuple[str, ...],
        pin: bool = False) -> dict[str, Any]:
    import redis

    from kvstrata.client.sdk import KVCacheClient, _Filler

    cases = [Case(s, seed=i) for i, s in enumerate(specs)]
    total = sum(c.nbytes for c in cases)
    sockdir = tempfile.mkdtemp(prefix="kvs-bench-")
    sock = os.path.join(sockdir, "kv.sock")
    notes: list[str] = []
    servers: list[ServerProcess] = []
    lmc: LMCacheWorker | None = None
    server_cpus: tuple[int, ...] = ()
    client_cpus: tuple[int, ...] = ()
    pin_args: list[str] = []
    if pin:
        # The servers on one half of the CPUs, this process (the clients, memcpy, loopback's receiver) on the
        # other: no scheduler co-location (kvstrata.cpulist). LMCache's worker keeps every CPU (it is started
        # before this process pins itself): an in-process cache has no server to keep apart from, and torch
        # copies with as many threads as it may use.
        server_cpus, client_cpus = split_cpus(os.sched_getaffinity(0))
        pin_args = ["--server-cpulist", format_cpus(server_cpus)]
    try:
        _log(f"restore: {len(cases)} cases, {total / MB:.0f} MB of KV; starting kvstrata")
        kv = start_server("kvstrata", [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning",
                                       "--http-port", "0", "--dram-size", str(2 * total + 256 * MB),
                                       "--unixsocket", sock, "--pull-store", "yes", *pin_args])
        servers.append(kv)
        clients = {
            "arena": KVCacheClient(f"unix://{sock}", local_plane=True, stage_writes=True),
            "pull": KVCacheClient(f"unix://{sock}", local_plane=True),
            "unix": KVCacheClient(f"unix://{sock}", local_plane=False),
            "tcp": KVCacheClient(f"redis://127.0.0.1:{kv.port}", local_plane=False),
        }
        rpy = None
        if "redis-py" in modes and shutil.which("redis-server"):
            rs = start_server("redis", ["redis-server", "--save", "", "--appendonly", "no",
                                        "--protected-mode", "no"])
            servers.append(rs)
            if server_cpus:
                pin_process(server_cpus, rs.pid)
            rpy = redis.Redis(port=rs.port)
            clients["redis-py"] = KVCacheClient(f"redis://127.0.0.1:{rs.port}", local_plane=False)
        elif "redis-py" in modes:
            notes.append("redis-server not installed: the redis-py mode was skipped")
        if "lmcache" in modes:
            if os.path.exists(lmcache_python):
                try:
                    lmc = LMCacheWorker(lmcache_python, cases)
                except (RuntimeError, OSError) as exc:
                    notes.append(f"LMCache worker failed to start ({exc}): LMCache skipped")
            else:
                notes.append(f"{lmcache_python} not found (python3 -m venv /tmp/lmc && /tmp/lmc/bin/pip install "
                             "torch==2.13.0 lmcache==0.5.6): LMCache skipped")
        if client_cpus:
            pin_process(client_cpus)
        clients["arena"].pull_store = False  # store-stage: the staging segment, not pulls
        clients["pull"].pull_store = True
        for c in cases:
            for name in ("arena", "redis-py"):
                if name in clients:
                    clients[name].namespace = c.namespace()
                    clients[name].store(c.token_ids, c.kv, skip_existing=False)
        for cl in clients.values():
            cl.namespace = cases[0].namespace()
        arena_client = clients["arena"]

        def restore(mode: str, i: int) -> float:
            c = cases[i]
            if mode == "memcpy":
                return _timed(lambda: np.copyto(c.out, c.kv))
            if mode == "loopback":
                return c.nbytes / (loopback_gbps(c.nbytes, msg=-(-c.nbytes // MB) * MB, sender_cpus=server_cpus)
                                   * 1e9)
            if mode == "lmcache":
                assert lmc is not None
                return lmc.time("retrieve", i)
            if mode == "arena-copy":
                return _leased_copy(clients["arena"], c)
            if mode == "redis-py":
                clients["redis-py"].namespace = c.namespace()
                keys = clients["redis-py"].keys(c.token_ids)
                return _timed(lambda: _redis_mget_restore(rpy, keys, c, clients["redis-py"]))
            cl = clients["tcp" if mode.startswith("tcp") else mode]
            cl.namespace = c.namespace()
            n = [0]

            def go() -> None:
                if mode == "tcp-buffered":
                    n[0], _ = cl.retrieve_chunks(c.token_ids, reuse_buffers=True, _into=_Filler(c.out, 3))
                elif mode == "tcp-new":
                    n[0], _ = cl.retrieve(c.token_ids)
                elif mode == "tcp-new-concat":
                    n[0], chunks = cl.retrieve_chunks(c.token_ids)
                    cl.concat(chunks, "LKHTD")  # LKHTD: T is axis 3
                else:
                    n[0], _ = cl.retrieve(c.token_ids, out=c.out)

            dt = _timed(go)
            if n[0] != c.tokens:
                raise RuntimeError(f"{mode}: restored {n[0]} of {c.tokens} tokens of {c.name}")
            return dt

        def store(mode: str, i: int) -> float:
            c = cases[i]
            if mode == "store-memcpy":
                return _timed(lambda: np.copyto(c.out, c.kv))
            if mode == "store-lmcache":
                assert lmc is not None
                return lmc.time("store", i)
            cl = clients[_STORE_CLIENT[mode]]
            cl.namespace = c.namespace()
            if mode == "store-reserve":
                return _timed(lambda: _reserve_store(cl, c))
            dt = _timed(lambda: cl.store(c.token_ids, c.kv, skip_existing=False))
            if mode == "store-pull" and getattr(cl, "_pull_off", False):
                raise RuntimeError("store-pull: the server refused to pull from this process (see the log)")
            return dt

        active = [m for m in modes if m in ("memcpy", "arena", "arena-copy", "unix", "tcp", "tcp-buffered", "tcp-new",
                                            "tcp-new-concat", "loopback")
                  or (m == "redis-py" and rpy)
                  or (m == "lmcache" and lmc)]
        active_store = [m for m in STORE_MODES if m != "store-lmcache" or lmc]
        times: dict[tuple[int, str], list[float]] = {}
        for rnd in range(repeats + 1):
            order = active + active_store
            if rnd % 2:
                order = order[::-1]
            for i in range(len(cases)):
                for mode in order:
                    if mode not in active and mode not in active_store:
                        continue
                    try:
                        dt = store(mode, i) if mode.startswith("store-") else restore(mode, i)
                    except RuntimeError as exc:
                        if "lmcache" not in mode:
                            raise
                        notes.append(f"LMCache failed ({exc}): left out of this run")
                        active = [m for m in active if m != "lmcache"]
                        active_store = [m for m in active_store if m != "store-lmcache"]
                        continue
                    if rnd:  # round 0 is the warm-up
                        times.setdefault((i, mode), []).append(dt)
            _log(f"round {rnd}/{repeats} done" + (" (warm-up)" if rnd == 0 else ""))
        # Stored values must still be exact after all of this.
        for c in cases:
            arena_client.namespace = c.namespace()
            n, got = arena_client.retrieve(c.token_ids)
            if n != c.tokens or not np.array_equal(got, c.kv):
                raise RuntimeError(f"restored KV of {c.name} differs from what was stored")
        loop = loopback_gbps(2 * 1024 * MB, sender_cpus=server_cpus)
        mem = memcpy_gbps(2 * 1024 * MB)
        for cl in clients.values():
            cl.close()
    finally:
        if lmc is not None:
            lmc.close()
        for s in servers:
            s.stop()
        shutil.rmtree(sockdir, ignore_errors=True)
    rows = []
    for i, c in enumerate(cases):
        row: dict[str, Any] = {"case": c.name, "model": c.model, "dtype": c.dtype, "tokens": c.tokens,
                               "mb": round(c.nbytes / MB, 1), "kb_per_token": round(c.kb_per_token, 1),
                               "chunk_mb": round(c.nbytes / (c.tokens // CHUNK) / MB, 2), "gbps": {}}
        for mode in [*active, *active_store]:
            row["gbps"][mode] = round(c.nbytes / statistics.median(times[(i, mode)]) / 1e9, 3)
        g = row["gbps"]
        row["ratios"] = {
            "arena/memcpy": round(g["arena"] / g["memcpy"], 3),
            "store-stage/memcpy": round(g["store-stage"] / g["store-memcpy"], 3),
            "store-reserve/memcpy": round(g["store-reserve"] / g["store-memcpy"], 3),
            "store-unix/memcpy": round(g["store-unix"] / g["store-memcpy"], 3),
            "store-stage/store-unix": round(g["store-stage"] / g["store-unix"], 3),
            "store-pull/memcpy": round(g["store-pull"] / g["store-memcpy"], 3),
            "store-pull/store-stage": round(g["store-pull"] / g["store-stage"], 3),
        }
        if "lmcache" in g:
            row["ratios"]["arena/lmcache"] = round(g["arena"] / g["lmcache"], 3)
            row["ratios"]["store-stage/store-lmcache"] = round(g["store-stage"] / g["store-lmcache"], 3)
            row["ratios"]["store-pull/store-lmcache"] = round(g["store-pull"] / g["store-lmcache"], 3)
            row["ratios"]["store-reserve/store-lmcache"] = round(g["store-reserve"] / g["store-lmcache"], 3)
            row["ratios"]["store-unix/store-lmcache"] = round(g["store-unix"] / g["store-lmcache"], 3)
        if "tcp" in g:
            # The loopback of the same rounds when measured (it swings with the machine's load), else the one
            # measured after them.
            row["ratios"]["tcp/loopback"] = round(g["tcp"] / g.get("loopback", loop), 3)
            row["ratios"]["tcp/loopback-64mb"] = round(g["tcp"] / loop, 3)
        if "tcp" in g and "tcp-buffered" in g:
            row["ratios"]["tcp/tcp-buffered"] = round(g["tcp"] / g["tcp-buffered"], 3)
        if "tcp-new" in g and "tcp-new-concat" in g:
            row["ratios"]["tcp-new/tcp-new-concat"] = round(g["tcp-new"] / g["tcp-new-concat"], 3)
        rows.append(row)
    return {
        "benchmark": "restore",
        "machine": describe_machine(),
        "repeats": repeats,
        "loopback_gbps": round(loop, 3),
        "memcpy_64mb_gbps": round(mem, 3),
        "lmcache": lmc.version if lmc is not None else None,
        "pinned": {"server": format_cpus(server_cpus), "client": format_cpus(client_cpus)} if pin else None,
        "cases": rows,
        "break_even": break_even(rows),
        "targets": targets(rows),
        "notes": notes,
    }


def break_even(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case: the restore bandwidth at which a hit beats recompute at each GPU prefill rate, and 10x TTFT."""
    out = []
    for r in rows:
        per_token = r["kb_per_token"] * 1024
        need = {str(rate): round(per_token * rate / 1e9, 2) for rate in PREFILL_RATES}
        arena = r["gbps"]["arena"]
        out.append({"case": r["case"], "kb_per_token": r["kb_per_token"], "break_even_gbps": need,
                    "ten_x_gbps": {k: round(10 * v, 1) for k, v in need.items()},
                    "arena_gbps": arena,
                    "arena_x_break_even": {k: round(arena / v, 2) for k, v in need.items()}})
    return out


def targets(rows: list[dict[str, Any]]) -> dict[str, bool]:
    t = {
        "arena restore >= 0.8x memcpy": all(r["ratios"]["arena/memcpy"] >= 0.8 for r in rows),
        "store >= 0.5x memcpy (two-phase)": all(r["ratios"]["store-stage/memcpy"] >= 0.5 for r in rows),
        "store >= 0.5x memcpy (pull)": all(r["ratios"]["store-pull/memcpy"] >= 0.5 for r in rows),
    }
    if all("arena/lmcache" in r["ratios"] for r in rows):
        t["arena restore >= 1.0x LMCache local_cpu"] = all(r["ratios"]["arena/lmcache"] >= 1.0 for r in rows)
        t["store >= 0.5x LMCache store (two-phase)"] = all(r["ratios"]["store-stage/store-lmcache"] >= 0.5
                                                             for r in rows)
        t["store >= 0.5x LMCache store (pull)"] = all(r["ratios"]["store-pull/store-lmcache"] >= 0.5 for r in rows)
    big = [r for r in rows if r["chunk_mb"] >= 4 and "tcp/loopback" in r["ratios"]]
    if big:
        t["TCP restore >= 90% of loopback (chunks >= 4 MB)"] = all(r["ratios"]["tcp/loopback"] >= 0.9 for r in big)
    return t


def render(result: dict[str, Any]) -> str:
    lines = [f"kvstrata bench restore  ({machine_summary(result['machine'])})",
             f"loopback TCP {result['loopback_gbps']} GB/s, memcpy {result['memcpy_64mb_gbps']} GB/s "
             f"(64 MB messages); medians of {result['repeats']} rounds{_pinned(result)}", ""]
    modes = list(result["cases"][0]["gbps"])
    lines.append(f"{'case':34} " + " ".join(f"{m:>13}" for m in modes))
    for r in result["cases"]:
        lines.append(f"{r['case']:34} " + " ".join(f"{r['gbps'][m]:>13.2f}" for m in modes))
    lines.append("")
    for r in result["cases"]:
        lines.append(f"{r['case']:34} " + ", ".join(f"{k} {v:.2f}" for k, v in r["ratios"].items()))
    lines.append("")
    lines.append("break-even (GB/s at 15k / 30k prefill tokens/s) and the arena's multiple of it:")
    for b in result["break_even"]:
        lines.append(f"  {b['case']:34} {b['kb_per_token']:6.1f} KB/token  need {b['break_even_gbps']['15000']}"
                     f" / {b['break_even_gbps']['30000']}  arena {b['arena_gbps']:.2f}"
                     f"  = {b['arena_x_break_even']['15000']}x / {b['arena_x_break_even']['30000']}x")
    lines += ["", *target_lines(result["targets"]), *result["notes"]]
    return "\n".join(lines)


def _pinned(result: dict[str, Any]) -> str:
    p = result.get("pinned")
    return f"; servers on CPU {p['server']}, clients on CPU {p['client']} (--pin)" if p else ""


def write_markdown(result: dict[str, Any]) -> str:
    modes = list(result["cases"][0]["gbps"])
    out = [f"Machine: {machine_summary(result['machine'])}. Loopback TCP {result['loopback_gbps']} GB/s, memcpy "
           f"{result['memcpy_64mb_gbps']} GB/s (64 MB messages, same run). Medians of {result['repeats']} rounds"
           f"{_pinned(result)}.",
           "", "| case | MB | " + " | ".join(modes) + " |", "|---|---|" + "---|" * len(modes)]
    for r in result["cases"]:
        out.append(f"| {r['case']} | {r['mb']} | " + " | ".join(f"{r['gbps'][m]:.2f}" for m in modes) + " |")
    out += ["", "| case | " + " | ".join(result["cases"][0]["ratios"]) + " |",
            "|---|" + "---|" * len(result["cases"][0]["ratios"])]
    for r in result["cases"]:
        out.append(f"| {r['case']} | " + " | ".join(f"{v:.2f}" for v in r["ratios"].values()) + " |")
    out += ["", "| case | KB/token | break-even GB/s (15k / 30k tok/s) | 10x TTFT GB/s | arena GB/s | arena / "
            "break-even |", "|---|---|---|---|---|---|"]
    for b in result["break_even"]:
        out.append(f"| {b['case']} | {b['kb_per_token']} | {b['break_even_gbps']['15000']} / "
                   f"{b['break_even_gbps']['30000']} | {b['ten_x_gbps']['15000']} / {b['ten_x_gbps']['30000']} | "
                   f"{b['arena_gbps']:.2f} | {b['arena_x_break_even']['15000']}x / "
                   f"{b['arena_x_break_even']['30000']}x |")
    out += ["", *target_table(result["targets"], {})]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvstrata bench restore", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help="model:dtype:tokens,... (models: "
                        + ", ".join(MODELS) + ")")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default=",".join(RESTORE_MODES))
    parser.add_argument("--lmcache-python", default="/tmp/lmc/bin/python")
    parser.add_argument("--markdown", action="store_true", help="print the BENCHMARKS.md tables")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--pin", action="store_true",
                        help="run the servers on the upper half of the CPUs and the clients on the rest "
                             "(loopback's sender with the servers)")
    args = parser.parse_args(argv)
    modes = tuple(args.modes.split(","))
    for m in ("memcpy", "arena"):
        if m not in modes:
            modes = (m, *modes)  # the ratios need them
    result = run(args.cases.split(","), args.repeats, args.lmcache_python, modes, pin=args.pin)
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.markdown:
        print(write_markdown(result))
    else:
        print(render(result))
    return 0
