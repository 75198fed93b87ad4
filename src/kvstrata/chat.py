"""``kvstrata chat --model smollm2``: a multi-turn chat that reuses the KV cache of earlier turns through kvstrata.

The reply streams as it is generated; after it, each turn prints the time to first token (TTFT), how many prompt
tokens were restored from the cache and how many were computed. ``--no-cache`` is the recompute baseline. By
default a kvstrata server is started for the session on a free loopback port (``--port`` picks one); ``--url``
uses a running server, ``--local`` an in-process tier only.

    kvstrata chat --model smollm2 --script turns.txt     # one user message per line
    kvstrata chat --model smollm2 --no-cache --script turns.txt
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEFAULT_SYSTEM = ("You are a helpful assistant for kvstrata, a tiered KV-cache service for LLM inference. "
                  "Answer briefly and precisely.")


class ByteChatTokenizer:
    """A stand-in tokenizer for the tiny random-weight models (they have no vocabulary): UTF-8 bytes as ids,
    with a ChatML-like template built from a few reserved ids above 255."""

    eos_token_id = None
    ROLE = {"system": 256, "user": 257, "assistant": 258}
    END = 259

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                            tokenize: bool = True) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += [self.ROLE[m["role"]], *m["content"].encode(), self.END]
        if add_generation_prompt:
            ids.append(self.ROLE["assistant"])
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", "replace")

    def __call__(self, text: str) -> Any:
        class _Enc:
            input_ids = list(text.encode())

        return _Enc()


def load(model_name: str) -> tuple[Any, Any]:
    from kvstrata.integrations.models import load_model

    model, tok = load_model(model_name)
    return model, tok if tok is not None else ByteChatTokenizer()


@contextlib.contextmanager
def server_url(url: str | None, local: bool, port: int | None = None) -> Iterator[str | None]:
    """The server to use: ``url``, none (``local``), or a kvstrata server started for the session (on ``port``,
    or a free one)."""
    if local or url:
        yield None if local else url
        return
    from kvstrata.bench.procs import start_server

    srv = start_server("kvstrata", [sys.executable, "-m", "kvstrata", "serve"], port=port)
    try:
        yield f"redis://{srv.host}:{srv.port}"
    finally:
        srv.stop()


def make_generator(model: Any, url: str | None, *, no_cache: bool, local: bool, chunk_size: int,
                   compression: str | None, salt: str = "") -> Any:
    from kvstrata.client import KVCacheClient, LocalTier
    from kvstrata.integrations.transformers import CachedGenerator, model_namespace

    if no_cache:
        return CachedGenerator(model)
    client = KVCacheClient(None if local else url, model_namespace(model, salt=salt), chunk_size=chunk_size,
                           compression=compression, local_tier=LocalTier(4 << 30) if local else None)
    return CachedGenerator(model, client)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kvstrata chat", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="smollm2 | tiny-qwen2 | tiny-qwen3 | tiny-llama | "
                   "tiny-mistral | tiny-gemma2 | tiny-deepseek_v3")
    p.add_argument("--script", metavar="FILE", help="user messages, one per line (default: interactive)")
    p.add_argument("--system", default=None, help="system prompt text")
    p.add_argument("--system-file", metavar="FILE", help="system prompt from a file")
    p.add_argument("--url", default=os.environ.get("KVSTRATA_URL"), help="a running kvstrata server")
    p.add_argument("--port", type=int, default=None,
                   help="port of the session's own kvstrata server (without --url; default: a free port)")
    p.add_argument("--local", action="store_true", help="in-process local tier only (no server)")
    p.add_argument("--no-cache", action="store_true", help="recompute every prompt (the baseline)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--chunk-size", type=int, default=32)
    p.add_argument("--compression", default=None, help="raw | zstd | fp8 | fp8+zstd (default: "
                   "$KVSTRATA_COMPRESSION or raw)")
    p.add_argument("--salt", default=None, help="cache salt (default: a fresh one, so runs do not share)")
    args = p.parse_args(argv)
    system = Path(args.system_file).read_text() if args.system_file else (args.system or DEFAULT_SYSTEM)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    print(f"loading {args.model} ...", file=sys.stderr)
    from kvstrata.integrations.transformers import ChatSession

    model, tok = load(args.model)
    lines: Iterator[str]
    if args.script:
        lines = iter([ln.strip() for ln in Path(args.script).read_text().splitlines() if ln.strip()])
    else:
        def interactive() -> Iterator[str]:
            while True:
                try:
                    text = input("you> ").strip()
                except EOFError:
                    return
                if text in ("/quit", "/exit"):
                    return
                if text:
                    yield text
        lines = interactive()
    with server_url(None if args.no_cache else args.url, args.local and not args.no_cache, args.port) as url:
        gen = make_generator(model, url, no_cache=args.no_cache, local=args.local, chunk_size=args.chunk_size,
                             compression=args.compression, salt=args.salt or uuid.uuid4().hex)
        session = ChatSession(gen, tok, system)
        mode = "no-cache" if args.no_cache else ("local tier" if args.local else f"server {url}")
        print(f"model {args.model}, {mode}, chunk {args.chunk_size} tokens", file=sys.stderr)
        try:
            for turn, text in enumerate(lines, 1):
                if args.script:
                    print(f"you> {text}")
                print("assistant> ", end="", flush=True)
                started = [False]

                def show(piece: str, started: list[bool] = started) -> None:
                    if not started[0]:  # the reply's leading whitespace is not shown
                        piece = piece.lstrip()
                        started[0] = bool(piece)
                    print(piece, end="", flush=True)

                _, r = session.ask(text, max_new_tokens=args.max_new_tokens, on_text=show)
                print()
                print(f"  [turn {turn}: TTFT {r.ttft_s * 1000:.0f} ms | cached {r.cached_tokens} tokens | "
                      f"computed {r.computed_tokens} tokens | restore {r.restore_s * 1000:.0f} ms | "
                      f"reply {len(r.tokens)} tokens in {r.total_s:.2f} s]", flush=True)
        finally:
            gen.close()
    return 0
