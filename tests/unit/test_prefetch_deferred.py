"""Predicted chunks whose state is known without a read (the SSD writer's pending writes, a command's load) are
promoted after the command's reply, never on its path (Prefetcher._submit_predicted, _promote_along); one whose
pending write commits before its turn is queued and loaded instead. ``Store.unknown`` answers what ``loaded``
answers, for many keys at once."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from tests.unit.chain_support import chain_store

from kvstrata.engine.store import Store
from kvstrata.engine.tiers.ssd import SsdTier
from kvstrata.server.prefetch import Prefetcher

VALUE = b"v" * 100
CHAIN = [b"k%02d" % i for i in range(6)]


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Store, SsdTier, queue.Queue[Callable[[], None]]]]:
    """A chain learnt by a reader, then demoted to an SSD whose writer thread commits but whose completions are
    held back (``held``): until one is run, the keys of its batch stay in the pending writes."""
    ssd = SsdTier(str(tmp_path / "ssd"), 1 << 30, fsync="no", threaded=True)
    completions: queue.Queue[Callable[[], None]] = queue.Queue()
    ssd.set_delivery(completions.put)
    try:
        store = chain_store(ssd, 12, CHAIN, VALUE)
        assert not store.dram.entries and all(key in ssd.pending for key in CHAIN)
        yield store, ssd, completions
    finally:
        ssd.close()


def _release(ssd: SsdTier, completions: queue.Queue[Callable[[], None]]) -> None:
    """Run the held completions until everything queued so far is committed (10 s at most a batch)."""
    while ssd.committed_seq < ssd.enqueued_seq:
        completions.get(timeout=10)()


def _read_first(store: Store, pf: Prefetcher) -> list[bytes]:
    """A new reader's GET of the chain's first chunk (served from the pending writes, nothing loaded), and the
    prediction handed over as the command does before its reply; the keys predicted."""
    store.command.stream = 2
    assert store.get(CHAIN[0]) is not None
    assert store.predictor.pending
    pf.submit_predicted()
    store.end_command()
    predicted = [k for k in CHAIN[1:] if pf.in_flight([k])]
    assert len(predicted) >= 2
    return predicted


def _recording_load(store: Store, batches: list[list[bytes]]) -> Callable[[list[bytes]], Awaitable[bool]]:
    """The prefetcher's load: records each batch in ``batches``, then reads it at once."""

    async def load(keys: list[bytes]) -> bool:
        batches.append(list(keys))
        ticket = store.begin_load(store.missing(keys))
        return store.finish_load(ticket, store.read_lower(ticket))

    return load


def test_keys_in_pending_writes_come_up_after_the_reply_without_a_load(
        held: tuple[Store, SsdTier, queue.Queue[Callable[[], None]]]) -> None:
    store, _ssd, _completions = held
    batches: list[list[bytes]] = []

    async def main() -> list[bytes]:
        pf = Prefetcher(store, _recording_load(store, batches))
        predicted = _read_first(store, pf)
        # Nothing promoted on the reply's path: they are handed over, and a read of one would wait for it.
        assert not any(k in store.dram.entries for k in predicted) and pf.in_flight(predicted)
        while pf.in_flight(predicted):
            await asyncio.sleep(0)
        return predicted

    predicted = asyncio.run(asyncio.wait_for(main(), 10))
    assert all(k in store.dram.entries for k in predicted)  # from the pending writes
    assert batches == []  # nothing was read for them
    assert store.stats.prefetch_issued == len(predicted)


def test_a_pending_write_committed_before_its_turn_is_loaded_instead(
        held: tuple[Store, SsdTier, queue.Queue[Callable[[], None]]]) -> None:
    store, ssd, completions = held
    batches: list[list[bytes]] = []

    async def main() -> list[bytes]:
        pf = Prefetcher(store, _recording_load(store, batches))
        worker = asyncio.create_task(pf.run())
        predicted = _read_first(store, pf)
        _release(ssd, completions)  # committed before the promotions' turn: no longer known without a read
        assert not any(k in ssd.pending for k in predicted)
        while pf.in_flight(predicted) or len(pf):
            await asyncio.sleep(0)
        worker.cancel()
        return predicted

    predicted = asyncio.run(asyncio.wait_for(main(), 10))
    assert sorted(k for b in batches for k in b) == sorted(predicted)  # queued and read, each once
    assert all(k in store.dram.entries for k in predicted)
    for key in predicted:
        entry = store.get(key)
        assert entry is not None and bytes(entry.value) == VALUE


def test_unknown_answers_what_loaded_answers(
        held: tuple[Store, SsdTier, queue.Queue[Callable[[], None]]]) -> None:
    store, ssd, completions = held
    _release(ssd, completions)  # the chain on the SSD only
    store.put(b"in-dram", VALUE)
    store.put(b"pending", VALUE)
    store.make_room(store.dram.budget)  # b"in-dram" and b"pending" go down, their writes pending
    store.put(b"in-dram", VALUE)
    loaded = [CHAIN[0], CHAIN[1]]
    ticket = store.begin_load(store.missing(loaded))
    assert store.finish_load(ticket, store.read_lower(ticket))  # the overlay: CHAIN[0:2]
    keys = [*CHAIN, b"in-dram", b"pending", b"absent"]
    assert store.unknown(keys) == {k for k in keys if not store.loaded(k)} == {*CHAIN[2:], b"absent"}
    store.end_command()
    assert store.unknown(keys) == {k for k in keys if not store.loaded(k)} == {*CHAIN, b"absent"}


def test_a_queued_batch_known_from_pending_writes_survives_their_commit(
        held: tuple[Store, SsdTier, queue.Queue[Callable[[], None]]]) -> None:
    """A client's prefetch (TAIR.KV.PREFETCH) of keys still in the SSD writer's pending writes: the batch is known
    without a read and promoted one key per turn; writes that commit between two turns leave the rest of the
    batch unknown, and those keys are queued and loaded again instead of being dropped."""
    store, ssd, completions = held
    batches: list[list[bytes]] = []
    keys = CHAIN[:4]

    async def main() -> None:
        async def load(batch: list[bytes]) -> bool:
            batches.append(list(batch))
            if len(batches) == 1:
                assert not store.missing(batch)  # all known from the pending writes
                loop = asyncio.get_running_loop()
                # Committed right after the first promotion's turn.
                loop.call_soon(lambda: _release(ssd, completions))
                return True
            ticket = store.begin_load(store.missing(batch))
            return store.finish_load(ticket, store.read_lower(ticket))

        pf = Prefetcher(store, load, batch=len(keys))
        pf.submit(keys)
        worker = asyncio.create_task(pf.run())
        while not all(k in store.dram.entries for k in keys):
            assert not worker.done()
            await asyncio.sleep(0)
        worker.cancel()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert len(batches) >= 2 and sorted(k for b in batches[1:] for k in b) == sorted(
        k for k in keys if k not in batches[0][:1])
    for key in keys:
        entry = store.get(key)
        assert entry is not None and bytes(entry.value) == VALUE
