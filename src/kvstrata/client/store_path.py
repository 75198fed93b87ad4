"""The sync client's store transport: pipelined writes on the socket, or two-phase writes through staging.

``_StorePath`` is a part of ``KVCacheClient`` (it uses the connection state set up in its ``__init__``):
``_roundtrip`` sends a batch of writes in vectored writes on this thread's ``FastClient``, and
``_stager``/``_put_staged`` store without the socket when the server is local: pulled by the server out of
this process (``kvstrata.client.pull_store``), or through this client's staging segment
(``kvstrata.client.stage``, imported on first use), falling back to the socket. ``reserve`` hands an engine
the room of its next chunks to write its KV into (the staging segment itself when the server is local).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from kvstrata.client.codec import CHECKSUM_OFFSET, DTYPES, parts_nbytes, raw_header, seal_parts
from kvstrata.client.fast import pack, sendmsg_all
from kvstrata.client.planning import _Base
from kvstrata.client.pull_store import PullRefused, pull_refused, pull_writer
from kvstrata.client.rediserrors import reply_error, socket_error

log = logging.getLogger("kvstrata.client")


class _StorePath(_Base):
    """How a batch of writes reaches the server (a mixin of ``KVCacheClient``)."""

    # ---- raw transport ----
    def _store_conn(self) -> Any:
        """This thread's ``FastClient`` for writes, fresh when the one it had went stale while idle (what a
        pool checks before lending a connection). Connection, TLS, AUTH and SELECT failures raise as redis-py's
        exceptions."""
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

    # ---- two-phase writes through a staging segment (kvstrata.client.stage) ----
    # stage_writes is on by default: with numpy block copies and resident pages, staged stores beat the store
    # through the Unix socket in every case of every same-run comparison on the 2-core VM (BENCHMARKS.md,
    # "Store: block copies, resident pages, reserve"); stage_writes=False keeps stores on the socket.

    def _forget_stager(self, sw: Any) -> None:
        """This thread's StageWriter (or PullWriter) failed: it is not used again (the next store makes a new one)."""
        if getattr(self._tls, "pull", None) is sw:
            self._tls.pull = None
        else:
            self._tls.stage = None
        with self._lock:
            if sw in self._fast_clients:
                self._fast_clients.remove(sw)

    def _stager(self) -> Any:
        """This thread's writer for stores that skip the socket, else None: a ``PullWriter`` when the server pulls
        the values out of this process (``kvstrata.client.pull_store``: no copy on this side), else the
        ``StageWriter`` of ``_segment_writer``."""
        pw = pull_writer(self)
        return pw if pw is not None else self._segment_writer()

    def _segment_writer(self) -> Any:
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

            try:
                sw = self._open_local("stage", StageWriter, StageUnavailable)
            except (StageUnavailable, OSError, RespError) as exc:
                log.info("kvstrata: storing over the socket (no staging segment: %s)", exc)
                self._stage_ok = False
                return None
        return sw

    def _put_staged(self, sw: Any, items: list[tuple[bytes, int, list[Any]]]) -> None:
        """Store ``items`` (unsealed: ``encode_chunk(sealed=False)``) through the staging segment, each value's
        codec checksum filled in as it is copied (``SUMAT``); a connection failure retries them over the socket."""
        from kvstrata.client.fast import RespError

        try:
            replies = sw.put_many(items, CHECKSUM_OFFSET)
        except PullRefused as exc:  # pull stores are off for this client now (logged once): stage this batch
            pull_refused(self, exc)
            sw = self._segment_writer()
            if sw is not None and all(sw.fits(parts_nbytes(p)) for _, _, p in items):
                return self._put_staged(sw, items)
            replies = self._roundtrip([["TAIR.KV.SETEX", k, t, seal_parts(list(p))] for k, t, p in items])
        except RespError as exc:  # a reservation refused for another reason than memory: this batch by socket
            log.info("kvstrata: staging refused (%s); storing this batch over the socket", exc)
            replies = self._roundtrip([["TAIR.KV.SETEX", k, t, seal_parts(list(p))] for k, t, p in items])
        except (OSError, ConnectionError) as exc:
            log.warning("kvstrata: staged write failed (%s); storing over the socket", exc)
            self._forget_stager(sw)
            with contextlib.suppress(OSError):
                sw.close()
            replies = self._roundtrip([["TAIR.KV.SETEX", k, t, seal_parts(list(p))] for k, t, p in items])
        self._raise_first([reply_error(str(r)) if isinstance(r, RespError) else r for r in replies])
        self._count(bytes_sent=sum(parts_nbytes(parts) for _, _, parts in items))

    # ---- KV written in place by the caller ----
    @contextlib.contextmanager
    def reserve(self, tokens: Sequence[int], shape: Sequence[int], *, dtype: str | None = None, start: int = 0,
                ttl_class: str | None = None, ttl: float | None = None,
                keys: list[bytes] | None = None) -> Iterator[Slots]:
        """Room for the KV of ``tokens``' full chunks from token ``start``, stored when the block ends::

            with client.reserve(tokens, (layers, 2, heads, client.chunk_size, dim)) as slots:
                for i, slot in enumerate(slots):    # C-contiguous numpy arrays, one per chunk
                    torch.from_numpy(slot).copy_(kv_chunk(i))   # or the engine's device-to-host copy
                    slots.done(i)                   # optional: commit this one now

        ``shape``: one chunk's tensor shape (the namespace's layout, its T axis ``chunk_size``); ``dtype``: a
        codec dtype name (default the namespace's ``kv_dtype``; bfloat16 slots are uint16 arrays:
        ``torch.from_numpy(slot).view(torch.bfloat16)``). With a local server, ``stage_writes`` and the raw codec
        the slots are views of this client's staging segment, payload 64-byte aligned: each value is hashed once
        and committed (the server verifies its own copy) when the block ends, or as soon as ``slots.done(i)``
        says slot ``i`` is filled (hashed while still in cache, verified while the next is written), so the
        caller's copy into the slots is the only one this client makes. Otherwise they are ordinary arrays,
        stored with ``store`` on exit. An exception in the block stores nothing but the slots already marked
        done; the slots must not be used after the block."""
        keys, todo = self._store_todo(tokens, start, keys)
        ttl_ms = self.ttl_ms(ttl_class, ttl)
        name = dtype or self.namespace.kv_dtype
        if name not in DTYPES:
            raise ValueError(f"unsupported dtype {name!r}; known: {', '.join(DTYPES)}")
        shape = tuple(int(n) for n in shape)
        storage = np.dtype(DTYPES[name][1])
        staged = self._stage_slots(keys, todo, ttl_ms, shape, name, storage)
        if staged is None:
            arrays = [np.empty(shape, storage) for _ in todo]
            yield Slots(arrays)
            by_chunk = dict(zip(todo, arrays, strict=True))
            cs = self.chunk_size
            self.store(tokens, lambda a, _b: _named(by_chunk[a // cs], name), start=start, skip_existing=False,
                       keys=keys)
            return
        sw, values = staged
        sent: list[Any] = []
        # While the block is open its StageWriter has COMMITs in flight whose replies are read at the end: no
        # other store may use it meanwhile (one in this thread, or, for the asyncio client, in the worker thread
        # that made it), so it leaves the thread's slot until the block ends.
        if getattr(self._tls, "stage", None) is sw:
            self._tls.stage = None

        def commit_now(i: int) -> None:
            if values[i] not in sent:
                sw.send_commit(values[i])
                sent.append(values[i])

        try:
            yield Slots([v.array for v in values], commit_now)
        except BaseException:
            # The slots marked done were sent: their replies are read (the connection stays in step); the rest
            # is given back. The block's own exception is the one raised.
            with contextlib.suppress(OSError, ConnectionError):
                if sent:
                    sw.commit_values(sent, sent)
                rest = [v for v in values if v not in sent]
                if rest:
                    sw.unreserve_values(rest)
            self._stager_back(sw)
            raise
        try:
            self._commit_slots(sw, values, sent)
        finally:
            self._stager_back(sw)

    def _stager_back(self, sw: Any) -> None:
        """A reservation block's StageWriter, its replies all read: this thread's again, unless it failed
        (forgotten) or the thread made another meanwhile (then it is closed)."""
        with self._lock:
            alive = sw in self._fast_clients and sw.sock.fileno() >= 0
        if alive and getattr(self._tls, "stage", None) is None:
            self._tls.stage = sw
        elif alive:
            self._close_stager(sw)

    def _close_stager(self, sw: Any) -> None:
        with self._lock:
            if sw in self._fast_clients:
                self._fast_clients.remove(sw)
        with contextlib.suppress(OSError):
            sw.close()

    def _stage_slots(self, keys: list[bytes], todo: list[int], ttl_ms: int, shape: tuple[int, ...], name: str,
                     storage: np.dtype) -> tuple[Any, list[Any]] | None:
        """(StageWriter, StagedValue per chunk of ``todo``) when they can be reserved in this client's staging
        segment, else None (no local server or staging, a local tier or a codec to apply, more than fits)."""
        from kvstrata.client.fast import RespError

        if not todo or self.redis is None or self.local is not None or self.compression != "raw":
            return None
        sw = self._segment_writer()
        if sw is None:
            return None
        header = raw_header(shape, name, self._layout())
        try:
            return sw, sw.stage_values([(keys[i], ttl_ms, header, shape, storage) for i in todo])
        except (ValueError, RespError) as exc:
            log.info("kvstrata: reserving in ordinary memory (%s)", exc)
            return None

    def _commit_slots(self, sw: Any, values: list[Any], sent: list[Any]) -> None:
        """Commit filled reservations (``sent``: those already sent by ``Slots.done``; any others held are given
        back); a connection lost on the way stores them over the socket from the mapping (still this process's
        memory)."""
        from kvstrata.client.fast import RespError

        try:
            replies = sw.commit_values(values, sent)
        except (OSError, ConnectionError) as exc:
            log.warning("kvstrata: staged commit failed (%s); storing over the socket", exc)
            self._forget_stager(sw)
            try:  # from its mapping (still this process's memory), so it is closed only once they are stored
                replies = self._roundtrip([["TAIR.KV.SETEX", v.key, v.ttl_ms,
                                            seal_parts([v.header, memoryview(v.array.reshape(-1).view(np.uint8))])]
                                           for v in values])
            finally:
                with contextlib.suppress(OSError):
                    sw.close()
        self._raise_first([reply_error(str(r)) if isinstance(r, RespError) else r for r in replies])
        self._count(bytes_sent=sum(v.nbytes for v in values), stored_chunks=len(values))


class Slots(list[np.ndarray]):
    """The arrays ``KVCacheClient.reserve`` yields; ``done(i)``: slot ``i`` is filled, commit it now (a no-op when
    the slots are ordinary arrays, stored when the block ends)."""

    def __init__(self, arrays: list[np.ndarray], commit: Any = None) -> None:
        super().__init__(arrays)
        self._commit = commit

    def done(self, i: int) -> None:
        if self._commit is not None:
            self._commit(i)


def _named(arr: np.ndarray, name: str) -> Any:
    """``arr`` as the codec will name its dtype: bfloat16 and float8 arrays (kept in uint storage) as torch views."""
    if arr.dtype.name == name:
        return arr
    import torch

    return torch.from_numpy(arr).view(getattr(torch, name))
