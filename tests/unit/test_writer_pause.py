"""The SSD writer thread's pauses for the event loop (engine/tiers/pause.py, ``ssd-writer-pause``): a pacer sleeps
once its thread has worked longer than the setting since its last pause, never with 0, and never when the writer
runs on the caller's thread; a writer that pauses after every operation still commits every record intact. A real
LMDB SSD tier and its real writer thread."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration.polling import wait_for

from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers.pause import EVERY_US, Pacer
from kvstrata.engine.tiers.ssd import SsdTier

VALUE = bytes(range(256)) * 128  # 32 KB, a KV chunk's size


def _work(pacer: Pacer, ns: int) -> None:
    """Tick ``pacer`` between steps of ``ns`` nanoseconds of busy work (the writer's operations)."""
    pacer.start()
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pacer.tick()


def test_a_pacer_pauses_once_its_thread_has_worked_longer_than_the_setting() -> None:
    pacer = Pacer(100)
    _work(pacer, 3_000_000)
    # 3 ms of work and pauses, at least 100 us of work before each pause.
    assert 1 <= pacer.pauses <= 30


def test_a_pacer_set_to_zero_never_pauses() -> None:
    pacer = Pacer(0)
    _work(pacer, 2_000_000)
    assert pacer.pauses == 0
    pacer.every_us = -5  # a negative setting is no pause, not a pause at every tick
    _work(pacer, 1_000_000)
    assert pacer.pauses == 0 and pacer.every_us == 0


def test_the_default_pauses_a_threaded_writer_only(tmp_path: Path) -> None:
    threaded = SsdTier(str(tmp_path / "a"), 1 << 26, fsync="no")
    inline = SsdTier(str(tmp_path / "b"), 1 << 26, fsync="no", threaded=False)
    try:
        assert threaded.pacer.every_us == EVERY_US
        assert inline.pacer.every_us == 0
        inline.set_writer_pause(1)  # CONFIG SET on a tier whose writes run on the caller's thread
        assert inline.pacer.every_us == 0
        for i in range(50):
            inline.put(b"k%03d" % i, Entry(VALUE, i + 1))
        assert inline.pacer.pauses == 0
        assert all(bytes(inline.read(b"k%03d" % i).value) == VALUE for i in range(50))  # type: ignore[union-attr]
    finally:
        threaded.close()
        inline.close()


def test_a_writer_pausing_after_every_operation_commits_every_record(tmp_path: Path) -> None:
    tier = SsdTier(str(tmp_path / "ssd"), 1 << 28, fsync="no")
    try:
        tier.set_writer_pause(1)
        last = 0
        for i in range(300):
            last = tier.put(b"k%04d" % i, Entry(VALUE[i % 256:] + VALUE[: i % 256], i + 1))
        tier.delete(b"k0007")
        deleted = tier.enqueued_seq
        assert deleted > last
        wait_for(lambda: tier.committed_seq >= deleted, what="the writer to commit every operation")
        assert tier.pacer.pauses > 0
        for i in range(300):
            got = tier.read(b"k%04d" % i)
            if i == 7:
                assert got is None
                continue
            assert got is not None and bytes(got.value) == VALUE[i % 256:] + VALUE[: i % 256], i  # type: ignore[union-attr]
            assert got.version == i + 1  # type: ignore[union-attr]
        assert tier.info()["writer_pauses"] == tier.pacer.pauses
        # Set to 0 at run time: the writer stops pausing.
        tier.set_writer_pause(0)
        paused = tier.pacer.pauses
        seq = 0
        for i in range(100):
            seq = tier.put(b"z%04d" % i, Entry(VALUE, 1))
        wait_for(lambda: tier.committed_seq >= seq, what="the writer to commit")
        assert tier.pacer.pauses == paused
    finally:
        tier.close()
