"""Chunk keys: chained SHA-256 over token ids (the scheme of SGLang HiCache pages), namespaced.

The exact specification, with test vectors, is ``docs/chunk-keys.md``. In short:

* tokens are split into chunks of ``chunk_size``; full chunks get keys, and the tokens after the last full chunk
  may be stored as a *tail chunk* under a key of the same form (``tail_keys``), chained the same way;
* ``digest_0 = SHA-256(le32(t_0) .. le32(t_{n-1}))`` and
  ``digest_i = SHA-256(digest_{i-1} || le32(tokens of chunk i))`` (each token id as a 4-byte little-endian
  unsigned integer, the previous digest as its 32 raw bytes);
* the key is ``kvs:`` + namespace id (16 hex digits) + ``:`` + the chunk's digest as 64 lower-case hex digits;
* the namespace id is the first 8 bytes of ``SHA-256(canonical namespace string)``, in hex.

Nothing here uses Python's ``hash()``: the same tokens give the same keys in every process and on every machine.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

KEY_PREFIX = b"kvs:"
DEFAULT_CHUNK_SIZE = 256


def _tokens_bytes(tokens: Sequence[int]) -> bytes:
    try:
        import numpy as np

        arr = np.asarray(tokens)
        if arr.dtype.kind in "iu" and arr.ndim == 1:
            if arr.size and (int(arr.min()) < 0 or int(arr.max()) > 0xFFFFFFFF):
                raise ValueError("token ids must fit in an unsigned 32-bit integer")
            return arr.astype("<u4").tobytes()
    except ImportError:  # numpy is optional for keys
        pass
    try:
        return struct.pack(f"<{len(tokens)}I", *tokens)
    except struct.error as exc:
        raise ValueError(f"token ids must fit in an unsigned 32-bit integer: {exc}") from None


def chunk_digests(tokens: Sequence[int], chunk_size: int = DEFAULT_CHUNK_SIZE) -> list[bytes]:
    """The chained digests (32 bytes each) of the full chunks of ``tokens``; a partial last chunk has none."""
    if chunk_size <= 0:
        raise ValueError("chunk_size must be positive")
    n_full = len(tokens) // chunk_size
    data = _tokens_bytes(tokens[: n_full * chunk_size])
    step = 4 * chunk_size
    out: list[bytes] = []
    prev = b""
    for i in range(n_full):
        h = hashlib.sha256(prev)
        h.update(data[i * step:(i + 1) * step])
        prev = h.digest()
        out.append(prev)
    return out


@dataclass(frozen=True)
class Namespace:
    """Everything that makes two KV caches of the same tokens incompatible. It is part of every key.

    ``model``: model id (name or path and revision); ``kv_dtype``: the dtype of the stored KV as the engine
    computes it (``float32``, ``bfloat16``, ...); ``layout``: the axis order of a chunk's value (see
    docs/sdk.md); ``tp_rank``/``tp_size``: tensor-parallel shard; ``adapter``: LoRA/adapter id or empty;
    ``salt``: optional cache salt (tenant isolation: different salts never share chunks).
    """

    model: str
    kv_dtype: str = "float32"
    layout: str = "LKHTD"
    tp_rank: int = 0
    tp_size: int = 1
    adapter: str = ""
    salt: str = ""
    extra: tuple[tuple[str, str], ...] = field(default=())

    def canonical(self) -> str:
        parts = [f"model={self.model}", f"kv_dtype={self.kv_dtype}", f"layout={self.layout}",
                 f"tp={self.tp_rank}/{self.tp_size}", f"adapter={self.adapter}", f"salt={self.salt}"]
        parts += [f"{k}={v}" for k, v in sorted(self.extra)]
        return "\n".join(parts)

    @property
    def id(self) -> str:
        return hashlib.sha256(self.canonical().encode()).hexdigest()[:16]

    @property
    def prefix(self) -> bytes:
        """Every key of this namespace starts with this (``kvs:<id>:``)."""
        return KEY_PREFIX + self.id.encode() + b":"


def tail_digests(parent: bytes, tokens: Sequence[int], longest_only: bool = False) -> list[bytes]:
    """The digests of the tail chunks that may follow the chunk whose digest is ``parent`` (``b""``: at the
    start of the sequence): entry ``r - 1`` is that of the tail made of the first ``r`` of ``tokens``. The rule
    is a full chunk's (``SHA-256(parent || le32(tokens))``), so a tail that later fills up to ``chunk_size``
    tokens has the digest that full chunk gets. ``longest_only``: just the tail of all of ``tokens`` (what a
    store writes; a lookup needs every length)."""
    data = _tokens_bytes(tokens)
    h = hashlib.sha256(parent)
    if longest_only:
        h.update(data)
        return [h.digest()]
    out: list[bytes] = []
    for i in range(0, len(data), 4):
        h.update(data[i:i + 4])
        out.append(h.digest())
    return out


def key_prefix(namespace: Namespace, shard_key: str | None = None) -> bytes:
    """What every key of ``namespace`` (and ``shard_key``) starts with, before the digest's hex."""
    prefix = namespace.prefix
    if shard_key:
        if "{" in shard_key or "}" in shard_key:
            raise ValueError("a shard key may not contain braces")
        prefix += b"{" + shard_key.encode() + b"}:"
    return prefix


def chunk_keys(tokens: Sequence[int], namespace: Namespace, chunk_size: int = DEFAULT_CHUNK_SIZE,
               shard_key: str | None = None) -> list[bytes]:
    """The keys of the full chunks of ``tokens`` in ``namespace``.

    With ``shard_key`` (a user or document id) every key carries it as a Redis Cluster hash tag,
    ``kvs:<ns>:{<shard_key>}:<digest>``, so all chunks of that session land on one shard of a cluster pool.
    The tag changes the keys: chunks stored under one shard key are not found under another (docs/pool.md).
    """
    prefix = key_prefix(namespace, shard_key)
    return [prefix + d.hex().encode() for d in chunk_digests(tokens, chunk_size)]


def tail_keys(tokens: Sequence[int], namespace: Namespace, chunk_size: int = DEFAULT_CHUNK_SIZE,
              shard_key: str | None = None, keys: Sequence[bytes] | None = None,
              longest_only: bool = False) -> list[bytes]:
    """The keys a tail chunk of ``tokens`` may have: the ``m = len(tokens) mod chunk_size`` tokens after the last
    full chunk; entry ``r - 1`` is the key of the tail of the first ``r`` of them (empty when ``m`` is 0).
    ``keys``: ``chunk_keys`` of ``tokens`` when the caller has them (the last one's digest is the parent).
    ``longest_only``: only the key of the tail of all ``m`` tokens."""
    n_full = len(tokens) // chunk_size
    if n_full * chunk_size == len(tokens):
        return []
    if keys is None:
        keys = chunk_keys(tokens, namespace, chunk_size, shard_key)
    if len(keys) != n_full:
        raise ValueError(f"{len(keys)} keys given for {n_full} full chunks")
    parent = bytes.fromhex(keys[-1][-64:].decode()) if n_full else b""
    prefix = key_prefix(namespace, shard_key)
    return [prefix + d.hex().encode() for d in tail_digests(parent, tokens[n_full * chunk_size:], longest_only)]

