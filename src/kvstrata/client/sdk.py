"""KVCacheClient: store and find KV-cache chunks of token prefixes in a kvstrata server (sync and asyncio).

See docs/sdk.md. The client splits tokens into chunks of ``chunk_size`` tokens, names each full chunk with a
chained SHA-256 key (``kvstrata.client.keys``), encodes each chunk's KV tensor with a self-describing header
(``kvstrata.client.codec``) and talks to the server with redis-py: pipelined ``EXISTS`` for lookups,
``TAIR.KV.SETEX`` for writes (large values sent as separate buffers, never joined), ``TAIR.KV.MGET`` for reads
and ``TAIR.KV.PREFETCH`` to have the server promote chunks from SSD before they are read.

``retrieve_chunks`` reads in windows and, with ``overlap=True`` (the default), has the next window's MGET on the
wire while the current one is decoded: a background thread in the sync client, a task in the asyncio one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvstrata.client.codec import (
    CHECKSUM_OFFSET,
    DTYPES,
    FLAG_FP8,
    FLAG_ZSTD,
    FLAGS_OFFSET,
    CodecError,
    FormatVersionError,
    as_array,
    check_codec,
    decode,
    default_codec,
    prepare_parts,
    seal_parts,
)
from kvstrata.client.fast import nbytes, pack, sendmsg_all
from kvstrata.client.keys import DEFAULT_CHUNK_SIZE, Namespace, chunk_keys
from kvstrata.client.local import LocalTier
from kvstrata.client.rediserrors import reply_error, socket_error
from kvstrata.client.scatter import mget_scatter, slot_fits
from kvstrata.engine.entry import Entry

log = logging.getLogger("kvstrata.client")

DEFAULT_BATCH_SIZE = 64
DEFAULT_PREFETCH_WINDOW = 4
# Seconds; None = no expiry. Session context ages in minutes, user profiles in a day, shared knowledge never.
DEFAULT_TTL_CLASSES: dict[str, float | None] = {"session": 30 * 60.0, "profile": 24 * 3600.0, "shared": None}
DEFAULT_TTL_CLASS = "session"
# The asyncio client decodes a window in a thread (asyncio.to_thread, ~75 us a hop here) only when decoding
# costs clearly more than the hop, since only then does freeing the event loop to receive the next window pay.
# zstd and fp8 both decode at ~0.5 GB/s of their encoded bytes (fp8+zstd ~0.25), so 64 KiB is >= 0.1 ms; the raw
# codec is only an xxh3 checksum and a view (~25-40 GB/s: 8 MiB is ~0.3 ms).
OFFLOAD_CODED_BYTES = 64 * 1024
OFFLOAD_RAW_BYTES = 8 * 1024 * 1024

KV = Any  # a numpy array or a torch tensor
KVSource = KV | Callable[[int, int], KV]


@dataclass
class ClientStats:
    lookups: int = 0
    hit_chunks: int = 0
    miss_chunks: int = 0
    stored_chunks: int = 0
    skipped_chunks: int = 0
    local_hits: int = 0
    corrupt: int = 0
    refused: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    store_errors: int = 0  # stores an integration gave up on (counted by it, e.g. the transformers generator)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["errors"] = list(self.errors[-10:])
        return d


class _Base:
    """Parameters, keys, TTLs, encoding and the local tier shared by the sync and asyncio clients."""

    def __init__(self, namespace: Namespace | str, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 batch_size: int = DEFAULT_BATCH_SIZE, prefetch_window: int = DEFAULT_PREFETCH_WINDOW,
                 compression: str | None = None, fp8_scale: str = "head",
                 ttl_classes: dict[str, float | None] | None = None, default_ttl_class: str = DEFAULT_TTL_CLASS,
                 local_tier: LocalTier | int | None = None, shard_key: str | None = None,
                 overlap: bool = True) -> None:
        if chunk_size <= 0 or batch_size <= 0 or prefetch_window < 0:
            raise ValueError("chunk_size and batch_size must be positive, prefetch_window >= 0")
        self.namespace = namespace if isinstance(namespace, Namespace) else Namespace(model=str(namespace))
        self.chunk_size = chunk_size
        # The Redis Cluster hash tag of every key (a session's user or document id): see chunk_keys.
        self.shard_key = shard_key
        self.batch_size = batch_size
        self.prefetch_window = prefetch_window
        # retrieve_chunks: fetch window i+1 while window i is decoded (False: one batch after the other).
        self.overlap = overlap
        self.compression = check_codec(compression) if compression else default_codec()
        if fp8_scale not in ("tensor", "head"):
            raise ValueError("fp8_scale must be 'tensor' or 'head'")
        self.fp8_scale = fp8_scale
        self.ttl_classes = dict(DEFAULT_TTL_CLASSES)
        self.ttl_classes.update(ttl_classes or {})
        if default_ttl_class not in self.ttl_classes:
            raise ValueError(f"unknown TTL class {default_ttl_class!r}")
        self.default_ttl_class = default_ttl_class
        self.local = LocalTier(local_tier) if isinstance(local_tier, int) else local_tier
        self.stats = ClientStats()
        self._stats_lock = threading.Lock()

    # ---- keys and TTLs ----
    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        """The keys of the full chunks of ``tokens`` (a partial last chunk has none)."""
        return chunk_keys(tokens, self.namespace, self.chunk_size, self.shard_key)

    def ttl_ms(self, ttl_class: str | None = None, ttl: float | None = None) -> int:
        """Milliseconds for TAIR.KV.SETEX (0 = no expiry): ``ttl`` seconds if given (0 = none), else the class's."""
        if ttl is not None:
            return max(0, int(ttl * 1000))
        name = ttl_class or self.default_ttl_class
        if name not in self.ttl_classes:
            raise ValueError(f"unknown TTL class {name!r}; known: {', '.join(self.ttl_classes)}")
        seconds = self.ttl_classes[name]
        return 0 if seconds is None else max(1, int(seconds * 1000))

    def _window(self) -> int:
        """Chunks per MGET when reads overlap decoding.

        One prefetch window: the PREFETCH sent with window i's MGET then covers exactly window i+1, which the
        server has a whole fetch-and-decode of window i to promote. It is also small enough (4 by default) that a
        prefix of a few to tens of chunks splits into several windows, so that only the first fetch and the
        last decode are not hidden. No prefetch (0) still reads in windows of the default size."""
        return max(1, min(self.batch_size, self.prefetch_window or DEFAULT_PREFETCH_WINDOW))

    # ---- read planning (shared by the sync and the asyncio client) ----
    def _plan_window(self, keys: list[bytes], start: int, size: int) -> tuple[list[bytes], list[bytes]]:
        """The keys of the read window at ``start`` (at most ``size``) and the keys to prefetch with it: the
        ``prefetch_window`` keys after it."""
        batch = keys[start:start + size]
        end = start + len(batch)
        return batch, keys[end:end + self.prefetch_window]

    @staticmethod
    def _window_commands(keys: list[bytes], ahead: list[bytes],
                         plain: bool) -> tuple[list[Any] | None, list[Any]]:
        """(PREFETCH of ``ahead`` or None, the MGET of ``keys``): one read window, sent in one write. Replies on
        one connection come back in order, so the server has queued the prefetch before it answers the MGET.
        Plain Redis gets no PREFETCH and a plain MGET."""
        before = [b"TAIR.KV.PREFETCH", *ahead] if ahead and not plain else None
        return before, [b"MGET" if plain else b"TAIR.KV.MGET", *keys]

    # ---- store planning (shared by the sync and the asyncio client) ----
    def _store_todo(self, tokens: Sequence[int], start: int,
                    keys: list[bytes] | None) -> tuple[list[bytes], list[int]]:
        """The keys of ``tokens`` (``keys`` when the caller has them) and the indexes of the chunks a store from
        token ``start`` covers, before the existence check."""
        keys = self.keys(tokens) if keys is None else keys
        return keys, list(range(start // self.chunk_size, len(keys)))

    def _batches(self, items: list[Any]) -> Iterator[list[Any]]:
        """``items`` (chunk indexes or keys) in batches of ``batch_size``: one pipelined EXISTS, or one
        pipelined write, per batch."""
        for b in range(0, len(items), self.batch_size):
            yield items[b:b + self.batch_size]

    @staticmethod
    def _leading(found: Sequence[Any]) -> int:
        """How many of one EXISTS batch's answers, from the first, said yes (a prefix ends at its first miss)."""
        return next((j for j, f in enumerate(found) if not f), len(found))

    @staticmethod
    def _absent_of(batch: list[int], found: Sequence[Any]) -> list[int]:
        """The chunks of ``batch`` whose EXISTS said no."""
        return [i for i, f in zip(batch, found, strict=True) if not f]

    def _count_skipped(self, keys: list[bytes], start: int, todo: list[int]) -> None:
        self._count(skipped_chunks=max(0, len(keys) - start // self.chunk_size - len(todo)))

    def _chunk_parts(self, kv: KVSource, i: int) -> list[Any]:
        """Chunk ``i`` of ``kv`` encoded, its checksum not yet filled in (``seal_parts``, or the staging copy)."""
        cs = self.chunk_size
        return self.encode_chunk(self._chunk_value(kv, i * cs, (i + 1) * cs), sealed=False)

    def _sealed(self, key: bytes, parts: list[Any], ttl_ms: int) -> list[Any]:
        """``parts`` sealed, and kept in the local tier when there is one."""
        parts = seal_parts(parts)
        self._local_put(key, parts, ttl_ms)
        return parts

    @staticmethod
    def _store_command(key: bytes, ttl_ms: int, parts: list[Any], plain: bool) -> list[Any]:
        """The write of one chunk (its value given as unjoined parts): TAIR.KV.SETEX, or SET [PX] on plain
        Redis."""
        if plain:
            return ["SET", key, parts] + (["PX", ttl_ms] if ttl_ms else [])
        return ["TAIR.KV.SETEX", key, ttl_ms, parts]

    @staticmethod
    def _raise_first(replies: Sequence[Any]) -> None:
        """A pipeline's first error reply, raised (after every reply was read: the connection stays in step)."""
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply

    # ---- encoding ----
    def _layout(self) -> str:
        return self.namespace.layout

    def _chunk_value(self, kv: KVSource, start: int, end: int) -> Any:
        if callable(kv):
            return kv(start, end)
        layout = self._layout()
        axis = layout.index("T") if "T" in layout else 0
        arr = kv
        index = [slice(None)] * len(arr.shape)
        index[axis] = slice(start, end)
        return arr[tuple(index)]

    def encode_chunk(self, value: Any, *, sealed: bool = True) -> list[Any]:
        """``[header, payload...]``; ``sealed=False`` leaves the header's checksum to be filled in while the
        parts are copied into place (a two-phase write: one pass over the tensor instead of two)."""
        parts = prepare_parts(value, self.compression, self._layout(), fp8_scale=self.fp8_scale)
        return seal_parts(parts) if sealed else parts

    def _decode(self, key: bytes, value: Any) -> np.ndarray | None:
        try:
            arr, _ = decode(value)
            return arr
        except FormatVersionError as exc:
            self._error("refused", f"{key.decode()}: {exc}")
        except CodecError as exc:
            self._error("corrupt", f"{key.decode()}: {exc}")
        return None

    def _decode_window(self, keys: list[bytes], values: Sequence[Any], out: list[np.ndarray]) -> int:
        """Decode one MGET's values in order into ``out``; returns how many were usable (fewer than ``keys``:
        the prefix ends at the first missing or undecodable value, the rest is never decoded)."""
        for n, (key, value) in enumerate(zip(keys, values, strict=True)):
            arr = None if value is None else self._decode(key, value)
            if arr is None:
                return n
            self._received(key, value)
            self._count(bytes_received=len(value))
            out.append(arr)
        return len(keys)

    def _received(self, key: bytes, value: Any) -> None:
        """A value read from the server was usable (the sync client remembers its size and fills the local tier)."""

    def _error(self, kind: str, message: str) -> None:
        with self._stats_lock:
            setattr(self.stats, kind, getattr(self.stats, kind) + 1)
            self.stats.errors.append(message)
        log.warning("kvstrata: chunk treated as a miss: %s", message)

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for k, v in deltas.items():  # ClientStats also holds a list (errors): not a Counters
                setattr(self.stats, k, getattr(self.stats, k) + v)

    # ---- local tier ----
    def _local_get(self, key: bytes) -> Any | None:
        if self.local is None:
            return None
        entry = self.local.get(key)
        if entry is None:
            return None
        if entry.expired(int(time.time() * 1000)):
            self.local.delete(key)
            return None
        return entry.value

    def _local_put(self, key: bytes, parts: list[Any], ttl_ms: int) -> None:
        if self.local is not None:
            value = b"".join(bytes(p) if isinstance(p, memoryview) else p for p in parts)
            self.local.put(key, Entry(value, 0, int(time.time() * 1000) + ttl_ms if ttl_ms else 0))

    def _local_leading(self, keys: list[bytes]) -> int:
        n = 0
        if self.local is not None:
            while n < len(keys) and self._local_get(keys[n]) is not None:
                n += 1
        return n

    @staticmethod
    def concat(chunks: list[np.ndarray], layout: str) -> np.ndarray | None:
        if not chunks:
            return None
        if len(chunks) == 1:
            return chunks[0]
        return np.concatenate(chunks, axis=layout.index("T") if "T" in layout else 0)


def _copy_bytes(dst: np.ndarray, src: np.ndarray) -> None:
    """np.copyto through byte views: a value's payload in the arena follows its header at an odd offset, and
    numpy copies misaligned arrays of wider types several times slower than bytes."""
    if dst.ndim and dst.strides[-1] == dst.itemsize and src.flags.c_contiguous and src.dtype == dst.dtype:
        np.copyto(dst.view(np.uint8), src.view(np.uint8))
    else:
        np.copyto(dst, src, casting="no")


class _Filler(list):  # type: ignore[type-arg]
    """The chunk list of ``retrieve(out=)``: each appended chunk is copied at once into the next slot of ``out``
    along the token axis (the list keeps those filled slots)."""

    def __init__(self, out: np.ndarray | None, axis: int, tokens: int = 0) -> None:
        """``out=None``: ``out`` is made on the first chunk, ``tokens`` long on the token axis (np.empty: pages
        never written cost nothing)."""
        super().__init__()
        self.dest: np.ndarray = out  # type: ignore[assignment]
        self.axis, self.pos, self.tokens = axis, 0, tokens

    def _make(self, shape: tuple[int, ...], dtype: Any) -> None:
        if self.dest is None:
            full = list(shape)
            full[self.axis] = self.tokens
            self.dest = np.empty(tuple(full), dtype)

    def _slot(self, start: int, end: int) -> np.ndarray:
        index: list[Any] = [slice(None)] * self.dest.ndim
        index[self.axis] = slice(start, end)
        return self.dest[tuple(index)]

    def append(self, chunk: np.ndarray) -> None:
        self._make(chunk.shape, chunk.dtype)
        end = self.pos + chunk.shape[self.axis]
        if end > self.dest.shape[self.axis]:
            raise ValueError(f"chunk of {chunk.shape[self.axis]} tokens does not fit at {self.pos} of "
                             f"{self.dest.shape[self.axis]}")
        slot = self._slot(self.pos, end)
        _copy_bytes(slot, chunk.view(self.dest.dtype) if chunk.dtype != self.dest.dtype else chunk)
        self.pos = end
        super().append(slot)

    def extend(self, chunks: Any) -> None:
        for chunk in chunks:
            self.append(chunk)

    def place(self, hdr: Any) -> np.ndarray | None:
        """The next slot, for a scatter receive of a value with header ``hdr``; None when it does not fit there
        byte for byte (then the value is decoded and ``append``-ed as usual)."""
        shape = hdr.shape
        if len(shape) <= self.axis:
            return None
        self._make(shape, np.dtype(DTYPES[hdr.dtype][1]))
        if len(shape) != self.dest.ndim or any(
                s != d for k, (s, d) in enumerate(zip(shape, self.dest.shape, strict=True)) if k != self.axis):
            return None
        end = self.pos + shape[self.axis]
        if end > self.dest.shape[self.axis]:
            return None
        slot = self._slot(self.pos, end)
        return slot if slot_fits(slot, hdr) else None

    def commit(self, slot: np.ndarray) -> None:
        """``slot`` (from ``place``) has been filled and verified: it is the next chunk."""
        self.pos += slot.shape[self.axis]
        super().append(slot)

    def filled(self) -> np.ndarray | None:
        return self._slot(0, self.pos) if self.pos else None

    def compact(self) -> np.ndarray | None:
        """The filled part as a C-contiguous array of its own size (a copy only when ``out`` is not all filled)."""
        if not self.pos:
            return None
        if self.pos == self.dest.shape[self.axis]:
            return self.dest
        return np.ascontiguousarray(self.filled())


def _copied(a: np.ndarray) -> np.ndarray:
    out = np.empty(a.shape, a.dtype)
    _copy_bytes(out, a)
    return out


def _joined_shape(chunks: list[np.ndarray], axis: int) -> tuple[int, ...]:
    shape = list(chunks[0].shape)
    shape[axis] = sum(c.shape[axis] for c in chunks)
    return tuple(shape)


class KVCacheClient(_Base):
    """Synchronous client. ``url=None`` runs with the local tier only (no server).

    >>> c = KVCacheClient("redis://127.0.0.1:6379", Namespace("my-model", kv_dtype="float32"))
    >>> c.store(tokens, kv)          # kv: [layers, 2, kv_heads, tokens, head_dim] (layout "LKHTD")
    >>> n, kv = c.retrieve(tokens)   # n leading tokens found, their KV concatenated along the token axis
    """

    def __init__(self, url: str | None = "redis://127.0.0.1:6379", namespace: Namespace | str = "default",
                 *, max_connections: int = 8, socket_timeout: float = 30.0, username: str | None = None,
                 password: str | None = None, local_plane: bool = True, verify_local: bool = False,
                 lease_ms: int = 10_000, stage_writes: bool = False, **kw: Any) -> None:
        """``url``: ``redis://host:port`` or ``unix:///path/to/socket``. ``local_plane``: read through the
        server's shared-memory arena when it is local (a ``unix://`` URL, or TCP to a loopback address of a
        server whose ``unixsocket`` this process can open): one copy from the server's memory, no socket
        transfer (docs/dataplane.md). ``verify_local``: check each arena read against the value's checksum
        too (leased bytes cannot change, so this is off by default). ``stage_writes``: store through a staging
        segment of a local server (two-phase writes) instead of the socket."""
        super().__init__(namespace, **kw)
        self.url = url
        self.redis = None
        self._arena_ok = url is not None and local_plane
        # Stores through a staging segment (two-phase writes) when the server is local: same rule as reads.
        self._stage_ok = url is not None and local_plane
        self.stage_writes = stage_writes
        self.verify_local = verify_local
        self.lease_ms = lease_ms
        if url is not None:
            import redis

            # An ACL user (``username``/``password``, or ``redis://user:password@host``) restricted to its
            # tenant's keys (``~kvs:<tenant>:*``) is how tenants share one server.
            self.pool = redis.ConnectionPool.from_url(url, max_connections=max_connections,
                                                      socket_timeout=socket_timeout, **_auth(username, password))
            self.redis = redis.Redis(connection_pool=self.pool)
        self._plain_redis: bool | None = None  # server without TAIR.KV.* (plain Redis): SET PX / MGET
        self._tls = threading.local()  # per thread: a FastClient and its reusable receive buffers
        self._fast_ok = url is not None
        self._size_hint = 0  # largest value seen: the size of the reusable receive buffers
        # Every thread's FastClient (the fetch threads' too), so that close() reaches them all.
        self._fast_clients: list[Any] = []
        self._lock = threading.Lock()
        # The thread that fetches the next window while the caller decodes (started on first use), and the slot
        # for its one fetch in flight. A caller that finds the slot taken (another thread's call is using it)
        # reads its next window itself after decoding, as without overlap, instead of queueing behind that call.
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._fetch_slot = threading.Lock()

    # ---- reads into reusable buffers (kvstrata.client.fast) ----
    def _fast(self) -> Any:
        """This thread's ``FastClient`` (values received straight into reusable buffers), or None when the
        connection is not a plain TCP one without a database number (then redis-py reads them)."""
        if not self._fast_ok:
            return None
        fc = getattr(self._tls, "fast", None)
        if fc is None:
            import redis

            try:
                from kvstrata.client.fast import FastClient
            except ImportError:
                self._fast_ok = False
                return None
            kw = self.pool.connection_kwargs
            cls = self.pool.connection_class
            if cls not in (redis.Connection, redis.UnixDomainSocketConnection) or kw.get("db", 0):
                self._fast_ok = False
                return None
            fc = FastClient(kw.get("host", "localhost"), int(kw.get("port", 6379)),
                            timeout=kw.get("socket_timeout"), password=kw.get("password"),
                            username=kw.get("username"),
                            unix_path=kw.get("path") if cls is redis.UnixDomainSocketConnection else None)
            self._tls.fast = fc
            with self._lock:
                self._fast_clients.append(fc)
        return fc

    def _drop_fast(self, fc: Any) -> None:
        fc.close()
        self._tls.fast = None
        with self._lock:
            if fc in self._fast_clients:
                self._fast_clients.remove(fc)

    # ---- the local data plane (kvstrata.client.arena) ----
    def _arena_path(self) -> str | None:
        """The server's Unix socket: the URL's, or the one a loopback server reports (CONFIG GET unixsocket)."""
        import redis

        kw = self.pool.connection_kwargs
        if kw.get("db", 0):
            return None
        if self.pool.connection_class is redis.UnixDomainSocketConnection:
            return kw.get("path")
        if self.pool.connection_class is not redis.Connection:
            return None  # TLS: a server that wants encryption gets it, even on this host
        if str(kw.get("host", "")) not in ("localhost", "127.0.0.1", "::1"):
            return None
        try:
            path = self.redis.config_get("unixsocket").get("unixsocket")
        except redis.RedisError:
            return None
        if isinstance(path, bytes):
            path = path.decode()
        return path if path and os.path.exists(path) else None

    def _arena(self) -> Any:
        """This thread's ``ArenaClient``, or None when the server's arena cannot be mapped from here."""
        if not self._arena_ok:
            return None
        ac = getattr(self._tls, "arena", None)
        if ac is None:
            from kvstrata.client.arena import ArenaClient, ArenaUnavailable
            from kvstrata.client.fast import RespError

            path = self._arena_path()
            kw = self.pool.connection_kwargs
            try:
                if path is None:
                    raise ArenaUnavailable("no local Unix socket")
                ac = ArenaClient(path, password=kw.get("password"), username=kw.get("username"),
                                 timeout=kw.get("socket_timeout"), lease_ms=self.lease_ms)
            except (ArenaUnavailable, OSError, RespError) as exc:
                log.info("kvstrata: reading over the socket (no shared-memory arena: %s)", exc)
                self._arena_ok = False
                return None
            self._tls.arena = ac
            with self._lock:
                self._fast_clients.append(ac)
        return ac

    def _drop_arena(self, ac: Any, exc: BaseException) -> None:
        log.warning("kvstrata: arena read failed (%s); reading over the socket", exc)
        self._tls.arena = None
        with self._lock:
            if ac in self._fast_clients:
                self._fast_clients.remove(ac)
        try:
            ac.close()
        except OSError:
            pass

    def _read_arena(self, ac: Any, keys: list[bytes], out: list[np.ndarray]) -> tuple[int, int]:
        """Lease ``keys`` and decode the leading ones found into ``out`` as views of the mapping (valid until the
        returned lease is released); returns (how many, lease)."""
        from kvstrata.client.arena import Ref

        # NOSUM: the codec's own checksum is what verify_local checks, so the server's would be a wasted pass.
        lease, refs = ac.mgetref(keys, checksums=False)
        n = 0
        for key, ref in zip(keys, refs, strict=True):
            value = ac.value(ref)
            if value is None:
                break
            try:
                arr, _ = decode(value, check=self.verify_local or not isinstance(ref, Ref))
            except FormatVersionError as exc:
                self._error("refused", f"{key.decode()}: {exc}")
                break
            except CodecError as exc:
                self._error("corrupt", f"{key.decode()}: {exc}")
                break
            self._received(key, value)
            self._count(bytes_received=len(value))
            out.append(arr)
            n += 1
        return n, lease

    def _retrieve_arena(self, keys: list[bytes], first: int, out: list[np.ndarray],
                        copy: bool) -> int | None:
        """The arena path of retrieve_chunks (``copy``: each chunk copied out) and retrieve (the caller
        concatenates, the one copy, before ``_arena_done``). None when the arena is not usable."""
        ac = self._arena()
        if ac is None:
            return None
        from kvstrata.client.fast import RespError

        self._arena_done()  # views handed out by this thread's previous call end now (released with this one)
        mine: list[np.ndarray] = []
        try:
            n, lease = self._read_arena(ac, keys[first:], mine)
        except (OSError, ConnectionError, RespError) as exc:
            self._drop_arena(ac, exc)
            return None
        if copy:
            out.extend(_copied(a) for a in mine)
            ac.release(lease)
        else:
            out.extend(mine)
            self._tls.lease = lease
        return first + n

    def _arena_done(self) -> None:
        lease = getattr(self._tls, "lease", 0)
        ac = getattr(self._tls, "arena", None)
        if lease and ac is not None:
            ac.release(lease)
        self._tls.lease = 0

    def _bufs(self) -> list[bytearray]:
        """This thread's reusable receive buffers: the arrays ``retrieve_chunks(reuse_buffers=True)`` returns are
        views of them, whichever thread's connection received the bytes."""
        bufs = getattr(self._tls, "bufs", None)
        if bufs is None:
            bufs = self._tls.bufs = []
        return bufs

    def _mget_into(self, keys: list[bytes], bufs: list[bytearray], offset: int,
                   before: list[bytes] | None = None) -> list[memoryview | None] | None:
        """MGET on this thread's FastClient into ``bufs[offset ..]`` (a call's other windows keep theirs), after
        ``before`` in the same write; None when that path is unavailable for this batch."""
        if not self._size_hint:
            return None
        fc = self._fast()
        if fc is None:
            return None
        from kvstrata.client.fast import RespError, ValueTooLarge

        while len(bufs) < offset + len(keys):
            bufs.append(bytearray(self._size_hint))
        for j in range(offset, offset + len(keys)):
            if len(bufs[j]) < self._size_hint:
                bufs[j] = bytearray(self._size_hint)
        mine = bufs[offset: offset + len(keys)]
        try:
            lengths = fc.mget_into(keys, mine, before)
        except ValueTooLarge:
            return None  # read again through redis-py, which raises the size hint
        except (OSError, RespError):
            self._drop_fast(fc)
            return None
        return [None if n is None else memoryview(mine[j])[:n] for j, n in enumerate(lengths)]

    def _fetch_executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="kvstrata-fetch")
            return self._executor

    def _fetch_behind(self, fetch: Callable[[int], list[Any]],
                      start: int) -> concurrent.futures.Future[list[Any]] | None:
        """``fetch(start)`` on the fetch thread, or None when it is busy with another call's window."""
        if not self._fetch_slot.acquire(blocking=False):
            return None

        def run() -> list[Any]:
            try:
                return fetch(start)
            finally:
                # Freed before the result is set, so that the caller's next window finds the slot free.
                self._fetch_slot.release()

        try:
            return self._fetch_executor().submit(run)
        except BaseException:
            self._fetch_slot.release()
            raise

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)  # no fetch may still be using a connection closed below
        self._arena_done()  # this thread's leased views end here (their release goes out as the client closes)
        with self._lock:
            fast, self._fast_clients = self._fast_clients, []
        for fc in fast:
            fc.close()  # another thread's FastClient, found closed, is replaced on its next use
        self._tls.fast = None
        self._tls.arena = None
        self._tls.stage = None
        if self.redis is not None:
            self.redis.close()
            self.pool.disconnect()

    def __enter__(self) -> KVCacheClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- raw transport ----
    def _store_conn(self) -> Any:
        """This thread's ``FastClient`` for writes, fresh when the one it had went stale while idle (what a
        pool checks before lending a connection), or None when it cannot speak this URL (TLS, a database
        number). Connection and AUTH failures raise as redis-py's exceptions."""
        from kvstrata.client.fast import RespError

        try:
            fc = self._fast()
            if fc is not None and fc.broken():
                self._drop_fast(fc)
                fc = self._fast()
        except OSError as exc:
            raise socket_error(exc, "connecting") from exc
        except RespError as exc:
            raise reply_error(str(exc)) from exc
        return fc

    def _roundtrip(self, commands: list[list[Any]]) -> list[Any]:
        """Send ``commands`` pipelined on this thread's ``FastClient`` in vectored writes (values unjoined: the
        kernel copies them straight from the caller's tensors) and read every reply. An error reply comes back
        in its place as the exception redis-py would raise for it; a socket failure drops the connection and
        raises redis-py's ConnectionError or TimeoutError."""
        from kvstrata.client.fast import RespError

        fc = self._store_conn()
        if fc is None:
            return self._roundtrip_redis(commands)
        parts: list[Any] = []
        for cmd in commands:
            pack(cmd, parts)
        replies: list[Any] = []
        try:
            sent = sendmsg_all(fc.sock, parts)
            for _ in commands:
                try:
                    replies.append(fc.read_reply())
                except RespError as exc:
                    replies.append(reply_error(str(exc)))
        except OSError as exc:
            self._drop_fast(fc)
            raise socket_error(exc, "while storing") from exc
        except BaseException:
            self._drop_fast(fc)  # interrupted between a command and its reply: out of step, never reused
            raise
        self._count(bytes_sent=sent)
        return replies

    def _roundtrip_redis(self, commands: list[list[Any]]) -> list[Any]:
        """``_roundtrip`` through redis-py's pipeline, for connections ``FastClient`` does not make (TLS, a
        database number): each value is joined into one bytes object first."""
        pipe = self.redis.pipeline(transaction=False)
        size = 0
        for cmd in commands:
            size += pack(cmd, [])
            pipe.execute_command(*[b"".join(a) if isinstance(a, list) else a for a in cmd])
        replies = pipe.execute(raise_on_error=False)
        self._count(bytes_sent=size)
        return list(replies)

    def _is_plain(self) -> bool:
        if self._plain_redis is None:
            import redis

            try:
                self.redis.execute_command("TAIR.KV.VERSION", "kvstrata:probe")
                self._plain_redis = False
            except redis.ResponseError:
                self._plain_redis = True
        return self._plain_redis

    def _server_leading(self, keys: list[bytes]) -> int:
        """How many leading keys exist on the server (pipelined EXISTS, batch by batch, stops at a miss)."""
        n = 0
        for batch in self._batches(keys):
            pipe = self.redis.pipeline(transaction=False)
            for k in batch:
                pipe.exists(k)
            hit = self._leading(pipe.execute())
            n += hit
            if hit < len(batch):
                break
        return n

    # ---- operations ----
    def lookup(self, tokens: Sequence[int]) -> int:
        """Number of leading tokens of ``tokens`` whose chunks are all cached (a multiple of chunk_size)."""
        keys = self.keys(tokens)
        n = self._local_leading(keys)
        if n < len(keys) and self.redis is not None:
            n += self._server_leading(keys[n:])
        self._count(lookups=1, hit_chunks=n, miss_chunks=min(1, len(keys) - n))
        return n * self.chunk_size

    def store(self, tokens: Sequence[int], kv: KVSource, *, ttl_class: str | None = None,
              ttl: float | None = None, start: int = 0, skip_existing: bool = True,
              keys: list[bytes] | None = None) -> int:
        """Store the full chunks of ``tokens`` (from token ``start``, a multiple of chunk_size) that are not cached
        yet. ``kv`` is a tensor with a token axis (the ``T`` of the namespace's layout) covering ``tokens``, or
        a function ``kv(start, end)`` returning one chunk's tensor. ``keys``: ``self.keys(tokens)`` when the
        caller has them already. Returns the number of chunks written."""
        keys, todo = self._store_todo(tokens, start, keys)
        if skip_existing and todo:
            todo = self._absent(keys, todo)
        self._count_skipped(keys, start, todo)
        if not todo:
            return 0
        ttl_ms = self.ttl_ms(ttl_class, ttl)
        plain = self.redis is not None and self._is_plain()
        written = 0
        for batch in self._batches(todo):
            cmds = []
            staged: list[tuple[bytes, int, list[Any]]] = []
            stager = self._stager() if self.redis is not None else None
            for i in batch:
                parts = self._chunk_parts(kv, i)
                size = sum(nbytes(p) for p in parts)
                self._size_hint = max(self._size_hint, size)
                stage = stager is not None and stager.fits(size)
                if stage:
                    staged.append((keys[i], ttl_ms, parts))  # its checksum is computed while it is copied
                if self.local is not None or not stage:
                    parts = self._sealed(keys[i], parts, ttl_ms)
                if self.redis is not None and not stage:
                    cmds.append(self._store_command(keys[i], ttl_ms, parts, plain))
            if staged:
                self._put_staged(stager, staged)
            if cmds:
                self._raise_first(self._roundtrip(cmds))
            written += len(batch)
        self._count(stored_chunks=written)
        return written

    # ---- two-phase writes through a staging segment (kvstrata.client.stage) ----
    # stage_writes is off by default: on the 2-core VM staged writes did not win over the socket (0.73-0.99x in
    # a quieter run) and they move the copy and the hash from the client to the shared server (BENCHMARKS.md,
    # "Restore: two-phase writes").

    def _stager(self) -> Any:
        """This thread's ``StageWriter`` when the server is local and gives this client a staging segment (the
        store path then copies each chunk once into it instead of sending it through the socket), else None."""
        if not (self._stage_ok and self.stage_writes):
            return None
        sw = getattr(self._tls, "stage", None)
        if sw is not None and sw.sock.fileno() < 0:  # closed by close() from another thread: a new one
            sw = None
        if sw is None:
            from kvstrata.client.fast import RespError
            from kvstrata.client.stage import StageUnavailable, StageWriter

            path = self._arena_path()
            kw = self.pool.connection_kwargs
            try:
                if path is None:
                    raise StageUnavailable("no local Unix socket")
                sw = StageWriter(path, password=kw.get("password"), username=kw.get("username"),
                                 timeout=kw.get("socket_timeout"))
            except (StageUnavailable, OSError, RespError) as exc:
                log.info("kvstrata: storing over the socket (no staging segment: %s)", exc)
                self._stage_ok = False
                return None
            self._tls.stage = sw
            with self._lock:
                self._fast_clients.append(sw)
        return sw

    def _put_staged(self, sw: Any, items: list[tuple[bytes, int, list[Any]]]) -> None:
        """Store ``items`` (unsealed: ``encode_chunk(sealed=False)``) through the staging segment, each value's
        codec checksum filled in as it is copied (``SUMAT``); a connection failure retries them over the socket."""
        from kvstrata.client.fast import RespError

        try:
            replies = sw.put_many(items, CHECKSUM_OFFSET)
        except RespError as exc:  # a reservation refused for another reason than memory: this batch by socket
            log.info("kvstrata: staging refused (%s); storing this batch over the socket", exc)
            replies = self._roundtrip([["TAIR.KV.SETEX", k, t, seal_parts(list(p))] for k, t, p in items])
        except (OSError, ConnectionError) as exc:
            log.warning("kvstrata: staged write failed (%s); storing over the socket", exc)
            self._tls.stage = None
            with self._lock:
                if sw in self._fast_clients:
                    self._fast_clients.remove(sw)
            try:
                sw.close()
            except OSError:
                pass
            replies = self._roundtrip([["TAIR.KV.SETEX", k, t, seal_parts(list(p))] for k, t, p in items])
        self._raise_first([reply_error(str(r)) if isinstance(r, RespError) else r for r in replies])
        self._count(bytes_sent=sum(nbytes(p) for _, _, parts in items for p in parts))

    def _absent(self, keys: list[bytes], idx: list[int]) -> list[int]:
        """The chunks of ``idx`` not stored yet (pipelined EXISTS per batch; the local tier alone without a
        server)."""
        if self.redis is None:
            return [i for i in idx if self._local_get(keys[i]) is None]
        out = []
        for batch in self._batches(idx):
            pipe = self.redis.pipeline(transaction=False)
            for i in batch:
                pipe.exists(keys[i])
            out += self._absent_of(batch, pipe.execute())
        return out

    def retrieve_chunks(self, tokens: Sequence[int], max_tokens: int | None = None, skip_chunks: int = 0,
                        reuse_buffers: bool = False,
                        keys: list[bytes] | None = None,
                        _into: list[np.ndarray] | None = None) -> tuple[int, list[np.ndarray]]:
        """(n_tokens, decoded chunk arrays) for the leading cached chunks of ``tokens``. With ``skip_chunks``
        the caller already holds the first chunks (a device tier): they are counted in n_tokens, not read.
        ``keys``: the keys of ``tokens[:max_tokens]`` when the caller has computed them already.

        With ``overlap`` (the default) the chunks are read in windows of ``_window()`` chunks and the next
        window is fetched on a background thread while this one decodes; a window fetched past the end of the
        prefix (an undecodable chunk) is discarded, and the call returns only once no fetch of it is in flight.

        ``reuse_buffers=True``: values are received straight into this thread's reusable buffers (no new
        memory, no page faults) and the raw-codec arrays returned are views of them, valid only until this
        thread's next ``retrieve_chunks``: copy them out first (the transformers integration does). From a
        local server's arena they are read-only views of its memory, leased until that next call (at most
        ``lease_ms``). This holds
        with ``overlap`` too: a background fetch receives into the calling thread's buffers (each window of a
        call into buffers of its own, never those of an earlier window) over the fetch thread's own
        connection, and it has finished before the call returns."""
        if keys is None:
            keys = self.keys(tokens if max_tokens is None else tokens[:max_tokens])
        out: list[np.ndarray] = [] if _into is None else _into  # retrieve(out=): a _Filler
        i = min(skip_chunks, len(keys))
        skipped = i
        # Local tier first.
        while i < len(keys):
            value = self._local_get(keys[i])
            if value is None:
                break
            arr = self._decode(keys[i], value)
            if arr is None:
                self.local.delete(keys[i])
                break
            out.append(arr)
            i += 1
        self._count(local_hits=i - skipped)
        if i < len(keys) and self.redis is not None and self._arena_ok:
            # Local server: read in place from its arena, one copy per chunk; with reuse_buffers the arrays are
            # views of the mapping instead, under a lease held until this thread's next call (or lease_ms).
            done = self._retrieve_arena(keys, i, out, copy=not reuse_buffers)
            if done is not None:
                self._count(hit_chunks=done, miss_chunks=min(1, len(keys) - done))
                return done * self.chunk_size, out
        if i < len(keys) and self.redis is not None:
            bufs = self._bufs() if reuse_buffers else None
            if self.overlap:
                i = self._read_overlapped(keys, i, out, bufs)
            else:
                i = self._read_sequential(keys, i, out, bufs)
        self._count(hit_chunks=i, miss_chunks=min(1, len(keys) - i))
        return i * self.chunk_size, out

    def _fetch_window(self, keys: list[bytes], ahead: list[bytes], plain: bool, bufs: list[bytearray] | None,
                      offset: int) -> list[Any]:
        """PREFETCH ``ahead``, then MGET ``keys`` (into ``bufs[offset ..]`` when given and possible), in one round
        trip (``_window_commands``)."""
        prefetch, mget = self._window_commands(keys, ahead, plain)
        values = self._mget_into(keys, bufs, offset, prefetch) if bufs is not None else None
        if values is None:
            pipe = self.redis.pipeline(transaction=False)
            if prefetch is not None:
                pipe.execute_command(*prefetch)
            pipe.execute_command(*mget)
            values = pipe.execute()[-1]
        return values

    def _read_sequential(self, keys: list[bytes], i: int, out: list[np.ndarray],
                         bufs: list[bytearray] | None) -> int:
        """Fetch a batch, decode it, fetch the next (``overlap=False``); returns the index past the last chunk."""
        plain = self._is_plain()
        first = i
        while i < len(keys):
            batch, ahead = self._plan_window(keys, i, self.batch_size)
            values = self._fetch_window(batch, ahead, plain, bufs, i - first)
            n = self._decode_window(batch, values, out)
            i += n
            if n < len(batch):
                break
        return i

    def _read_overlapped(self, keys: list[bytes], i: int, out: list[np.ndarray],
                         bufs: list[bytearray] | None) -> int:
        """Decode window k while window k+1 is fetched on a fetch thread; returns the index past the last chunk."""
        plain = self._is_plain()
        size = self._window()
        first = i

        def fetch(start: int) -> list[Any]:
            return self._fetch_window(*self._plan_window(keys, start, size), plain, bufs, start - first)

        # The first window is fetched here: there is nothing to overlap it with yet, and a one-window prefix
        # then costs no thread hop.
        values = fetch(i)
        pending: concurrent.futures.Future[list[Any]] | None = None
        try:
            while True:
                batch = keys[i:i + size]
                nxt = i + len(batch)
                # A missing value ends the prefix in this window: nothing after it is worth fetching.
                more = nxt < len(keys) and all(v is not None for v in values)
                if more:
                    pending = self._fetch_behind(fetch, nxt)
                n = self._decode_window(batch, values, out)
                i += n
                if n < len(batch) or not more:
                    return i
                if pending is None:
                    values = fetch(nxt)
                else:
                    future, pending = pending, None
                    values = future.result()
        finally:
            if pending is not None:
                if pending.cancel():
                    self._fetch_slot.release()  # never ran, so never freed it
                else:
                    # Fetched past the end of the prefix: wait for it (its buffers and connection must be free
                    # when this returns) and drop it, error included, since the prefix ended before it.
                    concurrent.futures.wait([pending])

    def _received(self, key: bytes, value: Any) -> None:
        self._size_hint = max(self._size_hint, len(value))
        if self.local is not None:
            self.local.put(key, Entry(bytes(value) if isinstance(value, memoryview) else value, 0))

    def retrieve(self, tokens: Sequence[int], max_tokens: int | None = None,
                 out: np.ndarray | None = None) -> tuple[int, np.ndarray | None]:
        """(n_tokens, kv): the leading cached tokens and their KV concatenated along the token axis (None if 0).

        ``out``: an existing array with room for every token of ``tokens`` along the token axis (same dtype);
        the KV is written there and ``kv`` is its first n_tokens (reused memory: no page faults). From a local
        server's arena the chunks are copied straight out of its memory: one copy."""
        if self.local is None and self.redis is not None and self._arena_ok:
            keys = self.keys(tokens if max_tokens is None else tokens[:max_tokens])
            chunks: list[np.ndarray] = []
            try:
                n = self._retrieve_arena(keys, 0, chunks, copy=False)
                if n is not None:
                    self._count(hit_chunks=n, miss_chunks=min(1, len(keys) - n))
                    if out is not None:
                        return n * self.chunk_size, self._into(chunks, out)
                    if not chunks:
                        return 0, None
                    layout = self._layout()
                    axis = layout.index("T") if "T" in layout else 0
                    kv = np.empty(_joined_shape(chunks, axis), chunks[0].dtype)
                    return n * self.chunk_size, self._into(chunks, kv)
            finally:
                self._arena_done()
        if out is not None:
            layout = self._layout()
            filler = _Filler(out, layout.index("T") if "T" in layout else 0)
            keys = self.keys(tokens if max_tokens is None else tokens[:max_tokens])
            # Over a socket: each value received straight into its slot of ``out`` (scatter receive).
            if self._scatter_reads():
                done = self._retrieve_scatter(keys, filler)
                if done is not None:
                    return done * self.chunk_size, filler.filled()
            # Otherwise received into this thread's reused buffers, each chunk copied out as soon as it is
            # decoded (its bytes still in cache from the checksum).
            n, _ = self.retrieve_chunks(tokens, max_tokens, reuse_buffers=True, _into=filler, keys=keys)
            return n, filler.filled()
        layout = self._layout()
        if self._scatter_reads() and "T" in layout:
            # Over a socket, into one array made on the first chunk: each value received straight into its
            # place, no concatenation afterwards.
            keys = self.keys(tokens if max_tokens is None else tokens[:max_tokens])
            filler = _Filler(None, layout.index("T"), len(keys) * self.chunk_size)
            try:
                done = self._retrieve_scatter(keys, filler)
            except ValueError:  # chunks of another length than chunk_size: read them the general way below
                done = None
            if done is not None:
                return done * self.chunk_size, filler.compact()
        n, chunks = self.retrieve_chunks(tokens, max_tokens)
        return n, self.concat(chunks, layout)

    def _scatter_reads(self) -> bool:
        """Whether ``retrieve`` receives values straight into place. Not with a local tier (it keeps the encoded
        values), and not when this client writes compressed values: those are decoded, not placed, and the
        windowed path overlaps their decoding with the next window's receive."""
        return self.local is None and self.redis is not None and self.compression == "raw"

    def _retrieve_scatter(self, keys: list[bytes], filler: _Filler) -> int | None:
        """``retrieve(out=)`` over this thread's FastClient: windows of MGET (with the next window's PREFETCH),
        each raw value received straight into its slot of ``out`` and verified on the way
        (``kvstrata.client.scatter``). Returns the chunks restored, or None when that connection is unavailable.
        A connection failing mid-value drops it, and the chunks not yet verified are read again the usual way
        (redis-py reconnects, or raises): the slot being filled is never counted."""
        try:
            fc = self._fast()
        except OSError:
            return None  # cannot connect: the redis-py path below raises its usual error (or reconnects)
        if fc is None:
            return None
        from kvstrata.client.fast import RespError

        plain = self._is_plain()
        size = self._window()
        i = 0
        misfit: list[BaseException] = []
        while i < len(keys):
            batch, ahead = self._plan_window(keys, i, size)
            before, mget = self._window_commands(batch, ahead, plain)

            def on_value(j: int, hdr: Any, arr: np.ndarray, placed: bool, nbytes: int,
                         batch: list[bytes] = batch) -> bool:
                if placed:
                    filler.commit(arr)
                else:
                    try:
                        filler.append(arr)
                    except ValueError as exc:  # a chunk that does not fit ``out``: raised once the reply is read
                        misfit.append(exc)
                        return False
                self._size_hint = max(self._size_hint, nbytes)
                self._count(bytes_received=nbytes)
                return True

            def on_error(j: int, exc: CodecError, batch: list[bytes] = batch) -> None:
                kind = "refused" if isinstance(exc, FormatVersionError) else "corrupt"
                self._error(kind, f"{batch[j].decode()}: {exc}")

            try:
                n = mget_scatter(fc, batch, filler.place, before, mget[0], on_value, on_error)
            except (OSError, RespError) as exc:
                self._drop_fast(fc)
                done = len(filler)  # chunks verified and in place, this window's first ones included
                log.warning("kvstrata: socket read failed after %d chunks (%s); reading the rest again", done, exc)
                n_tok, _ = self.retrieve_chunks([], skip_chunks=done, reuse_buffers=True, keys=keys,
                                                _into=filler)
                return n_tok // self.chunk_size
            if misfit:
                raise misfit[0]
            i += n
            if n < len(batch):
                break
        self._count(hit_chunks=i, miss_chunks=min(1, len(keys) - i))
        return i

    def _into(self, chunks: list[np.ndarray], out: np.ndarray) -> np.ndarray | None:
        """Copy ``chunks`` one after the other along the token axis into ``out``; returns the filled part."""
        if not chunks:
            return None
        layout = self._layout()
        axis = layout.index("T") if "T" in layout else 0
        index: list[Any] = [slice(None)] * out.ndim
        pos = 0
        for c in chunks:
            index[axis] = slice(pos, pos + c.shape[axis])
            _copy_bytes(out[tuple(index)], c.view(out.dtype) if c.dtype != out.dtype else c)
            pos += c.shape[axis]
        index[axis] = slice(0, pos)
        return out[tuple(index)]

    def prefetch(self, tokens: Sequence[int], max_chunks: int | None = None) -> int:
        """Ask the server to promote the chunks of ``tokens`` to DRAM (TAIR.KV.PREFETCH); returns how many it
        queued."""
        keys = self.keys(tokens)[:max_chunks]
        if not keys or self.redis is None or self._is_plain():
            return 0
        queued = 0
        for i in range(0, len(keys), self.batch_size):
            queued += int(self.redis.execute_command("TAIR.KV.PREFETCH", *keys[i:i + self.batch_size]))
        return queued

    def delete(self, tokens: Sequence[int]) -> int:
        """Delete the chunks of ``tokens`` (server and local tier); returns how many the server deleted."""
        keys = self.keys(tokens)
        if self.local is not None:
            for k in keys:
                self.local.delete(k)
        if not keys or self.redis is None:
            return 0
        return sum(int(self.redis.delete(*keys[i:i + self.batch_size]))
                   for i in range(0, len(keys), self.batch_size))

    def clear(self) -> int:
        """Delete every chunk of this namespace (SCAN by key prefix); returns how many the server deleted."""
        prefix = self.namespace.prefix
        if self.local is not None:
            self.local.clear(prefix)
        if self.redis is None:
            return 0
        n = 0
        batch: list[bytes] = []
        for key in self.redis.scan_iter(match=prefix + b"*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                n += int(self.redis.delete(*batch))
                batch = []
        if batch:
            n += int(self.redis.delete(*batch))
        return n


def _auth(username: str | None, password: str | None) -> dict[str, str]:
    """Connection keywords that override the URL's user and password (only those given)."""
    out = {}
    if username is not None:
        out["username"] = username
    if password is not None:
        out["password"] = password
    return out


class AsyncKVCacheClient(_Base):
    """asyncio client with the same operations as ``KVCacheClient`` (``await c.lookup(tokens)``, ...)."""

    def __init__(self, url: str = "redis://127.0.0.1:6379", namespace: Namespace | str = "default", *,
                 max_connections: int = 8, socket_timeout: float = 30.0, username: str | None = None,
                 password: str | None = None, local_plane: bool = True, stage_writes: bool = False,
                 **kw: Any) -> None:
        super().__init__(namespace, **kw)
        import redis.asyncio as aredis

        # Reads through a local server's arena (docs/dataplane.md) go through a synchronous client in a worker
        # thread: the copy out of the mapping is the work, and it must not run on the event loop.
        self._local_kw = {"socket_timeout": socket_timeout, "username": username, "password": password,
                          "stage_writes": stage_writes, **kw}
        self._local: KVCacheClient | None = None
        self._local_ok = local_plane
        self._reader: KVCacheClient | None = None  # retrieve(out=) over the socket, in a worker thread
        self.url = url
        self.pool = aredis.ConnectionPool.from_url(url, max_connections=max_connections,
                                                   socket_timeout=socket_timeout, **_auth(username, password))
        self.redis = aredis.Redis(connection_pool=self.pool)
        self._plain_redis: bool | None = None

    async def aclose(self) -> None:
        for sync in (self._local, self._reader):
            if sync is not None:
                sync.close()
        self._local = self._reader = None
        await self.redis.aclose()
        await self.pool.disconnect()

    async def __aenter__(self) -> AsyncKVCacheClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _is_plain(self) -> bool:
        if self._plain_redis is None:
            import redis

            try:
                await self.redis.execute_command("TAIR.KV.VERSION", "kvstrata:probe")
                self._plain_redis = False
            except redis.ResponseError:
                self._plain_redis = True
        return self._plain_redis

    async def _roundtrip(self, commands: list[list[Any]]) -> list[Any]:
        import redis

        conn = await self.pool.get_connection()
        try:
            parts: list[Any] = []
            size = sum(pack(cmd, parts) for cmd in commands)
            await conn.send_packed_command(parts, check_health=False)  # writelines: buffers are not joined
            replies = []
            for _ in commands:
                try:
                    replies.append(await conn.read_response())
                except redis.ResponseError as exc:
                    replies.append(exc)
            self._count(bytes_sent=size)
            return replies
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await self.pool.release(conn)

    async def _exists_each(self, keys: list[bytes]) -> list[bool]:
        pipe = self.redis.pipeline(transaction=False)
        for k in keys:
            pipe.exists(k)
        return [bool(x) for x in await pipe.execute()]

    async def lookup(self, tokens: Sequence[int]) -> int:
        keys = self.keys(tokens)
        n = self._local_leading(keys)
        for batch in self._batches(keys[n:]):
            hit = self._leading(await self._exists_each(batch))
            n += hit
            if hit < len(batch):
                break
        self._count(lookups=1, hit_chunks=n, miss_chunks=min(1, len(keys) - n))
        return n * self.chunk_size

    async def store(self, tokens: Sequence[int], kv: KVSource, *, ttl_class: str | None = None,
                    ttl: float | None = None, start: int = 0, skip_existing: bool = True,
                    keys: list[bytes] | None = None) -> int:
        """``KVCacheClient.store``: the same chunks, checks, batches and counters (one planning layer)."""
        if self.local is None and await self._plane():
            # A local server: the synchronous client's store, in a worker thread, as retrieve reads the arena.
            assert self._local is not None
            self._local.namespace = self.namespace
            return await asyncio.to_thread(self._local.store, tokens, kv, ttl_class=ttl_class, ttl=ttl,
                                           start=start, skip_existing=skip_existing, keys=keys)
        keys, todo = self._store_todo(tokens, start, keys)
        if skip_existing and todo:
            absent: list[int] = []
            for batch in self._batches(todo):
                absent += self._absent_of(batch, await self._exists_each([keys[i] for i in batch]))
            todo = absent
        self._count_skipped(keys, start, todo)
        if not todo:
            return 0
        ttl_ms = self.ttl_ms(ttl_class, ttl)
        plain = await self._is_plain()
        for batch in self._batches(todo):
            cmds = [self._store_command(keys[i], ttl_ms, self._sealed(keys[i], self._chunk_parts(kv, i), ttl_ms),
                                        plain) for i in batch]
            self._raise_first(await self._roundtrip(cmds))
        self._count(stored_chunks=len(todo))
        return len(todo)

    async def retrieve_chunks(self, tokens: Sequence[int],
                              max_tokens: int | None = None) -> tuple[int, list[np.ndarray]]:
        """(n_tokens, decoded chunk arrays) for the leading cached chunks of ``tokens``. With ``overlap`` (the
        default) the next window's MGET is sent before the current window is decoded, and its reply is read by
        a task meanwhile; large or compressed windows are decoded in a thread so that the loop is free to."""
        keys = self.keys(tokens if max_tokens is None else tokens[:max_tokens])
        out: list[np.ndarray] = []
        i = 0
        while i < len(keys):
            value = self._local_get(keys[i])
            arr = None if value is None else self._decode(keys[i], value)
            if arr is None:
                break
            out.append(arr)
            i += 1
        self._count(local_hits=i)
        plain = await self._is_plain()
        if self.overlap:
            if i < len(keys):
                i = await self._read_overlapped(keys, i, out, plain)
            self._count(hit_chunks=i, miss_chunks=min(1, len(keys) - i))  # as the sync client counts
            return i * self.chunk_size, out
        while i < len(keys):
            batch, ahead = self._plan_window(keys, i, self.batch_size)
            values = await self._recv_and_release(*await self._send_window(batch, ahead, plain))
            n = self._decode_window(batch, values, out)
            i += n
            if n < len(batch):
                break
        self._count(hit_chunks=i, miss_chunks=min(1, len(keys) - i))
        return i * self.chunk_size, out

    async def _send_window(self, keys: list[bytes], ahead: list[bytes], plain: bool) -> tuple[Any, int]:
        """Send PREFETCH ``ahead`` and MGET ``keys`` in one write on a pooled connection; returns it and the
        number of replies to read. Sending here, not in the reading task, puts the request on the wire before
        the caller goes on to decode, even when it decodes on the event loop."""
        before, mget = self._window_commands(keys, ahead, plain)
        cmds = [mget] if before is None else [before, mget]
        conn = await self.pool.get_connection()
        try:
            await conn.send_packed_command(conn.pack_commands(cmds), check_health=False)
        except BaseException:
            await conn.disconnect()
            await self.pool.release(conn)
            raise
        return conn, len(cmds)

    async def _recv_window(self, conn: Any, n_replies: int) -> list[Any]:
        """Read the replies of ``_send_window``; returns the MGET's values. The connection is given back by the
        caller (``_done_with``), not here: a task cancelled before it started never runs its own ``finally``."""
        reply = None
        for _ in range(n_replies):
            reply = await conn.read_response()
        return reply  # type: ignore[return-value]

    async def _done_with(self, conn: Any, clean: bool) -> None:
        if not clean:
            await conn.disconnect()  # replies may be left unread (an error, a dropped window)
        await self.pool.release(conn)

    async def _recv_and_release(self, conn: Any, n_replies: int) -> list[Any]:
        clean = False
        try:
            values = await self._recv_window(conn, n_replies)
            clean = True
            return values
        finally:
            await self._done_with(conn, clean)

    @staticmethod
    def _offload(values: Sequence[Any]) -> bool:
        """Whether decoding these values is worth a thread hop (see OFFLOAD_CODED_BYTES)."""
        total = coded = 0
        for v in values:
            if v is None:
                continue
            total += len(v)
            if len(v) > FLAGS_OFFSET and v[FLAGS_OFFSET] & (FLAG_FP8 | FLAG_ZSTD):
                coded += len(v)
        return coded >= OFFLOAD_CODED_BYTES or total >= OFFLOAD_RAW_BYTES

    async def _read_overlapped(self, keys: list[bytes], i: int, out: list[np.ndarray], plain: bool) -> int:
        """Decode window k while window k+1's reply is read by a task; returns the index past the last chunk."""
        size = self._window()

        async def send(start: int) -> tuple[Any, int]:
            return await self._send_window(*self._plan_window(keys, start, size), plain)

        values = await self._recv_and_release(*await send(i))
        pending: tuple[asyncio.Future[list[Any]], Any] | None = None  # the reading task and its connection
        try:
            while True:
                batch = keys[i:i + size]
                nxt = i + len(batch)
                # A missing value ends the prefix in this window: nothing after it is worth fetching.
                more = nxt < len(keys) and all(v is not None for v in values)
                if more:
                    conn, n_replies = await send(nxt)
                    pending = asyncio.ensure_future(self._recv_window(conn, n_replies)), conn
                if self._offload(values):
                    n = await asyncio.to_thread(self._decode_window, batch, values, out)
                else:
                    n = self._decode_window(batch, values, out)
                i += n
                if n < len(batch) or pending is None:
                    return i
                (task, conn), pending = pending, None
                clean = False
                try:
                    values = await task
                    clean = True
                finally:
                    await self._done_with(conn, clean)
        finally:
            if pending is not None:
                # Fetched past the end of the prefix (or given up on): drop it; its connection is closed rather
                # than drained, which would mean receiving the whole window for nothing.
                task, conn = pending
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await self._done_with(conn, False)

    async def retrieve(self, tokens: Sequence[int], max_tokens: int | None = None,
                       out: np.ndarray | None = None) -> tuple[int, np.ndarray | None]:
        """As ``KVCacheClient.retrieve``. Through a local server's arena, and with ``out`` over the socket too,
        a synchronous client does the work in a worker thread (the copy, or the scatter receive straight into
        ``out``, must not run on the event loop); otherwise windows are read on the loop, overlapped."""
        if self.local is None and await self._plane():
            assert self._local is not None
            self._local.namespace = self.namespace
            return await asyncio.to_thread(self._local.retrieve, tokens, max_tokens, out)
        if out is not None:
            reader = self._sync_reader()
            reader.namespace = self.namespace
            return await asyncio.to_thread(reader.retrieve, tokens, max_tokens, out)
        n, chunks = await self.retrieve_chunks(tokens, max_tokens)
        return n, self.concat(chunks, self._layout())

    def _sync_reader(self) -> KVCacheClient:
        """The synchronous client of ``retrieve(out=)`` over the socket (one set of counters with this one)."""
        if self._reader is None:
            c = KVCacheClient(self.url, self.namespace, local_plane=False, **self._local_kw)
            c.stats, c._stats_lock = self.stats, self._stats_lock
            self._reader = c
        return self._reader

    async def _plane(self) -> bool:
        """Whether the server's arena can be mapped from here (decided once, in a worker thread)."""
        if not self._local_ok:
            return False
        if self._local is None:
            def attach() -> KVCacheClient | None:
                c = KVCacheClient(self.url, self.namespace, **self._local_kw)
                c.stats, c._stats_lock = self.stats, self._stats_lock  # one set of counters
                if c._arena() is None:
                    c.close()
                    return None
                return c

            self._local = await asyncio.to_thread(attach)
            if self._local is None:
                self._local_ok = False
                return False
        return True

    async def prefetch(self, tokens: Sequence[int], max_chunks: int | None = None) -> int:
        keys = self.keys(tokens)[:max_chunks]
        if not keys or await self._is_plain():
            return 0
        queued = 0
        for i in range(0, len(keys), self.batch_size):
            queued += int(await self.redis.execute_command("TAIR.KV.PREFETCH", *keys[i:i + self.batch_size]))
        return queued

    async def delete(self, tokens: Sequence[int]) -> int:
        keys = self.keys(tokens)
        if self.local is not None:
            for k in keys:
                self.local.delete(k)
        n = 0
        for i in range(0, len(keys), self.batch_size):
            n += int(await self.redis.delete(*keys[i:i + self.batch_size]))
        return n

    async def clear(self) -> int:
        prefix = self.namespace.prefix
        if self.local is not None:
            self.local.clear(prefix)
        keys = [k async for k in self.redis.scan_iter(match=prefix + b"*", count=1000)]
        n = 0
        for i in range(0, len(keys), 1000):
            n += int(await self.redis.delete(*keys[i:i + 1000]))
        return n


def client_from_env(namespace: Namespace | str, **kw: Any) -> KVCacheClient:
    """A client for ``$KVSTRATA_URL`` (default redis://127.0.0.1:6379)."""
    return KVCacheClient(os.environ.get("KVSTRATA_URL", "redis://127.0.0.1:6379"), namespace, **kw)


__all__ = ["AsyncKVCacheClient", "ClientStats", "KVCacheClient", "as_array", "client_from_env"]
