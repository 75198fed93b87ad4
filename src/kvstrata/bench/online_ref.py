"""Reference caches for the hit-ratio benchmark: how close can an *online* policy get to Belady's MIN?

MIN knows the future. The registered policies know keys and access order only. Between them this module puts:

* **informed** (online): knows the trace generator's true parameters and, for every request served so far, its
  hidden :class:`~kvstrata.bench.traces.Origin` (family, session and turn, prompt and document), and the current
  time. It never sees a later request. It evicts the resident chunk of lowest *hit density* (LHD, Beckmann et
  al., NSDI 2018): the most expected hits per second of cache space, ``max over t of F(t) / E[min(T, t)]``,
  ``T`` the time to the chunk's next read and ``F`` its distribution, here the generator's own:

  - a chunk of a request that is never read again by construction (a single request's message and answer, a
    RAG query and answer, the chunks of a chat session that reached ``max_turns``): density 0, evicted first;
  - a prompt or document chunk: read by a Poisson stream of new arrivals at rate ``lambda`` (arrival rate x family
    share x Zipf share of the prompt or document): density ``lambda``;
  - a chat session's own chunks: the session continues with probability ``p = 1 - 1/mean_turns`` and, if it does,
    returns ``decode_s + Exp(T)`` (``T = think_time_mean_s``) after its last turn. Once it is ``x`` seconds
    overdue, Bayes gives ``q = p e^(-x/T) / (p e^(-x/T) + 1 - p)`` and the density is ``q / T``; while it is
    still ``w`` seconds from due, the maximum over ``t`` is found numerically (it falls as ``w`` grows).

  Sessions share ``p``, so among sessions the density falls with how overdue they are, and three heap heads
  (least popular Poisson chunk, most overdue session, session due last) hold the minimum: O(log n) per eviction.
* **informed-no-decode**, **informed-no-oneoff**, **informed-no-popularity** (online, ablations): the informed
  reference denied one part of the hidden state: the decode times (a session is due as soon as it is served, so
  sessions rank by idle time, as in LRU), which requests are one-off (a single or RAG request's own chunks are
  then treated like a chat session's first turn), or the Zipf ranks (every prompt and document equally popular).
  **informed-no-ranks** learns them instead: a prompt's or document's rate is the requests seen for it so far
  over the time so far, as a server counting reads per key could estimate it.
* **informed+peek** (not online): the same, but told whether each session will have another turn (``p`` is 1
  or 0). How much of MIN's lead is "knowing which sessions end".
* **lfu-memory** (online, keys and order only): evicts the lowest access count among 16 sampled residents,
  counts kept for every key ever seen. Tests the lead of ``informed-no-ranks``: popularity with long memory.
* **static** (offline): the best static cache, the ``C`` chunks with the most re-reads in the whole trace; every
  read of them after their first access hits. How much is popularity alone.

The informed reference is an online policy, so its hit count is *reachable* online with the generator's hidden
state. It is not proven optimal among online policies (no such bound is computed here), but it ranks by the
exact posterior of a model in which the remaining randomness (which sessions end, think times, which prompt or
document the next arrival draws) is independent of everything observable: a policy that beats it by much would
need information the generator does not reveal.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvstrata.bench.traces import Origin, Request, TraceParams

__all__ = [
    "InformedCache",
    "run_references",
    "simulate_informed",
    "simulate_lfu_memory",
    "simulate_static",
    "session_continues",
]

_ONEOFF, _POISSON, _SESSION = 0, 1, 2


def _zipf_shares(n: int, s: float) -> list[float]:
    weights = [1.0 / (i + 1) ** s for i in range(n)]
    total = sum(weights)
    return [w / total for w in weights]


def session_continues(origins: Sequence[Origin]) -> dict[int, set[int]]:
    """For the peeking reference only: session -> the turns after which that session has another turn."""
    last: dict[int, int] = {}
    for o in origins:
        if o.family == "chat":
            last[o.session] = max(last.get(o.session, -1), o.turn)
    return {s: set(range(t)) for s, t in last.items()}


@dataclass(slots=True)
class _Session:
    ready: float
    """When the session's next turn can come at the earliest (last turn's time plus its decode time)."""
    version: int
    chunks: list[bytes]


class InformedCache:
    """The informed reference's ranking: which resident chunk has the lowest hit density now.

    Driven by :func:`simulate_informed`: ``begin(time, origin, reads)`` before a request's accesses,
    ``access(key, index)`` for each of its chunks once it is resident (``index``: position in the request's
    chain), and ``victim()`` (which also forgets the chunk) whenever the cache is full.
    """

    def __init__(
        self,
        params: TraceParams,
        *,
        continues: dict[int, set[int]] | None = None,
        blind: frozenset[str] = frozenset(),
    ) -> None:
        unknown = set(blind) - BLIND
        if unknown:
            raise ValueError(f"unknown blind spots {sorted(unknown)}; known: {sorted(BLIND)}")
        self._blind_oneoff = "oneoff" in blind
        self._blind_decode = "decode" in blind
        self._learn = "ranks" in blind
        self._counts: Counter[tuple[int, ...]] = Counter()  # requests seen per prompt and document (learnt ranks)
        self._p = 1.0 - 1.0 / params.mean_turns
        self._max_turns = params.max_turns
        self._think = max(params.think_time_mean_s, 1e-9)
        weights = params.weight_chat + params.weight_single + params.weight_rag
        sys_rate = params.arrival_rate * (params.weight_chat + params.weight_single) / weights
        rag_rate = params.arrival_rate * params.weight_rag / weights / params.rag_system_prompts
        self._sys_rate = [sys_rate * z for z in _zipf_shares(params.system_prompts, params.system_zipf_s)]
        self._rag_rate = rag_rate
        self._doc_rate = [rag_rate * z for z in _zipf_shares(params.documents, params.doc_zipf_s)]
        if "popularity" in blind:  # every prompt, and every document, looks equally popular
            self._sys_rate = [sys_rate / params.system_prompts] * params.system_prompts
            self._doc_rate = [rag_rate / params.documents] * params.documents
        self._continues = continues
        self.now = 0.0
        self._origin: Origin | None = None
        self._reads = 0
        self._p_now = self._p
        # resident key -> (class, rate or count or session id)
        self._cls: dict[bytes, tuple[int, float]] = {}
        self._oneoff: deque[bytes] = deque()
        self._poisson: list[tuple[float, bytes]] = []  # min-heap by rate
        self._sessions: dict[int, _Session] = {}
        self._early: list[tuple[float, int, int]] = []  # min-heap (ready, version, session)
        self._late: list[tuple[float, int, int]] = []  # max-heap (-ready, version, session)

    # -- the request being served ------------------------------------------------------------------------------
    def begin(self, time: float, origin: Origin, reads: int) -> None:
        """A request at ``time`` with hidden ``origin`` and ``reads`` read chunks is about to be served."""
        self.now = time
        self._origin = origin
        self._reads = reads
        if self._learn:
            self._counts[(origin.family == "rag", origin.prompt)] += 1
            if origin.family == "rag":
                self._counts[(2, origin.prompt, origin.doc)] += 1
        if origin.family == "chat" or self._blind_oneoff:
            # Blind to one-off requests, a single or RAG request's own chunks look like a session's first turn.
            more = origin.turn + 1 < self._max_turns or origin.family != "chat"
            if self._continues is not None and origin.family == "chat":
                more = more and origin.turn in self._continues.get(origin.session, ())
                self._p_now = 1.0 if more else 0.0
            else:
                self._p_now = self._p if more else 0.0
            sess = self._sessions.get(origin.session)
            if sess is None:
                sess = self._sessions[origin.session] = _Session(0.0, 0, [])
            sess.ready = time if self._blind_decode else time + origin.decode_s
            sess.version += 1
            if self._p_now > 0:
                heapq.heappush(self._early, (sess.ready, sess.version, origin.session))
                heapq.heappush(self._late, (-sess.ready, sess.version, origin.session))

    def access(self, key: bytes, index: int) -> None:
        """``key`` is the ``index``-th chunk of the current request's chain; it is (or becomes) resident."""
        o = self._origin
        assert o is not None
        if index < o.prompt_chunks:
            if self._learn:
                rate = float(self._counts[(o.family == "rag", o.prompt)])
            else:
                rate = self._rag_rate if o.family == "rag" else self._sys_rate[o.prompt]
            cls = (_POISSON, rate)
        elif o.family == "rag" and index < self._reads:
            if self._learn:
                cls = (_POISSON, float(self._counts[(2, o.prompt, o.doc)]))
            else:
                cls = (_POISSON, self._doc_rate[o.doc] if o.doc >= 0 else 0.0)
        elif (o.family == "chat" or self._blind_oneoff) and self._p_now > 0:
            cls = (_SESSION, float(o.session))
        else:
            cls = (_ONEOFF, 0.0)
        if self._cls.get(key) == cls:
            return  # already filed there (a session's chunks stay on its list)
        self._cls[key] = cls
        if cls[0] == _ONEOFF:
            self._oneoff.append(key)
        elif cls[0] == _POISSON:
            heapq.heappush(self._poisson, (cls[1], key))
        else:
            sess = self._sessions[o.session]
            if not self._session_has_chunks(sess, o.session):
                # A victim search may have dropped its heap entries while it had no chunk: file it again.
                heapq.heappush(self._early, (sess.ready, sess.version, o.session))
                heapq.heappush(self._late, (-sess.ready, sess.version, o.session))
            sess.chunks.append(key)

    # -- eviction ------------------------------------------------------------------------------------------------
    def score_session(self, ready: float) -> float:
        """Hit density (expected reads per second of cache space) of a session last due at ``ready``."""
        p, t = self._p_now_for_scoring(), self._think
        x = self.now - ready
        if x >= 0:
            stay = p * math.exp(-x / t)
            return (stay / (stay + 1.0 - p) if stay > 0 else 0.0) / t
        return _waiting_density(p, t, -x)

    def _p_now_for_scoring(self) -> float:
        return 1.0 if self._continues is not None else self._p

    def _valid(self, key: bytes, cls: int) -> bool:
        c = self._cls.get(key)
        return c is not None and c[0] == cls

    def _session_head(self, heap: list[tuple[float, int, int]], sign: float) -> tuple[float, int] | None:
        while heap:
            r, version, sid = heap[0]
            sess = self._sessions.get(sid)
            if sess is None or sess.version != version or not self._session_has_chunks(sess, sid):
                heapq.heappop(heap)
                continue
            return sign * r, sid
        return None

    def _session_has_chunks(self, sess: _Session, sid: int) -> bool:
        chunks = sess.chunks
        while chunks and self._cls.get(chunks[-1]) != (_SESSION, float(sid)):
            chunks.pop()
        return bool(chunks)

    def victim(self) -> bytes:
        """The resident chunk of lowest hit density (popped from the ranking)."""
        while self._oneoff:
            key = self._oneoff.popleft()
            if self._valid(key, _ONEOFF):
                return self._drop(key)
        best: tuple[float, int, Any] | None = None
        while self._poisson and not (self._valid(self._poisson[0][1], _POISSON)
                                     and self._cls[self._poisson[0][1]][1] == self._poisson[0][0]):
            heapq.heappop(self._poisson)
        if self._poisson:
            rate, key = self._poisson[0]
            # Learnt ranks file the count of requests seen; the rate estimate is that count over the time so far.
            best = (rate / max(self.now, 1.0) if self._learn else rate, 0, key)
        early = self._session_head(self._early, 1.0)
        if early is not None and early[0] <= self.now:
            s = self.score_session(early[0])
            if best is None or s < best[0]:
                best = (s, 1, early[1])
        late = self._session_head(self._late, -1.0)
        if late is not None and late[0] > self.now:
            s = self.score_session(late[0])
            if best is None or s < best[0]:
                best = (s, 1, late[1])
        if best is None:  # pragma: no cover - every resident chunk is filed somewhere
            raise RuntimeError("informed reference: no victim")
        if best[1] == 0:
            heapq.heappop(self._poisson)
            return self._drop(best[2])
        sess = self._sessions[best[2]]
        return self._drop(sess.chunks.pop())  # the deepest chunk first: its prefix stays usable

    def _drop(self, key: bytes) -> bytes:
        del self._cls[key]
        return key


_GRID = tuple(0.02 * 1.25**i for i in range(36))
"""Times (in think-time means) after a waiting session is due at which its hit density is evaluated."""


def _waiting_density(p: float, think: float, wait: float) -> float:
    """``max over u`` of ``p (1 - e^(-u/T)) / (wait + (1 - p) u + p T (1 - e^(-u/T)))``: a session due in
    ``wait`` seconds that returns with probability ``p`` after ``Exp(T)``, kept until ``wait + u``."""
    best = 0.0
    for g in _GRID:
        a = -math.expm1(-g)
        d = p * a / (wait + (1.0 - p) * g * think + p * think * a)
        if d > best:
            best = d
    return best


def simulate_informed(
    trace: Sequence[Request],
    origins: Sequence[Origin],
    params: TraceParams,
    capacity: int,
    *,
    peek: bool = False,
    victims: list[tuple[int, bytes]] | None = None,
    blind: frozenset[str] = frozenset(),
) -> int:
    """Read hits of the informed reference (``peek``: also told which sessions continue; not online).

    ``blind`` denies it part of the hidden state (see ``BLIND``), to show what each part is worth.

    Same replay as :func:`kvstrata.bench.hitrate.replay`: a read hits if resident, a missed read and every written
    chunk not resident are admitted, evicting while full. ``victims``, when given, receives ``(request index,
    evicted key)`` for every eviction, in order.
    """
    if capacity < 1:
        raise ValueError("capacity must be at least one chunk")
    if len(origins) != len(trace):
        raise ValueError("one origin per request is required")
    ref = InformedCache(params, continues=session_continues(origins) if peek else None,
                        blind=blind)
    resident: set[bytes] = set()
    hits = 0
    for i, (req, origin) in enumerate(zip(trace, origins, strict=True)):
        ref.begin(req.time, origin, len(req.reads))
        for index, key in enumerate(req.reads + req.writes):
            if key in resident:
                hits += index < len(req.reads)
            else:
                while len(resident) >= capacity:
                    v = ref.victim()
                    resident.discard(v)
                    if victims is not None:
                        victims.append((i, v))
                resident.add(key)
            ref.access(key, index)
    return hits


def simulate_static(trace: Sequence[Request], capacity: int) -> int:
    """Read hits of the best static cache of ``capacity`` chunks (offline: it counts every future read).

    A chunk's first access is a compulsory miss; every later read of a chunk in the static set hits.
    """
    if capacity < 1:
        raise ValueError("capacity must be at least one chunk")
    seen: set[bytes] = set()
    rereads: Counter[bytes] = Counter()
    for req in trace:
        for key in req.reads:
            if key in seen:
                rereads[key] += 1
            seen.add(key)
        seen.update(req.writes)
    return sum(n for _, n in rereads.most_common(capacity))


def simulate_lfu_memory(trace: Sequence[Request], capacity: int, *, sample: int = 16, seed: int = 1) -> int:
    """Read hits of ``lfu-memory``: keys and order only, the lead that ``informed-no-ranks`` points to.

    Every key's access count is kept for the whole trace (it outlives eviction: a long memory, unbounded here; a
    decayed count-min sketch would bound it); a full cache evicts the lowest count among ``sample`` residents
    drawn at random (all of them when there are no more), as Redis samples. Online, and without hidden state.
    """
    if capacity < 1:
        raise ValueError("capacity must be at least one chunk")
    rng = random.Random(seed)
    count: Counter[bytes] = Counter()
    pool: list[bytes] = []
    pos: dict[bytes, int] = {}
    hits = 0
    for req in trace:
        reads = len(req.reads)
        for index, key in enumerate(req.reads + req.writes):
            if key in pos:
                hits += index < reads
            else:
                while len(pool) >= capacity:
                    n = len(pool)
                    cands = pool if n <= sample else [pool[rng.randrange(n)] for _ in range(sample)]
                    v = min(cands, key=count.__getitem__)
                    i = pos.pop(v)
                    tail = pool.pop()
                    if tail != v:
                        pool[i] = tail
                        pos[tail] = i
                pos[key] = len(pool)
                pool.append(key)
            count[key] += 1
    return hits


BLIND = frozenset({"decode", "oneoff", "popularity", "ranks"})
"""What an ablation of the informed reference can be denied: decode times (a session is then due as soon as it
is served, so sessions rank by idle time as in LRU), which requests are one-off, the Zipf ranks (``popularity``:
all equal; ``ranks``: learnt, each prompt's and document's rate estimated as requests seen / time so far)."""


def run_references(
    traces: Sequence[str],
    fractions: Sequence[float],
    *,
    policies: Sequence[str],
    seed_offset: int = 0,
    trace_file: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """MIN, the references and ``policies`` on each trace and capacity: the JSON document of ``--online-ref``.

    A public trace (no generator, so no hidden state) gets MIN, the static reference and the policies only."""
    from kvstrata.bench.hitrate import _capacity, simulate_optimal, simulate_policy
    from kvstrata.bench.public_traces import PUBLIC_TRACES, load_public
    from kvstrata.bench.traces import generate_annotated, preset

    say = progress or (lambda _msg: None)
    rows: list[dict[str, Any]] = []
    for name in traces:
        params: TraceParams | None = None
        origins: list[Origin] | None = None
        if name in PUBLIC_TRACES:
            trace = load_public(name, trace_file)
        else:
            params = preset(name, seed_offset=seed_offset)
            trace, origins = generate_annotated(params)
        reads = sum(len(r.reads) for r in trace)
        distinct = len({k for r in trace for k in (*r.reads, *r.writes)})
        for fraction in fractions:
            cap = _capacity(fraction, distinct)
            opt = simulate_optimal(trace, cap)
            hits: dict[str, int] = {}
            if params is not None and origins is not None:
                hits["informed"] = simulate_informed(trace, origins, params, cap)
                hits["informed+peek"] = simulate_informed(trace, origins, params, cap, peek=True)
                for spot in sorted(BLIND):
                    hits[f"informed-no-{spot}"] = simulate_informed(trace, origins, params, cap,
                                                                 blind=frozenset({spot}))
            hits["lfu-memory"] = simulate_lfu_memory(trace, cap)
            hits["static"] = simulate_static(trace, cap)
            hits.update({p: simulate_policy(trace, cap, p) for p in policies})
            row = {"trace": name, "fraction": fraction, "capacity": cap, "reads": reads,
                   "optimal": opt / reads if reads else 0.0,
                   "over_optimal": {k: v / opt if opt else 1.0 for k, v in hits.items()},
                   "hits": {**hits, "optimal": opt}}
            rows.append(row)
            say(f"  {name} {fraction:.0%} ({cap} slots) OPT {row['optimal']:.4f}: "
                + " ".join(f"{k} {v:.3f}" for k, v in row["over_optimal"].items()))
    return {"benchmark": "hitrate-online-ref", "results": rows}


def format_references(result: dict[str, Any], markdown: bool = False) -> str:
    """The ``--online-ref`` table (ratios to MIN), plain or as a Markdown table; ``-`` where a column has no value."""
    rows = result["results"]
    cols = list(dict.fromkeys(c for r in rows for c in r["over_optimal"]))

    def cell(r: dict[str, Any], c: str, width: int = 0) -> str:
        v = r["over_optimal"].get(c)
        return f"{'-' if v is None else f'{v:.3f}':>{width}}"

    if markdown:
        out = ["| trace | capacity | slots | OPT | " + " | ".join(cols) + " |",
               "|---|---:|---:|---:|" + "---:|" * len(cols)]
        out += [f"| {r['trace']} | {r['fraction']:.0%} | {r['capacity']} | {r['optimal']:.4f} | "
                + " | ".join(cell(r, c) for c in cols) + " |" for r in rows]
        return "\n".join(out)
    out = [f"{'trace':<12} {'cap':>4} {'slots':>6} {'OPT':>7} " + " ".join(f"{c:>14}" for c in cols)]
    out += [f"{r['trace']:<12} {r['fraction']:>4.0%} {r['capacity']:>6} {r['optimal']:>7.4f} "
            + " ".join(cell(r, c, 14) for c in cols) for r in rows]
    return "\n".join(out)
