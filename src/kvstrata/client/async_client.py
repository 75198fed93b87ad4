"""AsyncKVCacheClient: the asyncio client, the same operations as KVCacheClient on the same RESP transport.

Commands go out on ``AsyncFastClient`` connections (kvstrata.client.afast: FastClient's framing, parsing and
error mapping around non-blocking I/O; TCP, TLS or a Unix socket, the URL's database selected), lent by an
``AsyncFastPool`` of at most ``max_connections``; redis-py's asyncio pool only parses the URL and backs
``client.redis`` for the caller's own commands. The planning (which chunks, batches, commands, counters) is
``planning._Base``'s, shared with the sync client. Reads overlap the next window's receive with this window's
decoding (a task), decode in a thread only when that is worth the hop (``OFFLOAD_*``), and go through a
synchronous client in a worker thread for a local server's arena, for ``retrieve(out=)`` and for ``reserve``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np

from kvstrata.client.afast import AsyncFastClient, AsyncFastPool, PoolExhausted
from kvstrata.client.codec import FLAG_FP8, FLAG_ZSTD, FLAGS_OFFSET
from kvstrata.client.endpoint import transport_args
from kvstrata.client.fast import pack
from kvstrata.client.keys import Namespace
from kvstrata.client.planning import CLEAR_BATCH, KVSource, _Base
from kvstrata.client.rediserrors import reply_error, socket_error
from kvstrata.client.resp import RespError
from kvstrata.client.store_path import Slots
from kvstrata.client.sync_client import KVCacheClient, _auth

# The asyncio client decodes a window in a thread (asyncio.to_thread, ~75 us a hop here) only when decoding
# costs clearly more than the hop, since only then does freeing the event loop to receive the next window pay.
# zstd and fp8 both decode at ~0.5 GB/s of their encoded bytes (fp8+zstd ~0.25), so 64 KiB is >= 0.1 ms; the raw
# codec is only an xxh3 checksum and a view (~25-40 GB/s: 8 MiB is ~0.3 ms).
OFFLOAD_CODED_BYTES = 64 * 1024
OFFLOAD_RAW_BYTES = 8 * 1024 * 1024


class AsyncKVCacheClient(_Base):
    """asyncio client with the same operations as ``KVCacheClient`` (``await c.lookup(tokens)``, ...).
    ``url=None`` runs with the local tier only (no server)."""

    def __init__(self, url: str | None = "redis://127.0.0.1:6379", namespace: Namespace | str = "default", *,
                 max_connections: int = 8, socket_timeout: float = 30.0, username: str | None = None,
                 password: str | None = None, local_plane: bool = True, verify_local: bool = False,
                 lease_ms: int = 10_000, stage_writes: bool = True, **kw: Any) -> None:
        """As ``KVCacheClient``; ``max_connections`` bounds the connections open at once (a call that finds them
        all lent waits for one, up to ``socket_timeout``, then raises redis-py's ConnectionError)."""
        super().__init__(namespace, **kw)
        # Reads through a local server's arena (docs/dataplane.md) go through a synchronous client in a worker
        # thread: the copy out of the mapping is the work, and it must not run on the event loop.
        self._local_kw = {"socket_timeout": socket_timeout, "username": username, "password": password,
                          "stage_writes": stage_writes, "verify_local": verify_local, "lease_ms": lease_ms, **kw}
        self._local: KVCacheClient | None = None
        self._local_ok = local_plane and url is not None
        self._reader: KVCacheClient | None = None  # retrieve(out=) over the socket, in a worker thread
        self.url = url
        self.redis: Any = None
        self._conns: AsyncFastPool | None = None
        if url is not None:
            import redis.asyncio as aredis

            # redis-py's pool connects nothing until asked: it parses the URL (endpoint.transport_args) and backs
            # client.redis; every command of this client goes out on self._conns.
            self.pool = aredis.ConnectionPool.from_url(url, max_connections=max_connections,
                                                       socket_timeout=socket_timeout, **_auth(username, password))
            self.redis = aredis.Redis(connection_pool=self.pool)
            args = transport_args(self.pool)

            async def connect() -> AsyncFastClient:
                return await AsyncFastClient.connect(**args)

            self._conns = AsyncFastPool(connect, max_connections, wait_timeout=args["timeout"])
        self._plain_redis: bool | None = None

    async def aclose(self) -> None:
        for sync in (self._local, self._reader):
            if sync is not None:
                sync.close()
        self._local = self._reader = None
        if self._conns is not None:
            self._conns.close()
        if self.redis is not None:
            await self.redis.aclose()
            await self.pool.disconnect()

    async def __aenter__(self) -> AsyncKVCacheClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _is_plain(self) -> bool:
        if self._plain_redis is None:
            (reply,), _ = await self._exchange([self._probe_command()], "probing the server")
            self._plain_redis = self._plain_from_probe(reply)
        return self._plain_redis

    async def _conn(self) -> AsyncFastClient:
        """A connection of ``self._conns``; connection and AUTH failures raise as redis-py's exceptions."""
        assert self._conns is not None
        try:
            return await self._conns.get()
        except PoolExhausted as exc:
            import redis

            raise redis.exceptions.ConnectionError(str(exc)) from None
        except OSError as exc:
            raise socket_error(exc, "connecting") from exc
        except RespError as exc:
            raise reply_error(str(exc)) from exc

    async def _exchange(self, commands: list[list[Any]], doing: str) -> tuple[list[Any], int]:
        """Send ``commands`` pipelined in vectored writes (values unjoined) and read every reply; an error reply
        comes back in its place as the exception redis-py would raise (as ``KVCacheClient._roundtrip``), a
        socket failure closes the connection and raises redis-py's ConnectionError or TimeoutError. Returns the
        replies and the bytes sent."""
        conn = await self._conn()
        parts: list[Any] = []
        size = sum(pack(cmd, parts) for cmd in commands)
        replies: list[Any] = []
        clean = False
        try:
            await conn.send_parts(parts)
            for _ in commands:
                try:
                    replies.append(await conn.read_reply())
                except RespError as exc:
                    replies.append(reply_error(str(exc)))
            clean = True
        except OSError as exc:
            raise socket_error(exc, doing) from exc
        finally:
            self._conns.put(conn, clean)  # closed unless every reply was read
        return replies, size

    async def _roundtrip(self, commands: list[list[Any]]) -> list[Any]:
        """A batch of writes (``_exchange``), its bytes counted as sent."""
        replies, size = await self._exchange(commands, "while storing")
        self._count(bytes_sent=size)
        return replies

    async def _exists_each(self, keys: list[bytes]) -> list[bool]:
        replies, _ = await self._exchange([["EXISTS", k] for k in keys], "checking keys")
        self._raise_first(replies)
        return [bool(x) for x in replies]

    async def _leading_present(self, keys: list[bytes]) -> int:
        """How many leading ``keys`` are cached (the local tier, then pipelined EXISTS), counted as a lookup."""
        n = self._local_leading(keys)
        if self._conns is not None:
            for batch in self._batches(keys[n:]):
                hit = self._leading(await self._exists_each(batch))
                n += hit
                if hit < len(batch):
                    break
        self._count(lookups=1, hit_chunks=n, miss_chunks=min(1, len(keys) - n))
        return n

    async def lookup(self, tokens: Sequence[int]) -> int:
        return await self._leading_present(self.keys(tokens)) * self.chunk_size

    async def lookup_tail(self, tokens: Sequence[int], keys: list[bytes] | None = None) -> tuple[int, bytes | None]:
        """``KVCacheClient.lookup_tail``."""
        keys = self.keys(tokens) if keys is None else keys
        j = await self._leading_present(keys)
        return self._with_tail(j, *await self.longest_tail(self._tail_span(tokens, j), keys[:j]))

    async def longest_tail(self, tokens: Sequence[int], keys: list[bytes] | None = None) -> tuple[int, bytes | None]:
        """``KVCacheClient.longest_tail``."""
        candidates = self.tail_keys(tokens, keys)
        if not candidates:
            return 0, None
        if self._conns is None:
            found = [self._local_get(k) is not None for k in candidates]
        else:
            found = await self._exists_each(candidates)
        return self._longest_tail(candidates, found)

    async def store(self, tokens: Sequence[int], kv: KVSource, *, ttl_class: str | None = None,
                    ttl: float | None = None, start: int = 0, skip_existing: bool = True,
                    keys: list[bytes] | None = None, tail: bool = False) -> int:
        """``KVCacheClient.store``: the same chunks, checks, batches and counters (one planning layer)."""
        if self.local is None and await self._plane():
            # A local server: the synchronous client's store, in a worker thread, as retrieve reads the arena.
            assert self._local is not None
            self._local.namespace = self.namespace
            return await asyncio.to_thread(self._local.store, tokens, kv, ttl_class=ttl_class, ttl=ttl,
                                           start=start, skip_existing=skip_existing, keys=keys, tail=tail)
        keys, todo = self._store_todo(tokens, start, keys, tail)
        if skip_existing and todo:
            if self._conns is None:
                todo = self._local_absent(keys, todo)
            else:
                absent: list[int] = []
                for batch in self._batches(todo):
                    absent += self._absent_of(batch, await self._exists_each([keys[i] for i in batch]))
                todo = absent
        self._count_skipped(keys, start, todo)
        if not todo:
            return 0
        ttl_ms = self.ttl_ms(ttl_class, ttl)
        plain = self._conns is not None and await self._is_plain()
        end = len(tokens) if tail else None
        for batch in self._batches(todo):
            cmds = [self._store_command(keys[i], ttl_ms, self._sealed(keys[i], self._chunk_parts(kv, i, end=end), ttl_ms),
                                        plain) for i in batch]
            if self._conns is not None:
                self._raise_first(await self._roundtrip(cmds))
        self._count(stored_chunks=len(todo))
        return len(todo)

    @contextlib.asynccontextmanager
    async def reserve(self, tokens: Sequence[int], shape: Sequence[int], *, dtype: str | None = None,
                      start: int = 0, ttl_class: str | None = None, ttl: float | None = None,
                      keys: list[bytes] | None = None) -> AsyncIterator[Slots]:
        """``KVCacheClient.reserve`` as ``async with client.reserve(tokens, shape) as slots:``: the same slots
        (views of the staging segment with a local server, else ordinary arrays), stored when the block ends.
        A synchronous client does the reserving and the committing in worker threads (the hashing and the
        copies must not run on the event loop); ``await slots.done(i)`` commits slot ``i`` at once."""
        if self.local is None and await self._plane():
            assert self._local is not None
            sync = self._local
        else:
            sync = self._sync_reader()
        sync.namespace = self.namespace
        block = sync.reserve(tokens, shape, dtype=dtype, start=start, ttl_class=ttl_class, ttl=ttl, keys=keys)
        slots = await asyncio.to_thread(block.__enter__)
        try:
            yield _AsyncSlots(slots)
        except BaseException as exc:
            # The block's exception goes into the synchronous block (which gives the room back) and is raised.
            if not await asyncio.to_thread(block.__exit__, type(exc), exc, exc.__traceback__):
                raise
        else:
            await asyncio.to_thread(block.__exit__, None, None, None)

    async def retrieve_chunks(self, tokens: Sequence[int], max_tokens: int | None = None, skip_chunks: int = 0,
                              keys: list[bytes] | None = None) -> tuple[int, list[np.ndarray]]:
        """(n_tokens, decoded chunk arrays) for the leading cached chunks of ``tokens``, as
        ``KVCacheClient.retrieve_chunks`` (``skip_chunks``: held by the caller already, counted, not read;
        ``keys``: those of ``tokens[:max_tokens]``). With ``overlap`` (the default) the next window's MGET is
        sent before the current window is decoded, and its reply is read by a task meanwhile; large or
        compressed windows are decoded in a thread so that the loop is free to."""
        if keys is None:
            keys = self.keys(tokens if max_tokens is None else tokens[:max_tokens])
        out: list[np.ndarray] = []
        first = min(skip_chunks, len(keys))
        i = self._local_prefix(keys, first, out)
        self._count(local_hits=i - first)
        if i < len(keys) and self._conns is not None:
            plain = await self._is_plain()
            if self.overlap:
                i = await self._read_overlapped(keys, i, out, plain)
            else:
                while i < len(keys):
                    batch, ahead = self._plan_window(keys, i, self.batch_size)
                    values = await self._recv_and_release(*await self._send_window(batch, ahead, plain))
                    n = self._decode_window(batch, values, out)
                    i += n
                    if n < len(batch):
                        break
        self._count(hit_chunks=i, miss_chunks=min(1, len(keys) - i))  # as the sync client counts
        return i * self.chunk_size, out

    async def _send_window(self, keys: list[bytes], ahead: list[bytes],
                           plain: bool) -> tuple[AsyncFastClient, int]:
        """Send PREFETCH ``ahead`` and MGET ``keys`` in one write on a pooled connection; returns it and the
        number of replies to read. Sending here, not in the reading task, puts the request on the wire before
        the caller goes on to decode, even when it decodes on the event loop."""
        before, mget = self._window_commands(keys, ahead, plain)
        cmds = [mget] if before is None else [before, mget]
        assert self._conns is not None
        conn = await self._conn()
        try:
            await conn.send_many(cmds)
        except BaseException as exc:
            self._conns.put(conn, False)
            if isinstance(exc, OSError):
                raise socket_error(exc, "sending a read") from exc
            raise
        return conn, len(cmds)

    async def _recv_window(self, conn: AsyncFastClient, n_replies: int) -> list[Any]:
        """Read the replies of ``_send_window``; returns the MGET's values. The connection is given back by the
        caller (``_done_with``), not here: a task cancelled before it started never runs its own ``finally``."""
        reply = None
        try:
            if n_replies > 1:  # the window's PREFETCH: a hint, whose refusal does not fail the read
                try:
                    await conn.read_reply()
                except RespError as exc:
                    self._hint_refused(exc)
            reply = await conn.read_reply()
        except RespError as exc:
            raise reply_error(str(exc)) from None
        except OSError as exc:
            raise socket_error(exc, "reading") from exc
        return reply  # type: ignore[return-value]

    async def _done_with(self, conn: AsyncFastClient, clean: bool) -> None:
        """Give ``conn`` back: kept when every reply was read (``clean``), else closed (replies may be left
        unread: an error, a dropped window)."""
        assert self._conns is not None
        self._conns.put(conn, clean)

    async def _recv_and_release(self, conn: AsyncFastClient, n_replies: int) -> list[Any]:
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
            c.local = self.local  # one local tier too
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

    async def _checked(self, commands: list[list[Any]], doing: str) -> list[Any]:
        """``_exchange``'s replies, its first error raised (as redis-py's pipeline raises it)."""
        replies, _ = await self._exchange(commands, doing)
        self._raise_first(replies)
        return replies

    async def prefetch(self, tokens: Sequence[int], max_chunks: int | None = None) -> int:
        keys = self.keys(tokens)[:max_chunks]
        if not keys or self._conns is None or await self._is_plain():
            return 0
        return sum(int(n) for n in await self._checked(
            [["TAIR.KV.PREFETCH", *batch] for batch in self._batches(keys)], "prefetching"))

    async def delete(self, tokens: Sequence[int]) -> int:
        keys = self.keys(tokens)
        if self.local is not None:
            for k in keys:
                self.local.delete(k)
        if not keys or self._conns is None:
            return 0
        return sum(int(n) for n in await self._checked([["DEL", *batch] for batch in self._batches(keys)],
                                                       "deleting"))

    async def clear(self) -> int:
        prefix = self.namespace.prefix
        if self.local is not None:
            self.local.clear(prefix)
        if self._conns is None:
            return 0
        keys: list[bytes] = []
        cursor: Any = b"0"
        while True:  # every page first, then the deletes (as the sync client)
            ((cursor, found),) = await self._checked([self._scan_command(cursor, prefix + b"*")], "scanning")
            keys += found
            if int(cursor) == 0:
                break
        return sum(int(n) for n in await self._checked(
            [["DEL", *batch] for batch in self._batches(keys, CLEAR_BATCH)], "deleting"))


class _AsyncSlots(Slots):
    """``AsyncKVCacheClient.reserve``'s slots: ``await slots.done(i)`` commits slot ``i`` in a worker thread (its
    hash must not run on the event loop)."""

    def __init__(self, slots: Slots) -> None:
        super().__init__(list(slots), slots._commit)

    async def done(self, i: int) -> None:  # type: ignore[override]
        if self._commit is not None:
            await asyncio.to_thread(self._commit, i)
