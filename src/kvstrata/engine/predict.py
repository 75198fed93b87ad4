"""The predictor: from what a client stream reads now, which chunks it will read next.

Each client stream (a connection in the server, a request in the replay benchmark) is followed separately,
and only keys of one family (the same text before the last ``:``: the SDK's ``kvs:<namespace>:`` and any
session tag) are linked.
Its reads and writes teach :class:`~kvstrata.engine.profile.AccessProfiles` the chunk chains; its reads trigger
walks along them:

* a read that continues the stream's current walk (the chunk predicted next) slides the window: one more
  chunk is predicted at the far end, so ``window`` chunks stay ahead of the reader;
* any other read starts a new walk from that chunk. When the chunk had not been touched for ``session_gap``
  seconds, the reader is a session coming back (a conversation's next turn, a document asked about again),
  and the walk goes to the end of the chain, up to ``session_max`` chunks, to bring the whole context up;
  otherwise it goes ``window`` chunks ahead.

A walk multiplies the scores of the turn boundaries it crosses (each is a separate event: did the session go
on past that turn?) and stops where the product drops below ``min_confidence``, at an interior link scoring
below it, at a branch, or where the chain is unknown, so it never guesses which conversation
follows a shared system prompt. Predictions wait in the stream until :meth:`Predictor.take` hands them to
whoever moves data (the server's prefetch queue), minus those the stream has already read by then: a
multi-key read (MGET) does not prefetch the keys it reads itself.
"""

from __future__ import annotations

from kvstrata.clock import Clock
from kvstrata.engine.profile import BOUNDARY, BRANCH, AccessProfiles


def _same_family(a: bytes | None, b: bytes) -> bool:
    """Keys link only inside one family: the same text before their last ``:`` (a namespace, a session tag).

    A client that writes several conversations, or unrelated keys, back to back on one connection must not
    chain them together.
    """
    if a is None:
        return False
    i = a.rfind(b":")
    return b.rfind(b":") == i and a[:i] == b[:i] if i >= 0 else b.find(b":") < 0


class _Stream:
    __slots__ = ("ahead", "budget", "hold", "prev", "prev_gen", "prev_read", "probs", "sent", "stuck", "time")

    def __init__(self) -> None:
        self.prev = -1
        self.prev_gen = 0
        self.prev_read = False
        self.time = 0.0
        self.ahead: list[bytes] = []  # predicted keys, in the order they will be read
        self.probs: list[float] = []  # link score of each step of ``ahead``
        self.sent = 0  # how many of ``ahead`` were handed out by take()
        self.budget = 0  # how far ahead this walk may go
        self.stuck = False  # the walk ended at a branch or at the end of the known chain
        self.hold: bytes | None = None  # first chunk past an untested link: nothing further until it is read


class Predictor:
    def __init__(self, clock: Clock, *, max_keys: int = 262_144, window: int = 8, session_max: int = 64,
                 min_confidence: float = 0.6, session_gap: float = 1.0, link_gap: float = 1.0,
                 half_life: float = 60.0, max_streams: int = 4096) -> None:
        self.clock = clock
        self.profiles = AccessProfiles(clock, max_keys=max_keys, half_life=half_life)
        self.window = window
        self.session_max = max(session_max, window)
        self.min_confidence = min_confidence
        self.session_gap = session_gap
        self.link_gap = link_gap
        self.max_streams = max_streams
        self._streams: dict[int, _Stream] = {}
        self._dirty: dict[int, _Stream] = {}
        self.walks = 0
        self.session_walks = 0

    # ---- streams ----
    def _stream(self, sid: int) -> _Stream:
        st = self._streams.get(sid)
        if st is None:
            if len(self._streams) >= self.max_streams:
                oldest = next(iter(self._streams))
                self.forget_stream(oldest)
            st = self._streams[sid] = _Stream()
        return st

    def clear(self) -> None:
        """Forget every profile and stream (FLUSHALL: the chains they describe are gone)."""
        p = self.profiles
        self.profiles = AccessProfiles(self.clock, max_keys=p.max_keys, half_life=p.half_life)
        self._streams.clear()
        self._dirty.clear()

    def forget_stream(self, sid: int) -> None:
        """The stream ended (a connection closed, a request finished): drop its state and pending predictions."""
        self._streams.pop(sid, None)
        self._dirty.pop(sid, None)

    # ---- observations ----
    def _observe(self, key: bytes, sid: int, is_read: bool) -> tuple[_Stream, int, float]:
        p = self.profiles
        now = self.clock.monotonic()
        s = p.slot(key)
        idle = p.touch(s, now)
        st = self._stream(sid)
        prev = st.prev
        if prev >= 0 and p.gen[prev] == st.prev_gen and now - st.time <= self.link_gap \
                and _same_family(p.keys[prev], key):
            if prev == s:
                # A read-miss filled by a write of the same key is still that read.
                st.time = now
                return st, s, idle
            fresh_read = False
            if st.prev_read:
                succ = p.successor(prev)
                if succ >= 0:
                    p.outcome(prev, is_read and succ == s)
                elif not is_read:
                    p.flags[prev] |= BOUNDARY
                else:
                    fresh_read = True
            p.link(prev, s)
            if fresh_read:
                p.outcome(prev, True)  # a link a reader made is one it has read across
        st.prev = s
        st.prev_gen = p.gen[s]
        st.prev_read = is_read
        st.time = now
        return st, s, idle

    def write(self, key: bytes, sid: int) -> None:
        self._observe(key, sid, False)

    def read(self, key: bytes, sid: int) -> None:
        st, s, idle = self._observe(key, sid, True)
        ahead = st.ahead
        if ahead and ahead[0] == key:
            del ahead[0]
            del st.probs[0]
            st.sent = max(0, st.sent - 1)
            self._extend(st)
        elif key in ahead:
            i = ahead.index(key) + 1
            del ahead[:i]
            del st.probs[:i]
            st.sent = max(0, st.sent - i)
            self._extend(st)
        else:
            self._walk(st, s, self.session_max if idle > self.session_gap else self.window,
                       idle > self.session_gap)
        if len(st.ahead) > st.sent:
            self._dirty[sid] = st

    # ---- walks ----
    def _walk(self, st: _Stream, s: int, budget: int, session: bool) -> None:
        self.walks += 1
        if session:
            self.session_walks += 1
        st.ahead = []
        st.probs = []
        st.sent = 0
        st.budget = budget
        st.stuck = False
        st.hold = None
        self._grow(st, s, 1.0)

    def _extend(self, st: _Stream) -> None:
        if st.hold is not None:
            if st.hold in st.ahead:
                return
            st.hold = None
        if st.stuck or len(st.ahead) >= st.budget:
            return
        p = self.profiles
        if st.ahead:
            s = p.slots.get(st.ahead[-1], -1)
            if s < 0:
                st.stuck = True
                return
            prob = 1.0
            for q in st.probs:
                prob *= q
        else:
            s = st.prev
            prob = 1.0
        self._grow(st, s, prob)

    def _grow(self, st: _Stream, s: int, prob: float) -> None:
        p = self.profiles
        ahead = st.ahead
        seen = 0
        while len(ahead) < st.budget:
            if p.flags[s] & BRANCH:
                st.stuck = True
                return
            n = p.successor(s)
            if n < 0 or n == s:
                st.stuck = True
                return
            q = p.link_score(s)
            untested = not p.cont[s]
            if not p.flags[s] & BOUNDARY:
                # Inside one written run the links stand or fall together (a prefix reader stops only where
                # its cached prefix ends), so they do not compound; crossing a turn's end is a new event.
                q = 1.0 if q >= self.min_confidence else 0.0
            if prob * q < self.min_confidence:
                return  # may pass later, once reads have confirmed the steps before it
            key = p.keys[n]
            if key is None:
                st.stuck = True
                return
            prob *= q
            ahead.append(key)
            st.probs.append(q)
            if untested:
                # Nobody has read across this link yet (it was written, never followed by a reader): one chunk,
                # and the rest once the reader takes it, so a wrong guess (a document whose readers never go on
                # to an earlier request's query and answer) costs one chunk, not that request's whole output.
                st.hold = key
                return
            s = n
            seen += 1
            if seen > self.session_max:  # a cycle of bad links cannot make a walk endless
                st.stuck = True
                return

    # ---- output ----
    def take(self) -> list[bytes]:
        """Predicted keys not handed out yet, nearest first per stream."""
        if not self._dirty:
            return []
        out: list[bytes] = []
        for st in self._dirty.values():
            out.extend(st.ahead[st.sent:])
            st.sent = len(st.ahead)
        self._dirty.clear()
        return out

    @property
    def pending(self) -> bool:
        return bool(self._dirty)

    def info(self) -> dict[str, float | int]:
        p = self.profiles
        return {
            "profiled_keys": len(p),
            "profile_capacity": p.max_keys,
            "profiles_aged_out": p.aged_out,
            "profile_streams": len(self._streams),
            "predict_walks": self.walks,
            "predict_session_walks": self.session_walks,
            "session_score": round(p.session_score, 4),
            "interior_link_score": round(p.interior.prior, 4),
        }
