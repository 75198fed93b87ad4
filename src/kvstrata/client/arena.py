"""The client side of the local data plane: map the server's arena read-only and read values in place.

``ArenaClient`` is a ``FastClient`` on the server's Unix socket. On connect (after AUTH) it sends
``TAIR.KV.ARENA``; the reply carries a read-only descriptor of the server's shared-memory arena (SCM_RIGHTS),
which it maps ``PROT_READ``. ``mgetref`` then answers where each value lies in that mapping under one lease:
the caller copies the bytes once, straight from the server's memory into its own buffers (or a GPU through
DMA, ``register_cuda``), and the lease is given back with the next request (no round trip of its own).

A value the server could not place in the arena comes back inline (bytes); a missing one as None.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import xxhash

from kvstrata.client import streamcopy
from kvstrata.client.fast import FastClient, RespError, _bytes_view


class Ref(NamedTuple):
    """Where one leased value lies in the arena."""

    offset: int
    length: int
    version: int
    checksum: int | None  # xxh3-64 of the value's bytes; None when asked without (``checksums=False``)


class ArenaUnavailable(Exception):
    """The server does not share an arena with this client (not a kvstrata server, arena off, not Unix)."""


class ArenaClient(FastClient):
    """A Unix-socket client with the server's arena mapped read-only (module docstring)."""

    def __init__(self, unix_path: str, *, password: str | None = None, username: str | None = None,
                 timeout: float | None = 60.0, lease_ms: int = 10_000) -> None:
        super().__init__(unix_path=unix_path, timeout=timeout, password=password, username=username)
        self.path = unix_path
        self.lease_ms = lease_ms
        self._pending: list[int] = []  # leases to give back with the next request
        self._cuda_registered = False
        try:
            self.mm, self.size = self._attach()
        except BaseException:
            self.sock.close()
            raise
        self.view = memoryview(self.mm)

    def _attach(self) -> tuple[mmap.mmap, int]:
        return self.map_passed_fd(b"TAIR.KV.ARENA", mmap.PROT_READ, ArenaUnavailable, "arena")

    # ---- reads by reference ----
    def mgetref(self, keys: Sequence[Any], lease_ms: int | None = None, *,
                checksums: bool = True) -> tuple[int, list[Ref | bytes | None]]:
        """(lease, one Ref / inline bytes / None per key); give the lease back with ``release``. ``checksums=False``
        (NOSUM): the server does not hash values it has no checksum for yet (a pass over each, on its core, while
        this client waits), and each ``Ref.checksum`` is None."""
        cmds: list[list[Any]] = []
        if self._pending:
            cmds.append([b"TAIR.KV.RELEASE", *self._pending])
            self._pending = []
        cmd = [b"TAIR.KV.MGETREF", *keys, b"LEASE", int(lease_ms or self.lease_ms)]
        if not checksums:
            cmd.append(b"NOSUM")
        cmds.append(cmd)
        self.send_many(cmds)
        if len(cmds) == 2:
            self.read_reply()  # how many were released: some may have expired meanwhile, which is fine
        lease, raw = self.read_reply()
        refs: list[Ref | bytes | None] = []
        for r in raw:
            if r is None or isinstance(r, bytes):
                refs.append(r)
            else:
                refs.append(Ref(int(r[0]), int(r[1]), int(r[2]), None if r[3] is None else int(r[3], 16)))
        return int(lease), refs

    def release(self, lease: int, *, now: bool = False) -> None:
        """Give a lease back: with the next request, or at once (``now``, one round trip)."""
        if lease:
            self._pending.append(lease)
        if now and self._pending:
            pending, self._pending = self._pending, []
            self.call(b"TAIR.KV.RELEASE", *pending)

    def value(self, ref: Ref | bytes | None) -> memoryview | bytes | None:
        """The bytes of one reference: a read-only view of the mapping (valid while its lease is held)."""
        if ref is None or isinstance(ref, bytes):
            return ref
        return self.view[ref.offset:ref.offset + ref.length]

    def read_into(self, keys: Sequence[Any], bufs: Sequence[Any], *, verify: bool = False) -> list[int | None]:
        """Copy each value into its buffer (one copy, from the server's memory): lengths, None when missing.
        ``verify`` checks each copy against the checksum the server answered with."""
        lease, refs = self.mgetref(keys, checksums=verify)
        try:
            out: list[int | None] = []
            for ref, buf in zip(refs, bufs, strict=True):
                data = self.value(ref)
                if data is None:
                    out.append(None)
                    continue
                n = len(data)
                dst = _bytes_view(buf)
                if n > dst.nbytes:
                    raise ValueError(f"value of {n} bytes does not fit a buffer of {dst.nbytes}")
                # streamed when large (kvstrata.client.streamcopy): numpy otherwise, the same bytes
                streamcopy.copy(np.frombuffer(dst, np.uint8, n), np.frombuffer(data, np.uint8))
                if verify and isinstance(ref, Ref) and xxhash.xxh3_64_intdigest(dst[:n]) != ref.checksum:
                    raise ValueError("arena copy does not match the server's checksum")
                out.append(n)
            return out
        finally:
            self.release(lease)

    # ---- GPU ----
    def register_cuda(self) -> bool:
        """Page-lock the mapping for the GPU (cudaHostRegister), so host-to-device copies from it are DMA.
        Read-only registration where the driver supports it; returns whether it is registered."""
        if self._cuda_registered:
            return True
        import torch

        if not torch.cuda.is_available():
            return False
        cudart = torch.cuda.cudart()
        ptr = _address(self.mm)
        # cudaHostRegisterReadOnly (8) where supported, else portable (1).
        for flags in (8 | 1, 1):
            if int(cudart.cudaHostRegister(ptr, self.size, flags)) == 0:
                self._cuda_registered = True
                return True
        return False

    def close(self) -> None:
        try:
            if self._pending:
                self.release(0, now=True)
        except (OSError, RespError, ConnectionError):
            pass
        if self._cuda_registered:
            import torch

            torch.cuda.cudart().cudaHostUnregister(_address(self.mm))
            self._cuda_registered = False
        self.view.release()
        try:
            self.mm.close()
        except BufferError:  # a caller still holds a view of the mapping: the GC unmaps it later
            pass
        super().close()


def _address(mm: mmap.mmap) -> int:
    """The address of a read-only mapping (ctypes' from_buffer needs a writable one; numpy does not)."""
    return int(np.frombuffer(mm, dtype=np.uint8).ctypes.data)
