"""The predictor: from what a client stream reads now, which chunks it will read next.

Each client stream (a connection in the server, a request in the replay benchmark) is followed separately, and
inside a stream each key *family* (the text before the key's last ``:``: the SDK's ``kvs:<namespace>:`` and a
``{shard}`` tag when the keys carry one) has its own **lane**, so several conversations interleaved on one
connection (an SGLang batch, a shared connection pool) keep their chains apart. Its reads and writes teach
:class:`~kvstrata.engine.profile.AccessProfiles` the chunk chains; its reads trigger walks along them:

* a read that continues the lane's current walk (the chunk predicted next) slides the window, which is topped
  up at the far end once ``REFILL`` of its chunks were read, so the walk stays ahead of the reader and its
  predictions go out a few at a time; after ``TRUST_STREAK`` such reads in a row the walk is trusted and keeps
  ``TRUST_AHEAD`` more chunks ahead, past a low-scoring or untested link (never past a branch);
* any other read starts a new walk from that chunk. When the chunk after it has left DRAM, the reader is a
  session coming back (a conversation's next turn, a document asked about again) and the walk goes to the end
  of the chain, up to ``session_max`` chunks, to bring the whole context up while the first chunks are served;
  otherwise it keeps ``window`` chunks ahead;
* a lookup (``EXISTS`` over a prefix, as SGLang's ``batch_exists`` and vLLM's scheduler send before reading)
  announces the reads: the keys it found are predicted at once, in order (:meth:`Predictor.lookup`).

Nothing here is measured in seconds. Links are learned between a lane's consecutive keys only when they are at
most ``link_window`` times the stream's usual gap apart, counted in accesses (the gap adapts to how many
streams share the server); a returning session is recognised by DRAM having dropped its chain, not by a time
out; every predicted key gets an expected use, in accesses (:meth:`Predictor.next_use`), which is what a
prefetch compares with the keys it would displace (:meth:`Predictor.may_displace`).

A walk multiplies the scores of the turn boundaries it crosses (each is a separate event: did the session go
on past that turn?) and stops where the product drops below ``min_confidence``, at an interior link scoring
below it, at a branch, or where the chain is unknown, so it never guesses which conversation follows a shared
system prompt. Predictions wait in the lane until :meth:`Predictor.take` hands them to whoever moves data (the
server's prefetch queue), minus those already read by then: a multi-key read (MGET) does not prefetch the keys
it reads itself.

:meth:`Predictor.read` and :meth:`Predictor.write` only log the access, and the log is processed in one batch when
the predictions are asked for (the server does so after each command, once its reply went out; a multi-key read
pays once), with the same predictions as processing each access at once. A read that continues its lane's
walk, with nothing logged before it, is processed at once instead (the short path, :meth:`Predictor._continue`:
the same steps), and leaves nothing to take unless the window was topped up.

:class:`PurePredictor` is all of this in Python, the definition. :data:`Predictor`, what the server runs, is the
same class with ``read``, ``write``, ``take`` and the processing of the log in C (``kvstrata.native._predict``,
built at install time; tests/unit/test_predict_native.py holds it to PurePredictor's predictions), or
PurePredictor itself where that module was not built or ``KVSTRATA_NATIVE_PREDICT=0`` (``NATIVE_WHY`` says why).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterable
from itertools import islice

from kvstrata.clock import Clock, SystemClock
from kvstrata.engine.profile import BOUNDARY, BRANCH, COUNT_MAX, HEAD, PRIOR_WEIGHT, AccessProfiles

LANES_PER_STREAM = 16
"""Key families one stream follows at once (the least recently used lane is dropped beyond)."""
LINK_MIN = 16
"""Accesses two keys of a lane may always be apart and still link (a stream's gap is not known at first)."""
DUE_MAX = 65536
"""Most predicted keys whose expected use is remembered (beyond, the oldest quarter is forgotten at once)."""
FAMILIES_MAX = 65536
"""Distinct key families whose bytes are shared among their keys' profiles (beyond, the table starts over)."""
LOG_MAX = 4096
"""Accesses logged before a read or write processes the log itself (nobody asked for predictions meanwhile)."""
TRUST_STREAK = 2
"""Consecutive continuation reads (the reader read exactly the chunk predicted next) that make a walk trusted."""
TRUST_AHEAD = 2
"""Chunks a trusted walk keeps beyond where confidence alone would stop it (past a low-scoring or untested link,
or past its budget): a reader that went along the last TRUST_STREAK predictions goes on more often than the
link scores say (a document or context re-read from its start is read to its end)."""
REFILL = 4
"""A sliding window is topped up once this many of its chunks were read (at most half its budget), not after
every read: the predictions of a chain go out in batches, and most reads have nothing new to hand out."""


def _arrays(p: AccessProfiles) -> tuple:  # type: ignore[type-arg]
    """The profile table's dict and arrays, in the order _drain and _grow unpack them (one tuple unpack instead
    of a dozen attribute loads per batch: most batches hold one access)."""
    return (p.slots, p.tick_at, p.heat, p.ival, p.last, p.ref, p.gen, p.next, p.next_gen, p.pred, p.pred_gen,
            p.flags, p.cont, p.stop, p.keys, p.family)


def family(key: bytes) -> bytes:
    """A key's family: the text before its last ``:`` (namespace and tag), or b"" for a key without one."""
    i = key.rfind(b":")
    return key[:i] if i >= 0 else b""


class _Lane:
    __slots__ = ("ahead", "budget", "extra", "fam", "hold", "low", "prev", "prev_gen", "prev_read", "prob", "probs",
                 "sent", "streak", "stuck", "tick")

    def __init__(self, fam: bytes = b"") -> None:
        self.fam = fam  # the key family this lane follows (the profile table's shared bytes object)
        self.prev = -1
        self.prev_gen = 0
        self.prev_read = False
        self.tick = 0  # access number of the lane's last key
        self.ahead: list[bytes] = []  # predicted keys, in the order they will be read
        self.probs: list[float] = []  # link score of each step of ``ahead``
        self.prob = 1.0  # their product, multiplied in order (-1.0: to be recomputed)
        self.sent = 0  # how many of ``ahead`` were handed out by take()
        self.budget = 0  # how far ahead this walk may go
        self.stuck = False  # the walk ended at a branch or at the end of the known chain
        self.hold: bytes | None = None  # first chunk past an untested link: nothing further until it is read
        self.streak = 0  # consecutive reads of exactly the chunk predicted next (TRUST_STREAK: trusted)
        self.extra = 0  # chunks at the end of ``ahead`` that only the walk's trust predicted (TRUST_AHEAD)
        self.low = -1  # the window is topped up when ``ahead`` is down to this many (REFILL)


class _Stream:
    __slots__ = ("gap", "hot", "lanes", "tick")

    def __init__(self, gap: float) -> None:
        self.lanes: dict[bytes, _Lane] = {}
        self.hot: _Lane | None = None  # the lane of the stream's last access (Predictor.read's short path)
        self.gap = gap  # moving average of the accesses (all streams) between two of this stream's accesses
        self.tick = 0


class PurePredictor:
    """The predictor in Python: the definition of what it predicts. :data:`Predictor` is this class with its hot
    path compiled (``kvstrata.native._predict``) where that module was built, else this class itself."""

    # The classes of its per-stream state (the compiled predictor has its own, with the same attributes).
    Lane: type = _Lane
    Stream: type = _Stream
    NATIVE = False  # whether read, write, take and the walks are compiled (INFO prefetch predict_native)

    def __init__(self, clock: Clock, *, max_keys: int = 262_144, window: int = 8, session_max: int = 64,
                 min_confidence: float = 0.6, link_window: float = 8.0, half_life: float = 1.0,
                 max_streams: int = 4096, trust_streak: int = TRUST_STREAK, trust_ahead: int = TRUST_AHEAD,
                 refill: int = REFILL, short_path: bool = True) -> None:
        self.clock = clock
        # The system clock's reading without its Python frame (read() runs on every profiled access).
        self._now = time.monotonic if type(clock) is SystemClock else clock.monotonic
        self._profiles = AccessProfiles(clock, max_keys=max_keys, half_life=half_life)
        self._arrays = _arrays(self._profiles)
        # Accesses not processed yet: (key, stream, is_read, monotonic time), see read().
        self._log: list[tuple[bytes, int, bool, float]] = []
        self.window = window
        self.session_max = max(session_max, window)
        self.min_confidence = min_confidence
        self.link_window = link_window
        self.max_streams = max_streams
        self.trust_streak = trust_streak
        self.trust_ahead = trust_ahead
        self.refill = max(1, refill)
        # Whether a continuation read is processed at once in read() (identical predictions, less work per
        # read; off only to check that: tests/unit/test_predict_short.py).
        self.short_path = short_path
        # The keys DRAM holds (the Store's entries, see attach): a walk whose next chunk is not there is a return.
        self.resident: Collection[bytes] = ()
        self.gap = 1.0  # moving average of every stream's gap: the expected distance between a stream's reads
        self.survival = float("inf")  # accesses DRAM keeps a key unused (learned from prefetch victims)
        self._streams: dict[int, _Stream] = {}
        self._dirty: dict[int, _Lane] = {}
        self._announced: list[bytes] = []
        self._families: dict[bytes, bytes] = {}
        # Whether take() may have something (accesses logged, predictions not handed out yet): an attribute, not
        # a property, as the server asks after every command; take() resets it.
        self.pending = False
        self._due: dict[bytes, tuple[int, float]] = {}
        self.due_max = DUE_MAX
        self.walks = 0
        self.session_walks = 0
        self.lookups = 0
        self.expects = 0

    @property
    def profiles(self) -> AccessProfiles:
        """The access profiles, with every logged access recorded."""
        if self._log:
            self._drain()
        return self._profiles

    def attach(self, resident: Collection[bytes]) -> None:
        """Give the predictor a view of what DRAM holds (the store's entries dict, read only)."""
        self._drain()
        self.resident = resident

    def set_half_life(self, half_life: float) -> None:
        self.profiles.half_life = half_life

    # ---- streams ----
    def _stream(self, sid: int) -> _Stream:
        st = self._streams.get(sid)
        if st is None:
            if len(self._streams) >= self.max_streams:
                self._forget(next(iter(self._streams)))
            st = self._streams[sid] = self.Stream(self.gap)
        return st

    def _lane(self, st: _Stream, fam: bytes) -> _Lane:
        lanes = st.lanes
        lane = lanes.get(fam)
        if lane is None:
            if len(lanes) >= LANES_PER_STREAM:
                old = lanes.pop(next(iter(lanes)))
                self._dirty.pop(id(old), None)
                if st.hot is old:
                    st.hot = None
            lane = lanes[fam] = self.Lane(fam)
        return lane

    def clear(self) -> None:
        """Forget every profile and stream (FLUSHALL: the chains they describe are gone)."""
        p = self.profiles
        self._profiles = AccessProfiles(self.clock, max_keys=p.max_keys, half_life=p.half_life)
        self._arrays = _arrays(self._profiles)
        self._streams.clear()
        self._dirty.clear()
        self._announced.clear()
        self._due.clear()
        self.pending = False

    def forget_stream(self, sid: int) -> None:
        """The stream ended (a connection closed, a request finished): drop its state and pending predictions."""
        self._drain()
        self._forget(sid)

    def _forget(self, sid: int) -> None:
        st = self._streams.pop(sid, None)
        if st is not None:
            for lane in st.lanes.values():
                self._dirty.pop(id(lane), None)

    # ---- observations ----
    # Reads and writes only log the access (a tuple append: Store.get and Store.put call these on every profiled
    # access). The log is processed in one batch by whoever next asks for the predictor's state (take, next_use,
    # may_displace, profiles, ...), or at once by a read that missed DRAM: attribute lookups are paid once per
    # batch. Predictions are those of processing each access at once (tests/unit/test_predict_batched.py), except
    # that a walk started by a DRAM hit sees DRAM as it is when the batch is processed.
    def write(self, key: bytes, sid: int) -> None:
        log = self._log
        log.append((key, sid, False, self._now()))
        self.pending = True
        if len(log) >= LOG_MAX:
            self._drain()

    def read(self, key: bytes, sid: int) -> None:
        if self.short_path and not self._log:
            # The short path: a read of the chunk the stream's last lane predicted next, with nothing logged before
            # it, is processed at once (_continue), which is less work than logging it and draining the log.
            st = self._streams.get(sid)
            if st is not None:
                lane = st.hot
                if lane is not None:
                    ahead = lane.ahead
                    if ahead and ahead[0] == key and self._continue(st, lane, ahead, key):
                        return
        log = self._log
        log.append((key, sid, True, self._now()))
        self.pending = True
        if key not in self.resident or len(log) >= LOG_MAX:
            # A read from a lower tier (rare, and slow anyway) is processed at once, while DRAM is as the read
            # found it: the store brings the key up (and may drop others) right after.
            self._drain()

    def _drain(self) -> None:
        """Process the logged accesses in order: learn links and outcomes, slide or start walks."""
        log = self._log
        if not log:
            return
        self._log = []
        p = self._profiles
        slots, tick_at, heat, ival, last, ref, gen, nxt, next_gen, pred, pred_gen, flags, cont, stop, keys, fams = \
            self._arrays
        interior = p.interior
        boundary = p.boundary
        families = self._families
        streams = self._streams
        due = self._due
        link_window = self.link_window
        horizon = p.horizon
        tick = p.tick
        # Kept in locals for the batch and written back before anything else reads them (the table's access
        # count: nothing called from this loop reads it; the overall gap: _stream and _reach do).
        all_gap = self.gap
        last_sid: int | None = None  # consecutive accesses of one stream (a batch, an MGET) share a lookup
        st: _Stream
        for key, sid, is_read, now in log:
            s = slots.get(key)
            if s is None:
                s = p.slot(key)
            # AccessProfiles.touch, inline.
            tick += 1
            at = tick_at[s]
            h = heat[s]
            if at:
                g = tick - at
                if h:
                    h *= 0.5 ** (g / horizon)
                iv = ival[s]
                ival[s] = g if not iv else iv + (g - iv) * 0.25
            heat[s] = h + 1.0
            tick_at[s] = tick
            last[s] = now if now > 0.0 else 1e-9
            ref[s] = 1
            if not tick & 63:
                # Half-lives scale with the memory keys compete for: counted in DRAMs full of accesses.
                n = len(self.resident) or 4096
                horizon = p.horizon = max(64.0, p.half_life * n)
            if sid != last_sid:
                st = streams.get(sid)
                if st is None:
                    self.gap = all_gap
                    st = self._stream(sid)
                last_sid = sid
            gap = st.gap
            limit = link_window * gap
            if limit < LINK_MIN:
                limit = LINK_MIN
            g = st.tick
            if g:
                g = tick - g
                if g <= limit:
                    # Only gaps inside a request teach the usual gap; a pause between requests is not one.
                    st.gap = gap + (g - gap) * 0.125
                    all_gap += (g - all_gap) * 0.01
            st.tick = tick
            fam = fams[s]
            if fam is None:
                # Parsed once per profiled key (the slot keeps it); equal families share one bytes object.
                i = key.rfind(b":")
                fam = key[:i] if i >= 0 else b""
                if len(families) >= FAMILIES_MAX:
                    families.clear()
                fam = fams[s] = families.setdefault(fam, fam)
            lane = st.lanes.get(fam)
            if lane is None:
                lane = self._lane(st, fam)
            prev = lane.prev
            same = False
            if prev >= 0 and gen[prev] == lane.prev_gen and tick - lane.tick <= limit:
                if prev == s:
                    # A read-miss filled by a write of the same key is still that read.
                    lane.tick = tick
                    same = True
                elif lane.prev_read:
                    succ = nxt[prev]
                    if succ >= 0 and gen[succ] == next_gen[prev]:
                        if is_read and succ == s:
                            # The reader went on along the known link (AccessProfiles.outcome, inline).
                            if cont[prev] < COUNT_MAX:
                                cont[prev] += 1
                            f = flags[prev]
                            if not f & BRANCH:
                                (boundary if f & BOUNDARY else interior).cont += 1
                        elif is_read and (q := pred[s]) >= 0 and gen[q] == pred_gen[s]:
                            # A chunk of another chain read in between (an interleaved conversation of this
                            # family): no evidence about ``prev``; its own chain's next read still counts.
                            pass
                        else:
                            p.outcome(prev, False)
                            if not is_read:
                                p.link(prev, s)  # a new turn written after this read: a branch if it differs
                    elif not is_read:
                        if p.link(prev, s):
                            flags[prev] |= BOUNDARY
                    elif p.link(prev, s):
                        p.outcome(prev, True)  # a link a reader made is one it has read across
                elif not is_read:
                    p.link(prev, s)
                # A read after a write is where a stream's next request starts: never a link.
            if not same:
                if is_read:
                    q = pred[s]
                    if q >= 0 and q != prev and gen[q] == pred_gen[s] and tick - tick_at[q] <= 4 * limit:
                        # Its parent was read a moment ago, on this lane or an interleaved one: the reader went on.
                        p.outcome(q, True)
                lane.prev = s
                lane.prev_gen = gen[s]
                lane.prev_read = is_read
                lane.tick = tick
            st.hot = lane
            if not is_read:
                continue
            if due:
                due.pop(key, None)
            ahead = lane.ahead
            if ahead and ahead[0] == key:
                # The common case: the reader took the chunk predicted next (what read()'s short path does).
                self._advance(lane, ahead)
            else:
                self.gap = all_gap
                self._slide(lane, key, s)
        p.tick = tick
        self.gap = all_gap

    def _continue(self, st: _Stream, lane: _Lane, ahead: list[bytes], key: bytes) -> bool:
        """read()'s short path: the read of ``key``, ``ahead[0]`` of ``lane`` (the stream's last lane), when it is
        a plain continuation (the reader went on along the link it last read across, in time); False, with
        nothing changed, for anything else (the log and _drain handle it). Exactly _drain's steps for such a
        read, in the same order: tests/unit/test_predict_short.py runs both in lock-step."""
        slots, tick_at, heat, ival, last, ref, gen, nxt, next_gen, pred, pred_gen, flags, cont, _, _, fams = \
            self._arrays
        s = slots.get(key)
        if s is None or fams[s] is not lane.fam:
            return False
        prev = lane.prev
        if prev < 0 or prev == s or not lane.prev_read or nxt[prev] != s or gen[s] != next_gen[prev] or \
                gen[prev] != lane.prev_gen:
            return False
        p = self._profiles
        tick = p.tick + 1
        gap = st.gap
        limit = self.link_window * gap
        if limit < LINK_MIN:
            limit = LINK_MIN
        if tick - lane.tick > limit:
            return False
        q = pred[s]
        if q >= 0 and q != prev and gen[q] == pred_gen[s] and tick - tick_at[q] <= 4 * limit:
            return False  # its parent on another lane was read a moment ago: _drain's outcome for it
        # AccessProfiles.touch, inline (as _drain).
        p.tick = tick
        at = tick_at[s]
        h = heat[s]
        if at:
            g = tick - at
            if h:
                h *= 0.5 ** (g / p.horizon)
            iv = ival[s]
            ival[s] = g if not iv else iv + (g - iv) * 0.25
        heat[s] = h + 1.0
        tick_at[s] = tick
        now = self._now()
        last[s] = now if now > 0.0 else 1e-9
        ref[s] = 1
        if not tick & 63:
            n = len(self.resident) or 4096
            p.horizon = max(64.0, p.half_life * n)
        g = st.tick
        if g:
            g = tick - g
            if g <= limit:
                st.gap = gap + (g - gap) * 0.125
                self.gap += (g - self.gap) * 0.01
        st.tick = tick
        # The reader went on along the known link (AccessProfiles.outcome, inline).
        if cont[prev] < COUNT_MAX:
            cont[prev] += 1
        f = flags[prev]
        if not f & BRANCH:
            (p.boundary if f & BOUNDARY else p.interior).cont += 1
        lane.prev = s
        lane.prev_gen = gen[s]
        lane.tick = tick
        due = self._due
        if due:
            due.pop(key, None)
        # _advance, inline (and the lane marked pending for take(), which _drain's callers do): calling it cost
        # 0.12-0.14 us more per continuation read, 3-4% of the predictor's cost, in a same-process A/B of the
        # two versions (2026-12-02). test_predict_short holds the two in lock step.
        del ahead[0]
        if lane.probs.pop(0) != 1.0:
            lane.prob = -1.0
        if lane.sent:
            lane.sent -= 1
        n = len(ahead)
        if lane.extra:
            lane.extra = min(lane.extra - 1, n)
        streak = lane.streak = lane.streak + 1
        if streak == self.trust_streak:
            self._set_low(lane)
        if n <= lane.low and not lane.stuck:
            self._extend(lane)
            if len(ahead) > lane.sent:
                self._dirty[id(lane)] = lane
                self.pending = True
        return True

    def _advance(self, lane: _Lane, ahead: list[bytes]) -> None:
        """The reader took ``ahead[0]``, the chunk predicted next: slide the window, topped up every REFILL
        reads (a trusted walk, TRUST_STREAK continuations in a row, may go TRUST_AHEAD chunks further)."""
        del ahead[0]
        if lane.probs.pop(0) != 1.0:
            lane.prob = -1.0
        if lane.sent:
            lane.sent -= 1
        n = len(ahead)
        if lane.extra:
            # The trusted chunks are the end of the window, and one more of them is now one the reader went
            # towards (the walk without trust would now predict up to it).
            lane.extra = min(lane.extra - 1, n)
        lane.streak += 1
        if lane.streak == self.trust_streak:
            self._set_low(lane)
        if n <= lane.low and not lane.stuck:
            self._extend(lane)
            if len(ahead) > lane.sent:
                self._dirty[id(lane)] = lane

    def _set_low(self, lane: _Lane) -> None:
        """When the lane's window is topped up: once REFILL chunks (at most half the budget) were read from
        it full (a trusted walk's full is TRUST_AHEAD further)."""
        cap = lane.budget
        if self.trust_ahead > 0 and lane.streak >= self.trust_streak:
            cap += self.trust_ahead
        r = lane.budget // 2
        if r > self.refill:
            r = self.refill
        lane.low = cap - (r if r > 1 else 1)

    def _slide(self, lane: _Lane, key: bytes, s: int) -> None:
        """A read of ``key`` (slot ``s``) that is not the lane's predicted next chunk: skip ahead to it when it
        was predicted further on, else start a new walk from it."""
        ahead = lane.ahead
        if key in ahead:
            i = ahead.index(key) + 1
            del ahead[:i]
            del lane.probs[:i]
            lane.prob = -1.0
            lane.sent = max(0, lane.sent - i)
            if lane.extra:
                lane.extra = max(0, min(lane.extra - i, len(ahead)))
            lane.streak = 0  # not the chunk predicted next: the walk is not confirmed
            self._set_low(lane)
            self._extend(lane)
        else:
            budget, returning = self._reach(s)
            self._walk(lane, s, budget, returning)
        if len(lane.ahead) > lane.sent:
            self._dirty[id(lane)] = lane

    def _reach(self, s: int) -> tuple[int, bool]:
        """How many chunks a walk from slot ``s`` may predict, and whether its reader is a session coming back."""
        p = self._profiles
        nk = p.next[s]
        # The chunk after this one has left DRAM: a session coming back, whose whole context is below.
        returning = nk >= 0 and p.gen[nk] == p.next_gen[s] and p.keys[nk] not in self.resident
        budget = self.session_max if returning else self.window
        # No further ahead than DRAM keeps a key unused (a chunk due later would be dropped before its read), nor
        # more than a fair share of DRAM: half of it split among the streams reading at once.
        sgap = self.gap if self.gap > 1.0 else 1.0
        reach = min(self.survival, len(self.resident) / 2 if self.resident else float("inf")) / sgap
        if reach < budget:
            budget = max(1, int(reach))
        return budget, returning

    def expect(self, key: bytes, sid: int) -> None:
        """Stream ``sid`` is about to load ``key`` from a lower tier to read it: predict now what that read will
        (the walk from ``key``, unless it continues the stream's walk), so those chunks load right behind it
        instead of after its reply. The read itself is recorded when it happens, as any other."""
        self._drain()
        p = self._profiles
        s = p.slots.get(key)
        if s is None:
            return
        st = self._streams.get(sid)
        lane = st.lanes.get(family(key)) if st is not None else None
        if lane is not None and key in lane.ahead:
            return  # a continuation: what follows is predicted already
        scratch = self.Lane()
        scratch.budget = self._reach(s)[0]
        self._grow(scratch, s, 1.0)
        if scratch.ahead:
            self.expects += 1
            self._announced.extend(scratch.ahead)
            self.pending = True

    def lookup(self, keys: Iterable[bytes], sid: int) -> None:
        """A lookup batch (EXISTS) found ``keys``: the client is about to read them; predict those not in DRAM."""
        resident = self.resident
        fresh = [k for k in keys if k not in resident]
        if fresh:
            self.lookups += 1
            self._announced.extend(fresh)
            self.pending = True

    # ---- walks ----
    def _walk(self, lane: _Lane, s: int, budget: int, session: bool) -> None:
        self.walks += 1
        if session:
            self.session_walks += 1
        lane.ahead = []
        lane.probs = []
        lane.prob = 1.0
        lane.sent = 0
        lane.budget = budget
        lane.stuck = False
        lane.hold = None
        lane.streak = 0
        lane.extra = 0
        self._set_low(lane)
        self._grow(lane, s, 1.0)

    def _extend(self, lane: _Lane) -> None:
        trusted = self.trust_ahead > 0 and lane.streak >= self.trust_streak
        if lane.hold is not None:
            if lane.hold in lane.ahead:
                if not trusted:
                    return
            else:
                lane.hold = None
        if lane.stuck or len(lane.ahead) >= lane.budget + (self.trust_ahead if trusted else 0):
            return
        if lane.ahead:
            s = self._profiles.slots.get(lane.ahead[-1], -1)
            if s < 0:
                lane.stuck = True
                return
            prob = lane.prob
            if prob < 0.0:
                prob = 1.0
                for q in lane.probs:
                    prob *= q
                lane.prob = prob
        else:
            s = lane.prev
            prob = 1.0
        self._grow(lane, s, prob)

    def _grow(self, lane: _Lane, s: int, prob: float) -> None:
        p = self._profiles
        _, _, _, _, _, _, gen, nxt, next_gen, _, _, flags, cont, stop, keys, _ = self._arrays
        interior = p.interior
        min_confidence = self.min_confidence
        ahead = lane.ahead
        budget = lane.budget
        # A trusted walk (its last TRUST_STREAK predictions were read in order) goes TRUST_AHEAD chunks past its
        # budget and past where confidence stops it (a low score, an untested link): ``extra`` counts those
        # chunks, the end of the window; structure (a branch, the end of the known chain) still stops it.
        trust = self.trust_ahead if lane.streak >= self.trust_streak else 0
        if trust:
            budget += trust
        extra = lane.extra
        seen = 0
        while len(ahead) < budget:
            f = flags[s]
            if f & BRANCH:
                lane.stuck = True
                return
            n = nxt[s]
            if n < 0 or gen[n] != next_gen[s] or n == s:
                lane.stuck = True
                return
            # AccessProfiles.link_score, inline (the same arithmetic: the same predictions).
            c = cls = p.boundary if f & BOUNDARY else interior
            prior = (c.cont + c.prior_cont) / (c.cont + c.stop + c.prior_cont + c.prior_stop)
            c = cont[s]
            q = (c + PRIOR_WEIGHT * prior) / (c + stop[s] + PRIOR_WEIGHT)
            if cls is interior:
                # Inside one written run the links stand or fall together (a prefix reader stops only where
                # its cached prefix ends), so they do not compound; crossing a turn's end is a new event.
                q = 1.0 if q >= min_confidence else 0.0
            if extra or prob * q < min_confidence or lane.hold is not None:
                if extra >= trust:
                    return  # may pass later, once reads have confirmed the steps before it
                extra += 1
            key = keys[n]
            if key is None:
                lane.stuck = True
                return
            lane.prob = prob = prob * q
            ahead.append(key)
            lane.probs.append(q)
            lane.extra = extra
            if not c:
                # Nobody has read across this link yet (it was written, never followed by a reader): one chunk,
                # and the rest once the reader takes it, so a wrong guess (a document whose readers never go on
                # to an earlier request's query and answer) costs one chunk, not that request's whole output
                # (a trusted walk goes on, its chunks past this one counted in ``extra``).
                lane.hold = key
                if not trust:
                    return
            s = n
            seen += 1
            if seen > self.session_max:  # a cycle of bad links cannot make a walk endless
                lane.stuck = True
                return

    # ---- output ----
    def take(self) -> list[bytes]:
        """Predicted keys not handed out yet, nearest first per lane; each gets an expected use (next_use)."""
        if not self.pending:
            return []  # nothing logged nor predicted since the last take (most reads: see REFILL)
        if self._log:
            self._drain()
        out: list[bytes] = []
        tick = self._profiles.tick
        due = self._due
        gap = self.gap
        if gap < 1.0:
            gap = 1.0
        if self._announced:
            for i, key in enumerate(self._announced):
                d = (i + 1) * gap
                due[key] = (tick + int(d), d)
            out.extend(self._announced)
            self._announced = []
        dirty = self._dirty
        if dirty:
            for lane in dirty.values():
                ahead = lane.ahead
                n = len(ahead)
                for i in range(lane.sent, n):
                    key = ahead[i]
                    d = (i + 1) * gap
                    due[key] = (tick + int(d), d)
                    out.append(key)
                lane.sent = n
            dirty.clear()
        if len(due) > self.due_max:
            # The oldest quarter goes at once, into a new dict: deleting one key at a time from the front leaves
            # deleted slots that every later next(iter()) scans again until the dict resizes.
            self._due = dict(islice(due.items(), len(due) - self.due_max * 3 // 4, None))
        self.pending = False
        return out

    # ---- predicted reuse ----
    def due_at(self, key: bytes) -> int:
        """The access number at which ``key`` is expected to be read (its pending prediction; take() sets it),
        or the current one for a key not predicted: the order in which prefetches are worth loading."""
        d = self._due.get(key)
        return d[0] if d is not None else self._profiles.tick

    def next_use(self, key: bytes) -> float:
        """Accesses (all streams) until ``key`` is expected to be read: from a prediction when one is pending
        (until it is as late again as it was far), else from the key's own history; inf for an unknown key."""
        p = self.profiles
        d = self._due.get(key)
        if d is not None:
            left = d[0] - p.tick
            if left >= -d[1]:
                return max(0.0, float(left))
            del self._due[key]  # overdue: the prediction did not come true (yet), its history speaks again
        s = p.slots.get(key)
        return float("inf") if s is None else p.reuse_distance(s)

    def may_displace(self, key: bytes, victims: Iterable[bytes], factor: float = 1.0) -> bool:
        """Whether a prefetch of ``key`` may demote ``victims``: each must be expected to be used later than
        ``key`` (``factor`` times as late), and must have been idle longer than that too: the victims are the
        keys DRAM would drop next, so their idle time is how long a key now survives in DRAM unused, and a chunk
        due later than that would be dropped again before its read. A key asked for without a prediction
        (TAIR.KV.PREFETCH) is expected within a window of reads."""
        p = self.profiles
        tick = p.tick
        d = self._due.get(key)
        if d is not None and d[0] - tick >= -d[1]:
            mine = max(0.0, float(d[0] - tick))
        else:
            mine = self.window * max(1.0, self.gap)
            self._due[key] = (tick + int(mine), mine)
        limit = factor * mine
        survive = float("inf")
        ok = True
        for victim in victims:
            s = p.slots.get(victim)
            if s is not None and p.tick_at[s]:
                idle = tick - p.tick_at[s]
                if idle < survive:
                    survive = idle
                if idle <= limit:
                    ok = False
            if ok and self.next_use(victim) <= limit:
                ok = False
        if survive != float("inf"):
            # How long DRAM keeps a key unused, in accesses: walks go no further ahead than that (see read).
            self.survival = survive if self.survival == float("inf") else \
                self.survival + (survive - self.survival) * 0.1
        return ok

    def info(self) -> dict[str, float | int]:
        p = self.profiles
        return {
            "profiled_keys": len(p),
            "profile_capacity": p.max_keys,
            "profiles_aged_out": p.aged_out,
            "profile_streams": len(self._streams),
            "predict_native": int(self.NATIVE),
            "predict_walks": self.walks,
            "predict_session_walks": self.session_walks,
            "predict_lookups": self.lookups,
            "predict_expects": self.expects,
            "predict_stream_gap": round(self.gap, 2),
            "predict_dram_survival": -1 if self.survival == float("inf") else round(self.survival, 1),
            "session_score": round(p.session_score, 4),
            "interior_link_score": round(p.interior.prior, 4),
        }


def _compiled() -> tuple[type[PurePredictor] | None, str]:
    """(PurePredictor with its hot path compiled, or None; why not, or "")."""
    setting = os.environ.get(NATIVE_ENV, "").strip().lower()
    if setting in ("0", "off", "no", "false"):
        return None, f"{NATIVE_ENV}={setting}"
    try:
        from kvstrata.native import _predict
    except ImportError as exc:
        return None, f"kvstrata.native._predict not built ({exc})"
    # The C file carries these numbers as #defines: a change on one side only must not change predictions.
    mine = {"LANES_PER_STREAM": LANES_PER_STREAM, "LINK_MIN": LINK_MIN, "FAMILIES_MAX": FAMILIES_MAX,
            "LOG_MAX": LOG_MAX, "COUNT_MAX": COUNT_MAX, "BRANCH": BRANCH, "BOUNDARY": BOUNDARY, "HEAD": HEAD,
            "PRIOR_WEIGHT": PRIOR_WEIGHT}
    differ = sorted(k for k, v in mine.items() if getattr(_predict, k, None) != v)
    if differ:
        return None, f"kvstrata.native._predict is stale ({', '.join(differ)} differ): rebuild it"

    class CompiledPredictor(_predict.Core, PurePredictor):  # type: ignore[misc]
        """PurePredictor with read, write, take and the walks in C (kvstrata.native._predict): the same
        predictions (tests/unit/test_predict_native.py)."""

        Lane = _predict.Lane
        Stream = _predict.Stream
        NATIVE = True

    return CompiledPredictor, ""


NATIVE_ENV = "KVSTRATA_NATIVE_PREDICT"
CompiledPredictor, NATIVE_WHY = _compiled()
Predictor: type[PurePredictor] = CompiledPredictor or PurePredictor
"""The predictor the server uses: compiled where it could be, else :class:`PurePredictor`."""
