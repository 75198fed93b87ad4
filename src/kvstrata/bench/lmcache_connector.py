"""An LMCache 0.5.6 GPU connector that really copies, shared by the two scripts that drive LMCache in its own
virtual environment (`kvstrata bench restore`'s ``lmcache_worker.py`` and the LMCache-backend test's
``tests/lmcache/remote_worker.py``).

LMCache's ``MockGPUConnector`` copies nothing, so a benchmark or test built on it would time or check nothing.
This one copies between each memory object (one chunk) and CPU tensors in LMCache's ``KV_2LTD`` layout (K/V,
layers, tokens, kv heads x head dim): the same bytes kvstrata moves, into an existing buffer.

It imports only LMCache and torch, never kvstrata (kvstrata is not installed in LMCache's environment): the
scripts load it by path.
"""

from __future__ import annotations

from typing import Any

import torch
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface


class CopyConnector(GPUConnectorInterface):
    """Stores from ``src`` and restores into ``dst``; ``shape`` is the KV_2LTD shape of a whole prefix (its token
    dimension is replaced per call). ``src``/``dst`` may be set after construction, per store or retrieve."""

    def __init__(self, shape: tuple[int, ...], src: torch.Tensor | None = None,
                 dst: torch.Tensor | None = None) -> None:
        self.shape = tuple(shape)
        self.src = src
        self.dst = dst
        self.kvcaches = None

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        assert self.src is not None, "no source tensor set for a store"
        memory_obj.tensor[:, :, : end - start].copy_(self.src[:, :, start:end])

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        assert self.dst is not None, "no destination tensor set for a retrieve"
        self.dst[:, :, start:end].copy_(memory_obj.tensor[:, :, : end - start])

    def batched_from_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kwargs: Any) -> None:
        for m, s, e in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(m, s, e)

    def batched_to_gpu(self, memory_objs: Any = None, starts: Any = None, ends: Any = None, **kwargs: Any) -> None:
        for m, s, e in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(m, s, e)

    def get_shape(self, num_tokens: int) -> torch.Size:
        shape = list(self.shape)
        shape[2] = num_tokens
        return torch.Size(shape)
