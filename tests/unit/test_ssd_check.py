"""SSD robustness against real damage: bytes flipped in ``data.mdb`` (values, headers, B-tree pages). Listings skip
unreadable pages instead of failing, ``kvstrata check`` finds every record the flips damaged, and ``--repair``
salvages every readable one."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from kvstrata.cli import main as cli_main
from kvstrata.engine.entry import Entry
from kvstrata.engine.keyspace import SCAN_BUCKETS, bucket_of
from kvstrata.engine.tiers.ssd import SsdTier
from kvstrata.engine.tiers.ssd_check import MISPLACED, check, repair

N = 2000
SEEDS = range(6)


def value_of(i: int) -> bytes:
    # Mostly small values (kept in leaf pages beside their keys), some spilling to overflow pages.
    return bytes([i % 251]) * (50 + (i * 37) % 1500)


def key_of(i: int) -> bytes:
    return b"key:%05d" % i


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ssd") / "tier"
    tier = SsdTier(str(path), 1 << 30, fsync="no", threaded=False)
    for i in range(N):
        tier.put(key_of(i), Entry(value_of(i), i + 1))
    tier.close()
    return path


def flipped(pristine: Path, dest: Path, seed: int, flips: int = 30) -> Path:
    """A copy of the tier with ``flips`` random bits flipped anywhere past LMDB's two meta pages."""
    shutil.copytree(pristine, dest)
    data = dest / "data.mdb"
    size = data.stat().st_size
    rnd = random.Random(seed)
    with open(data, "r+b") as f:
        for _ in range(flips):
            off = rnd.randrange(2 * 4096, size)
            f.seek(off)
            byte = f.read(1)[0]
            f.seek(off)
            f.write(bytes([byte ^ (1 << rnd.randrange(8))]))
    return dest


def damaged_keys(path: Path) -> set[bytes]:
    """The ground truth: keys a reader can no longer get back intact."""
    tier = SsdTier(str(path), 1 << 30, fsync="no", threaded=False)
    try:
        bad = set()
        for i in range(N):
            got = tier.read(key_of(i))
            if not isinstance(got, Entry) or got.value != value_of(i) or got.version != i + 1:
                bad.add(key_of(i))
        return bad
    finally:
        tier.close()


def test_check_finds_every_damaged_record_and_listings_never_fail(pristine: Path, tmp_path: Path) -> None:
    page_damage = 0
    for seed in SEEDS:
        path = flipped(pristine, tmp_path / f"s{seed}", seed)
        bad = damaged_keys(path)
        assert bad, "the flips damaged nothing: the test would prove nothing"
        report, _ = check(str(path))
        assert not report.clean
        reported = {k for k, _ in report.corrupt}
        hidden_buckets = {b for b, _ in report.unreadable_buckets}
        unaccounted = [k for k in bad if k not in reported and bucket_of(k) not in hidden_buckets]
        # A damaged page can hide records without LMDB reporting an error (the check counts them as missing),
        # and a damaged key moves a record (reported under the LMDB key it is stored as).
        misplaced = sum(1 for _, why in report.corrupt if why == MISPLACED)
        assert len(unaccounted) <= report.missing + misplaced, (seed, unaccounted[:5])
        originals = {key_of(i) for i in range(N)}
        assert not (reported & originals) - bad, "a record reported corrupt reads back intact"
        assert report.ok >= N - len(bad) - report.missing

        tier = SsdTier(str(path), 1 << 30, fsync="no", threaded=False)
        try:
            listed = set()
            for bucket in range(SCAN_BUCKETS):
                listed.update(tier.bucket_keys(bucket))  # never raises
            assert len(listed & originals) >= N - len(bad)  # every intact key is still listed (these seeds)
            page_damage += tier.unreadable_pages > 0
        finally:
            tier.close()
    assert page_damage, "no seed damaged a B-tree page: the skip path went untested"


def test_repair_salvages_every_readable_record(pristine: Path, tmp_path: Path) -> None:
    path = flipped(pristine, tmp_path / "tier", 3)
    bad = damaged_keys(path)
    assert cli_main(["check", "--essd-path", str(path)]) == 1
    assert cli_main(["check", "--essd-path", str(path), "--repair", "--essd-size", "1gb"]) == 0
    assert [p for p in os.listdir(tmp_path) if p.startswith("tier.damaged-")], "the damaged tier is kept"
    report, _ = check(str(path))
    assert report.clean and report.records == report.meta_count
    tier = SsdTier(str(path), 1 << 30, fsync="no", threaded=False)
    try:
        for i in range(N):
            got = tier.read(key_of(i))
            if key_of(i) in bad:
                assert got is None or (isinstance(got, Entry) and got.value == value_of(i))
            else:
                assert isinstance(got, Entry) and got.value == value_of(i) and got.version == i + 1
        assert tier.version_high_water > N  # versions keep increasing after the repair
    finally:
        tier.close()


def test_check_of_a_clean_tier(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["check", "--essd-path", str(pristine)]) == 0
    out = capsys.readouterr().out
    assert f"{N} records, {N} ok, 0 corrupt, 0 unreadable buckets, 0 missing (meta count: {N}; 0 found" in out


def test_check_of_a_missing_tier(tmp_path: Path) -> None:
    assert cli_main(["check", "--essd-path", str(tmp_path / "nothing")]) == 2


def test_repair_keeps_repair_separate_from_the_original(pristine: Path, tmp_path: Path) -> None:
    path = flipped(pristine, tmp_path / "tier", 0)
    report = repair(str(path), 1 << 30)
    assert report.copied == report.ok and report.repaired_to is not None
    assert check(report.repaired_to)[0].records == report.records  # the damaged copy is untouched
