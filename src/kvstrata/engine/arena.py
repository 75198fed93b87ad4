"""The shared-memory arena: DRAM values in one memfd mapping that local clients can map read-only.

**Region.** One ``memfd`` (``os.memfd_create``) of a fixed size, mapped shared. Huge pages are tried first
(``MFD_HUGETLB``, which needs reserved huge pages), then transparent huge pages (``MADV_HUGEPAGE``; whether
shmem gets them is the kernel's ``shmem_enabled`` setting). The file is sealed against shrinking and growing,
so no holder of its descriptor can truncate it under the server (which would turn every access into SIGBUS).
Clients get a second, read-only descriptor of the same file (``/proc/self/fd/N`` opened ``O_RDONLY``): they can
map it only ``PROT_READ``.

**Slots.** A value is a ``memoryview`` of exactly its length over a slot of its size class (four classes per
power of two, ``kvstrata.engine.bufpool.class_size``) carved by ``kvstrata.engine.extents.Extents``. The engine
stores that memoryview as the entry's value, so every reader (GET, the SSD writer, replies) sees an ordinary
buffer. ``ArenaPool`` has the ``BufferPool`` interface the connection already uses for received values
(``acquire``, ``retain``, ``release``, ``tracked``, ``settle``, ``holders``): the parser receives a large value
straight into its slot.

**Holds.** A slot counts its holds: the parser until the command carrying the value ran, each DRAM entry
storing it, each reply in flight that sends it, each client lease. At zero the slot goes through three gates
before its bytes may be reused:

1. *limbo* until the next allocation (a handler may still return the value, e.g. GETDEL, and its reply take a
   hold);
2. *writers*: a value may have been handed to the SSD or pool writer thread (demotion, write-through,
   publishing), which holds no hold. The slot waits until every writer has committed what was queued when
   the slot was dropped (``enqueued_seq`` then, ``committed_seq`` now), and while a failed write still
   references it (``stuck``, or ``retrying`` once it is queued again: the retry's sequence number is newer than
   the ones the slot waits for);
3. *exports*: the view is released (``memoryview.release()``); if C code still holds a buffer export of it (a
   transport write in progress), that fails and the slot waits in quarantine. After a successful release any
   stale Python reference raises instead of reading reused memory.

**Leases.** ``lease()`` gives a client a hold per slot and an id; ``release_lease`` (or expiry, or the client
going away) gives them back. Leases are bounded per client in number and in time. A DRAM entry dropped while
its slot is leased keeps the slot's bytes charged to the DRAM budget until the slot is freed
(``on_uncharge``): *leased-but-dropped* bytes, shown in INFO.
"""

from __future__ import annotations

import fcntl
import heapq
import itertools
import mmap
import os
import sys
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import xxhash

from kvstrata.engine.bufpool import MIN_SIZE, class_size
from kvstrata.engine.extents import Extents

PAGE = 4096
_HUGE = 2 * 1024 * 1024


class Region:
    """A sealed memfd of ``size`` bytes mapped read-write into this process."""

    def __init__(self, size: int, *, name: str = "kvstrata-arena", hugepages: bool = True) -> None:
        size = max(_HUGE, -(-size // _HUGE) * _HUGE)
        self.size = size
        self.hugetlb = False
        self.thp = False
        fd = -1
        mm = None
        flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
        if hugepages and hasattr(os, "MFD_HUGETLB"):
            try:
                fd = os.memfd_create(name, flags | os.MFD_HUGETLB)
                os.ftruncate(fd, size)
                mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                self.hugetlb = True
            except OSError:  # no huge pages reserved (the usual case): ordinary pages
                if fd >= 0:
                    os.close(fd)
                fd, mm = -1, None
        if mm is None:
            fd = os.memfd_create(name, flags)
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            if hugepages and hasattr(mmap, "MADV_HUGEPAGE"):
                try:
                    mm.madvise(mmap.MADV_HUGEPAGE)
                    self.thp = True
                except OSError:
                    pass
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        self.fd = fd
        self.mm = mm
        self.view = memoryview(mm)
        # The descriptor lives as long as the region (servers built and dropped in one process, as in tests).
        self._close_fd = weakref.finalize(self, os.close, fd)

    def close(self) -> None:
        """Unmap and close now (a writer's staging segment when its client is gone). A view still exported
        elsewhere keeps the mapping until the garbage collector drops it."""
        try:
            self.view.release()
            self.mm.close()
        except BufferError:
            pass
        self._close_fd()

    def reader_fd(self) -> int:
        """A new read-only descriptor of the region (the caller closes it): mappable only PROT_READ."""
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)


class Slot:
    """One allocation: ``view`` is the value (exactly ``length`` bytes at ``off``; ``cls`` bytes reserved)."""

    __slots__ = ("checksum", "cls", "deferred", "entries", "gen", "holds", "leases", "length", "off", "punch",
                 "seqs", "view")

    def __init__(self, off: int, cls: int, length: int, view: memoryview) -> None:
        self.off = off
        self.cls = cls
        self.length = length
        self.view = view
        self.holds = 0
        self.leases = 0
        self.entries = 0
        self.deferred = 0  # DRAM budget bytes still charged for this slot after its entries dropped it
        self.checksum: int | None = None
        self.seqs: tuple[int, ...] = ()
        # A value its client never finished: its pages go back to the kernel when the slot is freed.
        self.punch = False
        # Bumped each time the holds reach zero: a queue entry of an older generation is stale (the slot was
        # held again since, and queued anew when that hold ended).
        self.gen = 0

    def digest(self) -> int:
        """xxh3-64 of the value, computed once (a slot's bytes never change while it is allocated)."""
        if self.checksum is None:
            self.checksum = xxhash.xxh3_64_intdigest(self.view)
        return self.checksum


@dataclass
class Lease:
    id: int
    client: int
    expire_ms: int
    slots: list[Slot] = field(default_factory=list)


class LeaseError(Exception):
    """A lease request the bounds refuse (the message is the reply's error text)."""


class ArenaPool:
    """Slots of one ``Region`` for values of ``min_size`` bytes or more, with holds and leases (module docstring).

    ``room``: the DRAM budget left; the pool never hands out a slot bigger than that (the engine would have to
    evict for a value that cannot be stored anyway), falling back to an ordinary bytearray instead.
    """

    def __init__(self, size: int, *, min_size: int = MIN_SIZE, hugepages: bool = True,
                 max_lease_ms: int = 60_000, max_leases: int = 64,
                 room: Callable[[], int] | None = None) -> None:
        self.region = Region(size, hugepages=hugepages)
        self.extents = Extents(self.region.size, PAGE)
        self.min_size = min_size
        self.room = room
        self.max_lease_ms = max_lease_ms
        self.max_leases = max_leases
        self._slots: dict[int, Slot] = {}  # id(view) -> slot; the slot keeps the view alive, so ids stay unique
        # (slot, generation) waiting at each gate; see Slot.gen.
        self._limbo: list[tuple[Slot, int]] = []
        self._gated: list[tuple[Slot, int]] = []
        self._quarantine: list[tuple[Slot, int]] = []
        # Writers that may read stored values from another thread: objects with enqueued_seq and committed_seq
        # (and optionally ``stuck``, failed writes kept for a retry).
        self.gates: list[Any] = []
        self.holders: set[Any] = set()
        self.on_uncharge: Callable[[int], None] | None = None
        self.lease_table: dict[int, Lease] = {}
        self._by_client: dict[int, set[int]] = {}
        self._expiry: list[tuple[int, int]] = []
        self._ids = itertools.count(1)
        self.allocated = 0  # class bytes of live slots
        self.slack = 0  # class minus value bytes of live slots
        self.deferred_bytes = 0  # leased-but-dropped bytes still charged to the DRAM budget
        self.hits = 0
        self.misses = 0
        self.copies = 0
        self.hashed_bytes = 0  # value bytes hashed to answer MGETREF's checksums (NOSUM skips it)
        self.gated_frees = 0
        self.quarantined = 0
        self.leases_granted = 0
        self.leases_expired = 0
        # Two-phase writes (kvstrata.engine.staging.Staging), when enabled: its reserved bytes are charged to the
        # DRAM budget and cannot be moved out to make room, like leased-but-dropped ones.
        self.staging: Any = None

    @property
    def reserved_bytes(self) -> int:
        return self.staging.reserved_bytes if self.staging is not None else 0

    # ---- allocation ----
    def _new_slot(self, n: int) -> Slot | None:
        cls = class_size(n, PAGE)
        if self.room is not None and cls > self.room():
            return None
        off = self.extents.alloc(cls)
        if off is None:
            return None
        view = self.region.view[off:off + n]
        slot = Slot(off, cls, n, view)
        self._slots[id(view)] = slot
        self.allocated += cls
        self.slack += cls - n
        return slot

    def acquire(self, n: int) -> bytearray | memoryview:
        """A buffer of exactly ``n`` bytes holding one hold: a slot's view, or a bytearray when it is small
        or the arena has no room."""
        if n < self.min_size:
            return bytearray(n)
        # Reply holds the transports have written are given back first: a slot freed now is reused while its
        # pages are resident, rather than touching (page-faulting) fresh ones.
        if self.holders or self._quarantine:
            self.settle()
        else:
            self.collect()
        slot = self._new_slot(n)
        if slot is None:
            self.misses += 1
            return bytearray(n)
        self.hits += 1
        slot.holds = 1
        return slot.view

    def copy_in(self, value: Any) -> memoryview | None:
        """A new slot holding a copy of ``value`` (no holds yet), or None when it is empty or does not fit."""
        n = len(value)
        if n == 0:
            return None
        # No collect() here: this runs inside a command, and a value an earlier command of the same batch
        # dropped may still be on its way into that command's reply (limbo exists for it).
        slot = self._new_slot(n)
        if slot is None:
            return None
        slot.view[:] = value
        self.copies += 1
        return slot.view

    def held_slot(self, n: int) -> memoryview | None:
        """A new slot for ``n`` bytes holding one hold (as ``acquire``'s, given back with ``release``), or None
        when the arena has no room. A committed two-phase write is copied into it."""
        slot = self._new_slot(n) if n > 0 else None
        if slot is None:
            return None
        slot.holds = 1
        return slot.view

    def discard(self, view: Any) -> None:
        """Give back a slot from ``copy_in`` that nothing took a hold on."""
        s = self._slots.get(id(view))
        if s is not None and s.holds == 0:
            self._queue(s)

    def charge_transient(self, view: Any) -> None:
        """A slot that no DRAM entry holds (a lower tier's value copied in for a lease) stays charged to the
        DRAM budget until it is freed, as leased-but-dropped bytes are."""
        s = self._slots[id(view)]
        s.deferred += s.cls
        self.deferred_bytes += s.cls

    # ---- holds (the BufferPool interface) ----
    def slot(self, buf: Any) -> Slot | None:
        return self._slots.get(id(buf))

    def tracked(self, buf: Any) -> bool:
        s = self._slots.get(id(buf))
        return s is not None and s.holds > 0

    def leases(self, buf: Any) -> int:
        """Holds on ``buf``'s slot (the BufferPool interface's name for them); 0 for other objects."""
        s = self._slots.get(id(buf))
        return 0 if s is None else s.holds

    def retain(self, buf: Any) -> bool:
        s = self._slots.get(id(buf))
        if s is None:
            return False
        s.holds += 1
        return True

    def release(self, buf: Any) -> None:
        s = self._slots.get(id(buf))
        if s is not None:
            self._unhold(s)

    def _unhold(self, s: Slot) -> None:
        if s.holds <= 0:
            return
        s.holds -= 1
        if s.holds == 0:
            self._queue(s)

    def _queue(self, s: Slot) -> None:
        s.gen += 1
        self._limbo.append((s, s.gen))

    def forfeit(self, buf: Any) -> None:
        """A value its client never finished (it disconnected mid-value): when the slot is freed its pages are
        returned to the kernel, so a client that declares large values and leaves costs no resident memory.
        Slots of stored values keep their pages: reusing touched memory is what makes large writes fast.
        The caller gives up its hold with this call (as with ``release``)."""
        s = self._slots.get(id(buf))
        if s is not None:
            s.punch = True
            self._unhold(s)

    # ---- DRAM entries ----
    def adopt(self, buf: Any) -> bool:
        """A DRAM entry now stores ``buf``; returns whether it is a slot."""
        s = self._slots.get(id(buf))
        if s is None:
            return False
        s.holds += 1
        s.entries += 1
        return True

    def drop(self, buf: Any) -> int:
        """A DRAM entry no longer stores ``buf``. Returns the bytes that stay charged to the DRAM budget
        (the class size when the slot is leased, else 0); the DRAM tier is told through ``on_uncharge``
        once they are freed."""
        s = self._slots.get(id(buf))
        if s is None:
            return 0
        s.entries -= 1
        kept = 0
        if s.leases:
            kept = s.cls
            s.deferred += kept
            self.deferred_bytes += kept
        self._unhold(s)
        return kept

    def leased(self, buf: Any) -> bool:
        s = self._slots.get(id(buf))
        return s is not None and s.leases > 0

    def charge(self, n: int) -> int:
        """Bytes a value of ``n`` bytes takes in the arena (its class)."""
        return class_size(n, PAGE)

    # ---- freeing ----
    def collect(self) -> None:
        """Move slots whose holds reached zero through the gates (module docstring); free what passed."""
        if self._limbo:
            limbo, self._limbo = self._limbo, []
            seqs = tuple(g.enqueued_seq for g in self.gates)
            for s, gen in limbo:
                if self._current(s, gen):
                    s.seqs = seqs
                    self._gated.append((s, gen))
        if self._gated:
            waiting, self._gated = self._gated, []
            for s, gen in waiting:
                if not self._current(s, gen):  # held again since: it is live (or queued anew)
                    continue
                if self._writers_done(s):
                    self._try_free(s, gen)
                else:
                    self._gated.append((s, gen))

    def collect_unreferenced(self) -> None:
        """``collect()`` from inside a command (before ``held_slot``), where plain ``collect()`` is unsafe: limbo
        exists because a handler of the same batch may have returned a dropped value, and the reply holding it
        takes its hold only when the batch's replies are flushed (or a transaction's results are). So this
        collects only while no slot in limbo is referenced outside the arena (reference count: the slot's own
        and the call's); otherwise nothing now (the background cycle or the next value received will)."""
        if self._limbo and all(sys.getrefcount(s.view) <= 2 for s, _ in self._limbo):
            self.collect()

    def _current(self, s: Slot, gen: int) -> bool:
        return s.gen == gen and s.holds == 0 and self._slots.get(id(s.view)) is s

    def _writers_done(self, s: Slot) -> bool:
        for g, seq in zip(self.gates, s.seqs, strict=False):
            if g.committed_seq < seq:
                return False
            # Failed writes kept for a retry, and retries queued after the slot was dropped (which its
            # sequence numbers do not cover): ``pending`` and the writer thread still read their values.
            for held in (getattr(g, "stuck", None), getattr(g, "retrying", None)):
                if held and any(e.value is s.view for e in held.values()):
                    return False
        return True

    def _try_free(self, s: Slot, gen: int) -> None:
        try:
            s.view.release()
        except BufferError:  # still exported by C code (a transport write): not yet
            self.quarantined += 1
            self._quarantine.append((s, gen))
            return
        del self._slots[id(s.view)]
        if s.punch and hasattr(mmap, "MADV_REMOVE"):
            try:
                self.region.mm.madvise(mmap.MADV_REMOVE, s.off, s.cls)
            except (OSError, ValueError):  # hugetlbfs wants huge-page alignment: the pages then stay
                pass
        self.extents.free(s.off, s.cls)
        self.allocated -= s.cls
        self.slack -= s.cls - s.length
        if s.deferred:
            self.deferred_bytes -= s.deferred
            if self.on_uncharge is not None:
                self.on_uncharge(s.deferred)
            s.deferred = 0

    def settle(self) -> None:
        """Collect holds that holders can give back, then retry quarantined slots."""
        for holder in list(self.holders):
            holder.settle()
        self.collect()
        if self._quarantine:
            waiting, self._quarantine = self._quarantine, []
            for s, gen in waiting:
                if self._current(s, gen):
                    self._try_free(s, gen)

    def trim(self) -> None:
        self.settle()

    def clear(self) -> None:
        self.settle()

    # ---- leases ----
    def lease(self, client: int, values: Iterable[Any], ttl_ms: int, now_ms: int) -> int:
        """Hold the slots of ``values`` (each must be a slot's view) for ``client`` until release or expiry."""
        self.expire(now_ms)
        mine = self._by_client.get(client)
        if mine is not None and len(mine) >= self.max_leases:
            raise LeaseError(f"ERR too many leases held by this client (max {self.max_leases}); release some")
        ttl_ms = max(1, min(int(ttl_ms), self.max_lease_ms))
        lease = Lease(next(self._ids), client, now_ms + ttl_ms)
        for v in values:
            self._add(lease, v)
        self.lease_table[lease.id] = lease
        self._by_client.setdefault(client, set()).add(lease.id)
        heapq.heappush(self._expiry, (lease.expire_ms, lease.id))
        self.leases_granted += 1
        return lease.id

    def _add(self, lease: Lease, view: Any) -> None:
        s = self._slots[id(view)]
        s.holds += 1
        s.leases += 1
        lease.slots.append(s)

    def extend(self, lease_id: int, view: Any) -> None:
        """Add the slot of ``view`` to a lease (MGETREF leases each slot as soon as it has placed it, so that
        placing the next value cannot free or move it)."""
        self._add(self.lease_table[lease_id], view)

    def release_lease(self, lease_id: int, client: int | None = None) -> bool:
        """Give back a lease (only its own client may, when ``client`` is given); False when unknown."""
        lease = self.lease_table.get(lease_id)
        if lease is None or (client is not None and lease.client != client):
            return False
        del self.lease_table[lease_id]
        mine = self._by_client.get(lease.client)
        if mine is not None:
            mine.discard(lease_id)
            if not mine:
                del self._by_client[lease.client]
        for s in lease.slots:
            s.leases -= 1
            self._unhold(s)
        return True

    def expire(self, now_ms: int) -> int:
        """Drop leases past their time; returns how many."""
        n = 0
        heap = self._expiry
        while heap and heap[0][0] <= now_ms:
            _, lid = heapq.heappop(heap)
            if self.release_lease(lid):
                n += 1
        self.leases_expired += n
        return n

    def drop_clients(self, alive: Callable[[int], bool]) -> int:
        """Release every lease of clients that are gone (``alive(id)`` false); returns how many."""
        n = 0
        for client in [c for c in self._by_client if not alive(c)]:
            for lid in list(self._by_client.get(client, ())):
                n += self.release_lease(lid)
        return n

    # ---- reporting ----
    @property
    def free_bytes(self) -> int:
        return self.extents.free_bytes

    def info(self) -> dict[str, int]:
        return {
            "arena_size": self.region.size,
            "arena_hugetlb": int(self.region.hugetlb),
            "arena_thp_advised": int(self.region.thp),
            "arena_allocated_bytes": self.allocated,
            "arena_free_bytes": self.extents.free_bytes,
            "arena_largest_free": self.extents.largest,
            "arena_fragments": self.extents.fragments,
            "arena_slack_bytes": self.slack,
            "arena_slots": len(self._slots),
            "arena_hits": self.hits,
            "arena_misses": self.misses,
            "arena_copies_in": self.copies,
            "arena_hashed_bytes": self.hashed_bytes,
            "arena_waiting_writers": len(self._gated),
            "arena_quarantined": self.quarantined,
            "arena_leases": len(self.lease_table),
            "arena_leased_slots": sum(1 for s in self._slots.values() if s.leases),
            "arena_leased_dropped_bytes": self.deferred_bytes,
            "arena_leases_granted": self.leases_granted,
            "arena_leases_expired": self.leases_expired,
            **(self.staging.info() if self.staging is not None else {}),
        }
