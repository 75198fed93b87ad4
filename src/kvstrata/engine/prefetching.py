"""Prefetch accounting and admission: promotion of prefetched keys that never displaces hotter data, and the
outcome counters (issued, used, late, wasted) behind accuracy and coverage (docs/prefetch.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvstrata.errors import OutOfMemoryError

LATE = -1.0  # Store.prefetched: a read waited for this key's prefetch


class PrefetchMixin:
    """Store's prefetches (state: ``prefetched``, ``prefetch_protect``)."""

    def promote(self, key: bytes, *, sync: bool = True) -> bool:
        """Move a lower-tier key up now (a prefetch); False when it is missing, already in DRAM, or could only
        come up by displacing pinned, recently used or hotter data.

        ``sync=False`` (the server's prefetcher): only a key whose lower-tier state is known without reading
        LMDB (pending writes, the loader's overlay) is promoted; the event loop never reads a lower tier.
        """
        if key in self.dram.entries:
            return False
        if not sync and not self.loaded(key):
            return False
        entry, origin = self.lookup_below(key)
        if entry is None:
            self.stats.prefetch_absent += 1
            return False
        copy = not self._by_name[origin].authoritative
        size = self.dram.size(key, entry.value)
        if not copy and size > self.dram.budget:
            return False
        if not self._prefetch_room(key, size):
            self.stats.prefetch_rejected += 1
            return False
        # Room is made: the usual paths up only install the entry.
        done = self.adopt(key, entry, origin) if copy else self._promote(key, entry)
        if done:
            self.prefetched[key] = self.clock.monotonic()
            self.stats.prefetch_issued += 1
        return done

    def _prefetch_room(self, key: bytes, size: int) -> bool:
        """Make room for a prefetched key, but only by demoting colder data; False (nothing moved) otherwise."""
        dram = self.dram
        if dram.used + size <= dram.budget:
            return True
        if dram.pinned_bytes + size > dram.budget:
            return False
        need = dram.used + size - dram.budget
        chosen = self._choose_victims(need, key)
        if sum(dram.size(k, dram.entries[k].value) for k in chosen) < need:
            return False
        # Predicted reuse decides, counted in accesses: a victim must be expected to be used later than the
        # prefetched key (Predictor.may_displace). Without a predictor, a prefetch never displaces another
        # prefetch nobody has read yet.
        predictor = self.predictor
        if predictor is not None:
            if not predictor.may_displace(key, chosen, self.prefetch_protect):
                return False
        elif any(victim in self.prefetched for victim in chosen):
            return False
        try:
            self._move_out(chosen)
        except OutOfMemoryError:
            return False
        return True

    def _prefetch_used(self, key: bytes) -> None:
        landed = self.prefetched.pop(key)
        self.stats.prefetch_used += 1
        if landed < 0:
            self.stats.prefetch_late += 1

    def _unprefetch(self, key: bytes) -> None:
        if self.prefetched.pop(key, None) is not None:
            self.stats.prefetch_wasted += 1

    def mark_late(self, keys: Iterable[bytes]) -> None:
        """These prefetched keys were read while their load was still in flight (the read waited for it)."""
        for key in keys:
            if key in self.prefetched:
                self.prefetched[key] = LATE

    def prefetch_ratios(self) -> tuple[float | None, float | None]:
        """(accuracy, coverage), each None while there is nothing to measure (docs/prefetch.md)."""
        st = self.stats
        lower = st.prefetch_used + sum(t.hits for name, t in self.tier_stats.items() if name != "dram")
        accuracy = round(st.prefetch_used / st.prefetch_issued, 4) if st.prefetch_issued else None
        coverage = round((st.prefetch_used - st.prefetch_late) / lower, 4) if lower else None
        return accuracy, coverage

    def prefetch_info(self) -> dict[str, float | int]:
        """Prefetch outcomes and the ratios built from them (0.0 while there is nothing to measure)."""
        st = self.stats
        accuracy, coverage = self.prefetch_ratios()
        out: dict[str, float | int] = {
            "prefetch_issued": st.prefetch_issued,
            "prefetch_used": st.prefetch_used,
            "prefetch_late": st.prefetch_late,
            "prefetch_wasted": st.prefetch_wasted,
            "prefetch_pending_use": len(self.prefetched),
            "prefetch_absent": st.prefetch_absent,
            "prefetch_rejected": st.prefetch_rejected,
            "prefetch_predicted": st.prefetch_predicted,
            "prefetch_accuracy": 0.0 if accuracy is None else accuracy,
            "prefetch_coverage": 0.0 if coverage is None else coverage,
        }
        if self.predictor is not None:
            out.update(self.predictor.info())
        return out
