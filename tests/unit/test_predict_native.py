"""The compiled predictor (``kvstrata.native._predict``) predicts exactly what the Python one does.

:class:`~kvstrata.engine.predict.PurePredictor` is the definition; the server runs
:data:`~kvstrata.engine.predict.Predictor`, the same class with its hot path in C. Both are driven through the same
accesses in lock step and every answer is compared: each ``take``, ``next_use``, ``due_at`` and
``may_displace``, then the whole state (every profile array, the streams and their lanes, the expected uses).
The traces are the benchmark's (several requests in flight per stream, key families with shard tags) and a
random one built to reach the rare branches: tiny tables (profile slots reclaimed under the walks, streams and
lanes dropped), more families than a stream keeps lanes, the expected-use table overflowing, FLUSHALL, streams
ending. A reference count check catches a C reference leaked or dropped once too often.
"""

from __future__ import annotations

import gc
import random
import sys
from collections import OrderedDict

import pytest
from tests.unit.test_predict_short import _accesses, _replay

from kvstrata.clock import ManualClock
from kvstrata.engine import predict
from kvstrata.engine.predict import CompiledPredictor, PurePredictor


def _compiled() -> type[PurePredictor]:
    assert CompiledPredictor is not None, (
        f"the predictor's native module is not in use: {predict.NATIVE_WHY} (scripts/test.sh builds it; "
        "python3 hatch_build.py builds it in a source tree)")
    return CompiledPredictor


def test_the_server_uses_the_compiled_predictor() -> None:
    assert predict.Predictor is _compiled()
    assert issubclass(predict.Predictor, PurePredictor)
    assert predict.Predictor(ManualClock()).info()["predict_native"] == 1
    assert PurePredictor(ManualClock()).info()["predict_native"] == 0


def _same(answers: list[object]) -> list[object]:
    """The answers without INFO's ``predict_native``, which tells the two predictors apart by design."""
    return [[kv for kv in a if kv[0] != "predict_native"] if isinstance(a, list) and a and isinstance(a[0], tuple)
             and isinstance(a[0][0], str) else a for a in answers]


def _state(pred: PurePredictor) -> list[object]:
    """Everything the predictor keeps, in comparable form."""
    p = pred.profiles
    out: list[object] = [p.tick, p.horizon, len(p), sorted(p.slots.items()), list(p.keys), list(p.family)]
    for name in ("last", "tick_at", "heat", "ival", "pred", "pred_gen", "next", "next_gen", "gen", "cont", "stop",
                 "flags", "ref"):
        out.append((name, list(getattr(p, name))))
    out.append([(c.cont, c.stop) for c in (p.interior, p.boundary)])
    out.append(list(pred._due.items()))
    out.append((pred.gap, pred.survival, pred.pending, pred.walks, pred.session_walks, pred.lookups,
                pred.expects, list(pred._announced)))
    for sid, st in pred._streams.items():
        lanes = []
        for fam, lane in st.lanes.items():
            lanes.append((fam, lane.fam, lane.prev, lane.prev_gen, lane.prev_read, lane.tick, list(lane.ahead),
                          list(lane.probs), lane.prob, lane.sent, lane.budget, lane.stuck, lane.hold, lane.streak,
                          lane.extra, lane.low, st.hot is lane))
        out.append((sid, st.gap, st.tick, lanes))
    out.append([(lane.fam, list(lane.ahead)) for lane in pred._dirty.values()])
    return out


@pytest.mark.parametrize("trusted", [True, False])
@pytest.mark.parametrize("name", ["multi_turn", "rag", "default", "independent"])
def test_compiled_and_python_predict_alike_on_the_benchmark_traces(name: str, trusted: bool) -> None:
    accesses = _accesses(name)
    kw = {} if trusted else {"trust_ahead": 0, "refill": 1}
    py = PurePredictor(ManualClock(), max_keys=8192, **kw)  # type: ignore[arg-type]
    c = _compiled()(ManualClock(), max_keys=8192, **kw)  # type: ignore[arg-type]
    assert _same(_replay(c, accesses)) == _same(_replay(py, accesses))
    assert _state(c) == _state(py)
    assert c.walks > 10 and c.info()["profiled_keys"] > 100  # the replay did exercise the walks


def _random_ops(seed: int, n: int) -> list[tuple[str, int, bytes]]:
    """Accesses over chains of many families (more than a stream keeps lanes), in runs as readers make them,
    with the predictor's other entry points mixed in."""
    rng = random.Random(seed)
    fams = [b"kvs:ns%d:{t%d}:" % (f % 3, f) for f in range(20)] + [b"", b"plain:"]
    chains = [[fams[rng.randrange(len(fams))] + b"c%d-%d" % (c, i) for i in range(rng.randrange(2, 14))]
              for c in range(60)]
    ops: list[tuple[str, int, bytes]] = []
    while len(ops) < n:
        sid = rng.randrange(6)
        chain = chains[rng.randrange(len(chains))]
        r = rng.random()
        if r < 0.02:
            ops.append(("forget", sid, b""))
        elif r < 0.025:
            ops.append(("clear", sid, b""))
        elif r < 0.06:
            ops.append(("lookup", sid, chain[0]))
        elif r < 0.09:
            ops.append(("expect", sid, chain[0]))
        start = rng.randrange(len(chain)) if rng.random() < 0.3 else 0
        verb = "write" if rng.random() < 0.25 else "read"
        for key in chain[start:start + rng.randrange(1, len(chain) + 1)]:
            ops.append((verb, sid, key))
            if rng.random() < 0.05:  # another chain read in between (an interleaved conversation)
                other = chains[rng.randrange(len(chains))]
                ops.append(("read", sid, other[rng.randrange(len(other))]))
    return ops[:n]


def _drive(pred: PurePredictor, ops: list[tuple[str, int, bytes]], take_every: int) -> list[object]:
    dram: OrderedDict[bytes, None] = OrderedDict()
    pred.attach(dram)
    out: list[object] = []
    pred.aged = 0  # type: ignore[attr-defined]  # profiles aged out, over every clear()
    for i, (verb, sid, key) in enumerate(ops):
        pred.clock.advance(0.001)  # type: ignore[attr-defined]
        if verb == "read":
            pred.read(key, sid)
            dram[key] = None
            dram.move_to_end(key)
        elif verb == "write":
            pred.write(key, sid)
            dram[key] = None
        elif verb == "forget":
            pred.forget_stream(sid)
        elif verb == "clear":
            pred.aged += pred.profiles.aged_out  # type: ignore[attr-defined]
            pred.clear()
        elif verb == "lookup":
            pred.lookup([key, key + b"x"], sid)
        elif verb == "expect":
            pred.expect(key, sid)
        while len(dram) > 40:
            dram.popitem(last=False)
        if i % take_every == 0:
            got = pred.take()
            out.append(tuple(got))
            for k in got[:3]:
                victims = list(dram)[:2]
                out.append((pred.may_displace(k, victims), pred.next_use(k), pred.due_at(k)))
    out.append(pred.take())
    out.append(sorted(pred.info().items()))
    return out


@pytest.mark.parametrize("take_every", [1, 7])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_compiled_and_python_predict_alike_on_random_accesses_with_tiny_tables(seed: int, take_every: int) -> None:
    ops = _random_ops(seed, 6000)
    kw = {"max_keys": 48, "max_streams": 3, "window": 4, "session_max": 12}
    py = PurePredictor(ManualClock(), **kw)  # type: ignore[arg-type]
    c = _compiled()(ManualClock(), **kw)  # type: ignore[arg-type]
    py.due_max = c.due_max = 6
    a, b = _drive(c, ops, take_every), _drive(py, ops, take_every)
    assert _same(a) == _same(b)
    assert len(a) > 500 and sum(1 for x in a if x) > 100  # predictions were made and compared
    assert _state(c) == _state(py)
    assert c.aged + c.profiles.aged_out > 100  # type: ignore[attr-defined]  # slots reclaimed under the walks


def test_no_reference_is_leaked_or_dropped() -> None:
    ops = _random_ops(5, 4000)
    keys = sorted({k for _, _, k in ops if k})  # b"" is a shared singleton: anything in the process counts it
    before = [sys.getrefcount(k) for k in keys]
    for _ in range(3):
        pred = _compiled()(ManualClock(), max_keys=64, max_streams=3, window=4)
        _drive(pred, ops, 3)
        del pred
    gc.collect()
    after = [sys.getrefcount(k) for k in keys]
    assert after == before


def test_bad_input_is_an_exception_not_a_crash() -> None:
    pred = _compiled()(ManualClock())
    with pytest.raises(TypeError):
        pred.read("not bytes", 1)  # type: ignore[arg-type]
        pred.take()
    pred = _compiled()(ManualClock())
    with pytest.raises(TypeError):
        pred.read(b"k", 1, 2)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        pred._grow(object(), 0, 1.0)  # type: ignore[arg-type]
    with pytest.raises(IndexError):
        pred._reach(10**9)
    with pytest.raises(TypeError):
        pred.pending = 1  # type: ignore[assignment]
    pred.read(b"kvs:ns:a", 1)  # still works after the refusals
    pred.read(b"kvs:ns:b", 1)
    assert pred.take() == []
    # State that Python code could break: a lane's slot out of range, its hold deleted, its list replaced.
    lane = pred._streams[1].lanes[b"kvs:ns"]
    lane.prev = 10**9
    with pytest.raises(IndexError):
        pred.read(b"kvs:ns:c", 1)
    lane.prev = -1
    del lane.hold
    lane.ahead = ()
    with pytest.raises(TypeError):
        pred.read(b"kvs:ns:d", 1)
    lane.ahead = []
    pred.read(b"kvs:ns:e", 1)
    pred.take()


def test_a_server_without_the_compiled_predictor_says_so(tmp_path, monkeypatch, caplog) -> None:
    from kvstrata.config import Config
    from kvstrata.server import app

    def build() -> PurePredictor:
        cfg = Config()
        cfg.set("essd-path", str(tmp_path / "ssd"))
        store = app.build_store(cfg)
        try:
            assert store.predictor is not None
            return store.predictor
        finally:
            for tier in store.lower:
                tier.close()

    with caplog.at_level("WARNING", logger="kvstrata.prefetch"):
        assert build().NATIVE and not caplog.records
        monkeypatch.setattr(app, "Predictor", PurePredictor)
        monkeypatch.setattr(predict, "NATIVE_WHY", "KVSTRATA_NATIVE_PREDICT=0")
        assert not build().NATIVE
    assert [r.getMessage() for r in caplog.records] == [
        "the prefetch predictor runs in Python (KVSTRATA_NATIVE_PREDICT=0): 4-5x the CPU per read of the compiled "
        "one"]
