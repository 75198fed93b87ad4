"""Pull stores: the server copies a value straight out of its local client's memory (``process_vm_readv``).

A client on the Unix socket names address ranges of *its own* memory (``TAIR.KV.PULL``); the server reads them
with Linux cross-memory attach (one kernel copy, no socket transfer, no staging segment, no copy on the
client), into a fresh arena slot, piece by piece, hashing each piece right after it lands, while it is in cache.
Whose memory is read is never the client's choice: it is the process that connected the socket (the peer's
credentials, ``SO_PEERPIDFD``/``SO_PEERCRED``), held as a pidfd so that a pid number reused by another process
is never read: the pidfd must still reach a live process after the copy (``pidfd_send_signal(fd, 0)``), and a
process alive at that point cannot have lent its pid to anyone in between. The kernel decides whether the
server may read that process at all (the ptrace access check: same user, or CAP_SYS_PTRACE; Yama's
``ptrace_scope``; seccomp filters in containers): a refusal is ``PullError`` with the NOPERM prefix.

The bytes stored are whatever the client's memory held while the copy ran (like a SET of a buffer the client
changes while sending it): the checksum is computed over the server's own copy, so what was stored is
consistent with itself, whatever the client did meanwhile. The command is in ``kvstrata.commands.pull``;
design and security model in docs/dataplane.md.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import errno
import os
import signal
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xxhash

from kvstrata.engine.copyalong import copy_along
from kvstrata.engine.staging import CommitJob

# Each piece lands in the slot with one process_vm_readv and is hashed right away, while it is in cache (1 MiB:
# the prototype's best, 0.52-0.55x memcpy for copy + hash on the 2-core VM).
PIECE = 1024 * 1024
IOV_MAX = 1024  # remote ranges one process_vm_readv takes (Linux UIO_MAXIOV)
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5; Python names it from 3.13 on
MAX_RANGE = 1 << 48  # bytes one range may name (packed form): more than a process maps, and sums cannot overflow
Ranges = Sequence[tuple[int, int]] | np.ndarray
"""(address, length) pairs, or rows of them (``parse_packed``, ``ranges_array``)."""


class PullError(Exception):
    """A pull the kernel or the bounds refused; the message is the reply's error text (with its prefix)."""


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc: Any = None


def _readv() -> Any:
    """libc's process_vm_readv (ctypes releases the GIL while it runs: the copy does not stop the loop)."""
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.process_vm_readv
        fn.restype = ctypes.c_ssize_t
        fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                       ctypes.c_ulong]
        _libc = fn
    return _libc


class Peer:
    """The process at the other end of a Unix-socket connection: ``pid`` and a pidfd of it. Reference-counted:
    ``hold`` for each user (a connection, a pull in flight), ``close`` by each; the pidfd is closed by the last,
    so a pull whose connection went away keeps a valid pidfd until its thread is done with it."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.refs = 1

    def hold(self) -> Peer:
        self.refs += 1
        return self

    def alive(self) -> bool:
        """Whether the process is still running (a dead one's pidfd says so even when its pid was reused)."""
        try:
            signal.pidfd_send_signal(self.pidfd, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # signalling refused, but it exists
            return True
        return True

    def close(self) -> None:
        self.refs -= 1
        if self.refs == 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)


def _pid_of(pidfd: int) -> int:
    with open(f"/proc/self/fdinfo/{pidfd}", encoding="ascii") as f:
        for line in f:
            if line.startswith("Pid:"):
                return int(line.split()[1])
    raise OSError(errno.ENOSYS, "no Pid in the pidfd's fdinfo")


def _started_s(pid: int) -> float:
    """When ``pid`` started, in seconds of CLOCK_BOOTTIME (``/proc/PID/stat`` field 22)."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def peer_of(sock: socket.socket, age_s: float) -> Peer:
    """The process that connected ``sock`` (a Unix-domain socket), connected ``age_s`` seconds ago.

    Linux >= 6.5 hands the peer's pidfd itself (``SO_PEERPIDFD``). Older kernels give its pid
    (``SO_PEERCRED``), opened with ``pidfd_open``; a process found there that started after the connection was
    made is not the one that connected (its pid was reused): refused. PullError when the peer is gone."""
    dup = socket.socket(fileno=os.dup(sock.fileno()))
    try:
        try:
            pidfd = dup.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                raise PullError("ERR the process that connected this socket is gone") from None
            pidfd = -1
        if pidfd >= 0:
            try:
                pid = _pid_of(pidfd)
            except OSError:
                pid = -1
            if pid <= 0:  # gone (-1), or in a PID namespace the server cannot see (0)
                os.close(pidfd)
                raise PullError("ERR the process that connected this socket is gone or not visible to the server")
            return Peer(pid, pidfd)
        pid, _uid, _gid = struct.unpack("3i", dup.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    finally:
        dup.close()
    try:
        pidfd = os.pidfd_open(pid)
        connected = time.clock_gettime(time.CLOCK_BOOTTIME) - age_s
        # /proc's start time has clock-tick resolution: a little slack for the process that connected.
        if _started_s(pid) > connected + 0.05:
            os.close(pidfd)
            raise PullError("ERR the process that connected this socket is gone (its pid is another's now)")
    except OSError:
        raise PullError("ERR the process that connected this socket is gone") from None
    return Peer(pid, pidfd)


def parse_ranges(words: Sequence[bytes], limit: int) -> list[tuple[int, int]]:
    """(address, length) pairs from ``addr len addr len ...`` (decimal), empty ones left out."""
    out: list[tuple[int, int]] = []
    for i in range(0, len(words), 2):
        try:
            addr, n = int(bytes(words[i])), int(bytes(words[i + 1]))
        except ValueError:
            raise PullError("ERR PULL ranges are decimal addresses and lengths") from None
        if addr < 0 or n < 0 or addr + n >= 1 << 64:
            raise PullError(f"ERR invalid PULL range {addr} {n}")
        if n:
            out.append((addr, n))
    if len(out) > limit:
        raise PullError(f"ERR too many PULL ranges ({len(out)}; at most {limit})")
    return out


def parse_packed(blob: bytes, limit: int) -> np.ndarray:
    """(address, length) rows from ``RANGES``' packed form: little-endian u64 pairs, 16 bytes a range (a KV chunk's
    few hundred ranges cost one bulk string instead of two decimal arguments each: no per-range parsing on either
    side). Empty ranges are left out; a range must end inside the 64-bit address space and be shorter than
    2**48 bytes (more than any process maps), so that no sum of them overflows. Few numpy calls: this runs on the
    event loop right after a large copy, with cold caches, where each one cost 3-5x its warm time."""
    if len(blob) % 16:
        raise PullError(f"ERR PULL RANGES takes 16 bytes a range (address and length, u64 little-endian); got "
                        f"{len(blob)} bytes")
    rows = np.frombuffer(blob, "<u8").reshape(-1, 2)
    if not rows[:, 1].all():
        rows = rows[rows[:, 1] != 0]
    if len(rows) > limit:
        raise PullError(f"ERR too many PULL ranges ({len(rows)}; at most {limit})")
    if len(rows):
        top_addr, top_len = (int(x) for x in rows.max(axis=0))
        if top_len >= MAX_RANGE or top_addr + top_len >= 1 << 64:  # an upper bound of every range's end
            for addr, n in rows.tolist():
                if n >= MAX_RANGE or addr + n >= 1 << 64:
                    raise PullError(f"ERR invalid PULL range {addr} {n}")
    return rows


def ranges_array(ranges: Ranges) -> np.ndarray:
    """``ranges`` as rows of (address, length), u64: the layout of ``struct iovec`` on 64-bit Linux."""
    return np.ascontiguousarray(np.asarray(ranges, dtype=np.uint64).reshape(-1, 2))


def _failed(err: int, addr: int, what: str) -> PullError:
    if err in (errno.EPERM, errno.EACCES):
        return PullError("NOPERM the server may not read this client's memory (process_vm_readv: "
                         f"{os.strerror(err)}: another user, Yama ptrace_scope, or a seccomp/container rule); "
                         "nothing was stored")
    if err == errno.ESRCH:
        return PullError("ERR the client process is gone; nothing was stored")
    if err == errno.EFAULT:
        return PullError(f"ERR PULL could not read the client's memory at {addr:#x} ({what}: EFAULT, not mapped "
                         "or not readable); nothing was stored")
    return PullError(f"ERR PULL failed at {addr:#x}: {os.strerror(err)}; nothing was stored")


def _pieces(at: int, ranges: Ranges, piece: int) -> list[tuple[int, int, np.ndarray]]:
    """``ranges`` (landing from offset ``at`` on) cut into pieces of at most ``piece`` bytes and ``IOV_MAX``
    ranges: (offset in the destination, bytes, the remote ranges as iovec rows) each. A loop over the pieces,
    not over the ranges (a chunk has a few hundred ranges and a few pieces)."""
    rows = ranges_array(ranges)
    if not len(rows):
        return []
    lens = rows[:, 1].astype(np.int64)
    ends = (at + np.cumsum(lens)).tolist()
    total = ends[-1]
    out: list[tuple[int, int, np.ndarray]] = []
    off, i, skip = at, 0, 0  # the next byte, and where it lies: ``skip`` bytes into range ``i``
    while off < total:
        stop = min(off + piece, total)
        j = bisect.bisect_left(ends, stop, i)  # the range holding the piece's last byte
        seg = rows[i:j + 1].copy()
        tail = ends[j] - stop  # bytes of range j left for the next piece
        seg[0, 0] += skip
        seg[0, 1] -= skip
        seg[-1, 1] -= tail
        for b in range(0, len(seg), IOV_MAX):
            part = seg[b:b + IOV_MAX]
            size = int(part[:, 1].sum())
            out.append((off, size, part))
            off += size
        i, skip = (j, int(lens[j]) - tail) if tail else (j + 1, 0)
    return out


def _read_piece(readv: Any, pid: int, base: int, off: int, size: int, batch: np.ndarray) -> None:
    remote = batch.ctypes.data_as(ctypes.POINTER(_Iovec))
    local = _Iovec(base + off, size)
    got = readv(pid, ctypes.byref(local), 1, remote, len(batch), 0)
    if got < 0:
        raise _failed(ctypes.get_errno(), int(batch[0, 0]), "read failed")
    if got != size:  # stopped at the first byte it could not read
        at, left = int(batch[0, 0]), got
        for a, n in batch.tolist():
            if left < n:
                at = a + left
                break
            left -= n
        raise _failed(errno.EFAULT, at, f"{got} of {size} bytes of this piece read")


def pull_hash(pid: int, head: bytes, ranges: Ranges, dst: Any, sum_at: int | None = None,
              piece: int = PIECE, helper: Any = None) -> int:
    """Write ``head`` then the bytes of process ``pid`` at ``ranges`` into ``dst`` (a writable buffer of exactly
    that many bytes), hashing each piece right after it landed; returns the xxh3-64 of what ``dst`` holds.
    ``sum_at``: the value carries its own checksum there (8 bytes inside ``head``, as the SDK codec's header): it
    is hashed as zeros and then holds the digest. ``helper``: an executor whose thread copies pieces alongside
    this one (``kvstrata.engine.copyalong``; None: this thread alone). PullError when a range cannot be read
    (nothing is undone: the caller drops ``dst``). Touches nothing but ``dst``: safe in a worker thread."""
    readv = _readv()
    d = np.frombuffer(dst, np.uint8)
    base = d.ctypes.data
    hl = len(head)
    d[:hl] = np.frombuffer(head, np.uint8)
    if sum_at is not None:
        d[sum_at:sum_at + 8] = 0
    h = xxhash.xxh3_64()
    h.update(d[:hl])
    pieces = _pieces(hl, ranges, piece)

    def hash_piece(i: int) -> None:
        off, size, _ = pieces[i]
        h.update(d[off:off + size])

    copy_along(len(pieces), lambda i: _read_piece(readv, pid, base, *pieces[i]), hash_piece, helper)
    digest = h.intdigest()
    if sum_at is not None:
        d[sum_at:sum_at + 8] = np.frombuffer(digest.to_bytes(8, "little"), np.uint8)
    return digest


def _still_there(peer: Peer) -> None:
    """After a copy: PullError unless its process is still alive (a dead one's pid may have been reused during
    the copy, and what was read would not be its)."""
    if not peer.alive():
        raise PullError("ERR the client process exited during the pull; nothing was stored")


class PullJob(CommitJob):
    """A pull's copy and hash (``pull_hash``) followed by the check that the peer is still the process that
    connected, run inline or by a worker thread as a commit's (``CommitJob``: ``found`` is (digest, digest)
    or the exception; ``abandon`` defers the cleanup until the thread is done)."""

    def __init__(self, peer: Peer, head: bytes, ranges: Ranges, dst: Any, sum_at: int | None,
                 cleanup: Callable[[], None], helper: Any = None) -> None:
        super().__init__(None, dst, sum_at, cleanup)
        self.peer = peer
        self.head = head
        self.ranges = ranges
        # An executor whose thread shares the copy (kvstrata.engine.copyalong). Only pulls get one: the client
        # waits for its PULL, so a core is free, while a two-phase writer copies its next value during a
        # COMMIT's copy (a helper there made two-phase stores 15-20% slower on 2 vCPUs: BENCHMARKS.md).
        self.helper = helper

    def work(self) -> tuple[int, int]:
        digest = pull_hash(self.peer.pid, self.head, self.ranges, self.dst, self.sum_at, helper=self.helper)
        _still_there(self.peer)
        return digest, digest


class MultiPullJob(CommitJob):
    """Several values' pulls (``TAIR.KV.MPULL``) in one worker run: one hand-off to the thread and one back for
    the lot, which cost about 0.65 ms a value on a 2-vCPU VM when each value was its own PULL. ``found`` is one
    (digest, digest) or PullError per value (a value that cannot be read does not stop the others), or, when
    the peer died during the copies, that error for all of them."""

    def __init__(self, peer: Peer, values: list[tuple[bytes, np.ndarray, Any]], sum_at: int | None,
                 cleanup: Callable[[], None], helper: Any = None) -> None:
        super().__init__(None, None, sum_at, cleanup)
        self.peer = peer
        self.values = values  # (head, ranges, dst) each
        self.helper = helper

    def work(self) -> list[tuple[int, int] | PullError]:  # type: ignore[override]
        out: list[tuple[int, int] | PullError] = []
        for head, ranges, dst in self.values:
            try:
                digest = pull_hash(self.peer.pid, head, ranges, dst, self.sum_at, helper=self.helper)
                out.append((digest, digest))
            except PullError as exc:
                out.append(exc)
        _still_there(self.peer)
        return out
