"""vLLM v1 KV connector: vLLM's paged KV blocks stored in, and loaded from, a kvstrata server.

Start vLLM with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvstrataConnector",
        "kv_connector_module_path": "kvstrata.integrations.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"url": "redis://127.0.0.1:6379", "chunk_size": 256}}'

Keys are the SDK's chunk keys (``kvstrata.client.keys``: chained SHA-256 over the token ids, the namespace in every
key), so a chunk is found by any engine that uses the same namespace and layout. A chunk's value is, per layer, its
tokens' K and V gathered from their blocks:

- MHA/GQA: ``[layers, 2, kv_heads, chunk_tokens, head_dim]``, layout ``LKHTD`` (the SDK's and the transformers
  integration's layout);
- MLA: ``[layers, 1, chunk_tokens, kv_lora_rank + rope_dim]``, layout ``LHTD`` (one latent row per token, what
  vLLM's MLA cache holds).

Scheduler side: ``get_num_new_matched_tokens`` looks the request's whole chunks up in one batched round trip (and
asks the server to prefetch them into DRAM), ``update_state_after_alloc`` records which blocks to load into,
``build_connector_meta`` turns the step into load and save plans. Worker side: ``start_load_kv`` fetches the
planned chunks on a background thread; ``wait_for_layer_load`` writes a layer's blocks once the chunks are in;
``save_kv_layer`` copies a layer's blocks of the chunks completed in this step into host staging;
``wait_for_save`` hands the staged chunks to a background store and returns, so saves never hold vLLM's blocks
(``request_finished`` frees them at once). Chunks that could not be loaded (evicted between lookup and load) are
reported through ``get_block_ids_with_load_errors``, and vLLM recomputes them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvstrata.client.keys import Namespace
from kvstrata.client.sdk import KVCacheClient

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    VLLM_AVAILABLE = True
except ImportError:  # pragma: no cover - only without vLLM
    KVConnectorBase_V1 = object  # type: ignore[assignment,misc]
    KVConnectorMetadata = object  # type: ignore[assignment,misc]
    KVConnectorRole = None  # type: ignore[assignment]
    VLLM_AVAILABLE = False

logger = logging.getLogger(__name__)

DEFAULT_URL = "redis://127.0.0.1:6379"
DEFAULT_CHUNK_SIZE = 256


@dataclass
class LoadSpec:
    """Load chunks ``keys`` (chunk 0 starts at token 0) into ``block_ids``, for tokens ``[start, end)``. ``tokens``
    lets a worker of another tensor-parallel rank compute its own keys (an MHA rank stores its own heads)."""

    req_id: str
    keys: list[bytes]
    block_ids: list[int]
    start: int
    end: int
    tokens: list[int] = field(default_factory=list)


@dataclass
class SaveSpec:
    """Store chunks ``first .. first+len(keys)`` of a request from its ``block_ids`` (all of the request's)."""

    req_id: str
    keys: list[bytes]
    first: int
    block_ids: list[int]
    tokens: list[int] = field(default_factory=list)


@dataclass
class KvstrataConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)


@dataclass
class _Request:
    """What the scheduler side keeps of a running request."""

    tokens: list[int]
    block_ids: list[int]
    saved_chunks: int  # chunks known to be stored (hit at lookup, or planned for saving)
    load: LoadSpec | None = None


def _block_ids(blocks: Any) -> list[int]:
    ids = blocks.get_block_ids() if hasattr(blocks, "get_block_ids") else blocks
    return list(ids[0]) if ids and isinstance(ids[0], list | tuple) else list(ids)


class PagedLayout:
    """How one layer's paged KV tensor is indexed, detected from its shape.

    MHA: ``[2, num_blocks, block_size, heads, dim]`` (FlashAttention, NHD), ``[num_blocks, 2, block_size, heads,
    dim]`` (FlashInfer), and the HND variants with ``heads`` before ``block_size``. MLA: ``[num_blocks, block_size,
    dim]``."""

    def __init__(self, shape: Sequence[int], num_blocks: int, block_size: int, mla: bool) -> None:
        self.mla = mla
        if mla:
            if len(shape) != 3 or shape[1] != block_size:
                raise ValueError(f"an MLA KV cache is [num_blocks, block_size, dim], got {tuple(shape)}")
            self.kv_first, self.hnd = False, False
            return
        if len(shape) != 5:
            raise ValueError(f"an MHA KV cache has 5 dimensions, got {tuple(shape)}")
        if shape[0] == 2 and shape[1] == num_blocks:
            self.kv_first = True
        elif shape[1] == 2 and shape[0] == num_blocks:
            self.kv_first = False
        else:
            raise ValueError(f"cannot find the K/V axis of a KV cache of shape {tuple(shape)}")
        self.hnd = shape[2] != block_size and shape[3] == block_size

    def gather(self, kv: torch.Tensor, blocks: list[int]) -> torch.Tensor:
        """The tokens of ``blocks`` as ``[2, heads, tokens, dim]`` (MHA) or ``[1, tokens, dim]`` (MLA)."""
        idx = torch.tensor(blocks, dtype=torch.long, device=kv.device)
        if self.mla:
            return kv.index_select(0, idx).reshape(1, -1, kv.shape[-1])
        x = kv.index_select(1 if self.kv_first else 0, idx)
        if not self.kv_first:
            x = x.transpose(0, 1)  # [2, n, ...]
        if self.hnd:  # [2, n, H, B, D] -> [2, H, n*B, D]
            return x.permute(0, 2, 1, 3, 4).reshape(2, x.shape[2], -1, x.shape[-1])
        # [2, n, B, H, D] -> [2, H, n*B, D]
        return x.permute(0, 3, 1, 2, 4).reshape(2, x.shape[3], -1, x.shape[-1])

    def scatter(self, kv: torch.Tensor, blocks: list[int], data: torch.Tensor, block_size: int) -> None:
        """Write ``data`` (as ``gather`` returns it, for these blocks' tokens) into ``blocks``."""
        idx = torch.tensor(blocks, dtype=torch.long, device=kv.device)
        n = len(blocks)
        data = data.to(kv.device, kv.dtype)
        if self.mla:
            kv.index_copy_(0, idx, data.reshape(n, block_size, kv.shape[-1]))
            return
        heads, dim = data.shape[1], data.shape[-1]
        x = data.reshape(2, heads, n, block_size, dim)
        x = x.permute(0, 2, 1, 3, 4) if self.hnd else x.permute(0, 2, 3, 1, 4)  # [2, n, ...]
        if self.kv_first:
            kv.index_copy_(1, idx, x.contiguous())
        else:
            kv.index_copy_(0, idx, x.transpose(0, 1).contiguous())


class KvstrataConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """vLLM's ``KVConnectorBase_V1`` on kvstrata. Extra config (``kv_connector_extra_config``):

    ``url``         kvstrata server (default ``redis://127.0.0.1:6379`` or ``$KVSTRATA_URL``)
    ``chunk_size``  tokens per chunk, a multiple of vLLM's block size (default 256)
    ``model``       model id in the namespace (default: vLLM's served model name)
    ``salt``, ``adapter``  namespace fields (tenant isolation, LoRA id)
    ``ttl``         seconds a chunk lives (default: the SDK's default TTL class)
    ``use_mla``     override vLLM's model config (needed only without one, e.g. in tests)
    ``kv_dtype``    override the dtype in the namespace (default: the KV cache tensors' dtype)
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(getattr(self._kv_transfer_config, "kv_connector_extra_config", None) or {})

        self.block_size = int(vllm_config.cache_config.block_size)
        self.chunk_size = int(extra.get("chunk_size", DEFAULT_CHUNK_SIZE))
        if self.chunk_size % self.block_size:
            raise ValueError(f"chunk_size {self.chunk_size} must be a multiple of the block size {self.block_size}")
        self.blocks_per_chunk = self.chunk_size // self.block_size
        model_config = getattr(vllm_config, "model_config", None)
        self.use_mla = bool(extra.get("use_mla", getattr(model_config, "use_mla", False)))
        model = extra.get("model") or getattr(model_config, "served_model_name", None) or getattr(
            model_config, "model", None) or "vllm-model"
        if isinstance(model, list | tuple):
            model = model[0]
        parallel = getattr(vllm_config, "parallel_config", None)
        self.tp_size = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
        self.tp_rank = int(extra.get("tp_rank", getattr(parallel, "rank", 0) or 0)) % self.tp_size
        self._ns_fields = dict(model=str(model), layout="LHTD" if self.use_mla else "LKHTD",
                               tp_rank=0 if self.use_mla else self.tp_rank,
                               tp_size=1 if self.use_mla else self.tp_size,
                               adapter=str(extra.get("adapter", "")), salt=str(extra.get("salt", "")))
        self.kv_dtype = extra.get("kv_dtype")
        cache_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto") or "auto")
        if self.kv_dtype is None and cache_dtype != "auto":
            self.kv_dtype = cache_dtype
        if self.kv_dtype is None and model_config is not None:
            self.kv_dtype = str(getattr(model_config, "dtype", "")).removeprefix("torch.") or None
        self.url = str(extra.get("url") or os.environ.get("KVSTRATA_URL") or DEFAULT_URL)
        self.ttl = extra.get("ttl")
        self.client: KVCacheClient | None = None
        if self.kv_dtype is not None:
            self._make_client(self.kv_dtype)
        # scheduler side
        self._requests: dict[str, _Request] = {}
        self._unsent_loads: list[LoadSpec] = []
        # worker side
        self.kv_caches: dict[str, torch.Tensor] = {}
        self._dtype = torch.float32
        self._own_keys = False  # a worker of another TP rank than the scheduler's namespace
        self.layouts: dict[str, PagedLayout] = {}
        self._fetch: Future | None = None
        self._loaded_layers: set[str] = set()
        self._load_errors: set[int] = set()
        self._staged: dict[str, list[torch.Tensor]] = {}
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="kvstrata-vllm")
        self._saves: list[Future] = []
        self._lock = threading.Lock()
        self.store_errors = 0

    # -- shared -----------------------------------------------------------------------------------------------
    def _make_client(self, kv_dtype: str) -> None:
        ns = Namespace(kv_dtype=kv_dtype, **self._ns_fields)
        self.client = KVCacheClient(self.url, ns, chunk_size=self.chunk_size)

    def _keys(self, tokens: Sequence[int]) -> list[bytes]:
        assert self.client is not None, "kv_dtype is not known yet (register_kv_caches or extra config kv_dtype)"
        return self.client.keys(tokens)

    # -- scheduler side ---------------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        tokens = list(request.prompt_token_ids or [])
        usable = (len(tokens) - 1) // self.chunk_size * self.chunk_size  # the last token is always computed
        hit = 0
        if usable > num_computed_tokens:
            try:
                hit = self.client.lookup(tokens[:usable])
                if hit > num_computed_tokens:
                    self.client.prefetch(tokens[:hit])  # promote them to DRAM before the worker reads them
            except Exception as exc:  # the cache is an optimisation: unreachable means recompute
                logger.warning("kvstrata: lookup failed, computing the prompt: %s", exc)
                hit = 0
        state = self._requests.get(request.request_id)
        if state is None:
            state = self._requests[request.request_id] = _Request(tokens, [], 0)
        state.saved_chunks = max(state.saved_chunks, hit // self.chunk_size)
        return max(0, hit - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        state = self._requests.setdefault(request.request_id,
                                          _Request(list(request.prompt_token_ids or []), [], 0))
        ids = _block_ids(blocks)
        if ids:
            state.block_ids = ids
        if num_external_tokens <= 0:
            return
        end = request.num_computed_tokens + num_external_tokens
        start = end - num_external_tokens
        n_chunks = end // self.chunk_size
        tokens = state.tokens[:n_chunks * self.chunk_size]
        spec = LoadSpec(request.request_id, self._keys(tokens), list(state.block_ids[:end // self.block_size]),
                        start, end, tokens)
        state.load = spec
        self._unsent_loads.append(spec)

    def build_connector_meta(self, scheduler_output: Any) -> KvstrataConnectorMetadata:
        meta = KvstrataConnectorMetadata(loads=self._unsent_loads, saves=[])
        self._unsent_loads = []
        steps: list[tuple[str, int]] = []
        for new in scheduler_output.scheduled_new_reqs:
            state = self._requests.setdefault(new.req_id, _Request(list(new.prompt_token_ids or []), [], 0))
            state.block_ids = _block_ids(new.block_ids)
            steps.append((new.req_id, new.num_computed_tokens))
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for i, req_id in enumerate(cached.req_ids):
            state = self._requests.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                ids = _block_ids(new_ids)
                state.block_ids = ids if req_id in resumed else state.block_ids + ids
            steps.append((req_id, cached.num_computed_tokens[i]))
        for req_id, computed in steps:
            state = self._requests[req_id]
            done = computed + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            # Whole prompt chunks whose KV exists after this step and is not stored yet.
            last = min(done, len(state.tokens)) // self.chunk_size
            if last > state.saved_chunks and len(state.block_ids) * self.block_size >= last * self.chunk_size:
                tokens = state.tokens[:last * self.chunk_size]
                meta.saves.append(SaveSpec(req_id, self._keys(tokens)[state.saved_chunks:], state.saved_chunks,
                                           list(state.block_ids[:last * self.blocks_per_chunk]), tokens))
                state.saved_chunks = last
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict | None]:
        """Saves copy the blocks out during the step, so vLLM may free them at once."""
        self._requests.pop(request.request_id, None)
        return False, None

    # -- worker side ------------------------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.kv_caches = dict(kv_caches)
        first = next(iter(self.kv_caches.values()))
        num_blocks = int(getattr(self._kv_cache_config, "num_blocks", 0) or
                         (first.shape[0] if self.use_mla or first.shape[0] != 2 else first.shape[1]))
        self.layouts = {name: PagedLayout(t.shape, num_blocks, self.block_size, self.use_mla)
                        for name, t in self.kv_caches.items()}
        self._dtype = first.dtype
        rank = _tp_rank()
        if rank is not None and not self.use_mla and rank != self._ns_fields["tp_rank"]:
            self._ns_fields["tp_rank"] = rank  # this worker's heads: its own keys (from the specs' tokens)
            self._own_keys = True
            self._make_client(self.kv_dtype or str(first.dtype).removeprefix("torch."))
        if self.client is None:
            self._make_client(str(first.dtype).removeprefix("torch."))

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        self._loaded_layers = set()
        self._load_errors = set()
        self._fetch = None
        if isinstance(meta, KvstrataConnectorMetadata) and meta.loads:
            self._fetch = self._pool.submit(self._fetch_chunks, list(meta.loads))

    def _fetch_chunks(self, loads: list[LoadSpec]) -> list[tuple[LoadSpec, list[torch.Tensor]]]:
        out = []
        for spec in loads:
            try:
                keys = self._keys(spec.tokens) if self._own_keys else spec.keys
                _, arrays = self.client.retrieve_chunks((), keys=keys)
            except Exception as exc:
                logger.warning("kvstrata: load of %s failed: %s", spec.req_id, exc)
                arrays = []
            chunks = [_as_tensor(a, self._dtype) for a in arrays]
            if len(chunks) < len(spec.keys):  # evicted since the lookup: vLLM recomputes these blocks
                lost_from = max(spec.start, len(chunks) * self.chunk_size) // self.block_size
                with self._lock:
                    self._load_errors.update(spec.block_ids[lost_from:spec.end // self.block_size])
            out.append((spec, chunks))
        return out

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._fetch is None or layer_name in self._loaded_layers:
            return
        fetched = self._fetch.result()
        layer = list(self.kv_caches).index(layer_name)
        kv, layout = self.kv_caches[layer_name], self.layouts[layer_name]
        for spec, chunks in fetched:
            if not chunks:
                continue
            first_block = spec.start // self.block_size
            last_block = min(spec.end, len(chunks) * self.chunk_size) // self.block_size
            if last_block <= first_block:
                continue
            data = torch.cat([c[layer] for c in chunks], dim=-2)  # tokens of every chunk, this layer
            tok0, tok1 = first_block * self.block_size, last_block * self.block_size
            layout.scatter(kv, spec.block_ids[first_block:last_block], data[..., tok0:tok1, :], self.block_size)
        self._loaded_layers.add(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvstrataConnectorMetadata) or not meta.saves:
            return
        layout = self.layouts[layer_name]
        for spec in meta.saves:
            blocks = spec.block_ids[spec.first * self.blocks_per_chunk:]
            # A host copy now: the store runs after the step, when vLLM may reuse the blocks.
            self._staged.setdefault(spec.req_id, []).append(layout.gather(kv_layer, blocks).cpu())

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        if self._fetch is not None:  # layers the model never asked for are loaded before the step ends
            for name in self.kv_caches:
                self.wait_for_layer_load(name)
        if not isinstance(meta, KvstrataConnectorMetadata) or not meta.saves:
            self._staged.clear()
            return
        for spec in meta.saves:
            layers = self._staged.pop(spec.req_id, [])
            if len(layers) != len(self.kv_caches):
                logger.warning("kvstrata: %s: %d of %d layers saved this step, not stored", spec.req_id,
                               len(layers), len(self.kv_caches))
                continue
            self._saves.append(self._pool.submit(self._store, spec, torch.stack(layers)))
        self._staged.clear()

    def _store(self, spec: SaveSpec, kv: torch.Tensor) -> int:
        """Store ``kv`` ([layers, ..., tokens, dim], tokens from chunk ``spec.first`` on) as chunks."""
        off = spec.first * self.chunk_size
        # The SDK indexes keys by chunk number; only those from spec.first on are written.
        keys = self._keys(spec.tokens) if self._own_keys else [b""] * spec.first + spec.keys
        try:
            return self.client.store((), lambda s, e: kv[..., s - off:e - off, :].contiguous(), keys=keys,
                                     start=off, ttl=self.ttl)
        except Exception as exc:
            with self._lock:
                self.store_errors += 1
            self.client._count(store_errors=1)
            self.client.stats.errors.append(f"store: {type(exc).__name__}: {exc}")
            logger.warning("kvstrata: storing %s failed (a later request recomputes it): %s", spec.req_id, exc)
            return 0

    def flush(self) -> None:
        """Wait for every background store submitted so far."""
        saves, self._saves = self._saves, []
        for f in saves:
            f.result()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        self._saves = [f for f in self._saves if not f.done()]
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        with self._lock:
            errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        self.flush()
        self._pool.shutdown(wait=True)
        if self.client is not None:
            self.client.close()


def _tp_rank() -> int | None:
    """This worker's tensor-parallel rank, when vLLM's parallel state is initialised (None in tests)."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # not initialised: a single process, or a test
        return None


def _as_tensor(arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A decoded chunk as a tensor of the cache's dtype (bfloat16 arrives as its uint16 bits)."""
    t = torch.from_numpy(np.array(arr))  # a copy: the client may reuse the buffer behind ``arr``
    if t.dtype != dtype and t.element_size() == torch.empty(0, dtype=dtype).element_size():
        t = t.view(dtype)
    return t


__all__ = ["KvstrataConnector", "KvstrataConnectorMetadata", "LoadSpec", "PagedLayout", "SaveSpec",
           "VLLM_AVAILABLE"]
