"""S3-FIFO (kvstrata.engine.policy.s3fifo) against a list-based reference model of the algorithm, plus its
hand-checkable behaviour: one-off keys stay in small, ghost hits go to main, main reinserts by frequency."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.policy_support import drive

from kvstrata.engine.policy.s3fifo import S3FIFOPolicy


class Reference:
    """S3-FIFO on plain lists, written from the paper's pseudo-code, sized by the tracked key count."""

    def __init__(self, capacity: int, small_ratio: float, promote: int) -> None:
        self.capacity, self.small_ratio, self.promote = capacity, small_ratio, promote
        self.small: list[int] = []
        self.main: list[int] = []
        self.ghost: list[int] = []
        self.freq: dict[int, int] = {}

    def evict(self) -> None:
        while True:
            tracked = len(self.small) + len(self.main)
            if self.small and (len(self.small) >= self.small_ratio * tracked or not self.main):
                k = self.small.pop(0)
                if self.freq[k] >= self.promote:
                    self.main.append(k)
                    self.freq[k] = 0
                    continue
                del self.freq[k]
                self.ghost.append(k)
                while len(self.ghost) > len(self.small) + len(self.main) + 1:
                    self.ghost.pop(0)
                return
            k = self.main.pop(0)
            if self.freq[k] > 0:
                self.freq[k] -= 1
                self.main.append(k)
                continue
            del self.freq[k]
            return

    def access(self, k: int) -> bool:
        if k in self.freq:
            self.freq[k] = min(3, self.freq[k] + 1)
            return True
        if len(self.freq) >= self.capacity:
            self.evict()
        if k in self.ghost:
            self.ghost.remove(k)
            self.main.append(k)
        else:
            self.small.append(k)
        self.freq[k] = 0
        return False


@settings(max_examples=80, deadline=None, database=None)
@given(
    keys=st.lists(st.integers(0, 15), max_size=200),
    capacity=st.integers(1, 8),
    small_ratio=st.sampled_from([0.1, 0.25, 0.5]),
    promote=st.integers(1, 2),
)
def test_matches_reference_model(keys: list[int], capacity: int, small_ratio: float, promote: int) -> None:
    policy = S3FIFOPolicy(small_ratio=small_ratio, promote=promote)
    ref = Reference(capacity, small_ratio, promote)
    resident: set[bytes] = set()
    for k in keys:
        assert drive(policy, resident, capacity, b"%d" % k) == ref.access(k)
        assert resident == {b"%d" % x for x in ref.freq}
        assert policy.segment_sizes()[:2] == (len(ref.small), len(ref.main))


def test_one_off_keys_leave_from_small_and_a_returning_ghost_enters_main() -> None:
    p = S3FIFOPolicy(small_ratio=0.5)
    resident: set[bytes] = set()
    for key in (b"a", b"b", b"c", b"d"):
        drive(p, resident, 4, key)
    drive(p, resident, 4, b"a")  # a hit: a will be promoted when it reaches small's head
    drive(p, resident, 4, b"e")  # small's head a goes to main; b (never hit) is evicted into the ghost
    assert resident == {b"a", b"c", b"d", b"e"}
    assert p.segment_sizes() == (3, 1, 1)
    drive(p, resident, 4, b"b")  # back from the ghost: straight into main
    assert p.segment_sizes()[1] == 2 and b"b" in p


def test_main_reinserts_keys_with_frequency_left() -> None:
    p = S3FIFOPolicy(small_ratio=0.1)
    resident: set[bytes] = set()
    for key in (b"a", b"b", b"c"):  # fill, then push them into main through hits and promotions
        drive(p, resident, 3, key)
        drive(p, resident, 3, key)
    for key in (b"x", b"y"):
        drive(p, resident, 3, key)
    assert resident >= {b"y"}
    # Whatever main held longest without a hit left first; a key touched in main survives a full round.
    survivor = next(k for k in (b"a", b"b", b"c") if k in resident)
    drive(p, resident, 3, survivor)
    drive(p, resident, 3, b"z")
    assert survivor in resident


def test_deleted_key_leaves_no_ghost() -> None:
    p = S3FIFOPolicy()
    p.admit(b"a")
    p.remove(b"a")
    assert p.segment_sizes() == (0, 0, 0) and b"a" not in p


def test_adaptive_small_grows_on_small_ghost_hits() -> None:
    p = S3FIFOPolicy(small_ratio=0.1, adaptive=True)
    resident: set[bytes] = set()
    for i in range(50):
        drive(p, resident, 20, b"k%d" % i)
    before = p.small_ratio
    for i in range(29, 24, -1):  # the latest evicted from small, back again: small was too small
        drive(p, resident, 20, b"k%d" % i)
    assert p.small_ratio > before
    assert p.segment_sizes()[1] == 5  # each return went straight to main
