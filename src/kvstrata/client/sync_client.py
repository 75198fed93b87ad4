"""KVCacheClient, the synchronous client: lookups, stores, reads and deletes of a token prefix's chunks.

The class puts together the planning layer (``kvstrata.client.planning``), the reads over the socket
(``socket_reads``), the local data plane (``arena_reads``) and the store transport (``store_path``), and holds
the operations callers use. ``client_from_env`` makes one for ``$KVSTRATA_URL``.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvstrata.client.arena_reads import _ArenaReads
from kvstrata.client.codec import parts_nbytes
from kvstrata.client.copypool import CopyPool
from kvstrata.client.filler import _copy_along, _Filler, _joined_shape
from kvstrata.client.keys import Namespace
from kvstrata.client.planning import CLEAR_BATCH, KVSource
from kvstrata.client.rediserrors import reply_error, socket_error
from kvstrata.client.socket_reads import _SocketReads
from kvstrata.client.store_path import _StorePath
from kvstrata.engine.entry import Entry


class KVCacheClient(_SocketReads, _ArenaReads, _StorePath):
    """Synchronous client. ``url=None`` runs with the local tier only (no server).

    >>> c = KVCacheClient("redis://127.0.0.1:6379", Namespace("my-model", kv_dtype="float32"))
    >>> c.store(tokens, kv)          # kv: [layers, 2, kv_heads, tokens, head_dim] (layout "LKHTD")
    >>> n, kv = c.retrieve(tokens)   # n leading tokens found, their KV concatenated along the token axis
    """

    def __init__(self, url: str | None = "redis://127.0.0.1:6379", namespace: Namespace | str = "default",
                 *, max_connections: int = 8, socket_timeout: float = 30.0, username: str | None = None,
                 password: str | None = None, local_plane: bool = True, verify_local: bool = False,
                 lease_ms: int = 10_000, stage_writes: bool = True, **kw: Any) -> None:
        """``url``: ``redis://host:port``, ``rediss://host:port`` (TLS, redis-py's ``?ssl_*`` options) or
        ``unix:///path/to/socket``; ``/N`` selects database N (``SELECT`` at connect; kvstrata refuses any but
        0, with an error that says so). Every command goes out on the SDK's own transport
        (``kvstrata.client.fast``); ``self.redis`` is a redis-py client on the same URL for the caller's own
        commands. ``local_plane``: read through the
        server's shared-memory arena when it is local (a ``unix://`` URL, or TCP to a loopback address of a
        server whose ``unixsocket`` this process can open): one copy from the server's memory, no socket
        transfer (docs/dataplane.md). ``verify_local``: check each arena read against the value's checksum
        too (leased bytes cannot change, so this is off by default). ``stage_writes``: store through a staging
        segment when the server is local (two-phase writes; on by default: faster than the socket there,
        BENCHMARKS.md "Store"), ``False`` for the socket."""
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
        self._connect_args: dict[str, Any] | None = None  # FastClient's keywords for url (endpoint), made once
        self._size_hint = 0  # largest value seen: the size of the reusable receive buffers
        # Every thread's FastClient (the fetch threads' too), so that close() reaches them all.
        self._fast_clients: list[Any] = []
        self._lock = threading.Lock()
        # The thread that fetches the next window while the caller decodes (started on first use), and the slot
        # for its one fetch in flight. A caller that finds the slot taken (another thread's call is using it)
        # reads its next window itself after decoding, as without overlap, instead of queueing behind that call.
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._fetch_slot = threading.Lock()
        self._copies: CopyPool | None = None  # made on first use (_copier), ended by close()

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)  # no fetch may still be using a connection closed below
        self._close_copier()
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

    def _small(self, commands: list[list[Any]], doing: str) -> list[Any]:
        """Small commands (EXISTS, DEL, SCAN, PREFETCH, the probe) pipelined on this thread's ``FastClient``, the
        connection the stores and reads use; each error reply in its place as the exception redis-py would raise,
        a socket failure as redis-py's ConnectionError / TimeoutError (the connection dropped)."""
        from kvstrata.client.fast import RespError

        fc = self._store_conn()
        try:
            replies = fc.pipeline(commands)
        except OSError as exc:
            self._drop_fast(fc)
            raise socket_error(exc, doing) from exc
        except BaseException:
            self._drop_fast(fc)  # interrupted between a command and its reply: out of step, never reused
            raise
        return [reply_error(str(r)) if isinstance(r, RespError) else r for r in replies]

    def _checked(self, commands: list[list[Any]], doing: str) -> list[Any]:
        """``_small``'s replies, its first error raised (as redis-py's pipeline raises it)."""
        replies = self._small(commands, doing)
        self._raise_first(replies)
        return replies

    def _is_plain(self) -> bool:
        if self._plain_redis is None:
            (reply,) = self._small([self._probe_command()], "probing the server")
            self._plain_redis = self._plain_from_probe(reply)
        return self._plain_redis

    def _server_leading(self, keys: list[bytes]) -> int:
        """How many leading keys exist on the server (pipelined EXISTS, batch by batch, stops at a miss)."""
        n = 0
        for batch in self._batches(keys):
            hit = self._leading(self._checked([["EXISTS", k] for k in batch], "checking keys"))
            n += hit
            if hit < len(batch):
                break
        return n

    # ---- operations ----
    def _leading_present(self, keys: list[bytes]) -> int:
        """How many leading ``keys`` are cached (the local tier, then the server), counted as a lookup."""
        n = self._local_leading(keys)
        if n < len(keys) and self.redis is not None:
            n += self._server_leading(keys[n:])
        self._count(lookups=1, hit_chunks=n, miss_chunks=min(1, len(keys) - n))
        return n

    def lookup(self, tokens: Sequence[int]) -> int:
        """Number of leading tokens of ``tokens`` whose chunks are all cached (a multiple of chunk_size)."""
        return self._leading_present(self.keys(tokens)) * self.chunk_size

    def store(self, tokens: Sequence[int], kv: KVSource, *, ttl_class: str | None = None,
              ttl: float | None = None, start: int = 0, skip_existing: bool = True,
              keys: list[bytes] | None = None, tail: bool = False) -> int:
        """Store the full chunks of ``tokens`` (from token ``start``, a multiple of chunk_size) that are not cached
        yet. ``kv`` is a tensor with a token axis (the ``T`` of the namespace's layout) covering ``tokens``, or
        a function ``kv(start, end)`` returning one chunk's tensor. ``keys``: ``self.keys(tokens)`` when the
        caller has them already. ``tail``: the tokens after the last full chunk too, as a tail chunk (found by
        ``lookup_tail``; docs/chunk-keys.md). Returns the number of chunks written."""
        keys, todo = self._store_todo(tokens, start, keys, tail)
        if skip_existing and todo:
            todo = self._absent(keys, todo)
        self._count_skipped(keys, start, todo)
        if not todo:
            return 0
        ttl_ms = self.ttl_ms(ttl_class, ttl)
        plain = self.redis is not None and self._is_plain()
        end = len(tokens) if tail else None  # where a tail chunk stops
        written = 0
        for batch in self._batches(todo):
            cmds = []
            staged: list[tuple[bytes, int, list[Any]]] = []
            stager = self._stager() if self.redis is not None else None
            for i in batch:
                parts = self._chunk_parts(kv, i, strided=stager is not None, end=end)
                size = parts_nbytes(parts)
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

    def lookup_tail(self, tokens: Sequence[int], keys: list[bytes] | None = None) -> tuple[int, bytes | None]:
        """(n, key): ``lookup`` that counts a stored tail chunk after the leading cached full chunks (``n``: their
        tokens and the tail's; ``key``: the tail's, to read after those chunks, or None). The full chunks first
        (the previous turn of a conversation may have ended chunks before the new prompt's last full one), then
        ``longest_tail`` at the boundary where they stop. ``keys``: ``self.keys(tokens)``."""
        keys = self.keys(tokens) if keys is None else keys
        j = self._leading_present(keys)
        return self._with_tail(j, *self.longest_tail(self._tail_span(tokens, j), keys[:j]))

    def longest_tail(self, tokens: Sequence[int], keys: list[bytes] | None = None) -> tuple[int, bytes | None]:
        """(r, key): the longest tail chunk of ``tokens`` that is stored, the first ``r`` tokens after the last
        full chunk (``store(tail=True)`` of a sequence that went on from there), or (0, None). One pipelined
        EXISTS of every candidate (the local tier's without a server). ``keys``: ``self.keys(tokens)``."""
        candidates = self.tail_keys(tokens, keys)
        if not candidates:
            return 0, None
        every = range(len(candidates))
        absent = set(self._absent(candidates, list(every)))
        return self._longest_tail(candidates, [i not in absent for i in every])

    def _absent(self, keys: list[bytes], idx: list[int]) -> list[int]:
        """The chunks of ``idx`` not stored yet (pipelined EXISTS per batch; the local tier alone without a
        server)."""
        if self.redis is None:
            return self._local_absent(keys, idx)
        out = []
        for batch in self._batches(idx):
            out += self._absent_of(batch, self._checked([["EXISTS", keys[i]] for i in batch], "checking keys"))
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
        skipped = min(skip_chunks, len(keys))
        i = self._local_prefix(keys, skipped, out)  # local tier first
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
            filler = _Filler(out, layout.index("T") if "T" in layout else 0, copies=self._copier())
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
            filler = _Filler(None, layout.index("T"), len(keys) * self.chunk_size, self._copier())
            try:
                done = self._retrieve_scatter(keys, filler)
            except ValueError:  # chunks of another length than chunk_size: read them the general way below
                done = None
            if done is not None:
                return done * self.chunk_size, filler.compact()
        n, chunks = self.retrieve_chunks(tokens, max_tokens)
        return n, self.concat(chunks, layout)

    def _into(self, chunks: list[np.ndarray], out: np.ndarray) -> np.ndarray | None:
        """Copy ``chunks`` one after the other along the token axis into ``out``; returns the filled part."""
        if not chunks:
            return None
        layout = self._layout()
        return _copy_along(chunks, out, layout.index("T") if "T" in layout else 0, self._copier())

    def prefetch(self, tokens: Sequence[int], max_chunks: int | None = None) -> int:
        """Ask the server to promote the chunks of ``tokens`` to DRAM (TAIR.KV.PREFETCH); returns how many it
        queued."""
        keys = self.keys(tokens)[:max_chunks]
        if not keys or self.redis is None or self._is_plain():
            return 0
        return sum(int(n) for n in self._checked(
            [["TAIR.KV.PREFETCH", *batch] for batch in self._batches(keys)], "prefetching"))

    def delete(self, tokens: Sequence[int]) -> int:
        """Delete the chunks of ``tokens`` (server and local tier); returns how many the server deleted."""
        keys = self.keys(tokens)
        if self.local is not None:
            for k in keys:
                self.local.delete(k)
        if not keys or self.redis is None:
            return 0
        return sum(int(n) for n in self._checked([["DEL", *batch] for batch in self._batches(keys)], "deleting"))

    def clear(self) -> int:
        """Delete every chunk of this namespace (SCAN by key prefix); returns how many the server deleted."""
        prefix = self.namespace.prefix
        if self.local is not None:
            self.local.clear(prefix)
        if self.redis is None:
            return 0
        return sum(int(n) for n in self._checked(
            [["DEL", *batch] for batch in self._batches(self._scan(prefix + b"*"), CLEAR_BATCH)], "deleting"))

    def _scan(self, pattern: bytes) -> list[bytes]:
        """Every key matching ``pattern`` (SCAN, all pages, before anything is deleted)."""
        keys: list[bytes] = []
        cursor: Any = b"0"
        while True:
            ((cursor, found),) = self._checked([self._scan_command(cursor, pattern)], "scanning")
            keys += found
            if int(cursor) == 0:
                return keys


def _auth(username: str | None, password: str | None) -> dict[str, str]:
    """Connection keywords that override the URL's user and password (only those given)."""
    out = {}
    if username is not None:
        out["username"] = username
    if password is not None:
        out["password"] = password
    return out


def client_from_env(namespace: Namespace | str, **kw: Any) -> KVCacheClient:
    """A client for ``$KVSTRATA_URL`` (default redis://127.0.0.1:6379)."""
    return KVCacheClient(os.environ.get("KVSTRATA_URL", "redis://127.0.0.1:6379"), namespace, **kw)
