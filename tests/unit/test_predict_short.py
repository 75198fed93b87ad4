"""The predictor's short path for a continuation read, and the trusted walk.

``Predictor.read`` processes a read of the chunk a stream's lane predicted next at once (``_continue``) instead of
logging it for ``_drain``: both must predict exactly the same. The lock-step test replays the benchmark's traces
(several requests in flight on each of a few streams, over a small LRU DRAM that prefetched keys enter) through
two predictors, one with the short path and one without, and compares every ``take``, ``next_use`` and
``may_displace`` answer and the final state.

A trusted walk (TRUST_STREAK continuation reads in a row) keeps TRUST_AHEAD more chunks ahead, past the point
where a link nobody has read across yet would make the walk wait for the reader; the last tests pin that on a
small deterministic sequence (they fail on a predictor without it).
"""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from kvstrata.bench.traces import generate, preset
from kvstrata.clock import ManualClock
from kvstrata.engine.predict import TRUST_AHEAD, TRUST_STREAK, Predictor, PurePredictor

STREAMS = 4
DRAM_KEYS = 300
REQUESTS = 500


def _accesses(name: str) -> list[tuple[int, bytes, bool]]:
    """(stream, key, is_read) of the first REQUESTS requests of a trace, two in flight per stream, interleaved
    chunk by chunk as concurrent clients (and SGLang batches on one connection) send them."""
    rng = random.Random(7)
    trace = generate(preset(name))[:REQUESTS]
    # Odd streams tag their keys (a shard tag: another key family), even ones use the plain namespace.
    queue = []
    for i, req in enumerate(trace):
        sid = i % STREAMS
        fam = b"kvs:ns:{t%d}:" % (i % 3) if sid % 2 else b"kvs:ns:"
        ops = [(fam + k.hex().encode(), True) for k in req.reads]
        ops += [(fam + k.hex().encode(), False) for k in req.writes]
        queue.append((sid, ops))
    out: list[tuple[int, bytes, bool]] = []
    active: list[list[list[tuple[bytes, bool]]]] = [[] for _ in range(STREAMS)]
    while queue or any(active):
        while queue and len(active[queue[0][0]]) < 2:
            sid, ops = queue.pop(0)
            active[sid].append(ops)
        live = [s for s in range(STREAMS) if active[s]]
        sid = live[int(rng.random() * len(live))]
        # Mostly the stream's oldest request, sometimes the other one: runs of continuation reads, interleaved.
        lanes = active[sid]
        ops = lanes[0] if len(lanes) == 1 or rng.random() < 0.8 else lanes[1]
        key, is_read = ops.pop(0)
        if not ops:
            lanes.remove(ops)
        out.append((sid, key, is_read))
    return out


def _replay(pred: PurePredictor, accesses: list[tuple[int, bytes, bool]]) -> list[object]:
    clock = ManualClock()
    pred.clock = clock
    dram: OrderedDict[bytes, None] = OrderedDict()
    pred.attach(dram)
    answers: list[object] = []

    def touch(key: bytes) -> None:
        dram[key] = None
        dram.move_to_end(key)
        while len(dram) > DRAM_KEYS:
            dram.popitem(last=False)

    for i, (sid, key, is_read) in enumerate(accesses):
        if is_read:
            pred.read(key, sid)
        else:
            pred.write(key, sid)
        out = pred.take()  # the server takes the predictions after every command
        answers.append(tuple(out))
        if is_read and key not in dram and i % 3:
            continue  # a miss the client does not fill (sometimes): DRAM stays as it was
        touch(key)
        for k in out[:4]:
            victims = list(islice_keys(dram, 2))
            ok = pred.may_displace(k, victims)
            answers.append((ok, pred.next_use(k), pred.due_at(k)))
            if ok:
                touch(k)
        if i % 997 == 996:
            pred.forget_stream(sid)
    answers.append(sorted(pred.info().items()))
    p = pred.profiles
    for arr in (p.tick_at, p.heat, p.ival, p.next, p.pred, p.cont, p.stop, p.flags):
        answers.append(list(arr[:DRAM_KEYS * 40]))
    return answers


def islice_keys(dram: OrderedDict[bytes, None], n: int) -> list[bytes]:
    out = []
    for k in dram:
        out.append(k)
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("trusted", [True, False])
@pytest.mark.parametrize("name", ["multi_turn", "rag", "default", "independent"])
def test_short_path_predicts_exactly_what_the_general_path_does(name: str, trusted: bool) -> None:
    accesses = _accesses(name)
    kw = {} if trusted else {"trust_ahead": 0, "refill": 1}  # also the predictor as it was before both
    # The Python predictor: _continue is looked up per read there (the compiled one calls its own, and is held to
    # this one's predictions by test_predict_native.py).
    short = PurePredictor(ManualClock(), max_keys=8192, **kw)  # type: ignore[arg-type]
    general = PurePredictor(ManualClock(), max_keys=8192, short_path=False, **kw)  # type: ignore[arg-type]
    taken = 0
    real = short._continue

    def counted(*args: object) -> bool:
        nonlocal taken
        ok = real(*args)  # type: ignore[arg-type]
        taken += ok
        return ok

    short._continue = counted  # type: ignore[method-assign]
    a = _replay(short, accesses)
    b = _replay(general, accesses)
    assert a == b
    reads = sum(1 for _, _, r in accesses if r)
    assert taken > reads // 10  # the short path did run (on a good share of the reads)


# ---- the trusted walk ----

def _chain(n: int, tag: str = "doc") -> list[bytes]:
    return [f"kvs:ns:{tag}.{i:02d}".encode() for i in range(n)]


def _written_then_read(pred: PurePredictor, chain: list[bytes], sid: int) -> list[list[bytes]]:
    """A document written once by one stream (its links untested: nobody read across them), then read from its
    start by another, chunk by chunk with a take after each read: what each take handed out."""
    for key in chain:
        pred.write(key, sid)
    pred.take()
    outs = []
    for key in chain:
        pred.read(key, sid + 1)
        outs.append(pred.take())
    return outs


def test_a_trusted_walk_keeps_chunks_ahead_past_untested_links() -> None:
    clock = ManualClock()
    pred = Predictor(clock, window=8, session_max=32)
    chain = _chain(12)
    dram = set(chain)
    pred.attach(dram)
    outs = _written_then_read(pred, chain, 1)
    # Untested links: one chunk at a time until TRUST_STREAK reads went along the walk ...
    for i in range(TRUST_STREAK):
        assert outs[i] == [chain[i + 1]]
    # ... then the walk runs TRUST_AHEAD chunks further than the next one, and stays that far ahead.
    handed = [k for out in outs[:TRUST_STREAK + 1] for k in out]
    assert handed == chain[1:TRUST_STREAK + 3 + TRUST_AHEAD - 1]
    for i in range(TRUST_STREAK + 1, len(chain) - 1 - TRUST_AHEAD):
        assert chain[i + 1 + TRUST_AHEAD] in outs[i]
    assert not [k for out in outs for k in out if k not in chain]  # nothing past the chain's end


def test_without_trust_an_untested_link_is_one_chunk_at_a_time() -> None:
    # The same sequence, the trusted walk turned off: what the predictor did before it (and main still does).
    clock = ManualClock()
    pred = Predictor(clock, window=8, session_max=32, trust_ahead=0)
    chain = _chain(12)
    pred.attach(set(chain))
    outs = _written_then_read(pred, chain, 1)
    assert outs[:-1] == [[chain[i + 1]] for i in range(len(chain) - 1)]


def test_a_new_walk_starts_untrusted() -> None:
    clock = ManualClock()
    pred = Predictor(clock, window=8, session_max=32)
    first, second = _chain(12, "a"), _chain(12, "b")
    pred.attach(set(first + second))
    for key in first + second:
        pred.write(key, 1)
    pred.take()
    for key in first[:6]:  # trusted by now
        pred.read(key, 2)
        pred.take()
    outs = []
    for key in second[:TRUST_STREAK + 1]:  # the same lane goes on to another document: a new walk
        pred.read(key, 2)
        outs.append(pred.take())
    assert outs[:TRUST_STREAK] == [[second[i + 1]] for i in range(TRUST_STREAK)]
    assert outs[TRUST_STREAK] == second[TRUST_STREAK + 1:TRUST_STREAK + 2 + TRUST_AHEAD]
