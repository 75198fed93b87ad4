"""kvstrata client SDK: chunk keys, the KV codec, the local tier and KVCacheClient (sync and asyncio).

Only light dependencies here (redis-py, numpy, xxhash; zstandard for the zstd codec); torch and transformers
are imported by ``kvstrata.integrations`` only.
"""

from kvstrata.client.codec import ChecksumError, CodecError, FormatVersionError, decode, encode, encode_parts
from kvstrata.client.keys import Namespace, chunk_digests, chunk_keys
from kvstrata.client.local import LocalTier
from kvstrata.client.sdk import AsyncKVCacheClient, KVCacheClient

__all__ = [
    "AsyncKVCacheClient", "ChecksumError", "CodecError", "FormatVersionError", "KVCacheClient", "LocalTier",
    "Namespace", "chunk_digests", "chunk_keys", "decode", "encode", "encode_parts",
]
