"""Prefix KV reuse for HuggingFace transformers causal LMs that use ``DynamicCache`` (Llama, Qwen2, Qwen3, ...).

``CachedGenerator(model, client).generate(token_ids)``:

1. looks up the longest cached prefix (whole chunks, then the longest stored tail chunk after them, leaving at
   least one prompt token to compute),
2. restores those chunks into a fresh ``DynamicCache``,
3. prefills only the rest of the prompt, then decodes greedily,
4. returns, and stores the new full chunks (prompt and reply) and the tokens after the last of them (a tail
   chunk, docs/chunk-keys.md) on a background thread, so the reply is never delayed by the store. The next
   ``generate`` of the same generator waits for that store first (outside the TTFT it measures), so a
   conversation's next turn finds the whole of the previous turn and computes only what is new.

A chunk's value is one tensor ``[layers, 2 (K, V), kv_heads, chunk_tokens, head_dim]`` (layout ``LKHTD``). Models
whose cached K and V differ in width (MLA: DeepSeek V2/V3, whose cache holds full heads in transformers 4.57 and
the compressed latent plus the rope key in 5.x) store ``[layers, kv_heads, chunk_tokens, k_dim + v_dim]`` instead:
each token's K then V (layout ``LHTD``, with ``kv_split=<k_dim>+<v_dim>`` in the namespace so the two never share
keys, also not across transformers releases that cache different things).

Store failures (server gone, a cache shape that cannot be stored) never pass silently: each is logged, counted
in ``CachedGenerator.store_errors`` and in the client's ``ClientStats.store_errors``.

Supported transformers versions: ``>=4.56,<6`` (the ``Cache.layers`` API; pyproject's [llm] extra), tested on
4.57 and 5.24. Older releases keep ``key_cache``/``value_cache`` lists, which ``cache_layers`` also reads.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import transformers
from transformers import DynamicCache

from kvstrata.client.keys import Namespace
from kvstrata.client.local import LOCAL_ENTRY_OVERHEAD, LocalTier
from kvstrata.client.sdk import KVCacheClient
from kvstrata.engine.entry import Entry

SUPPORTED_TRANSFORMERS = (">=4.56", "<6")
LAYOUT = "LKHTD"
SPLIT_LAYOUT = "LHTD"  # K and V of different widths, concatenated per token (MLA)

log = logging.getLogger(__name__)


def check_version() -> None:
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    if not (4, 56) <= (major, minor) < (6, 0):
        raise RuntimeError(f"kvstrata.integrations.transformers supports transformers "
                           f"{','.join(SUPPORTED_TRANSFORMERS)}, found {transformers.__version__}")


def model_namespace(model: Any, model_id: str | None = None, **kw: Any) -> Namespace:
    """The namespace of a model's KV cache: model id (name/path plus a hash of its config unless given),
    the KV dtype and the layout. Extra keywords (tp_rank, adapter, salt, ...) go to ``Namespace``."""
    cfg = model.config
    if model_id is None:
        digest = hashlib.sha256(cfg.to_json_string(use_diff=False).encode()).hexdigest()[:12]
        model_id = f"{cfg.model_type}:{getattr(cfg, '_name_or_path', '') or 'unnamed'}:{digest}"
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    split = kv_widths(model)
    if split is None:
        return Namespace(model=model_id, kv_dtype=dtype, layout=LAYOUT, **kw)
    extra = tuple(sorted({*kw.pop("extra", ()), ("kv_split", f"{split[0]}+{split[1]}")}))
    return Namespace(model=model_id, kv_dtype=dtype, layout=SPLIT_LAYOUT, extra=extra, **kw)


def kv_widths(model: Any) -> tuple[int, int] | None:
    """(K width, V width) per head when the model caches K and V of different widths, None when they are equal.

    Read from the cache itself (one forward of one token, once per model), because what is cached depends on
    the transformers release, not only on the config: DeepSeek-V3 caches full heads (K ``qk_nope + qk_rope``,
    V ``v_head_dim``) in transformers 4.57 and the compressed latent (``kv_lora_rank``, ``qk_rope_head_dim``)
    in 5.x. Layers whose shapes differ from each other are refused (ValueError)."""
    cached = getattr(model, "_kvstrata_kv_widths", False)
    if cached is not False:
        return cached
    with torch.inference_mode():
        cache = DynamicCache()
        device = next(model.parameters()).device
        model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=True,
              **{cache_kwarg(model): cache})
    shapes = {(tuple(k.shape[1:2]), k.shape[-1], tuple(v.shape[1:2]), v.shape[-1]) for k, v in cache_layers(cache)}
    if len(shapes) != 1:
        raise ValueError(f"layers cache K/V of different shapes {sorted(shapes)}: not supported")
    (hk, dk, hv, dv), = shapes
    if hk != hv:
        raise ValueError(f"K has {hk[0]} heads and V {hv[0]}: not supported")
    widths = None if dk == dv else (dk, dv)
    model._kvstrata_kv_widths = widths
    return widths


def expected_layout(model: Any) -> str:
    return LAYOUT if kv_widths(model) is None else SPLIT_LAYOUT


def cache_kwarg(model: Any) -> str:
    """The forward keyword that takes the cache: ``cache`` in transformers 5, ``past_key_values`` before."""
    name = getattr(model, "_kvstrata_cache_kwarg", None)
    if name is None:
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        model._kvstrata_cache_kwarg = name
    return name


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer, each [batch, kv_heads, tokens, head_dim]."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))  # transformers < 4.56


def chunk_tensor(layers: list[tuple[torch.Tensor, torch.Tensor]], start: int, end: int) -> torch.Tensor:
    """One chunk's KV on the cache's device (batch 0): [L, 2, H, end-start, D] when K and V have one width,
    [L, H, end-start, Dk+Dv] (each token's K then V) when they differ (MLA)."""
    for i, (k, v) in enumerate(layers):
        if k.shape[-2] < end or v.shape[-2] < end:
            # A sliding-window layer that dropped old tokens (a cache built with the model's config): its
            # chunk cannot be cut from it. CachedGenerator builds full caches, so this is a caller's cache.
            raise ValueError(f"cache layer {i} holds {k.shape[-2]} tokens, the chunk needs tokens up to {end}")
    k0, v0 = layers[0]
    if k0.shape == v0.shape and all(k.shape == k0.shape and v.shape == k0.shape for k, v in layers):
        return torch.stack([torch.stack((k[0, :, start:end], v[0, :, start:end])) for k, v in layers])
    return torch.stack([torch.cat((k[0, :, start:end], v[0, :, start:end]), dim=-1) for k, v in layers])


def chunk_from_cache(layers: list[tuple[torch.Tensor, torch.Tensor]], start: int, end: int) -> np.ndarray:
    """One chunk's KV as a host array (see ``chunk_tensor`` for its shape)."""
    return chunk_tensor(layers, start, end).cpu().numpy()


class TensorTier(LocalTier):
    """An LRU of decoded chunk tensors on a torch device (the GPU when there is one), in front of the client.

    The host ``LocalTier``'s LRU with tensor values: ``Entry.value`` is a [L, 2, H, T, D] tensor, moved to
    ``device`` on ``put`` and charged by its bytes. ``warmup_ratio``: at start, fill up to that fraction of the
    budget from a host ``LocalTier`` (most recently used chunks first), see ``warmup``.
    """

    name = "hbm"

    def __init__(self, budget: int, device: Any = None, warmup_ratio: float = 0.0, warm_from: Any = None) -> None:
        super().__init__(budget)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.warmup_ratio = warmup_ratio
        if warm_from is not None and warmup_ratio > 0:
            self.warmup(warm_from)

    def _size(self, key: bytes, entry: Entry) -> int:
        t = entry.value
        return len(key) + t.numel() * t.element_size() + LOCAL_ENTRY_OVERHEAD

    def put(self, key: bytes, entry: Entry) -> None:
        if entry.value.device != self.device:
            entry = Entry(entry.value.to(self.device), entry.version, entry.expire_at)
        super().put(key, entry)

    def warmup(self, host: Any) -> int:
        """Copy the most recently used chunks of a host ``LocalTier`` here, up to ``warmup_ratio`` of the budget."""
        from kvstrata.client.codec import CodecError, decode

        n = 0
        target = self.warmup_ratio * self._budget
        for key in reversed(list(host._entries)):
            if self._used >= target:
                break
            entry = host.get(key)
            if entry is None:
                continue
            try:
                arr, hdr = decode(entry.value)
            except CodecError:
                continue
            self.put(key, Entry(_chunk_tensor(arr, hdr.dtype).clone(), 0, entry.expire_at))
            n += 1
        return n


def _chunk_tensor(arr: np.ndarray, dtype: str) -> torch.Tensor:
    """A torch view of a decoded chunk (no copy, also for read-only buffers: it is only read from)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "The given NumPy array is not writable"
        t = torch.from_numpy(arr)
    if dtype == "bfloat16":
        t = t.view(torch.bfloat16)
    return t


def restore_cache(chunks: list[Any], dtype: str, device: Any = None, k_width: int | None = None) -> DynamicCache:
    """A DynamicCache holding the chunks concatenated along T: one copy per layer, into the cache's own tensors
    (on ``device`` when given). Chunks are [L, 2, H, T, D] arrays or tensors, or [L, H, T, Dk+Dv] ones (MLA), whose
    first ``k_width`` columns are K."""
    views = [c if isinstance(c, torch.Tensor) else _chunk_tensor(c, dtype) for c in chunks]
    if device is not None:
        views = [v.to(device, non_blocking=True) for v in views]
    split = views[0].dim() == 4
    if split and k_width is None:
        raise ValueError("chunks with K and V concatenated ([L, H, T, Dk+Dv]) need k_width")
    cache = DynamicCache()
    for layer in range(views[0].shape[0]):
        if split:
            k = torch.cat([v[layer, :, :, :k_width] for v in views], dim=1).unsqueeze(0)
            val = torch.cat([v[layer, :, :, k_width:] for v in views], dim=1).unsqueeze(0)
        else:
            k = torch.cat([v[layer, 0] for v in views], dim=1).unsqueeze(0)
            val = torch.cat([v[layer, 1] for v in views], dim=1).unsqueeze(0)
        _set_layer(cache, layer, k, val)
    return cache


def _set_layer(cache: DynamicCache, idx: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Install a layer's tensors without the extra copy ``update`` makes (torch.cat with an empty tensor)."""
    layers = getattr(cache, "layers", None)
    if layers is not None and len(layers) == idx and hasattr(cache, "layer_class_to_replicate"):
        cls = cache.layer_class_to_replicate
        if cls is not None:
            layer = cls()
            if len(inspect.signature(layer.lazy_initialization).parameters) >= 2:
                layer.lazy_initialization(keys, values)  # transformers 5
            else:
                layer.lazy_initialization(keys)
            layer.keys, layer.values = keys, values
            layers.append(layer)
            return
    cache.update(keys, values, idx)


@dataclass
class GenerateResult:
    tokens: list[int]
    ttft_s: float
    cached_tokens: int
    computed_tokens: int
    prompt_tokens: int
    restore_s: float = 0.0
    restored_bytes: int = 0
    total_s: float = 0.0
    first_logits: torch.Tensor | None = None
    step_logits: list[torch.Tensor] = field(default_factory=list)
    cache: Any = None


class CachedGenerator:
    """Greedy generation with kvstrata prefix reuse. ``client=None`` recomputes everything (the baseline)."""

    def __init__(self, model: Any, client: KVCacheClient | None = None, *, background_store: bool = True,
                 ttl_class: str | None = None, device_tier: TensorTier | None = None, tails: bool = True) -> None:
        """``tails``: also store the tokens after a turn's last full chunk (a tail chunk), and restore the
        longest stored tail of a prompt, so that the next turn of a conversation recomputes only its new tokens,
        not the up to ``chunk_size - 1`` before them (one EXISTS per turn for the candidates)."""
        check_version()
        self.model = model
        self.client = client
        widths = kv_widths(model)
        self.k_width = widths[0] if widths else None
        layout = expected_layout(model)
        if client is not None and client.namespace.layout != layout:
            raise ValueError(f"this model's chunks have layout {layout!r}, the client's namespace says "
                             f"{client.namespace.layout!r}: build the namespace with model_namespace(model)")
        self.device_tier = device_tier
        self.device = next(model.parameters()).device
        self.ttl_class = ttl_class
        self.background_store = background_store
        self.tails = tails
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvstrata-store") if background_store else None
        self._pending: Future | None = None
        self._lock = threading.Lock()
        self.last_store_s = 0.0
        self.store_errors: list[BaseException] = []  # also logged and counted in client.stats.store_errors
        self.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.device_hits = 0

    def flush(self) -> None:
        """Wait until the background store of the previous generate (if any) has finished."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except Exception as exc:
                self._store_failed(exc)

    def _store_failed(self, exc: Exception) -> None:
        """A store that failed is a lost cache entry, never a failed generate: logged and counted."""
        self.store_errors.append(exc)
        log.warning("kvstrata: storing the KV cache failed (the next turn recomputes it): %s: %s",
                    type(exc).__name__, exc)
        if self.client is not None:
            self.client._count(store_errors=1)
            self.client.stats.errors.append(f"store: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        self.flush()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> CachedGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _store(self, tokens: list[int], cache: Any, start: int) -> None:
        t0 = time.perf_counter()
        layers = cache_layers(cache)
        tier = self.device_tier
        keys = self.client.keys(tokens)
        cs = self.client.chunk_size
        if tier is not None:
            for i, key in enumerate(keys):
                if not tier.contains(key):
                    tier.put(key, Entry(chunk_tensor(layers, i * cs, (i + 1) * cs), 0))
        # From the chunk holding ``start``: a restored tail ended inside it, and that chunk is full now.
        self.client.store(tokens, lambda s, e: chunk_from_cache(layers, s, e), start=start // cs * cs,
                          ttl_class=self.ttl_class, keys=keys, tail=self.tails)
        self.last_store_s = time.perf_counter() - t0

    @torch.inference_mode()
    def generate(self, input_ids: Any, max_new_tokens: int = 32, eos_token_id: int | list[int] | None = None,
                 *, return_logits: bool = False, keep_cache: bool = False,
                 on_token: Callable[[int], None] | None = None) -> GenerateResult:
        """Greedy generation; ``on_token(token_id)`` is called with each token as soon as it is chosen (the first
        one right after the prefill, so a caller that streams shows it at TTFT)."""
        ids = [int(t) for t in (input_ids.reshape(-1).tolist() if hasattr(input_ids, "reshape") else input_ids)]
        if not ids:
            raise ValueError("empty prompt")
        eos = set([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id or [])
        self.flush()
        t0 = time.perf_counter()
        n_cached, restored_bytes, restore_s = 0, 0, 0.0
        cache = None
        if self.client is not None:
            cs = self.client.chunk_size
            limit = (len(ids) - 1) // cs * cs  # keep at least one token to compute the next-token logits
            keys = self.client.keys(ids[:limit])
            hit, tail_key = 0, None
            if self.tails:
                # The previous turn's last tokens, stored as a tail chunk after its last full chunk (which may be
                # chunks before this prompt's): found only when all of them are here, in order.
                hit, tail_key = self.client.lookup_tail(ids[:-1], keys)
                if tail_key is not None:
                    keys = keys[:hit // cs]
            if keys or tail_key is not None:
                held: list[torch.Tensor] = []
                if self.device_tier is not None:
                    for key in keys:
                        entry = self.device_tier.get(key)
                        if entry is None:
                            break
                        held.append(entry.value)
                wanted = keys if tail_key is None else [*keys, tail_key]
                n_cached, chunks = self.client.retrieve_chunks(ids[:limit], skip_chunks=len(held),
                                                               reuse_buffers=True, keys=wanted)  # copied below
                if tail_key is not None and n_cached > len(keys) * cs:  # the full chunks and then the tail
                    n_cached = hit
                if n_cached:
                    cache = restore_cache([*held, *chunks], self.dtype, self.device, self.k_width)
                    restored_bytes = sum(c.nbytes for c in chunks) + sum(
                        t.numel() * t.element_size() for t in held)
                self.device_hits = len(held)
            restore_s = time.perf_counter() - t0
        if cache is None:
            cache = DynamicCache()
        kw = {cache_kwarg(self.model): cache}
        out = self.model(input_ids=torch.tensor([ids[n_cached:]], device=self.device), use_cache=True,
                         logits_to_keep=1, **kw)
        logits = out.logits[0, -1]
        nxt = int(torch.argmax(logits))
        ttft = time.perf_counter() - t0
        result = GenerateResult([nxt], ttft, n_cached, len(ids) - n_cached, len(ids), restore_s, restored_bytes)
        if return_logits:
            result.first_logits = logits.float().clone()
        if on_token is not None:
            on_token(nxt)
        while len(result.tokens) < max_new_tokens and nxt not in eos:
            out = self.model(input_ids=torch.tensor([[nxt]], device=self.device), use_cache=True, **kw)
            logits = out.logits[0, -1]
            nxt = int(torch.argmax(logits))
            result.tokens.append(nxt)
            if return_logits:
                result.step_logits.append(logits.float().clone())
            if on_token is not None:
                on_token(nxt)
        result.total_s = time.perf_counter() - t0
        if keep_cache:
            result.cache = cache
        if self.client is not None:
            seen = ids + result.tokens[:-1]  # the cache holds KV for these
            if self._pool is not None:
                self._pending = self._pool.submit(self._store, seen, cache, n_cached)
            else:
                try:
                    self._store(seen, cache, n_cached)
                except Exception as exc:
                    self._store_failed(exc)
        return result


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` with the generation prompt: ``apply_chat_template`` returns a list in
    transformers 4 and a ``BatchEncoding`` in 5."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]


class ChatSession:
    """A multi-turn chat on top of ``CachedGenerator`` with a tokenizer's chat template."""

    def __init__(self, generator: CachedGenerator, tokenizer: Any, system: str | None = None) -> None:
        self.gen = generator
        self.tok = tokenizer
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []

    def prompt_ids(self) -> list[int]:
        return chat_ids(self.tok, self.messages)

    def ask(self, text: str, max_new_tokens: int = 32,
            on_text: Callable[[str], None] | None = None) -> tuple[str, GenerateResult]:
        """One turn. ``on_text(piece)`` receives the reply as it is generated, piece by piece (the pieces joined
        are the reply; a piece is held back while it ends in an incomplete UTF-8 sequence)."""
        self.messages.append({"role": "user", "content": text})
        ids = self.prompt_ids()
        eos = self.tok.eos_token_id
        kept: list[int] = []
        shown = [""]

        def stream(token: int) -> None:
            if token == eos:
                return
            kept.append(token)
            sofar = self.tok.decode(kept, skip_special_tokens=True)
            if sofar.endswith("\ufffd") or not sofar.startswith(shown[0]):
                return
            piece, shown[0] = sofar[len(shown[0]):], sofar
            if piece:
                on_text(piece)

        res = self.gen.generate(ids, max_new_tokens=max_new_tokens, eos_token_id=eos,
                                on_token=stream if on_text is not None else None)
        reply = self.tok.decode([t for t in res.tokens if t != eos], skip_special_tokens=True)
        if on_text is not None and reply.startswith(shown[0]) and len(reply) > len(shown[0]):
            on_text(reply[len(shown[0]):])  # what was held back at the end
        self.messages.append({"role": "assistant", "content": reply})
        return reply, res
