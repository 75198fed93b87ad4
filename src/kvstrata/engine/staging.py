"""Two-phase writes: per-writer staging segments, reservations in them, and commits verified by checksum.

A local writer (Unix socket, after AUTH) asks for its own **segment**: a separate sealed memfd that it gets
*writable* (SCM_RIGHTS). It reserves room there (``reserve``), writes a value's bytes with one memcpy from its
tensors, and commits the reservation under a key with the value's xxh3-64. The server then copies the bytes
into an arena slot of its own (clients only ever map the arena read-only), hashing each piece right after
copying it, and stores the value only when that hash of its *own copy* matches: the writer can keep scribbling
on its segment during and after the commit without changing what was verified and stored.

Why a separate segment per writer and not a writable mapping of the arena: a memfd cannot be narrowed to a
range, so a writable descriptor of the arena would let any writer change every stored value. A segment holds
nothing but its own writer's reservations. Why the copy on commit instead of making segments part of the arena
that readers map: a writer can change its segment at any time, so a committed value left there could change
under a reader's lease and under the SSD writer demoting it, breaking "leased bytes never change"
(docs/dataplane.md weighs both).

Bounds. A segment is ``size`` bytes (sparse: only touched pages use memory), one per client, closed when the
client is gone, its pages given back after ``idle_ms`` (``stage-idle-ms``) without reservations. Reservations
are bounded per client in number (``max_reservations``), in bytes (the segment), and in time (``reserve_ms``);
reserved bytes are charged to the DRAM budget (``ArenaPool.reserved_bytes``, counted as unmovable by the
engine's ``make_room``) until they are committed, given back, expired or their client is gone.

Large commits off the event loop. Copying and hashing a value of ``offload_min`` bytes or more
(``stage-offload-min``, 2 MiB by default) runs in a worker thread (``CommitJob``; numpy's copy and xxhash release the GIL), so a 192 MB commit does not
make every other client wait tens of milliseconds. Until the job has run, the reservation keeps its room in the
segment and its charge in the budget, and the segment stays mapped (``Segment.pins``) even when its client
leaves; the value becomes visible only after verification, when the command continues on the loop.
"""

from __future__ import annotations

import heapq
import itertools
import mmap
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from kvstrata.engine.arena import PAGE, Region
from kvstrata.engine.extents import Extents

# Commit copies and hashes in pieces this large, so each piece is hashed while it is still in (L2) cache: copy
# plus hash then cost about one memcpy (measured: 256 KiB pieces 1.1x a memcpy, 1 MiB 1.4x, 64 KiB 1.25x).
PIECE = 256 * 1024
# Commits of at least this many bytes copy and hash in a worker thread (``CommitJob``); smaller ones inline, where
# a thread hop would cost more than the copy (2 MiB: ~0.3-1 ms of copy + hash on the 2-core VM).
OFFLOAD_MIN = 2 * 1024 * 1024


class StageError(Exception):
    """A staging request the bounds or the state refuse (the message is the reply's error text)."""


@dataclass
class Reservation:
    id: int
    client: int
    off: int  # in the client's segment
    length: int
    span: int  # bytes taken in the segment (length rounded to pages)
    charge: int  # bytes charged to the DRAM budget
    expire_ms: int


class Segment:
    """One writer's memfd and the reservations carved from it."""

    def __init__(self, client: int, size: int, *, hugepages: bool) -> None:
        self.client = client
        self.region = Region(size, name="kvstrata-stage", hugepages=hugepages)
        self.extents = Extents(self.region.size, PAGE)
        self.reservations: dict[int, Reservation] = {}
        self.last_ms = 0  # when its last reservations were made
        self.trimmed = True  # no page of it has been handed to a reservation since the last trim
        self.pins = 0  # commits whose worker thread may still read the segment (``Staging.take(hold=True)``)
        self.closed = False  # its client is gone: unmapped when the last pin goes

    def trim(self) -> None:
        """Give the segment's pages back to the kernel (its writer then reads zeros there)."""
        if hasattr(mmap, "MADV_REMOVE"):
            try:
                self.region.mm.madvise(mmap.MADV_REMOVE, 0, self.region.size)
            except (OSError, ValueError):
                pass
        self.trimmed = True

    @property
    def size(self) -> int:
        return self.region.size


class Staging:
    """Every writer's segment and reservations (module docstring).

    ``charge(n)`` / ``uncharge(n)`` move reserved bytes in and out of the DRAM budget (the DRAM tier's ``used``
    and the arena's ``reserved_bytes``); the caller makes room before ``reserve`` with ``charge_of``.
    """

    def __init__(self, size: int, *, max_reservations: int = 256, reserve_ms: int = 60_000,
                 idle_ms: int = 60_000, hugepages: bool = False, charge_of: Callable[[int], int] | None = None,
                 charge: Callable[[int], None] | None = None,
                 uncharge: Callable[[int], None] | None = None) -> None:
        self.size = size
        self.max_reservations = max_reservations
        self.reserve_ms = reserve_ms
        self.hugepages = hugepages
        self.charge_of = charge_of or (lambda n: -(-n // PAGE) * PAGE)
        self._charge = charge or (lambda n: None)
        self._uncharge = uncharge or (lambda n: None)
        self.segments: dict[int, Segment] = {}  # client id -> its segment
        self._expiry: list[tuple[int, int, int]] = []  # (expire_ms, client, reservation id)
        self._ids = itertools.count(1)
        self.reserved_bytes = 0
        # A segment without reservations for this long gets its pages back from the kernel: an idle writer
        # keeps no memory outside the DRAM budget (a busy one keeps its pages: reusing them is what is fast; on
        # the 2-core VM a write into fresh pages ran at a tenth of a copy into resident ones, so a writer that
        # stores every few seconds should find its pages still there: ``stage-idle-ms``).
        self.idle_ms = idle_ms
        self.trims = 0
        self.commits = 0
        self.checksum_failures = 0
        self.expired = 0
        self.dropped = 0
        self.offload_min = OFFLOAD_MIN
        self.offloaded = 0  # commits copied and verified in a worker thread
        self.in_flight = 0  # of those, taken and not yet finished
        # Pull stores (kvstrata.engine.pull, TAIR.KV.PULL): stored, refused, bytes stored, copying now.
        self.pulls = 0
        self.pull_failures = 0
        self.pull_bytes = 0
        self.pulls_in_flight = 0

    # ---- segments ----
    def segment(self, client: int) -> Segment:
        """The client's segment, created on first use (StageError when staging is off)."""
        seg = self.segments.get(client)
        if seg is None:
            if self.size <= 0:
                raise StageError("ERR two-phase writes are disabled (stage-size 0)")
            seg = self.segments[client] = Segment(client, self.size, hugepages=self.hugepages)
        return seg

    def close_segment(self, client: int) -> None:
        """Drop the client's reservations (uncharged) and unmap its segment."""
        seg = self.segments.pop(client, None)
        if seg is None:
            return
        for res in list(seg.reservations.values()):
            self._end(seg, res)
        seg.closed = True
        if not seg.pins:  # otherwise the last commit still copying from it closes it (``finish``)
            seg.region.close()

    def drop_clients(self, alive: Callable[[int], bool]) -> int:
        """Close the segments of clients that are gone; returns how many."""
        gone = [c for c in self.segments if not alive(c)]
        for c in gone:
            self.dropped += len(self.segments[c].reservations)
            self.close_segment(c)
        return len(gone)

    # ---- reservations ----
    def demand(self, lengths: list[int]) -> int:
        """DRAM budget bytes that reserving ``lengths`` will charge."""
        return sum(self.charge_of(n) for n in lengths)

    def check(self, client: int, lengths: list[int]) -> Segment:
        """The client's segment if ``lengths`` may be reserved there (StageError otherwise): called before the
        engine makes room for them, so that a request refused anyway moves nothing."""
        seg = self.segments.get(client)
        if seg is None:
            raise StageError("ERR no staging segment: send TAIR.KV.STAGE first")
        if any(n <= 0 for n in lengths):
            raise StageError("ERR reservation lengths must be positive")
        if len(seg.reservations) + len(lengths) > self.max_reservations:
            raise StageError(f"ERR too many reservations held by this client (max {self.max_reservations}); "
                             "commit or unreserve some")
        if sum(seg.extents.round(n) for n in lengths) > seg.extents.free_bytes:
            raise StageError(f"ERR staging segment full ({seg.size} bytes): commit or unreserve first")
        return seg

    def reserve(self, client: int, lengths: list[int], now_ms: int) -> list[Reservation]:
        """Reserve room for each length in the client's segment, all or none (StageError when refused)."""
        self.expire(now_ms)
        seg = self.check(client, lengths)
        made: list[Reservation] = []
        for n in lengths:
            span = seg.extents.round(n)
            off = seg.extents.alloc(span)
            if off is None:
                for res in made:
                    seg.extents.free(res.off, res.span)
                raise StageError(f"ERR staging segment full ({seg.size} bytes): commit or unreserve first")
            made.append(Reservation(next(self._ids), client, off, n, span, self.charge_of(n),
                                    now_ms + self.reserve_ms))
        seg.last_ms = now_ms
        seg.trimmed = False
        for res in made:
            seg.reservations[res.id] = res
            heapq.heappush(self._expiry, (res.expire_ms, client, res.id))
            self.reserved_bytes += res.charge
            self._charge(res.charge)
        return made

    def take(self, client: int, rid: int, *, hold: bool = False) -> tuple[Segment, Reservation]:
        """End a reservation for its commit: no longer committable, given back or expired. Without ``hold``
        it is uncharged and its room free for the next one at once (the caller copies the bytes out before
        yielding to anything else). With ``hold`` both stay, and the segment stays mapped, until ``finish``:
        a copy that may run in a worker thread meanwhile."""
        seg = self.segments.get(client)
        res = seg.reservations.get(rid) if seg is not None else None
        if seg is None or res is None:
            raise StageError(f"ERR unknown reservation {rid} (expired, committed, or another client's)")
        if hold:
            del seg.reservations[res.id]
            seg.pins += 1
            self.in_flight += 1
        else:
            self._end(seg, res)
        return seg, res

    def finish(self, seg: Segment, res: Reservation) -> None:
        """The commit of a reservation taken with ``hold`` is over (stored or refused): give back its room and
        its charge, and unmap the segment if its client left meanwhile."""
        seg.extents.free(res.off, res.span)
        self.reserved_bytes -= res.charge
        self._uncharge(res.charge)
        seg.pins -= 1
        self.in_flight -= 1
        if seg.closed and not seg.pins:
            seg.region.close()

    def hold_bytes(self, n: int) -> None:
        """Charge ``n`` bytes of a value being pulled (TAIR.KV.PULL) to the DRAM budget until ``unhold_bytes``:
        counted with the reserved bytes, which ``make_room`` treats as unmovable."""
        self.reserved_bytes += n
        self._charge(n)
        self.pulls_in_flight += 1

    def unhold_bytes(self, n: int) -> None:
        self.reserved_bytes -= n
        self._uncharge(n)
        self.pulls_in_flight -= 1

    def unreserve(self, client: int, rids: list[int]) -> int:
        seg = self.segments.get(client)
        if seg is None:
            return 0
        n = 0
        for rid in rids:
            res = seg.reservations.get(rid)
            if res is not None:
                self._end(seg, res)
                n += 1
        return n

    def _end(self, seg: Segment, res: Reservation) -> None:
        del seg.reservations[res.id]
        seg.extents.free(res.off, res.span)
        self.reserved_bytes -= res.charge
        self._uncharge(res.charge)

    def expire(self, now_ms: int) -> int:
        """End reservations past their time, trim idle segments; returns how many reservations ended."""
        for seg in self.segments.values():
            # Not under a commit still copying from it (its reservation is no longer in ``reservations``).
            if not seg.trimmed and not seg.reservations and not seg.pins and now_ms - seg.last_ms >= self.idle_ms:
                seg.trim()
                self.trims += 1
        n = 0
        heap = self._expiry
        while heap and heap[0][0] <= now_ms:
            _, client, rid = heapq.heappop(heap)
            seg = self.segments.get(client)
            res = seg.reservations.get(rid) if seg is not None else None
            if seg is not None and res is not None:
                self._end(seg, res)
                n += 1
        self.expired += n
        return n

    # ---- commit ----
    @staticmethod
    def value_length(res: Reservation, skip: int) -> int:
        """Bytes of the value a commit stores: the reservation's after its first ``skip`` (StageError when none)."""
        if not 0 <= skip < res.length:
            raise StageError(f"ERR SKIP {skip} leaves no value in a reservation of {res.length} bytes")
        return res.length - skip

    @staticmethod
    def check_sum_at(n: int, sum_at: int | None) -> None:
        if sum_at is not None and not 0 <= sum_at <= n - 8:
            raise StageError(f"ERR SUMAT {sum_at} is outside the value ({n} bytes)")

    def copy_verified(self, seg: Segment, res: Reservation, dst: Any, checksum: int,
                      sum_at: int | None = None, skip: int = 0) -> int:
        """Copy the reservation's bytes from ``skip`` on into ``dst`` (a writable buffer of that many bytes that
        only the server can write), hashing each piece of the copy; StageError when the copy's xxh3-64 is not
        ``checksum``. With ``sum_at`` the value carries its own checksum there (8 bytes, little-endian, computed
        with that field zeroed, as the SDK codec's header does): the hash reads that field as zero and the field
        must hold ``checksum``. ``skip``: the value starts that far into the reservation (a writer that places
        its payload aligned). Returns the digest."""
        n = self.value_length(res, skip)
        self.check_sum_at(n, sum_at)
        src = seg.region.view[res.off + skip:res.off + skip + n]
        try:
            found = copy_hash(src, dst, sum_at)
        finally:
            src.release()
        return self.verify(found, checksum)

    def verify(self, found: tuple[int, int], checksum: int) -> int:
        """``copy_hash``'s (digest, field) against the commit's checksum: the digest, or StageError (counted)."""
        digest, stored = found
        if digest != checksum or stored != checksum:
            self.checksum_failures += 1
            raise StageError(f"ERR checksum mismatch: the staged bytes hash to {digest:016x}, not {checksum:016x}"
                             + ("" if stored == digest else f" (the value's own field holds {stored:016x})")
                             + "; nothing was stored")
        self.commits += 1
        return digest

    def info(self) -> dict[str, int]:
        return {
            "stage_segments": len(self.segments),
            "stage_reservations": sum(len(s.reservations) for s in self.segments.values()),
            "stage_reserved_bytes": self.reserved_bytes,
            "stage_commits": self.commits,
            "stage_checksum_failures": self.checksum_failures,
            "stage_reservations_expired": self.expired,
            "stage_reservations_dropped": self.dropped,
            "stage_segments_trimmed": self.trims,
            "stage_commits_offloaded": self.offloaded,
            "stage_commits_in_flight": self.in_flight,
            "pull_stores": self.pulls,
            "pull_stored_bytes": self.pull_bytes,
            "pull_failures": self.pull_failures,
            "pulls_in_flight": self.pulls_in_flight,
        }


def copy_hash(src: Any, dst: Any, sum_at: int | None = None) -> tuple[int, int]:
    """Copy ``src`` into ``dst`` (same length) piece by piece, hashing each piece of the copy while it is in
    cache; returns (xxh3-64 of the copy with the 8-byte field at ``sum_at`` read as zeros, the field's value as
    stored; the digest itself without ``sum_at``). Touches nothing but the two buffers: safe in a worker thread,
    where numpy's copy and xxhash run without the GIL."""
    s = np.frombuffer(src, np.uint8)
    d = np.frombuffer(dst, np.uint8)
    n = len(s)
    lo, hi = (sum_at, sum_at + 8) if sum_at is not None else (n, n)
    h = xxhash.xxh3_64()
    for o in range(0, n, PIECE):
        e = min(o + PIECE, n)
        np.copyto(d[o:e], s[o:e])
        if o < hi and lo < e:  # the self-checksum field lies (partly) in this piece: hashed as zeros
            a, b = max(o, lo), min(e, hi)
            h.update(d[o:a])
            h.update(bytes(b - a))
            h.update(d[b:e])
        else:
            h.update(d[o:e])
    digest = h.intdigest()
    return digest, (int.from_bytes(d[lo:hi].tobytes(), "little") if sum_at is not None else digest)


class CommitJob:
    """A large commit's copy and hash, run by a worker thread (``run``); ``found`` is ``copy_hash``'s result or
    the exception it raised. ``abandon`` is for a commit whose continuation will never run (its task was
    cancelled): what the job touches is given back (``cleanup``) only once the thread is done with it."""

    def __init__(self, src: memoryview | None, dst: Any, sum_at: int | None, cleanup: Callable[[], None]) -> None:
        self.src = src
        self.dst = dst
        self.sum_at = sum_at
        self.found: tuple[int, int] | BaseException | None = None
        self._cleanup: Callable[[], None] | None = cleanup
        self._lock = threading.Lock()
        self._ran = False
        self._orphan_loop: Any = None
        self._also: Callable[[], None] | None = None

    def work(self) -> tuple[int, int]:
        """The copy and hash itself (a pull store's job reads another process instead: engine/pull.py)."""
        assert self.src is not None
        return copy_hash(self.src, self.dst, self.sum_at)

    def run(self) -> tuple[int, int] | BaseException:
        try:
            self.found = self.work()
        except Exception as exc:  # handed to the continuation, which replies with an error
            self.found = exc
        with self._lock:
            self._ran = True
            loop = self._orphan_loop
        if loop is not None:
            loop.call_soon_threadsafe(self.cleanup)
        return self.found

    def cleanup(self) -> None:
        """On the loop, once: release the source view and give back what the commit held (and, when abandoned,
        what the continuation would have)."""
        done, self._cleanup = self._cleanup, None
        if done is not None:
            if self.src is not None:
                self.src.release()
            done()
            if self._also is not None:
                self._also()

    def abandon(self, loop: Any, also: Callable[[], None] | None = None) -> None:
        """The continuation will never run: ``cleanup`` and then ``also`` once the thread has returned."""
        self._also = also
        with self._lock:
            if not self._ran:
                self._orphan_loop = loop
                return
        self.cleanup()

