"""kvstrata bench chat: multi-turn chats with a shared ~1,500-token system prompt, measured four ways in one run.

Modes: ``recompute`` (no cache: every turn prefills its whole prompt), ``arena`` (a kvstrata server started
here, read through its shared-memory arena over the Unix socket: docs/dataplane.md), ``server`` (the same server
over TCP loopback, no arena) and ``local`` (the SDK's in-process local tier, no server). Several users each hold
a conversation of ``--turns`` turns; turns are taken round-robin (every user's turn 1, then every user's turn 2,
...), so users after the first find the system prompt cached in turn 1 already. Each (turn, user) step runs in
every mode back to back, in an order that alternates from step to step, so changes of load on a shared machine
hit all modes alike. Every mode first runs one untimed warm-up turn on a prompt of its own. Between turns the
generator finishes storing the previous turn's chunks (that is the user's think time; it is not part of any TTFT).

Reported per mode and turn: the median TTFT over users, restored (hit) and computed tokens; per mode: the
restore time against a plain memcpy of the same bytes, the restore bandwidth next to this machine's break-even
(KV bytes per token x the prefill tokens/s recompute achieved here), and whether every generated token equals
recompute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from typing import Any

import numpy as np

from kvstrata.bench.procs import describe_machine, machine_summary, start_server

MODES = ("recompute", "arena", "server", "local")
TOPICS = ["the eviction policy", "the SSD tier", "TTL classes", "prefetching", "chunk keys", "the codec",
          "tensor parallelism", "cache salts", "the local tier", "versions"]


def system_prompt(tok: Any, target_tokens: int) -> str:
    """A deterministic knowledge-base text of about ``target_tokens`` tokens."""
    parts: list[str] = ["You are the support assistant of a storage company. Use only the facts below."]
    i = 0
    while True:
        text = " ".join(parts)
        if len(tok(text).input_ids) >= target_tokens:
            return text
        topic = TOPICS[i % len(TOPICS)]
        parts.append(f"Fact {i + 1}: regarding {topic}, item {i + 1} has code {(i * 37) % 1000:03d}, "
                     f"belongs to region {'ABCDEFG'[i % 7]} and was reviewed {i % 12 + 1} months ago.")
        i += 1


def questions(user: int, turns: int) -> list[str]:
    return [f"I am user {user}. What is the code of item {user * 3 + t + 1}, and which region is it in?"
            for t in range(turns)]


def memcpy_seconds(nbytes: int, buffers: dict[str, np.ndarray], repeats: int = 3) -> float:
    """Median time to copy ``nbytes`` between two reused buffers (the floor for restoring that many bytes)."""
    if buffers.get("src") is None or buffers["src"].nbytes < nbytes:
        buffers["src"] = np.ones(nbytes, np.uint8)
        buffers["dst"] = np.ones(nbytes, np.uint8)
    src, dst = buffers["src"][:nbytes], buffers["dst"][:nbytes]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class _Mode:
    """One way of serving the conversations: its generator, its sessions and what it measured."""

    def __init__(self, mode: str, model: Any, tok: Any, system: str, users: int, chunk_size: int,
                 url: str | None, compression: str | None) -> None:
        from kvstrata.client import KVCacheClient, LocalTier
        from kvstrata.integrations.transformers import CachedGenerator, ChatSession, model_namespace

        self.mode = mode
        self.client = None
        if mode != "recompute":
            ns = model_namespace(model, salt=uuid.uuid4().hex)
            self.client = KVCacheClient(None if mode == "local" else url, ns, chunk_size=chunk_size,
                                        compression=compression, local_plane=mode == "arena",
                                        local_tier=LocalTier(8 << 30) if mode == "local" else None)
        self.gen = CachedGenerator(model, self.client)
        self.sessions = [ChatSession(self.gen, tok, system) for _ in range(users)]
        self.records: list[dict[str, Any]] = []
        self.buffers: dict[str, np.ndarray] = {}

    def warmup(self, tok: Any, max_new: int) -> None:
        """One untimed turn on a prompt no measured turn shares (first-call costs: allocator, kernels, sockets)."""
        from kvstrata.integrations.transformers import ChatSession

        session = ChatSession(self.gen, tok, "Warm-up: answer briefly. " * 20)
        session.ask("Say hello.", max_new_tokens=max_new)
        self.gen.flush()

    def turn(self, user: int, turn: int, question: str, max_new: int) -> None:
        _, r = self.sessions[user].ask(question, max_new_tokens=max_new)
        self.gen.flush()  # the user's think time: the store finishes before the next request
        rec = {"user": user, "turn": turn, "ttft_s": r.ttft_s, "cached_tokens": r.cached_tokens,
               "computed_tokens": r.computed_tokens, "prompt_tokens": r.prompt_tokens,
               "restore_s": r.restore_s, "restored_bytes": r.restored_bytes, "tokens": r.tokens,
               "store_s": self.gen.last_store_s}
        if r.restored_bytes:
            rec["memcpy_s"] = memcpy_seconds(r.restored_bytes, self.buffers)
        self.records.append(rec)
        print(f"  {self.mode:<9} user {user} turn {turn}: TTFT {r.ttft_s * 1000:7.0f} ms, cached "
              f"{r.cached_tokens:5d}, computed {r.computed_tokens:5d}", file=sys.stderr, flush=True)

    def summary(self, turns: int) -> dict[str, Any]:
        records = self.records
        self.gen.close()
        out: dict[str, Any] = {"records": records}
        by_turn = []
        for t in range(1, turns + 1):
            rs = [r for r in records if r["turn"] == t]
            by_turn.append({
                "turn": t,
                "ttft_median_s": statistics.median(r["ttft_s"] for r in rs),
                "cached_tokens": sum(r["cached_tokens"] for r in rs),
                "computed_tokens": sum(r["computed_tokens"] for r in rs),
                "prompt_tokens_median": statistics.median(r["prompt_tokens"] for r in rs),
            })
        out["by_turn"] = by_turn
        out["hit_tokens"] = sum(r["cached_tokens"] for r in records)
        out["computed_tokens"] = sum(r["computed_tokens"] for r in records)
        restored = [r for r in records if r["restored_bytes"]]
        if restored:
            out["restore_median_s"] = statistics.median(r["restore_s"] for r in restored)
            out["restore_over_memcpy_median"] = statistics.median(r["restore_s"] / max(r["memcpy_s"], 1e-9)
                                                                  for r in restored)
            out["restore_gbps_median"] = statistics.median(
                r["restored_bytes"] / max(r["restore_s"], 1e-9) / 1e9 for r in restored)
            out["memcpy_gbps_median"] = statistics.median(
                r["restored_bytes"] / max(r["memcpy_s"], 1e-9) / 1e9 for r in restored)
            out["restored_mb_median"] = statistics.median(r["restored_bytes"] for r in restored) / 1e6
        later = [r for r in records if r["turn"] >= 2 and r["cached_tokens"]]
        if later:
            # What the cache cannot remove: the model's forward over the uncached rest of the prompt (the new
            # message and the last reply token; the previous turn's tail chunk is restored), which bounds the
            # speedup on this machine.
            out["restore_share_median"] = statistics.median(r["restore_s"] / max(r["ttft_s"], 1e-9) for r in later)
            out["uncached_forward_median_s"] = statistics.median(r["ttft_s"] - r["restore_s"] for r in later)
            out["uncached_tokens_median"] = statistics.median(r["computed_tokens"] for r in later)
        if self.client is not None:
            out["client_stats"] = self.client.stats.as_dict()
            self.client.close()
        return out


def run(model_name: str, users: int, turns: int, max_new: int, chunk_size: int, system_tokens: int,
        modes: list[str], compression: str | None) -> dict[str, Any]:
    import os
    import shutil
    import tempfile

    from kvstrata.chat import load

    t0 = time.perf_counter()
    model, tok = load(model_name)
    load_s = time.perf_counter() - t0
    system = system_prompt(tok, system_tokens)
    result: dict[str, Any] = {
        "benchmark": "chat",
        "command": "kvstrata bench chat " + " ".join(sys.argv[3:] if sys.argv[1:3] == ["bench", "chat"]
                                                     else sys.argv[1:]),
        "machine": describe_machine(),
        "model": model_name, "users": users, "turns": turns, "max_new_tokens": max_new,
        "chunk_size": chunk_size, "system_tokens": len(tok(system).input_ids), "compression": compression or "raw",
        "model_load_s": load_s, "peers": ["recompute (no cache)", "kvstrata arena over its Unix socket",
                                          "kvstrata server over TCP loopback", "in-process local tier"],
        "order": "interleaved: each (turn, user) runs in every mode back to back, the mode order alternating "
                 "from step to step, after one warm-up turn per mode",
        "modes": {},
    }
    srv = None
    sockdir = tempfile.mkdtemp(prefix="kvs-chat-")
    try:
        urls: dict[str, str | None] = {"recompute": None, "local": None}
        if "server" in modes or "arena" in modes:
            sock = os.path.join(sockdir, "kv.sock")
            srv = start_server("kvstrata", [sys.executable, "-m", "kvstrata", "serve", "--http-port", "0",
                                            "--unixsocket", sock])
            urls["server"] = f"redis://{srv.host}:{srv.port}"
            urls["arena"] = f"unix://{sock}"
        runners = [_Mode(m, model, tok, system, users, chunk_size, urls[m], compression) for m in modes]
        for r in runners:
            r.warmup(tok, max_new)
        qs = [questions(u, turns) for u in range(users)]
        step = 0
        for t in range(turns):
            for u in range(users):
                for r in runners if step % 2 == 0 else runners[::-1]:
                    r.turn(u, t + 1, qs[u][t], max_new)
                step += 1
        for r in runners:
            result["modes"][r.mode] = r.summary(turns)
    finally:
        if srv is not None:
            srv.stop()
        shutil.rmtree(sockdir, ignore_errors=True)
    base = result["modes"].get("recompute")
    if base is not None:
        # This machine's break-even: a hit pays when restoring beats prefilling the same tokens here.
        rates = [r["computed_tokens"] / r["ttft_s"] for r in base["records"] if r["ttft_s"] > 0]
        result["prefill_tokens_per_s"] = statistics.median(rates) if rates else None
        for m in result["modes"].values():
            hits = [r for r in m["records"] if r["restored_bytes"] and r["cached_tokens"]]
            if hits and result["prefill_tokens_per_s"]:
                per_token = statistics.median(r["restored_bytes"] / r["cached_tokens"] for r in hits)
                m["break_even_gbps"] = per_token * result["prefill_tokens_per_s"] / 1e9
    for m in result["modes"].values():
        if base is not None:
            m["tokens_identical"] = all(a["tokens"] == b["tokens"]
                                        for a, b in zip(base["records"], m["records"], strict=True))
            m["speedup_by_turn"] = [b["ttft_median_s"] / max(x["ttft_median_s"], 1e-9)
                                    for b, x in zip(base["by_turn"], m["by_turn"], strict=True)]
            if "uncached_forward_median_s" in m and len(base["by_turn"]) > 1:
                recompute_later = statistics.median(b["ttft_median_s"] for b in base["by_turn"][1:])
                m["speedup_bound_from_turn_2"] = recompute_later / max(m["uncached_forward_median_s"], 1e-9)
    for m in result["modes"].values():
        for r in m["records"]:
            r["n_tokens"] = len(r.pop("tokens"))
    if base is not None:
        result["tokens_identical"] = all(m["tokens_identical"] for m in result["modes"].values())
        later = [s for mode, m in result["modes"].items() if mode != "recompute" for s in m["speedup_by_turn"][1:]]
        result["min_speedup_from_turn_2"] = min(later) if later else None
    return result


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['model']}: {result['users']} users x {result['turns']} turns, system prompt "
             f"{result['system_tokens']} tokens, chunk {result['chunk_size']}, {result['max_new_tokens']} new "
             f"tokens per turn"]
    lines.append(f"{'mode':<10} " + " ".join(f"{'turn ' + str(t):>10}" for t in range(1, result["turns"] + 1))
                 + f" {'hit tok':>8} {'identical':>9}")
    for mode, m in result["modes"].items():
        cells = " ".join(f"{b['ttft_median_s'] * 1000:8.0f}ms" for b in m["by_turn"])
        lines.append(f"{mode:<10} {cells} {m['hit_tokens']:>8} {m.get('tokens_identical', '-')!s:>9}")
    for mode, m in result["modes"].items():
        if "speedup_by_turn" in m and mode != "recompute":
            lines.append(f"{mode}: TTFT speedup vs recompute by turn: "
                         + ", ".join(f"{s:.1f}x" for s in m["speedup_by_turn"]))
        if "restore_over_memcpy_median" in m:
            lines.append(f"{mode}: restore {m['restore_median_s'] * 1000:.0f} ms median for "
                         f"{m['restored_mb_median']:.0f} MB = {m['restore_over_memcpy_median']:.1f}x a memcpy "
                         f"({m['restore_gbps_median']:.2f} vs {m['memcpy_gbps_median']:.2f} GB/s); break-even "
                         f"here {m.get('break_even_gbps', 0):.3f} GB/s")
        if "restore_share_median" in m:
            lines.append(f"{mode}: {_split_text(m)}")
    return "\n".join(lines)


def _split_text(m: dict[str, Any]) -> str:
    """Where a cached turn's TTFT goes: the restore, and the model's forward over the tokens it must compute."""
    text = (f"from turn 2 on the restore is {m['restore_share_median']:.0%} of TTFT; the model's forward over the "
            f"{m['uncached_tokens_median']:.0f} uncached tokens takes {m['uncached_forward_median_s'] * 1000:.0f} ms")
    if "speedup_bound_from_turn_2" in m:
        text += f", so even a free restore would give at most {m['speedup_bound_from_turn_2']:.1f}x here"
    return text


def write_markdown(result: dict[str, Any]) -> str:
    turns = result["turns"]
    head = "| mode | " + " | ".join(f"turn {t} TTFT" for t in range(1, turns + 1)) + \
        " | hit tokens | computed tokens | tokens identical |\n|---|" + "---|" * (turns + 3)
    rows = []
    for mode, m in result["modes"].items():
        cells = " | ".join(f"{b['ttft_median_s'] * 1000:.0f} ms" for b in m["by_turn"])
        rows.append(f"| {mode} | {cells} | {m['hit_tokens']} | {m['computed_tokens']} | "
                    f"{str(m.get('tokens_identical', '-')).lower()} |")
    notes = []
    for mode, m in result["modes"].items():
        if mode != "recompute" and "speedup_by_turn" in m:
            notes.append(f"- {mode}: TTFT speedup vs recompute by turn "
                         + ", ".join(f"{s:.1f}x" for s in m["speedup_by_turn"]))
        if "restore_over_memcpy_median" in m:
            notes.append(f"- {mode}: restore (fetch, decode, build the DynamicCache; checksums verified except on arena reads) "
                         f"{m['restore_median_s'] * 1000:.0f} ms median for {m['restored_mb_median']:.0f} MB: "
                         f"{m['restore_over_memcpy_median']:.1f}x a plain memcpy of the same bytes "
                         f"({m['restore_gbps_median']:.2f} vs {m['memcpy_gbps_median']:.2f} GB/s); this "
                         f"machine's break-even {m.get('break_even_gbps', 0):.3f} GB/s")
        if "restore_share_median" in m:
            notes.append(f"- {mode}: {_split_text(m)}")
    return (
        f"## Chat: prefix KV reuse with {result['model']}\n\n"
        f"Command: `{result['command']}`  \nMachine: {machine_summary(result['machine'])}\n\n"
        f"{result['users']} users x {result['turns']} turns, round-robin; a shared system prompt of "
        f"{result['system_tokens']} tokens; {result['max_new_tokens']} greedy tokens per reply; chunks of "
        f"{result['chunk_size']} tokens, codec {result['compression']}; fp32 on the CPU, 2 torch threads. TTFT "
        "is the median over users of the time from the request to the first token (lookup, restore and the "
        "prefill of the uncached rest). Peers in the same run, interleaved step by step (alternating order, one "
        "warm-up turn each): full recompute, the kvstrata arena over the Unix socket, the kvstrata server over TCP "
        "loopback, the SDK's in-process local tier. LMCache was not run.\n\n"
        f"{head}\n" + "\n".join(rows) + "\n\n" + "\n".join(notes) + "\n\n"
        f"Greedy tokens identical to recompute in every mode: **{str(result.get('tokens_identical')).lower()}**. "
        f"Smallest speedup from turn 2 on: {result.get('min_speedup_from_turn_2') or 0:.1f}x.\n"
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kvstrata bench chat", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="smollm2 | tiny-qwen2 | tiny-qwen3 | tiny-llama")
    p.add_argument("--users", type=int, default=3)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--chunk-size", type=int, default=32)
    p.add_argument("--system-tokens", type=int, default=1536)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--compression", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        p.error(f"unknown modes {sorted(unknown)}")
    result = run(args.model, args.users, args.turns, args.max_new_tokens, args.chunk_size, args.system_tokens,
                 modes, args.compression)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0
