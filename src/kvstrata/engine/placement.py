"""Placement: making room in DRAM (the policy ranks, the engine moves), demotion to the tiers below, promotion
from the authoritative tier (the SSD) and adoption of copies (the pool's, any copy tier's): every way into and
out of DRAM.
"""

from __future__ import annotations

import heapq

from kvstrata.engine.entry import Entry
from kvstrata.engine.profile import HEAD
from kvstrata.errors import OutOfMemoryError

HEAD_SCAN = 256  # chain-aware demotion passes over at most this many chain heads per choice


class PlacementMixin:
    """Store's DRAM placement."""

    def _insert(self, key: bytes, entry: Entry, size: int, old: Entry | None) -> None:
        """A client write: put an entry of ``size`` bytes into DRAM, replacing ``old``, after making room for it."""
        dram = self.dram
        # dram.size is what dropping ``old`` frees now (a leased arena slot stays charged)
        growth = size if old is None else size - dram.size(key, old.value)
        if dram.used + growth > dram.budget:
            self.make_room(growth, exclude=key)
        if old is not None and self.prefetched:
            self._unprefetch(key)
        self._place(key, entry, size, old)

    def _place(self, key: bytes, entry: Entry, size: int, old: Entry | None) -> None:
        """The one install path into DRAM, for client writes (``_insert``) and records from below (``_install``):
        the entry in the DRAM tier (replacing ``old``), in the policy's view or pinned, on the TTL heap. Room was
        made by the caller."""
        self.dram.put(key, entry, size, old)
        if old is None:
            self.policy.admit(key)
        elif old.pinned:
            # Still hot, but the grown value must fit under the pin cap again, or it goes back to the policy.
            if not self._pin(key, entry):
                self.policy.admit(key)
        else:
            self.policy.touch(key)
        if entry.expire_at:
            heapq.heappush(self._ttl_heap, (entry.expire_at, key))
        if not entry.pinned and self._hot_match(key):
            self._pin(key, entry)

    def make_room(self, nbytes: int, *, exclude: bytes | None = None) -> None:
        """Demote (or, in the last tier, evict) until ``nbytes`` more fit in DRAM; -OOM if they cannot.

        ``exclude`` is the key being written: it is never moved out to make room for itself. Nothing moves
        unless enough can be freed.
        """
        dram = self.dram
        if dram.used + nbytes <= dram.budget:
            return
        if self.keeper is None and self.noeviction:
            raise OutOfMemoryError()
        own = 0  # the key's current value stays until the write replaces it
        current = dram.entries.get(exclude) if exclude is not None else None
        if current is not None and not current.pinned:
            own = self.dram.size(exclude, current.value)  # type: ignore[arg-type]
        # Pinned keys, leased-but-dropped arena slots and two-phase reservations cannot move.
        if dram.pinned_bytes + dram.held_bytes + own + nbytes > dram.budget:
            raise OutOfMemoryError(self._no_room_text(nbytes, own))
        need = dram.used + nbytes - dram.budget
        chosen = self._choose_victims(need, exclude)
        # Leased arena slots free only their key when demoted (docs/dataplane.md): refuse rather than overshoot.
        freed = sum(dram.size(k, dram.entries[k].value) for k in chosen)
        if freed < need:
            raise OutOfMemoryError(f"command not allowed: moving out every value that can move frees {freed} of "
                                   f"the {need} bytes needed in the DRAM budget (values under a lease stay "
                                   "charged until their leases end).")
        self._move_out(chosen)

    def refuse_oversized(self, key: bytes, nbytes: int) -> None:
        """-OOM when a value of ``nbytes`` for ``key`` could never be stored: larger than the SSD tier's budget, or,
        with DRAM the only tier, than DRAM's. Called before a command builds a value out of a small request
        (SETRANGE at a large offset, APPEND), so that one it would refuse anyway is never allocated: a rejected
        512 MB SETRANGE must not take 512 MB, let alone the 1 GB a build and a copy took."""
        size = len(key) + nbytes + self.dram.overhead  # what ``charge`` is at least
        if self.ssd is not None:
            if size > self.ssd.budget:
                raise OutOfMemoryError("command not allowed: the value is larger than the SSD tier's budget.")
        elif self.pool is None and size > self.dram.budget:
            raise OutOfMemoryError(self._no_room_text(size, 0))

    def _no_room_text(self, nbytes: int, own: int) -> str:
        """-OOM's text when what cannot move leaves no room: says what holds the budget, as far as it is not 0."""
        dram = self.dram
        arena = dram.arena
        held = ", ".join(f"{n} bytes {what}" for n, what in (
            (dram.pinned_bytes, "pinned"),
            (arena.deferred_bytes if arena is not None else 0, "leased (dropped values held until their leases end)"),
            (arena.reserved_bytes if arena is not None else 0, "reserved by two-phase writes"),
            (own, "of the current value of the key written")) if n)
        if nbytes > 0:
            text = f"command not allowed: {nbytes} more bytes do not fit in the DRAM budget of {dram.budget} bytes"
        else:
            text = f"command not allowed: DRAM is over its budget of {dram.budget} bytes and cannot get under it"
        return f"{text} beside {held}." if held else f"{text}."

    def refuse_denyoom(self) -> str | None:
        """Redis's rule for the commands that may use more memory (``denyoom``): while DRAM is over its budget (a
        budget lowered at run time, leased or reserved bytes), first move out what can move; the -OOM text when
        it still cannot get under the budget (the command is refused before it runs), None when it may run."""
        dram = self.dram
        if dram.used <= dram.budget:
            return None
        try:
            self.make_room(0)
        except OutOfMemoryError as exc:
            return exc.message
        return None

    def _move_out(self, chosen: list[bytes]) -> None:
        """Demote ``chosen`` (or, in the last tier, evict them); -OOM, with nothing moved, if the SSD cannot take them."""
        entries = self.dram.entries
        if self.ssd is not None:
            # Check the last tier can take them all before anything moves: a refused write loses nothing.
            self._check_last_tier_room(sum(len(entries[k].value) for k in chosen if not entries[k].on_ssd))
        for victim in chosen:
            self._demote(victim)

    def _choose_victims(self, need: int, exclude: bytes | None) -> list[bytes]:
        """The keys to move out of DRAM to free ``need`` bytes, lowest ranked first.

        With chain-aware demotion, a chain head (a conversation's first chunk after a shared prefix) is passed
        over until it has been idle ``head_keep`` times as long as the key taken instead: reading it is what
        triggers the prefetch of the rest of the conversation, and the rest is not predictable without it.
        """
        chosen: list[bytes] = []
        entries = self.dram.entries
        size = self.dram.size
        heads: list[bytes] = []
        profiles = self.predictor.profiles if self.chain_evict and self.predictor is not None else None
        now = self.clock.monotonic()
        keep = self.head_keep
        for victim in self.policy.victims():
            if victim == exclude:
                continue
            if profiles is not None:
                s = profiles.slots.get(victim)
                if s is not None and profiles.flags[s] & HEAD and len(heads) < HEAD_SCAN:
                    heads.append(victim)
                    continue
                if heads:
                    idle = now - profiles.last_access(victim)
                    while heads and need > 0 and now - profiles.last_access(heads[0]) >= keep * idle:
                        head = heads.pop(0)
                        chosen.append(head)
                        need -= size(head, entries[head].value)
                    if need <= 0:
                        break
            chosen.append(victim)
            need -= size(victim, entries[victim].value)
            if need <= 0:
                break
        for victim in heads:
            if need <= 0:
                break
            chosen.append(victim)
            need -= size(victim, entries[victim].value)
        return chosen

    def _check_last_tier_room(self, nbytes: int) -> None:
        ssd = self.ssd
        if ssd is not None and ssd.stuck_bytes > ssd.stuck_limit:
            raise OutOfMemoryError(f"command not allowed: the SSD tier cannot take writes ({ssd.degraded}).")
        if self.noeviction and self.ssd is not None:
            if self.ssd.used + self.ssd.queued_bytes + nbytes > self.ssd.budget:
                raise OutOfMemoryError("command not allowed: the SSD tier is full and maxmemory-policy is noeviction.")

    def _demote(self, key: bytes) -> None:
        """Move a DRAM entry down: a copy to each tier holding copies above the authoritative tier (or to all
        of them when there is none: best effort, each has its own budget), the entry itself to the
        authoritative tier. With neither taking it, it is evicted."""
        entry = self._drop_dram(key)
        if entry is None:
            return
        keeper = self.keeper
        stats = self.tier_stats
        kept = False
        if self._copies_above and not entry.expired(self.clock.now_ms()):
            for tier in self._copies_above:
                if tier.holds(key, entry.version):
                    kept = True
                    if keeper is None:
                        stats[tier.name].demotions += 1
                elif tier.put(key, entry):
                    kept = True
                    stats[tier.name].demotions += 1
        if keeper is not None:
            stats["dram"].demotions += 1
            if not entry.on_ssd:
                keeper.put(key, entry)
        elif kept:
            stats["dram"].demotions += 1
        else:
            stats["dram"].evictions += 1
            self.stats.evicted_keys += 1
            if self.on_event is not None:
                self.on_event(b"evicted", key)

    def _promote(self, key: bytes, entry: Entry) -> bool:
        """Bring a record of the authoritative tier up into DRAM (it leaves that tier unless ``keep_below``)."""
        keeper = self.keeper
        size = self.dram.size(key, entry.value)
        if size > self.dram.budget or keeper is None:
            return False
        try:
            self.make_room(size)
        except OutOfMemoryError:
            return False
        fresh = self._install(key, entry, size)
        if self.keep_below:
            # A clean copy (demoting it writes nothing), unless the SSD evicted the record after a load read it:
            # then nothing is below, and the entry stays dirty so that its demotion writes it.
            if key in self._evicted_below:
                del self._evicted_below[key]
            else:
                fresh.on_ssd = True
        else:
            keeper.delete(key)
        self.tier_stats[keeper.name].promotions += 1
        self.admission.forget(key)
        return True

    def adopt(self, key: bytes, entry: Entry, origin: str = "pool") -> bool:
        """Install a copy read from tier ``origin`` in DRAM, keeping its version (a pool or copy-tier hit, a
        STRONG refresh). The copy stays in ``origin``.

        It replaces any local copy, which is older (the caller checked). The authoritative tier keeps its role:
        under write-back its local record is now stale and is deleted (DRAM is authoritative); under
        write-through the SSD gets the adopted value unless it is this node's own write (which it already holds).
        """
        ssd = self.keeper
        size = self.dram.size(key, entry.value)
        old = self.dram.entries.get(key)
        if size > self.dram.budget - self.dram.pinned_bytes:
            return False
        try:
            self.make_room(size if old is None else size - self.dram.size(key, old.value), exclude=key)
        except OutOfMemoryError:
            return False
        if self.refetch:
            self.refetch.pop(key, None)
        if old is not None:
            self._drop_dram(key)
        fresh = self._install(key, entry, size)
        pool = self.pool if origin == "pool" else None
        ours = pool is not None and pool.wrote(key, entry.version)
        if pool is not None and not ours:
            pool.note(key, entry.version)
        if ssd is None:
            pass  # only copies below DRAM: nothing local to keep in step
        elif self.write_through:
            if not ours:
                ssd.put(key, fresh)
            fresh.on_ssd = True
        else:
            # Under write-back the local record is older than the adopted copy (kept saved copies too: the
            # newer version lives in the pool, a pool read would cost an SSD write each otherwise).
            ssd.delete(key)
        self.tier_stats[origin].promotions += 1
        return True

    def _install(self, key: bytes, entry: Entry, size: int) -> Entry:
        """A record from below comes into DRAM (SSD promotion, pool adoption): a fresh entry with the record's
        version and expiry, placed as a new key (``_place``). Room was made and any old DRAM copy dropped by the
        caller; the tiers below are the caller's."""
        fresh = Entry(entry.value, entry.version, entry.expire_at)
        self._place(key, fresh, size, None)
        return fresh

    def _drop_dram(self, key: bytes) -> Entry | None:
        """Take a key out of DRAM and out of the policy's and the prefetch tracking's view; its entry or None."""
        entry = self.dram.pop(key)
        if entry is not None:
            self.policy.remove(key)
            if self.prefetched:
                self._unprefetch(key)
        return entry
