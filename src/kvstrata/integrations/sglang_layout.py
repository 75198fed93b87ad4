"""Layouts of SGLang host memory pools: what decides a page's bytes, and the tag that keeps layouts apart.

A key of the HiCache backend carries ``layout_tag(pool_layout(pool, ...))``, so writers whose pages differ in
memory layout, page size, heads, head dim, dtype or tensor-parallel size never share objects.
``_page_object_sizes`` reads the byte size of one page's objects from the pool itself.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class _PoolKeys:
    """An extra host pool of a hybrid model: its key prefix (with its layout tag) and object suffix."""

    pool: Any
    prefix: str
    suffix: str
    layout: dict[str, Any]

    def key(self, page_hash: str) -> bytes:
        return f"{self.prefix}{page_hash}{self.suffix}".encode()


_LAYOUT_FIELDS = ("layout", "page_size", "layer_num", "head_num", "head_dim", "kv_cache_dim", "kv_lora_rank",
                  "qk_rope_head_dim")


def pool_layout(pool: Any, kind: str, tp_size: int | None) -> dict[str, Any]:
    """What decides the bytes of a page in ``pool``: its kind (mha, mla or an extra pool's name), the host memory
    layout (``page_first`` and ``layer_first`` order a page's bytes differently), page size, layers, heads, head
    dim, dtype, the tensor-parallel size (a rank's heads depend on it; MLA pages are the same on every rank: None)
    and the byte sizes of one page's objects."""
    out: dict[str, Any] = {"kind": kind, "pool": type(pool).__name__}
    for name in _LAYOUT_FIELDS:
        value = getattr(pool, name, None)
        if isinstance(value, int | str):
            out[name] = value
    out["dtype"] = str(getattr(pool, "dtype", "")).removeprefix("torch.")
    if tp_size is not None:
        out["tp_size"] = tp_size
    sizes = _page_object_sizes(pool, 1)
    if sizes:
        out["page_bytes"] = sum(sizes)
    return out


def layout_tag(layout: dict[str, Any]) -> str:
    """A short stable tag of a layout, part of every key: writers of different layouts never share objects."""
    text = ",".join(f"{k}={layout[k]}" for k in sorted(layout))
    return "L" + hashlib.sha256(text.encode()).hexdigest()[:10]


def _page_object_sizes(pool: Any, nobj: int) -> list[int] | None:
    """Byte sizes of the ``nobj`` objects of one page (from the pool's ``get_page_buffer_meta`` for page 0),
    or None when the pool cannot tell."""
    page = int(getattr(pool, "page_size", 0) or 0)
    meta = getattr(pool, "get_page_buffer_meta", None)
    if page <= 0 or meta is None:
        return None
    try:
        _, sizes = meta(torch.arange(page, dtype=torch.int64))
    except Exception:  # a pool that cannot describe page 0 on its own: lengths are then not checked
        return None
    if sizes and isinstance(sizes[0], list | tuple):
        sizes = [s for group in sizes for s in group]
    if not sizes or len(sizes) % nobj:
        return None
    return [sum(sizes[j::nobj]) for j in range(nobj)]


