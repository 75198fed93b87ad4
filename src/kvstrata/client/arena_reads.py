"""The sync client's local data plane: reads in place from a local server's shared-memory arena.

``_ArenaReads`` is a part of ``KVCacheClient`` (it uses the connection state set up in its ``__init__``):
finding the server's Unix socket, this thread's ``ArenaClient`` (``kvstrata.client.arena``, imported on first
use), leasing and decoding the leading chunks as views of the mapping, releasing the lease (docs/dataplane.md), and
the client's ``CopyPool`` that shares a large restore's copies out of the mapping (and into ``retrieve(out=)``
over the socket) among ``copy_threads`` threads.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from kvstrata.client.codec import CodecError, FormatVersionError, decode
from kvstrata.client.copypool import CopyPool
from kvstrata.client.filler import _copied
from kvstrata.client.planning import _Base

log = logging.getLogger("kvstrata.client")


class _ArenaReads(_Base):
    """Reads through the server's arena (a mixin of ``KVCacheClient``)."""

    # ---- the local data plane (kvstrata.client.arena) ----
    def _arena_path(self) -> str | None:
        """The server's Unix socket: the URL's, or the one a loopback server reports (CONFIG GET unixsocket); asked
        once per client (the arena reader, the staging writer and the pull writer of every thread use it)."""
        try:
            return self._unix_path
        except AttributeError:
            self._unix_path: str | None = self._find_unix_path()
            return self._unix_path

    def _find_unix_path(self) -> str | None:
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
        try:  # on the SDK's own connection (a user without CONFIG gets no arena, not an error)
            reply = self._checked([["CONFIG", "GET", "unixsocket"]], "asking for the Unix socket")[0]
        except redis.RedisError:
            return None
        path = dict(zip(reply[::2], reply[1::2], strict=True)).get(b"unixsocket") if isinstance(reply, list) else None
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

            try:
                ac = self._open_local("arena", ArenaClient, ArenaUnavailable, lease_ms=self.lease_ms)
            except (ArenaUnavailable, OSError, RespError) as exc:
                log.info("kvstrata: reading over the socket (no shared-memory arena: %s)", exc)
                self._arena_ok = False
                return None
        return ac

    def _open_local(self, attr: str, cls: Any, unavailable: type[Exception], **kw: Any) -> Any:
        """A new ``cls`` connection (ArenaClient, StageWriter, PullWriter) on the server's Unix socket with this
        client's credentials, kept as this thread's ``attr`` and closed with the client; raises ``unavailable``
        without a local socket, or what the connection raised."""
        path = self._arena_path()
        if path is None:
            raise unavailable("no local Unix socket")
        conn_kw = self.pool.connection_kwargs
        conn = cls(path, password=conn_kw.get("password"), username=conn_kw.get("username"),
                   timeout=conn_kw.get("socket_timeout"), **kw)
        setattr(self._tls, attr, conn)
        with self._lock:
            self._fast_clients.append(conn)
        return conn

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
            out.extend(_copied(mine, self._copier()))
            ac.release(lease)
        else:
            out.extend(mine)
            self._tls.lease = lease
        return first + n

    def _copier(self) -> CopyPool:
        """The pool of ``copy_threads`` threads that shares this client's large copies (threads started on its
        first parallel copy, ended by ``close()``)."""
        pool = self._copies
        if pool is None:
            with self._lock:
                if self._copies is None:
                    self._copies = CopyPool(self.copy_threads)
                pool = self._copies
        return pool

    def _close_copier(self) -> None:
        with self._lock:
            pool, self._copies = self._copies, None
        if pool is not None:
            pool.close()

    def _arena_done(self) -> None:
        lease = getattr(self._tls, "lease", 0)
        ac = getattr(self._tls, "arena", None)
        if lease and ac is not None:
            ac.release(lease)
        self._tls.lease = 0
