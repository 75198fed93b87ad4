"""KVCacheClient: store and find KV-cache chunks of token prefixes in a kvstrata server (sync and asyncio).

See docs/sdk.md. The client splits tokens into chunks of ``chunk_size`` tokens, names each full chunk with a
chained SHA-256 key (``kvstrata.client.keys``), encodes each chunk's KV tensor with a self-describing header
(``kvstrata.client.codec``) and talks to the server with redis-py: pipelined ``EXISTS`` for lookups,
``TAIR.KV.SETEX`` for writes (large values sent as separate buffers, never joined), ``TAIR.KV.MGET`` for reads
and ``TAIR.KV.PREFETCH`` to have the server promote chunks from SSD before they are read.

``retrieve_chunks`` reads in windows and, with ``overlap=True`` (the default), has the next window's MGET on the
wire while the current one is decoded: a background thread in the sync client, a task in the asyncio one.

The code lives in modules with one job each; this module is the front that names them all (import from here
or from ``kvstrata.client``):

- ``planning``: ``_Base``, the planning layer both clients share (keys, TTLs, store batches, read windows,
  decoding, the local tier, ``ClientStats``);
- ``sync_client``: ``KVCacheClient`` and ``client_from_env``, made of ``socket_reads`` (FastClient reads,
  overlapped windows, scatter receive), ``arena_reads`` (the local data plane) and ``store_path`` (socket and
  staged writes);
- ``async_client``: ``AsyncKVCacheClient``;
- ``filler``: ``_Filler``, the destination placement of ``retrieve(out=)``.
"""

from __future__ import annotations

from kvstrata.client.arena_reads import _ArenaReads as _ArenaReads
from kvstrata.client.async_client import OFFLOAD_CODED_BYTES as OFFLOAD_CODED_BYTES
from kvstrata.client.async_client import OFFLOAD_RAW_BYTES as OFFLOAD_RAW_BYTES
from kvstrata.client.async_client import AsyncKVCacheClient
from kvstrata.client.codec import as_array
from kvstrata.client.filler import _copied as _copied
from kvstrata.client.filler import _copy_bytes as _copy_bytes
from kvstrata.client.filler import _Filler as _Filler
from kvstrata.client.filler import _joined_shape as _joined_shape
from kvstrata.client.planning import DEFAULT_BATCH_SIZE as DEFAULT_BATCH_SIZE
from kvstrata.client.planning import DEFAULT_PREFETCH_WINDOW as DEFAULT_PREFETCH_WINDOW
from kvstrata.client.planning import DEFAULT_TTL_CLASS as DEFAULT_TTL_CLASS
from kvstrata.client.planning import DEFAULT_TTL_CLASSES as DEFAULT_TTL_CLASSES
from kvstrata.client.planning import KV as KV
from kvstrata.client.planning import ClientStats
from kvstrata.client.planning import KVSource as KVSource
from kvstrata.client.planning import _Base as _Base
from kvstrata.client.socket_reads import _SocketReads as _SocketReads
from kvstrata.client.store_path import _StorePath as _StorePath
from kvstrata.client.sync_client import KVCacheClient, client_from_env
from kvstrata.client.sync_client import _auth as _auth

__all__ = ["AsyncKVCacheClient", "ClientStats", "KVCacheClient", "as_array", "client_from_env"]
