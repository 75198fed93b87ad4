"""Synthetic KV-cache traffic for the hit-ratio benchmark, deterministic from a seed.

A trace is a list of :class:`Request` objects sorted by time. Every request reads a prefix of its prompt's
KV chunks (the part a cache could hold) and then writes the chunks it newly filled (the rest of the prompt and
the generated answer). Chunks are fixed-size pages of ``chunk_tokens`` tokens, and a chunk's key chains its
parent's key with the chunk's own content, as SGLang/HiCache page hashes and LMCache chunk hashes do: chunk
``i`` of a context is the same key in two contexts only if chunks ``0..i-1`` are identical too. A partly filled
last chunk is never cached; once later tokens fill it, it is a new chunk with a new key.

Three request families are mixed by weights (see ``docs/traces.md`` for every parameter and why its default
resembles real serving traffic):

* ``single``: one request, a shared system prompt (Zipf popularity over a handful of prompts) and a unique
  user message;
* ``chat``: a multi-turn session; turn ``t`` re-reads the whole context (system prompt and all earlier turns)
  and appends a user message and an answer; turns are separated by the answer's decode time and an exponential
  think time;
* ``rag``: one request, a RAG system prompt, a document (Zipf popularity over many documents) and a unique
  query tail.

Everything is drawn from one ``random.Random(seed)``; the global ``random`` state is never used.
"""

from __future__ import annotations

import hashlib
import math
import random
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import accumulate
from typing import Any

__all__ = [
    "PRESETS",
    "Origin",
    "Request",
    "TraceParams",
    "chunk_chain",
    "generate",
    "generate_annotated",
    "preset",
    "trace_stats",
]


@dataclass(frozen=True)
class TraceParams:
    """Every knob of the trace generator. Defaults form the ``default`` (mixed) preset."""

    seed: int = 1
    """Seed of the one ``random.Random`` the generator uses."""
    arrivals: int = 2500
    """Number of arrivals (a chat session, a single request or a RAG request each)."""
    arrival_rate: float = 1.0
    """Poisson arrival rate, per second."""
    chunk_tokens: int = 256
    """Tokens per KV chunk (LMCache's default chunk size)."""

    weight_chat: float = 0.55
    """Share of arrivals that are multi-turn chat sessions."""
    weight_single: float = 0.15
    """Share of arrivals that are single requests (shared system prompt and a unique message)."""
    weight_rag: float = 0.30
    """Share of arrivals that are RAG requests."""

    system_prompts: int = 8
    """Distinct system prompts shared by chat sessions and single requests."""
    system_zipf_s: float = 1.0
    """Zipf exponent of system-prompt popularity (rank 1 is the most popular)."""
    system_tokens_min: int = 600
    """Shortest system prompt, in tokens (lengths are uniform between min and max, fixed per prompt)."""
    system_tokens_max: int = 3000
    """Longest system prompt, in tokens."""

    mean_turns: float = 4.0
    """Mean number of turns of a chat session (geometric, at least 1)."""
    max_turns: int = 24
    """Cap on the turns of one session."""
    user_tokens_median: float = 150.0
    """Median user message, in tokens (log-normal)."""
    user_tokens_sigma: float = 0.9
    """Log-normal sigma of user messages."""
    answer_tokens_median: float = 280.0
    """Median model answer, in tokens (log-normal)."""
    answer_tokens_sigma: float = 0.6
    """Log-normal sigma of answers."""
    max_message_tokens: int = 4096
    """Cap on one user message or one answer."""
    think_time_mean_s: float = 30.0
    """Mean user think time between an answer and the next turn (exponential), seconds."""
    decode_tokens_per_s: float = 40.0
    """Decode speed; an answer of n tokens takes n / speed seconds before the user can reply."""

    rag_system_prompts: int = 2
    """Distinct RAG system prompts (uniform choice); the document follows it, so it is part of the chain."""
    documents: int = 2000
    """Documents in the RAG corpus."""
    doc_zipf_s: float = 0.9
    """Zipf exponent of document popularity."""
    doc_tokens_median: float = 3000.0
    """Median document length, in tokens (log-normal, fixed per document)."""
    doc_tokens_sigma: float = 0.6
    """Log-normal sigma of document lengths."""
    max_doc_tokens: int = 16384
    """Cap on one document."""
    query_tokens_median: float = 60.0
    """Median RAG query, in tokens (log-normal, sigma ``user_tokens_sigma``)."""

    def __post_init__(self) -> None:
        weights = (self.weight_chat, self.weight_single, self.weight_rag)
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError("family weights must be non-negative and not all zero")
        if self.arrivals < 0 or self.arrival_rate <= 0 or self.chunk_tokens < 1:
            raise ValueError("arrivals >= 0, arrival_rate > 0 and chunk_tokens >= 1 are required")
        if self.system_prompts < 1 or self.rag_system_prompts < 1 or self.documents < 1:
            raise ValueError("need at least one system prompt, RAG prompt and document")
        if not 1 <= self.system_tokens_min <= self.system_tokens_max:
            raise ValueError("need 1 <= system_tokens_min <= system_tokens_max")
        if self.mean_turns < 1 or self.max_turns < 1:
            raise ValueError("mean_turns and max_turns must be >= 1")
        if self.think_time_mean_s < 0 or self.decode_tokens_per_s <= 0:
            raise ValueError("think_time_mean_s >= 0 and decode_tokens_per_s > 0 are required")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request as the cache sees it.

    ``reads`` are looked up in order (the cacheable prefix of the prompt: system prompt, earlier turns,
    document); ``writes`` are the chunks the request filled (its new prompt tokens and its answer), stored after
    the reads. ``reads + writes`` is one contiguous chunk chain.
    """

    time: float
    reads: tuple[bytes, ...]
    writes: tuple[bytes, ...]
    kind: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Origin:
    """What the generator knew about a request when it issued it (hidden from a cache; for reference policies).

    Everything here is known by the time the request has been served; none of it tells the future (a session's
    number of turns and its think times are not here).
    """

    family: str
    """``chat``, ``single`` or ``rag``."""
    session: int
    """The arrival this request belongs to (a chat session's turns share it)."""
    turn: int
    """Turn of a chat session, from 0 (0 for single and RAG requests)."""
    prompt: int
    """System prompt (chat, single) or RAG system prompt (rag) index, which is also its popularity rank."""
    doc: int
    """RAG document index (its popularity rank), -1 for other families."""
    prompt_chunks: int
    """Leading reads that are the prompt's own full chunks (shared by every request with this prompt)."""
    decode_s: float
    """Seconds this request's answer takes to decode (a chat session's next turn comes after it plus a think time)."""


class _Context:
    """A token context cut into chained chunks; only full chunks have keys."""

    __slots__ = ("chunk_tokens", "keys", "pending", "pending_tokens")

    def __init__(self, chunk_tokens: int) -> None:
        self.chunk_tokens = chunk_tokens
        self.keys: list[bytes] = []
        self.pending: list[bytes] = []
        self.pending_tokens = 0

    def copy(self) -> _Context:
        c = _Context(self.chunk_tokens)
        c.keys = list(self.keys)
        c.pending = list(self.pending)
        c.pending_tokens = self.pending_tokens
        return c

    def extend(self, segment: bytes, tokens: int) -> None:
        """Append ``tokens`` tokens of the segment named ``segment`` (equal names mean equal token content)."""
        offset = 0
        while offset < tokens:
            take = min(tokens - offset, self.chunk_tokens - self.pending_tokens)
            self.pending.append(b"%s@%d+%d" % (segment, offset, take))
            self.pending_tokens += take
            offset += take
            if self.pending_tokens == self.chunk_tokens:
                parent = self.keys[-1] if self.keys else b""
                self.keys.append(_chunk_key(parent, self.pending))
                self.pending = []
                self.pending_tokens = 0


def _chunk_key(parent: bytes, content: Sequence[bytes]) -> bytes:
    h = hashlib.blake2b(parent, digest_size=12)
    h.update(b"|")
    h.update(b";".join(content))
    return h.digest()


def chunk_chain(segments: Sequence[tuple[bytes, int]], chunk_tokens: int) -> list[bytes]:
    """Keys of the full chunks of a context made of ``(segment name, tokens)`` pieces, in order."""
    ctx = _Context(chunk_tokens)
    for name, tokens in segments:
        ctx.extend(name, tokens)
    return ctx.keys


class _Zipf:
    """Draws ranks 0..n-1 with probability proportional to 1 / (rank + 1) ** s."""

    def __init__(self, n: int, s: float) -> None:
        self._cum = list(accumulate(1.0 / (i + 1) ** s for i in range(n)))

    def draw(self, rng: random.Random) -> int:
        return min(bisect_left(self._cum, rng.random() * self._cum[-1]), len(self._cum) - 1)


def _lognormal_tokens(rng: random.Random, median: float, sigma: float, cap: int) -> int:
    return max(1, min(cap, int(round(rng.lognormvariate(math.log(median), sigma)))))


def _turns(rng: random.Random, mean: float, cap: int) -> int:
    p = 1.0 / mean
    n = 1
    while n < cap and rng.random() >= p:
        n += 1
    return n


def generate(params: TraceParams) -> list[Request]:
    """The trace for ``params``: requests sorted by time (ties keep generation order)."""
    return generate_annotated(params)[0]


def generate_annotated(params: TraceParams) -> tuple[list[Request], list[Origin]]:
    """The trace for ``params`` and, for each request in the same order, its :class:`Origin`."""
    rng = random.Random(params.seed)
    c = params.chunk_tokens

    sys_ctx: list[_Context] = []
    for i in range(params.system_prompts):
        ctx = _Context(c)
        ctx.extend(b"sys:%d" % i, rng.randint(params.system_tokens_min, params.system_tokens_max))
        sys_ctx.append(ctx)
    rag_sys_ctx: list[_Context] = []
    for i in range(params.rag_system_prompts):
        ctx = _Context(c)
        ctx.extend(b"ragsys:%d" % i, rng.randint(params.system_tokens_min, params.system_tokens_max))
        rag_sys_ctx.append(ctx)
    doc_tokens = [
        _lognormal_tokens(rng, params.doc_tokens_median, params.doc_tokens_sigma, params.max_doc_tokens)
        for _ in range(params.documents)
    ]
    sys_zipf = _Zipf(params.system_prompts, params.system_zipf_s)
    doc_zipf = _Zipf(params.documents, params.doc_zipf_s)
    cum_weights = list(accumulate((params.weight_chat, params.weight_single, params.weight_rag)))
    kinds = ("chat", "single", "rag")

    def user_tokens() -> int:
        return _lognormal_tokens(
            rng, params.user_tokens_median, params.user_tokens_sigma, params.max_message_tokens
        )

    def answer_tokens() -> int:
        return _lognormal_tokens(
            rng, params.answer_tokens_median, params.answer_tokens_sigma, params.max_message_tokens
        )

    out: list[tuple[float, int, Request, Origin]] = []
    t = 0.0
    for a in range(params.arrivals):
        t += rng.expovariate(params.arrival_rate)
        kind = kinds[bisect_left(cum_weights, rng.random() * cum_weights[-1])]
        if kind == "rag":
            r = rng.randrange(params.rag_system_prompts)
            ctx = rag_sys_ctx[r].copy()
            d = doc_zipf.draw(rng)
            ctx.extend(b"doc:%d" % d, doc_tokens[d])
            n_read = len(ctx.keys)
            q = _lognormal_tokens(
                rng, params.query_tokens_median, params.user_tokens_sigma, params.max_message_tokens
            )
            ctx.extend(b"q:%d" % a, q)
            answer = answer_tokens()
            ctx.extend(b"a:%d" % a, answer)
            origin = Origin(kind, a, 0, r, d, len(rag_sys_ctx[r].keys), answer / params.decode_tokens_per_s)
            out.append((t, len(out), Request(t, tuple(ctx.keys[:n_read]), tuple(ctx.keys[n_read:]), kind), origin))
            continue
        prompt = sys_zipf.draw(rng)
        ctx = sys_ctx[prompt].copy()
        turns = 1 if kind == "single" else _turns(rng, params.mean_turns, params.max_turns)
        when = t
        for turn in range(turns):
            n_read = len(ctx.keys)
            ctx.extend(b"u:%d:%d" % (a, turn), user_tokens())
            answer = answer_tokens()
            ctx.extend(b"a:%d:%d" % (a, turn), answer)
            origin = Origin(kind, a, turn, prompt, -1, len(sys_ctx[prompt].keys), answer / params.decode_tokens_per_s)
            out.append(
                (when, len(out), Request(when, tuple(ctx.keys[:n_read]), tuple(ctx.keys[n_read:]), kind), origin)
            )
            when += answer / params.decode_tokens_per_s
            if params.think_time_mean_s > 0:
                when += rng.expovariate(1.0 / params.think_time_mean_s)
    out.sort(key=lambda item: (item[0], item[1]))
    return [item[2] for item in out], [item[3] for item in out]


PRESETS: dict[str, TraceParams] = {
    "default": TraceParams(),
    "multi_turn": TraceParams(seed=2, arrivals=1800, weight_chat=0.85, weight_single=0.15, weight_rag=0.0),
    "rag": TraceParams(
        seed=3, arrivals=4000, arrival_rate=2.0, weight_chat=0.0, weight_single=0.0, weight_rag=1.0
    ),
    # Out-of-sample: every knob that shapes reuse differs from the presets above.
    "independent": TraceParams(
        seed=7919,
        arrivals=1600,
        arrival_rate=1.5,
        chunk_tokens=128,
        weight_chat=0.35,
        weight_single=0.25,
        weight_rag=0.40,
        system_prompts=5,
        system_zipf_s=0.8,
        system_tokens_min=300,
        system_tokens_max=1500,
        mean_turns=6.0,
        user_tokens_median=100.0,
        user_tokens_sigma=1.1,
        answer_tokens_median=350.0,
        answer_tokens_sigma=0.8,
        think_time_mean_s=20.0,
        decode_tokens_per_s=60.0,
        rag_system_prompts=3,
        documents=5000,
        doc_zipf_s=1.1,
        doc_tokens_median=1500.0,
        doc_tokens_sigma=0.9,
        query_tokens_median=40.0,
    ),
}


def preset(name: str, *, seed_offset: int = 0) -> TraceParams:
    """A preset by name (``default``, ``multi_turn``, ``rag``, ``independent``), its seed shifted by an offset."""
    try:
        params = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown trace preset {name!r}; known: {', '.join(PRESETS)}") from None
    return replace(params, seed=params.seed + seed_offset) if seed_offset else params


def trace_stats(trace: Sequence[Request]) -> dict[str, Any]:
    """Sizes of a trace: requests per family, chunk reads and writes, distinct chunks, duration."""
    kinds: dict[str, int] = {}
    distinct: set[bytes] = set()
    reads = writes = 0
    for r in trace:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
        reads += len(r.reads)
        writes += len(r.writes)
        distinct.update(r.reads)
        distinct.update(r.writes)
    return {
        "requests": len(trace),
        "requests_by_kind": dict(sorted(kinds.items())),
        "chunk_reads": reads,
        "chunk_writes": writes,
        "distinct_chunks": len(distinct),
        "duration_s": round(trace[-1].time - trace[0].time, 3) if trace else 0.0,
    }
