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
"""

from __future__ import annotations

import heapq
import itertools
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import xxhash

from kvstrata.engine.arena import PAGE, Region
from kvstrata.engine.extents import Extents

# Commit copies and hashes in pieces this large, so each piece is hashed while it is still in (L2) cache: copy
# plus hash then cost about one memcpy (measured: 256 KiB pieces 1.1x a memcpy, 1 MiB 1.4x, 64 KiB 1.25x).
PIECE = 256 * 1024


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

    def take(self, client: int, rid: int) -> tuple[Segment, Reservation]:
        """End a reservation for its commit: uncharged and its room free for the next one, which the caller
        may only reuse after it has copied the bytes out (it does so before yielding to anything else)."""
        seg = self.segments.get(client)
        res = seg.reservations.get(rid) if seg is not None else None
        if seg is None or res is None:
            raise StageError(f"ERR unknown reservation {rid} (expired, committed, or another client's)")
        self._end(seg, res)
        return seg, res

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
            if not seg.trimmed and not seg.reservations and now_ms - seg.last_ms >= self.idle_ms:
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

    def copy_verified(self, seg: Segment, res: Reservation, dst: Any, checksum: int,
                      sum_at: int | None = None, skip: int = 0) -> int:
        """Copy the reservation's bytes from ``skip`` on into ``dst`` (a writable buffer of that many bytes that
        only the server can write), hashing each piece of the copy; StageError when the copy's xxh3-64 is not
        ``checksum``. With ``sum_at`` the value carries its own checksum there (8 bytes, little-endian, computed
        with that field zeroed, as the SDK codec's header does): the hash reads that field as zero and the field
        must hold ``checksum``. ``skip``: the value starts that far into the reservation (a writer that places
        its payload aligned). Returns the digest."""
        n = self.value_length(res, skip)
        if sum_at is not None and not 0 <= sum_at <= n - 8:
            raise StageError(f"ERR SUMAT {sum_at} is outside the value ({n} bytes)")
        src = seg.region.view[res.off + skip:res.off + skip + n]
        out = memoryview(dst).cast("B") if not isinstance(dst, memoryview) else dst
        lo, hi = (sum_at, sum_at + 8) if sum_at is not None else (n, n)
        h = xxhash.xxh3_64()
        try:
            for o in range(0, n, PIECE):
                e = min(o + PIECE, n)
                out[o:e] = src[o:e]
                if o < hi and lo < e:  # the self-checksum field lies (partly) in this piece: hashed as zeros
                    a, b = max(o, lo), min(e, hi)
                    h.update(out[o:a])
                    h.update(bytes(b - a))
                    h.update(out[b:e])
                else:
                    h.update(out[o:e])
        finally:
            src.release()
        digest = h.intdigest()
        stored = int.from_bytes(out[lo:hi], "little") if sum_at is not None else digest
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
        }
