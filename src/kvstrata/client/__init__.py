"""kvstrata client SDK: chunk keys, the KV codec, the local tier and KVCacheClient (sync and asyncio).

Only light dependencies here (redis-py, numpy, xxhash; zstandard for the zstd codec); torch and transformers
are imported by ``kvstrata.integrations`` only. The names below are imported on first use, so importing one
submodule (``kvstrata.client.fast`` for ``kvstrata top`` and the SGLang backend) does not load numpy and the SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvstrata.client.codec import (
        ChecksumError,
        CodecError,
        FormatVersionError,
        decode,
        encode,
        encode_parts,
    )
    from kvstrata.client.keys import Namespace, chunk_digests, chunk_keys
    from kvstrata.client.local import LocalTier
    from kvstrata.client.sdk import AsyncKVCacheClient, KVCacheClient

_WHERE = {
    "ChecksumError": "codec", "CodecError": "codec", "FormatVersionError": "codec", "decode": "codec",
    "encode": "codec", "encode_parts": "codec", "Namespace": "keys", "chunk_digests": "keys",
    "chunk_keys": "keys", "LocalTier": "local", "AsyncKVCacheClient": "sdk", "KVCacheClient": "sdk",
}

__all__ = [
    "AsyncKVCacheClient", "ChecksumError", "CodecError", "FormatVersionError", "KVCacheClient", "LocalTier",
    "Namespace", "chunk_digests", "chunk_keys", "decode", "encode", "encode_parts",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'kvstrata.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"kvstrata.client.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
