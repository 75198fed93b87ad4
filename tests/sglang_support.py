"""Helpers for the SGLang HiCache backend tests: the real SGLang classes, and small CPU host pools.

* ``import_sglang()`` imports SGLang's real ``hicache_storage`` module (``pip install --no-deps sglang==0.5.23``
  plus the few modules it imports; see docs/sglang.md), next to the transformers 5 that the ``[llm]`` extra
  installs (SGLang 0.5.23 patches transformers 5 internals on import; with transformers 4.57 that failed, which
  is why ``[llm]`` now allows 5.x). Nothing is stubbed.
* ``MHAHostPool`` and ``MLAHostPool`` are the page methods of SGLang 0.5.23's ``MHATokenToKVPoolHost`` and
  ``MLATokenToKVPoolHost`` (``get_page_buffer_meta``, ``get_data_page``, ``get_dummy_flat_data_page``,
  ``set_from_flat_data_page``) copied with their pointer arithmetic unchanged, over a small CPU tensor. The real
  classes cannot be built without a device pool (and their modules import transformers 5 model configs).
"""

from __future__ import annotations

import os
import sys

import torch

SGLANG_VERSION = "0.5.23"


def import_sglang():
    """SGLang's real ``sglang.srt.mem_cache.hicache_storage`` module, or None when SGLang is not installed.

    The environment is restored afterwards (importing ``sglang`` points triton/inductor cache variables at
    SGLang's cache directory)."""
    if "sglang.srt.mem_cache.hicache_storage" in sys.modules:
        return sys.modules["sglang.srt.mem_cache.hicache_storage"]
    environ = dict(os.environ)
    try:
        import sglang.srt.mem_cache.hicache_storage as mod
        import sglang.srt.mem_cache.storage.backend_factory  # noqa: F401
    except ImportError:
        return None
    except AttributeError as exc:  # SGLang's transformers patches fail on transformers 4.x
        import pytest

        pytest.skip(f"SGLang 0.5.23 needs transformers 5 (scripts/test.sh installs it): {exc}",
                    allow_module_level=True)
    finally:
        os.environ.clear()
        os.environ.update(environ)
    return mod


def storage_config(mod, **overrides):
    """A real ``HiCacheStorageConfig`` for one TP rank of a small model."""
    values = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                  is_mla_model=False, enable_storage_metrics=True, is_page_first_layout=True,
                  model_name="Qwen/Qwen3-0.6B", extra_config={})
    values.update(overrides)
    return mod.HiCacheStorageConfig(**values)


class _PageChecks:
    """What the tests read back from a host pool: a page's bytes; and a way to wipe the pool."""

    kv_buffer: torch.Tensor

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        raise NotImplementedError

    def page_bytes(self, index: int) -> bytes:
        return self.get_data_page(index).contiguous().view(torch.uint8).numpy().tobytes()

    def zero(self) -> None:
        self.kv_buffer.zero_()


class MHAHostPool(_PageChecks):
    """``MHATokenToKVPoolHost`` page methods (sglang 0.5.23) over ``kv_buffer`` with dims per ``layout``."""

    def __init__(self, layout="page_first", size=64, page_size=4, layer_num=3, head_num=2, head_dim=8,
                 dtype=torch.bfloat16, seed=0):
        self.layout, self.size, self.page_size = layout, size, page_size
        self.layer_num, self.head_num, self.head_dim, self.dtype = layer_num, head_num, head_dim, dtype
        self.device, self.pin_memory = "cpu", False
        self.page_num = size // page_size
        if layout == "layer_first":
            dims = (2, layer_num, size, head_num, head_dim)
        elif layout == "page_first":
            dims = (2, size, layer_num, head_num, head_dim)
        elif layout == "page_first_direct":
            dims = (2, self.page_num, layer_num, page_size, head_num, head_dim)
        else:
            raise ValueError(layout)
        gen = torch.Generator().manual_seed(seed)
        self.kv_buffer = torch.randn(dims, generator=gen, dtype=torch.float32).to(dtype)

    def get_ksize_per_token(self):
        return self.head_dim * self.head_num * self.layer_num * self.dtype.itemsize

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        if self.layout == "layer_first":
            data_page = self.kv_buffer[:, :, index : index + self.page_size, :, :]
        elif self.layout == "page_first":
            data_page = self.kv_buffer[:, index : index + self.page_size, :, :, :]
        else:
            real_index = index // self.page_size
            data_page = self.kv_buffer[:, real_index : real_index + 1, :, :, :, :]
        if flat:
            data_page = data_page.flatten()
        return data_page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros((2, self.layer_num, self.page_size, self.head_num, self.head_dim),
                           dtype=self.dtype, device=self.device).flatten()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        if self.layout == "layer_first":
            self.kv_buffer[:, :, index : index + self.page_size, :, :] = data_page.reshape(
                2, self.layer_num, self.page_size, self.head_num, self.head_dim)
        elif self.layout == "page_first":
            self.kv_buffer[:, index : index + self.page_size, :, :, :] = data_page.reshape(
                2, self.page_size, self.layer_num, self.head_num, self.head_dim)
        else:
            real_index = index // self.page_size
            self.kv_buffer[:, real_index : real_index + 1, :, :, :, :] = data_page.reshape(
                2, 1, self.layer_num, self.page_size, self.head_num, self.head_dim)

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        ptr_list = []
        kv_buffer_data_ptr = self.kv_buffer.data_ptr()
        indices = indices.tolist()
        v_offset = self.layer_num * self.size * self.head_num * self.head_dim * self.dtype.itemsize
        if self.layout == "layer_first":
            for index in range(0, len(indices), self.page_size):
                for layer_id in range(self.layer_num):
                    k_ptr = (kv_buffer_data_ptr
                             + indices[index] * self.head_num * self.head_dim * self.dtype.itemsize
                             + layer_id * self.size * self.head_num * self.head_dim * self.dtype.itemsize)
                    v_ptr = k_ptr + v_offset
                    ptr_list.append(k_ptr)
                    ptr_list.append(v_ptr)
            element_size = self.dtype.itemsize * self.page_size * self.head_num * self.head_dim
            element_size_list = [element_size] * len(ptr_list)
        else:
            for index in range(0, len(indices), self.page_size):
                k_ptr = (kv_buffer_data_ptr
                         + indices[index] * self.layer_num * self.head_num * self.head_dim * self.dtype.itemsize)
                v_ptr = k_ptr + v_offset
                ptr_list.append(k_ptr)
                ptr_list.append(v_ptr)
            element_size = self.layer_num * self.dtype.itemsize * self.page_size * self.head_num * self.head_dim
            element_size_list = [element_size] * len(ptr_list)
        return ptr_list, element_size_list


class MLAHostPool(_PageChecks):
    """``MLATokenToKVPoolHost`` page methods (sglang 0.5.23, no DCP) over ``kv_buffer``."""

    def __init__(self, layout="page_first", size=64, page_size=4, layer_num=3, kv_cache_dim=24,
                 dtype=torch.bfloat16, seed=0):
        self.layout, self.size, self.page_size = layout, size, page_size
        self.layer_num, self.kv_cache_dim, self.dtype = layer_num, kv_cache_dim, dtype
        self.device, self.pin_memory = "cpu", False
        self.logical_page_size = page_size
        if layout == "layer_first":
            dims = (layer_num, size, 1, kv_cache_dim)
        elif layout == "page_first":
            dims = (size, layer_num, 1, kv_cache_dim)
        else:
            raise ValueError(layout)
        gen = torch.Generator().manual_seed(seed)
        self.kv_buffer = torch.randn(dims, generator=gen, dtype=torch.float32).to(dtype)

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        if self.layout == "layer_first":
            data_page = self.kv_buffer[:, index : index + self.page_size, :, :]
        else:
            data_page = self.kv_buffer[index : index + self.page_size, :, :, :]
        if flat:
            data_page = data_page.flatten()
        return data_page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros((self.layer_num, self.page_size, 1, self.kv_cache_dim), dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        if self.layout == "layer_first":
            self.kv_buffer[:, index : index + self.page_size, :, :] = data_page.reshape(
                self.layer_num, self.page_size, 1, self.kv_cache_dim)
        else:
            self.kv_buffer[index : index + self.page_size, :, :, :] = data_page.reshape(
                self.page_size, self.layer_num, 1, self.kv_cache_dim)

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.logical_page_size == 0
        ptr_list = []
        kv_buffer_data_ptr = self.kv_buffer.data_ptr()
        indices = indices.tolist()
        page_starts = list(indices[:: self.logical_page_size])
        if self.layout == "layer_first":
            for index in page_starts:
                for layer_id in range(self.layer_num):
                    k_ptr = (kv_buffer_data_ptr
                             + index * self.kv_cache_dim * self.dtype.itemsize
                             + layer_id * self.size * self.kv_cache_dim * self.dtype.itemsize)
                    ptr_list.append(k_ptr)
            element_size = self.dtype.itemsize * self.page_size * self.kv_cache_dim
            element_size_list = [element_size] * len(ptr_list)
        else:
            for index in page_starts:
                k_ptr = kv_buffer_data_ptr + index * self.layer_num * self.kv_cache_dim * self.dtype.itemsize
                ptr_list.append(k_ptr)
            element_size = self.layer_num * self.dtype.itemsize * self.page_size * self.kv_cache_dim
            element_size_list = [element_size] * len(ptr_list)
        return ptr_list, element_size_list


def page_indices(pages, page_size: int) -> torch.Tensor:
    """Host indices (token slots) of whole pages given by page number, as SGLang passes them."""
    return torch.cat([torch.arange(p * page_size, (p + 1) * page_size, dtype=torch.int64) for p in pages])


class StateHostPool(_PageChecks):
    """A hybrid model's extra host pool (Mamba/SWA state or a DSA indexer): ``size`` slots of ``slot_bytes``
    bytes, ``page_size`` slots per page; ``get_page_buffer_meta`` gives one buffer per page, as SGLang's state
    pools do for their storage objects."""

    def __init__(self, size=16, page_size=1, slot_elems=40, dtype=torch.float16, seed=0):
        self.size, self.page_size, self.dtype, self.layout = size, page_size, dtype, "page_first"
        gen = torch.Generator().manual_seed(seed)
        self.kv_buffer = torch.randn((size, slot_elems), generator=gen, dtype=torch.float32).to(dtype)

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        page = self.kv_buffer[index:index + self.page_size]
        return page.flatten() if flat else page

    def get_page_buffer_meta(self, indices):
        indices = indices.tolist()
        row = self.kv_buffer[0].numel() * self.dtype.itemsize
        starts = indices[:: self.page_size]
        return ([self.kv_buffer.data_ptr() + i * row for i in starts], [row * self.page_size] * len(starts))
