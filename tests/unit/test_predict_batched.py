"""The predictor's deferred bookkeeping: reads and writes are logged on the command path and processed in
batches (``Predictor.take`` and every other observer drain the log first); the predictions must be exactly those
of the per-access predictor it replaced, on a recorded multi-client trace.

The expected digest was recorded with the per-access predictor (commit a0db516, before the log existed) on the
trace below: every ``take`` output, every ``may_displace`` and ``next_use`` answer, the final ``info()`` and the
profile arrays go into it, so any change in what is predicted, or when, changes the digest.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict

import pytest

from kvstrata.clock import ManualClock
from kvstrata.engine.predict import Predictor

RECORDED: dict[tuple[int, int], str] = {
    # (profile slots, most accesses between two takes): sha256 under the per-access predictor (a0db516).
    (4096, 1): "d3f6966f176e532e8800d66a3a4f41295306f9001261bfc4b4cbb49c773c71bd",
    (4096, 3): "e2c1311f7efdae79e16311ed64e2dd4dbdebed55d34631465887f02abe8d03ce",
    (256, 6): "9fc890e5fe29474189eda4eeae828846c017173d771c61253828f6383fd4bd46",  # profiles age out
}


INFO_FIELDS = ("profiled_keys", "profile_capacity", "profiles_aged_out", "profile_streams", "predict_walks",
               "predict_session_walks", "predict_lookups", "predict_stream_gap", "predict_dram_survival",
               "session_score", "interior_link_score")
"""The predictor's INFO fields when the digests were recorded (fields added since are not part of them)."""


def _rand(rng: random.Random, n: int) -> int:
    # random() alone: its sequence is fixed across Python versions, randrange's helpers need not be.
    return int(rng.random() * n)


def replay(pred: Predictor, clock: ManualClock, *, batch_max: int = 3) -> str:
    """Several connections carrying interleaved conversations (shared system prompts, tagged and untagged keys,
    early stops, lookups, connections closing) over a small simulated DRAM; returns the digest of every answer."""
    rng = random.Random(19)
    h = hashlib.sha256()
    dram: OrderedDict[bytes, None] = OrderedDict()
    capacity = 60
    pred.attach(dram)
    systems = [[f"kvs:ns:sys{i}.{j}".encode() for j in range(3)] for i in range(3)]
    convs: list[list[bytes]] = []
    for c in range(30):
        fam = f"kvs:ns:{{c{c}}}:" if c % 2 else "kvs:ns:"
        convs.append(list(systems[c % 3]) if c % 4 else [f"{fam}c{c}.doc{j}".encode() for j in range(4)])
    turns = [0] * len(convs)

    def touch(key: bytes) -> None:
        dram[key] = None
        dram.move_to_end(key)
        while len(dram) > capacity:
            dram.popitem(last=False)

    def request(c: int) -> list[tuple[bytes, bool]]:
        chain = convs[c]
        stop = len(chain) if rng.random() < 0.85 else _rand(rng, len(chain) + 1)
        ops = [(k, True) for k in chain[:stop]]
        fam = f"kvs:ns:{{c{c}}}:" if c % 2 else "kvs:ns:"
        new = [f"{fam}c{c}.t{turns[c]}.{j}".encode() for j in range(2 + _rand(rng, 3))]
        turns[c] += 1
        chain[stop:] = new
        return ops + [(k, False) for k in new]

    pending: list[int] = [0] * 4
    active: list[list[list[tuple[bytes, bool]]]] = [[] for _ in range(4)]
    for _step in range(2600):
        sid = _rand(rng, 4)
        lanes = active[sid]
        if len(lanes) < 1 + (sid % 2) and rng.random() < 0.5:
            c = _rand(rng, len(convs))
            ops = request(c)
            if rng.random() < 0.2:
                pred.lookup([k for k, is_read in ops if is_read], sid)
            lanes.append(ops)
        if not lanes:
            continue
        ops = lanes[_rand(rng, len(lanes))]
        key, is_read = ops.pop(0)
        if not ops:
            lanes.remove(ops)
        if is_read:
            pred.read(key, sid)
        else:
            pred.write(key, sid)
        clock.advance(0.001 * (1 + _rand(rng, 5)))
        pending[sid] += 1
        if sum(pending) < 1 + _rand(rng, batch_max):
            continue
        pending = [0] * 4
        out = pred.take()
        h.update(b"take" + b",".join(out))
        # Simulated state changes happen after the predictions are taken (as the server's commands do).
        touch(key)
        for k in out[:6]:
            victims = list(dram)[:2]
            ok = pred.may_displace(k, victims)
            h.update(b"%d%s" % (ok, repr(pred.next_use(k)).encode()))
            if ok:
                touch(k)
        if rng.random() < 0.01:
            pred.forget_stream(_rand(rng, 4))
            active[_rand(rng, 4)].clear()
    p = pred.profiles
    info = pred.info()
    h.update(repr(sorted((k, info[k]) for k in INFO_FIELDS)).encode())
    for arr in (p.tick_at, p.heat, p.ival, p.next, p.pred, p.cont, p.stop, p.flags, p.last):
        h.update(repr(list(arr[:4096])).encode())
    return h.hexdigest()


@pytest.mark.parametrize("short_path", [True, False])
@pytest.mark.parametrize(("max_keys", "batch_max"), sorted(RECORDED))
def test_predictions_match_the_per_access_predictor_on_a_recorded_trace(max_keys: int, batch_max: int,
                                                                        short_path: bool) -> None:
    # The digests predate the trusted walk and the batched refill: without them (trust_ahead=0, refill=1) the
    # predictor must still predict exactly what the per-access one did, with read()'s short path or without.
    clock = ManualClock()
    pred = Predictor(clock, max_keys=max_keys, window=4, session_max=32, trust_ahead=0, refill=1,
                     short_path=short_path)
    assert replay(pred, clock, batch_max=batch_max) == RECORDED[(max_keys, batch_max)]
