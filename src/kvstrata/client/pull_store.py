"""The client side of pull stores: the server copies each value straight out of this process's memory.

``PullWriter`` is a ``FastClient`` on a local server's Unix socket. For each value it sends ``TAIR.KV.PULL key ttl
head RANGES packed``: the codec's small header inline, and the addresses of the payload where it lies (a chunk
sliced out of a KV tensor along its token axis as its contiguous runs, one range per layer, K/V and head, packed as
u64 pairs in one bulk string; decimal arguments for a server from before that form), so the client neither copies
nor hashes anything; the server reads the ranges with ``process_vm_readv`` into the value's arena slot and computes
the codec checksum over its own copy (``SUMAT``). The caller's arrays must stay unchanged until the reply
(``put_many`` returns only then): the value is whatever they held while the server copied them.

``pull_writer(client)`` is the SDK's hook (``KVCacheClient``'s store path): this thread's writer when the server is
local, ``client.pull_store`` (default: ``$KVSTRATA_PULL_STORE``, on unless ``0``/``no``/``false``) and
``stage_writes`` are on, and a probe succeeded (``TAIR.KV.PULLPROBE``: the server read a buffer of this process and
hashed it right). A refusal (an older server, ``pull-store no``, the kernel's ptrace rules: another user, Yama
``ptrace_scope``, seccomp in a container) turns pull stores off for that client, logged once, and the store path
falls back to the staging segment. Design and security model: docs/dataplane.md."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from kvstrata.client.fast import FastClient, RespError
from kvstrata.client.rediserrors import acl_refused

log = logging.getLogger("kvstrata.client")


class PullUnavailable(Exception):
    """The server does not pull from this process (not local, not kvstrata, disabled, not permitted)."""


class PullRefused(RespError):
    """The server refused to read this process's memory in a store (disabled, or the kernel said no)."""


def _refusal(exc: RespError) -> bool:
    text = str(exc)
    return (acl_refused(exc) or "pull stores are disabled" in text or "unknown command" in text.lower()
            or "only on the Unix socket" in text)


def address(buf: Any) -> int:
    """The address of a contiguous buffer's first byte (read-only buffers too)."""
    return int(np.frombuffer(buf, np.uint8).ctypes.data) if len(memoryview(buf)) else 0


def array_ranges(arr: np.ndarray) -> np.ndarray:
    """Rows of (address, length), u64, of ``arr``'s bytes in C order: one range when it is contiguous, else one
    per block of its trailing contiguous axes (a chunk of an LKHTD tensor: one per layer, K/V and head)."""
    if arr.size == 0:
        return np.empty((0, 2), np.uint64)
    if arr.flags.c_contiguous:
        return np.array([[arr.ctypes.data, arr.nbytes]], np.uint64)
    run = arr.itemsize
    k = arr.ndim
    while k > 0 and (arr.shape[k - 1] == 1 or arr.strides[k - 1] == run):
        run *= arr.shape[k - 1]
        k -= 1
    offsets = np.zeros(1, np.int64)
    for ax in range(k):
        offsets = (offsets[:, None] + np.arange(arr.shape[ax], dtype=np.int64) * arr.strides[ax]).reshape(-1)
    rows = np.empty((len(offsets), 2), np.uint64)
    rows[:, 0] = offsets + int(arr.ctypes.data)
    rows[:, 1] = run
    return rows


def value_ranges(parts: Sequence[Any]) -> tuple[bytes, np.ndarray, list[Any]]:
    """(head, ranges, keep) for ``parts`` = [codec header, payload...] (``codec.prepare_parts``; a strided chunk
    given as the array itself): the header goes inline, the payload by address (rows of address and length,
    adjacent ranges merged). ``keep``: copies made of payload parts that are not contiguous buffers, alive until
    the server has read them."""
    head = bytes(parts[0])
    pieces: list[np.ndarray] = []
    keep: list[Any] = []
    for p in parts[1:]:
        if isinstance(p, np.ndarray):
            pieces.append(array_ranges(p))
            continue
        mv = p if isinstance(p, memoryview) else memoryview(p)
        if not mv.c_contiguous:
            mv = memoryview(mv.tobytes())
            keep.append(mv)
        if mv.nbytes:
            pieces.append(np.array([[address(mv), mv.nbytes]], np.uint64))
    if not pieces:
        return head, np.empty((0, 2), np.uint64), keep
    rows = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    joined = rows[1:, 0] == rows[:-1, 0] + rows[:-1, 1]  # follows the previous range in memory
    if joined.any():
        first = np.flatnonzero(np.concatenate(([True], ~joined)))  # each merged range's first row
        rows = np.stack([rows[first, 0], np.add.reduceat(rows[:, 1], first)], axis=1)
    return head, rows, keep


def packed_ranges(ranges: Any) -> bytes:
    """``ranges`` (rows or pairs of address and length) in ``RANGES``' packed form: u64 little-endian, 16 bytes a
    range."""
    return np.ascontiguousarray(ranges, "<u8").tobytes()


def pull_command(key: Any, ttl_ms: int, head: bytes, ranges: Any, sum_at: int | None = None) -> bytes:
    """``TAIR.KV.PULL`` with decimal ranges, as RESP bytes, for a server from before the packed form: a chunk has
    hundreds of ranges, which the generic packer would cost milliseconds per chunk to encode (measured: 3 ms of a
    106 ms Qwen2.5-7B store per 14 MB chunk). The packed form has a handful of arguments: ``fast.pack`` it."""
    rows = np.asarray(ranges, np.uint64).reshape(-1, 2).tolist()
    words = [b"TAIR.KV.PULL", bytes(key), b"%d" % ttl_ms, head, b"%d" % len(rows)]
    words += [b"%d" % x for r in rows for x in r]
    if sum_at is not None:
        words += [b"SUMAT", b"%d" % sum_at]
    return b"*%d\r\n" % len(words) + b"".join([b"$%d\r\n%s\r\n" % (len(w), w) for w in words])


MPULL_VALUES = 64  # values per TAIR.KV.MPULL: a store of more sends several, pipelined


class PullWriter(FastClient):
    """A Unix-socket client whose values the server pulls out of this process (module docstring)."""

    def __init__(self, unix_path: str, *, password: str | None = None, username: str | None = None,
                 timeout: float | None = 60.0) -> None:
        super().__init__(unix_path=unix_path, timeout=timeout, password=password, username=username)
        self.pid = os.getpid()  # the process the server reads: a forked child must not use this connection
        self.packed = True  # ranges as one bulk string (RANGES); False for a server that only takes decimals
        self.multi = False  # several values per command (TAIR.KV.MPULL), where the server has it (probe)
        try:
            self.probe()
        except BaseException:
            self.sock.close()
            raise

    def probe(self) -> None:
        """PullUnavailable unless the server reads a buffer of this process exactly; learns whether it takes
        packed ranges (``RANGES``: a server from before them answers a syntax error, and gets decimals)."""
        buf = bytearray(os.urandom(4096))
        try:
            try:
                reply = self.call(b"TAIR.KV.PULLPROBE", b"RANGES", packed_ranges([(address(buf), len(buf))]))
            except RespError as exc:
                if _refusal(exc) or "decimal" not in str(exc):
                    raise
                self.packed = False
                reply = self.call(b"TAIR.KV.PULLPROBE", address(buf), len(buf))
        except RespError as exc:
            raise PullUnavailable(str(exc)) from None
        if int(reply, 16) != xxhash.xxh3_64_intdigest(bytes(buf)):
            raise PullUnavailable("the server read other bytes than this process holds")
        if self.packed:
            try:
                self.multi = self.call(b"TAIR.KV.MPULL", -1) == []
            except RespError:  # a server from before it (or an ACL that allows PULL only): one PULL a value
                self.multi = False

    @staticmethod
    def fits(n: int) -> bool:
        """Any value can be pulled (the store path asks the staging writer the same)."""
        return n > 0

    def put_many(self, items: Sequence[tuple[Any, int, Sequence[Any]]], sum_at: int | None = None) -> list[Any]:
        """Store each (key, ttl_ms, parts); one reply per item (the new version, or a RespError). The commands are
        pipelined; the parts must not change until this returns. PullRefused when the server refused to pull
        (some items may be stored: the caller stores the batch again another way)."""
        keep: list[Any] = []
        values = []
        for key, ttl_ms, parts in items:
            head, ranges, kept = value_ranges(parts)
            keep += kept
            values.append((key, ttl_ms, head, ranges))
        out: list[Any] = []
        if self.multi and len(values) > 1:
            # One command for up to MPULL_VALUES values: the server hands them to its worker once, not per value.
            groups = [values[i:i + MPULL_VALUES] for i in range(0, len(values), MPULL_VALUES)]
            self.send_many([[b"TAIR.KV.MPULL", -1 if sum_at is None else sum_at,
                             *(x for k, t, h, r in group for x in (k, t, h, packed_ranges(r)))] for group in groups])
            for group in groups:
                try:
                    got = self.read_reply()
                except RespError as exc:  # the whole command refused
                    got = [exc] * len(group)
                out += got
            return self._checked(out)
        if self.packed:
            sums = [b"SUMAT", sum_at] if sum_at is not None else []
            self.send_many([[b"TAIR.KV.PULL", k, t, h, b"RANGES", packed_ranges(r), *sums] for k, t, h, r in values])
        else:
            self.sock.sendall(b"".join(pull_command(k, t, h, r, sum_at) for k, t, h, r in values))
        for _ in items:
            try:
                out.append(self.read_reply())
            except RespError as exc:
                out.append(exc)
        return self._checked(out)

    @staticmethod
    def _checked(out: list[Any]) -> list[Any]:
        """``out``, unless the server refused to pull at all (PullRefused: the caller stores another way)."""
        refused = next((r for r in out if isinstance(r, RespError) and _refusal(r)), None)
        if refused is not None:
            raise PullRefused(str(refused))
        return out


def pull_writer(client: Any) -> PullWriter | None:
    """This thread's ``PullWriter`` for ``client`` (a ``KVCacheClient``) when the server pulls from this process,
    else None (decided once per client; a new writer in a forked child)."""
    enabled = getattr(client, "pull_store", None)
    if enabled is None:
        enabled = os.environ.get("KVSTRATA_PULL_STORE", "1").lower() not in ("0", "no", "false", "off")
    # stage_writes=False keeps every store on the socket, as it always has.
    if not enabled or not getattr(client, "_stage_ok", False) or not getattr(client, "stage_writes", True) \
            or getattr(client, "_pull_off", False) or client.redis is None:
        return None
    pw = getattr(client._tls, "pull", None)
    if pw is not None and (pw.pid != os.getpid() or pw.sock.fileno() < 0):
        pw = None  # a forked child (the server would read the parent), or closed by close() from another thread
    if pw is None:
        try:
            pw = client._open_local("pull", PullWriter, PullUnavailable)
        except (PullUnavailable, OSError, RespError) as exc:
            pull_refused(client, exc)
            return None
    return pw


def pull_refused(client: Any, exc: BaseException) -> None:
    """Pull stores are off for ``client`` from now on (logged once, with why); its writers are closed."""
    if not getattr(client, "_pull_off", False):
        # The server's default (pull-store no) is not news: every local client of such a server would say it.
        level = logging.DEBUG if "(pull-store no)" in str(exc) else logging.INFO
        log.log(level, "kvstrata: the server does not pull stores from this process (%s); storing through the "
                "staging segment or the socket", exc)
    client._pull_off = True
    pw = getattr(client._tls, "pull", None)
    if pw is not None:
        client._tls.pull = None
        with client._lock:
            if pw in client._fast_clients:
                client._fast_clients.remove(pw)
        with contextlib.suppress(OSError):
            pw.close()
