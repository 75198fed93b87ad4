"""A commit copied off the event loop (kvstrata.engine.staging: ``take(hold=True)``, ``finish``, ``CommitJob``):
its reservation keeps its room and its charge, and the segment stays mapped, until the copy is done, even when
its client is gone or the command's task is cancelled; ``copy_hash`` computes what the inline path does."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
import xxhash
from tests.unit.staging_support import MB, Budget

from kvstrata.engine.staging import CommitJob, StageError, Staging, copy_hash


def _staging() -> tuple[Staging, Budget]:
    b = Budget()
    return Staging(4 * MB, charge=b.charge, uncharge=b.uncharge), b


def test_a_held_reservation_keeps_room_charge_and_mapping_until_finish() -> None:
    s, budget = _staging()
    seg = s.segment(1)
    [res] = s.reserve(1, [3 * MB], 0)
    data = os.urandom(3 * MB)
    seg.region.view[res.off:res.off + len(data)] = data
    charged = budget.used
    seg2, res2 = s.take(1, res.id, hold=True)
    assert (seg2, res2) == (seg, res) and s.info()["stage_commits_in_flight"] == 1
    with pytest.raises(StageError, match="unknown reservation"):
        s.take(1, res.id)  # not committable twice
    assert s.unreserve(1, [res.id]) == 0 and budget.used == charged  # nor given back under the copy
    with pytest.raises(StageError, match="segment full"):
        s.reserve(1, [2 * MB], 0)  # its room is still taken
    s.idle_ms = 10
    s.expire(10_000)  # idle for long, but a commit still copies from it: its pages stay
    assert not seg.trimmed and bytes(seg.region.view[res.off:res.off + 16]) == data[:16]
    s.close_segment(1)  # the client left mid-commit
    assert budget.used == charged and not seg.region.mm.closed
    dst = bytearray(len(data))
    assert copy_hash(seg.region.view[res.off:res.off + len(data)], dst) == (xxhash.xxh3_64_intdigest(data),) * 2
    assert dst == data
    s.finish(seg, res)
    assert budget.used == 0 and s.reserved_bytes == 0 and s.info()["stage_commits_in_flight"] == 0
    assert seg.region.mm.closed  # the last pin unmapped it


def test_copy_hash_reads_the_self_checksum_field_as_zeros() -> None:
    body = bytearray(os.urandom(600 * 1024))
    body[300_000:300_008] = bytes(8)
    digest = xxhash.xxh3_64_intdigest(bytes(body))
    body[300_000:300_008] = digest.to_bytes(8, "little")
    dst = bytearray(len(body))
    assert copy_hash(memoryview(body), dst, 300_000) == (digest, digest) and dst == body
    # Across a piece boundary (256 KiB) too.
    body = bytearray(os.urandom(600 * 1024))
    at = 256 * 1024 - 3
    body[at:at + 8] = bytes(8)
    digest = xxhash.xxh3_64_intdigest(bytes(body))
    assert copy_hash(memoryview(body), bytearray(len(body)), at) == (digest, 0)


def test_an_abandoned_job_gives_back_only_after_its_thread_ran() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        events: list[str] = []
        src = memoryview(os.urandom(MB))
        job = CommitJob(src, bytearray(MB), None, lambda: events.append("cleanup"))
        job.abandon(loop, lambda: events.append("also"))  # the continuation will never run; no thread yet
        assert events == []
        done = asyncio.Event()
        threading.Thread(target=lambda: (job.run(), loop.call_soon_threadsafe(done.set))).start()
        await done.wait()  # the thread scheduled the cleanup before this, so it ran first
        assert events == ["cleanup", "also"]
        assert isinstance(job.found, tuple)
        # Abandoned after it ran: given back at once, and only once.
        job2 = CommitJob(memoryview(b"x" * 100), bytearray(100), None, lambda: events.append("cleanup2"))
        job2.run()
        job2.abandon(loop)
        job2.cleanup()
        return events

    assert asyncio.run(main()) == ["cleanup", "also", "cleanup2"]
