"""LRU-K as two segments with adaptive sizing (draft)."""

from __future__ import annotations

from collections import OrderedDict

from kvstrata.clock import Clock, SystemClock


class _Rec:
    __slots__ = ("count", "last")

    def __init__(self, count: int, last: float) -> None:
        self.count = count
        self.last = last


class LRUKPolicy:
    name = "lru-k"

    def __init__(
        self,
        k: int = 2,
        crp: float = 1.0,
        clock: Clock | None = None,
        retained: int = 100_000,
        *,
        p0: float = 0.0,
        crp_guard: bool = True,
        adapt: bool = True,
        ratio: bool = True,
        sym: bool = False,
    ) -> None:
        if k < 1:
            raise ValueError("LRU-K needs K >= 1")
        if crp < 0:
            raise ValueError("the correlated-reference period cannot be negative")
        if retained < 0:
            raise ValueError("retained cannot be negative")
        self.k = k
        self.crp = crp
        self._now = (clock or SystemClock()).monotonic
        self._retained = retained
        self._prob: OrderedDict[bytes, _Rec] = OrderedDict()
        self._prot: OrderedDict[bytes, _Rec] = OrderedDict()
        self._gprob: OrderedDict[bytes, _Rec] = OrderedDict()
        self._gprot: OrderedDict[bytes, _Rec] = OrderedDict()
        self._p0 = p0
        self._p = p0
        self._guard = crp_guard
        self._adapt = adapt
        self._ratio = ratio
        self._sym = sym

    @property
    def probation_target(self) -> float:
        return self._p

    def _place(self, key: bytes, rec: _Rec) -> None:
        if rec.count >= self.k:
            self._prot[key] = rec
        else:
            self._prob[key] = rec

    def admit(self, key: bytes) -> None:
        if key in self._prob or key in self._prot:
            self.touch(key)
            return
        now = self._now()
        rec = self._gprob.pop(key, None)
        if rec is not None:
            if self._adapt:
                n = len(self._prob) + len(self._prot) + 1
                b1 = len(self._gprob) + 1
                self._p = min(1.0, self._p + (max(1.0, len(self._gprot) / b1) if self._ratio else 1.0) / n)
            if now - rec.last > self.crp:
                rec.count += 1
            rec.last = now
            self._place(key, rec)
            return
        rec = self._gprot.pop(key, None)
        if rec is not None:
            if self._adapt:
                n = len(self._prob) + len(self._prot) + 1
                b2 = len(self._gprot) + 1
                self._p = max(0.0, self._p - (max(1.0, len(self._gprob) / b2) if self._ratio else 1.0) / n)
            rec.last = now
            self._prot[key] = rec
            return
        self._place(key, _Rec(1, now))

    def touch(self, key: bytes) -> None:
        rec = self._prob.get(key)
        if rec is not None:
            now = self._now()
            if now - rec.last > self.crp:
                rec.count += 1
                if rec.count >= self.k:
                    rec.last = now
                    del self._prob[key]
                    self._prot[key] = rec
                    return
            rec.last = now
            self._prob.move_to_end(key)
            return
        rec = self._prot.get(key)
        if rec is None:
            self.admit(key)
            return
        rec.last = self._now()
        self._prot.move_to_end(key)

    def remove(self, key: bytes) -> None:
        rec = self._prob.pop(key, None)
        if rec is not None:
            self._gprob[key] = rec
        else:
            rec = self._prot.pop(key, None)
            if rec is None:
                return
            self._gprot[key] = rec
        live = len(self._prob) + len(self._prot) + 1
        cap = min(live, self._retained)
        gprob, gprot = self._gprob, self._gprot
        while gprob and len(gprob) + len(self._prob) > live:
            gprob.popitem(last=False)
        if self._sym:
            while gprot and len(gprot) + len(self._prot) > live:
                gprot.popitem(last=False)
        while len(gprob) + len(gprot) > cap:
            (gprot or gprob).popitem(last=False)

    def victim(self) -> bytes | None:
        prob, prot = self._prob, self._prot
        if not prob:
            return next(iter(prot), None)
        if not prot:
            return next(iter(prob))
        first, second = (prob, prot) if len(prob) > self._p * (len(prob) + len(prot)) else (prot, prob)
        key, rec = next(iter(first.items()))
        if self._guard and self._now() - rec.last <= self.crp:
            key2, rec2 = next(iter(second.items()))
            if self._now() - rec2.last > self.crp:
                return key2
        return key

    def references(self, key: bytes) -> int:
        """How many uncorrelated references are remembered for a key (resident or retained), at most K."""
        rec = self._prob.get(key) or self._prot.get(key) or self._gprob.get(key) or self._gprot.get(key)
        return 0 if rec is None else min(rec.count, self.k)

    def __len__(self) -> int:
        return len(self._prob) + len(self._prot)

    def __contains__(self, key: object) -> bool:
        return key in self._prob or key in self._prot

    def clear(self) -> None:
        self._prob.clear()
        self._prot.clear()
        self._gprob.clear()
        self._gprot.clear()
        self._p = self._p0
