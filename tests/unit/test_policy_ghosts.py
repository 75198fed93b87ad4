"""The fingerprint ghost FIFO against an ordered dict: membership, order, payload and drop-oldest agree under
random operations, including hash collisions in the probe table (small fingerprints share low bits)."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstrata.engine.policy._ghosts import GhostFifo, fingerprint

ops = st.lists(st.tuples(st.sampled_from(["add", "add", "discard", "popleft", "find"]), st.integers(1, 40),
                         st.integers(0, 10**6)), max_size=300)


@settings(max_examples=150, deadline=None, database=None)
@given(script=ops, spread=st.sampled_from([1, 8, 1 << 40]))
def test_matches_an_ordered_dict(script: list[tuple[str, int, int]], spread: int) -> None:
    ghosts = GhostFifo(payload=("d", "I"))
    model: OrderedDict[int, tuple[float, int]] = OrderedDict()
    for op, k, value in script:
        fp = k * spread  # spread 8: many keys share a home slot; 1 << 40: only the high bits differ
        if op == "add":
            ghosts.add(fp, value / 4, value)
            model[fp] = (value / 4, value)  # an existing ghost keeps its place, as in an ordered dict
        elif op == "discard":
            assert ghosts.discard(fp) == (model.pop(fp, None) is not None)
        elif op == "popleft":
            assert ghosts.popleft() == (model.popitem(last=False)[0] if model else 0)
        else:
            pos = ghosts.find(fp)
            assert (pos >= 0) == (fp in model)
            if pos >= 0:
                assert (ghosts.payload[0][pos], ghosts.payload[1][pos]) == model[fp]
        assert len(ghosts) == len(model)
        assert list(ghosts) == list(model)
    ghosts.clear()
    assert len(ghosts) == 0 and list(ghosts) == []


def test_memory_stays_proportional_to_live_ghosts() -> None:
    ghosts = GhostFifo()
    for i in range(1, 100_001):
        ghosts.add(fingerprint(b"key:%d" % i))
        if len(ghosts) > 1000:
            ghosts.popleft()
    assert len(ghosts) == 1000
    assert ghosts._cap <= 4096  # churn through 100x the bound did not grow the arrays
    assert fingerprint(b"key:5") not in ghosts and fingerprint(b"key:100000") in ghosts
