"""A FIFO of ghost keys (keys that left the tier) stored as 64-bit fingerprints in flat arrays.

A ghost only has to answer "was this key evicted recently, and what did we know about it": keeping the key
object alive for that costs its bytes (often more than the rest of the policy's state), an ordered dict another
~100 B per entry. Here a ghost is its fingerprint (``hash(key)``, 64 bits) in a ring of ``array('q')`` slots in
FIFO order, found through an open-addressing table (linear probing, backward-shift deletion, load <= 3/4) whose
slots hold ring positions; a policy may keep per-ghost values in parallel arrays (``payload``). About 20-40 B per
ghost with no payload. Deleting a ghost from the middle leaves a hole in the ring (fingerprint 0), skipped by
``popleft`` and squeezed out when the ring is rebuilt; every operation is O(1) amortised.

Two different keys with the same 64-bit hash would share a ghost: with n ghosts that happens with probability
about n^2 / 2^65 (1e-10 for a million ghosts), and it can only change one ranking decision, never correctness.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence

_MIN_CAPACITY = 8


def fingerprint(key: bytes) -> int:
    """The key's ghost identity: its hash, never 0 (0 marks a free ring slot)."""
    return hash(key) or 1


class GhostFifo:
    """Fingerprints in insertion order, with O(1) membership, deletion and drop-oldest."""

    __slots__ = ("_cap", "_head", "_n", "_ring", "_table", "count", "payload", "typecodes")

    def __init__(self, payload: Sequence[str] = ()) -> None:
        self.typecodes = tuple(payload)
        self._reset(_MIN_CAPACITY)

    def _reset(self, capacity: int) -> None:
        self._cap = capacity
        self._ring = array("q", bytes(8 * capacity))
        self._table = array("q", bytes(8 * capacity))  # ring position + 1, 0 = empty
        self.payload: tuple[array, ...] = tuple(array(t, bytes(array(t).itemsize * capacity))
                                                for t in self.typecodes)
        self._head = 0  # ring position of the oldest entry (or hole)
        self._n = 0  # ring entries from the head, holes included
        self.count = 0  # live ghosts (read it rather than len(): no Python-level call)

    def __len__(self) -> int:
        return self.count

    def clear(self) -> None:
        self._reset(_MIN_CAPACITY)

    def _slot(self, fp: int) -> int:
        """The table slot holding ``fp``, or -1."""
        table, ring, mask = self._table, self._ring, self._cap - 1
        i = (fp ^ (fp >> 32)) & mask
        while True:
            v = table[i]
            if not v:
                return -1
            if ring[v - 1] == fp:
                return i
            i = (i + 1) & mask

    def find(self, fp: int) -> int:
        """The ring position of ``fp`` (index into the payload arrays), or -1."""
        i = self._slot(fp)
        return -1 if i < 0 else self._table[i] - 1

    def __contains__(self, fp: object) -> bool:
        return isinstance(fp, int) and self._slot(fp) >= 0

    def add(self, fp: int, *values: float) -> None:
        """Append ``fp`` as the newest ghost with its payload; an existing ghost keeps its place, values updated."""
        if 4 * (self.count + 1) > 3 * self._cap:
            self._rebuild(2 * self._cap)
        elif self._n == self._cap:
            self._rebuild(self._cap)  # only holes to squeeze out
        table, ring, mask = self._table, self._ring, self._cap - 1
        i = (fp ^ (fp >> 32)) & mask
        while True:  # one probe: either fp's slot or the empty slot where it goes
            v = table[i]
            if not v:
                pos = (self._head + self._n) & mask
                self._n += 1
                self.count += 1
                ring[pos] = fp
                table[i] = pos + 1
                break
            if ring[v - 1] == fp:
                pos = v - 1
                break
            i = (i + 1) & mask
        for column, value in zip(self.payload, values, strict=True):
            column[pos] = value

    def extend(self, fps: Iterable[int]) -> None:
        """Append many fingerprints, none of them present yet, with zero payloads: one resize for all of them
        (a rebuild from disk, where ``add`` one by one would grow the arrays step by step)."""
        fps = list(fps)
        cap = self._cap
        while 4 * (self.count + len(fps)) > 3 * cap:
            cap *= 2
        if cap != self._cap or self._n + len(fps) > cap:
            self._rebuild(cap)
        ring, mask, place = self._ring, self._cap - 1, self._place
        pos = (self._head + self._n) & mask
        for fp in fps:
            ring[pos] = fp
            place(fp, pos)
            for column in self.payload:
                column[pos] = 0
            pos = (pos + 1) & mask
        self._n += len(fps)
        self.count += len(fps)

    def _place(self, fp: int, pos: int) -> None:
        table, mask = self._table, self._cap - 1
        i = (fp ^ (fp >> 32)) & mask
        while table[i]:
            i = (i + 1) & mask
        table[i] = pos + 1

    def discard(self, fp: int) -> bool:
        """Forget ``fp``; whether it was a ghost."""
        i = self._slot(fp)
        if i < 0:
            return False
        self._ring[self._table[i] - 1] = 0
        self._unlink(i)
        self.count -= 1
        return True

    def oldest(self) -> int:
        """The oldest ghost's fingerprint, left in place (0 when there is none)."""
        if not self.count:
            return 0
        ring, mask = self._ring, self._cap - 1
        head = self._head
        while not ring[head]:  # holes at the head are dropped as popleft would
            head = (head + 1) & mask
            self._n -= 1
        self._head = head
        return ring[head]

    def popleft(self) -> int:
        """Drop the oldest ghost and return its fingerprint (0 when there is none)."""
        if not self.count:
            return 0
        ring, mask = self._ring, self._cap - 1
        head = self._head
        while not ring[head]:
            head = (head + 1) & mask
            self._n -= 1
        fp = ring[head]
        self._unlink(self._slot(fp))
        ring[head] = 0
        self._head = (head + 1) & mask
        self._n -= 1
        self.count -= 1
        return fp

    def _unlink(self, i: int) -> None:
        """Empty table slot ``i`` and shift later entries of its probe run back (no tombstones)."""
        table, ring, mask = self._table, self._ring, self._cap - 1
        j = i
        while True:
            j = (j + 1) & mask
            v = table[j]
            if not v:
                break
            fp = ring[v - 1]
            home = (fp ^ (fp >> 32)) & mask
            # The entry at j may move to i only if its home is not cyclically within (i, j].
            if (i < j and (home <= i or home > j)) or (i > j and home <= i and home > j):
                table[i] = v
                i = j
        table[i] = 0

    def __iter__(self) -> Iterator[int]:
        """Fingerprints, oldest first."""
        ring, mask = self._ring, self._cap - 1
        for k in range(self._n):
            fp = ring[(self._head + k) & mask]
            if fp:
                yield fp

    def _rebuild(self, capacity: int) -> None:
        """Copy the live ghosts, oldest first, into fresh arrays of ``capacity`` slots."""
        ring, mask = self._ring, self._cap - 1
        old_payload = self.payload
        keep = [(self._head + k) & mask for k in range(self._n) if ring[(self._head + k) & mask]]
        fps = [ring[p] for p in keep]
        columns = [[column[p] for p in keep] for column in old_payload]
        self._reset(capacity)
        new_ring = self._ring
        for pos, fp in enumerate(fps):
            new_ring[pos] = fp
            self._place(fp, pos)
        for column, values in zip(self.payload, columns, strict=True):
            column[: len(values)] = array(column.typecode, values)
        self._n = self.count = len(fps)
