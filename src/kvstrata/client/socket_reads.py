"""The sync client's reads over the socket: per-thread FastClient, reusable buffers, overlapped windows, scatter.

``_SocketReads`` is a part of ``KVCacheClient`` (it uses the connection state set up in its ``__init__``):
this thread's ``FastClient`` (``kvstrata.client.fast``) receiving values straight into reusable buffers, the
fetch thread that reads window k+1 while window k decodes, sequential and overlapped window reads, and the
scatter receive of ``retrieve(out=)`` straight into the destination (``kvstrata.client.scatter``).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from kvstrata.client.codec import CodecError, FormatVersionError
from kvstrata.client.planning import _Base
from kvstrata.client.scatter import mget_scatter

if TYPE_CHECKING:
    from kvstrata.client.filler import _Filler

log = logging.getLogger("kvstrata.client")


class _SocketReads(_Base):
    """Reads over this thread's connection (a mixin of ``KVCacheClient``)."""

    # ---- reads into reusable buffers (kvstrata.client.fast) ----
    def _fast(self) -> Any:
        """This thread's ``FastClient``: the SDK's connection for every command (TCP, TLS or a Unix socket, with
        the URL's database selected: ``kvstrata.client.endpoint``), or None without a server."""
        if not self._fast_ok:
            return None
        fc = getattr(self._tls, "fast", None)
        if fc is None:
            from kvstrata.client.fast import FastClient

            if self._connect_args is None:
                from kvstrata.client.endpoint import transport_args

                self._connect_args = transport_args(self.pool)
            fc = FastClient(**self._connect_args)
            fc.keep_bytearrays = True  # retrieve_chunks' values: decoded in place, never changed
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

    def _bufs(self) -> list[bytearray]:
        """This thread's reusable receive buffers: the arrays ``retrieve_chunks(reuse_buffers=True)`` returns are
        views of them, whichever thread's connection received the bytes."""
        bufs = getattr(self._tls, "bufs", None)
        if bufs is None:
            bufs = self._tls.bufs = []
        return bufs

    def _mget_into(self, keys: list[bytes], bufs: list[bytearray], offset: int,
                   before: list[bytes] | None = None, command: bytes = b"TAIR.KV.MGET") -> list[memoryview | None] | None:
        """``command`` (the window's MGET) on this thread's FastClient into ``bufs[offset ..]`` (a call's other
        windows keep theirs), after ``before`` in the same write; None when that path is unavailable."""
        if not self._size_hint:
            return None
        from kvstrata.client.fast import RespError, ValueTooLarge

        try:
            fc = self._fast()
        except (OSError, RespError):
            return None  # cannot connect: read as bytes (_small), which raises redis-py's error
        if fc is None:
            return None

        while len(bufs) < offset + len(keys):
            bufs.append(bytearray(self._size_hint))
        for j in range(offset, offset + len(keys)):
            if len(bufs[j]) < self._size_hint:
                bufs[j] = bytearray(self._size_hint)
        mine = bufs[offset: offset + len(keys)]
        try:
            lengths = fc.mget_into(keys, mine, before, command, self._hint_refused)
        except ValueTooLarge:
            return None  # read again as bytes (_small), which raises the size hint
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

    def _fetch_window(self, keys: list[bytes], ahead: list[bytes], plain: bool, bufs: list[bytearray] | None,
                      offset: int) -> list[Any]:
        """PREFETCH ``ahead``, then MGET ``keys`` (into ``bufs[offset ..]`` when given and possible), in one round
        trip (``_window_commands``)."""
        prefetch, mget = self._window_commands(keys, ahead, plain)
        values = self._mget_into(keys, bufs, offset, prefetch, mget[0]) if bufs is not None else None
        if values is None:  # values as bytes, on the same connection
            replies = self._small([mget] if prefetch is None else [prefetch, mget], "reading")
            if prefetch is not None and isinstance(replies[0], Exception):
                self._hint_refused(replies[0])
            self._raise_first(replies[-1:])
            values = replies[-1]
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
        (on a new connection, or it raises redis-py's error): the slot being filled is never counted."""
        from kvstrata.client.fast import RespError

        try:
            fc = self._fast()
        except (OSError, RespError):
            return None  # cannot connect: the windowed read below tries once more, or raises redis-py's error
        if fc is None:
            return None

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
                n = mget_scatter(fc, batch, filler.place, before, mget[0], on_value, on_error,
                                 self._hint_refused)
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
