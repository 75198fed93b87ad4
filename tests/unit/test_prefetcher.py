"""The server's prefetch queue against a real engine: priorities, take-over by a command, late loads."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.unit.chain_support import chain_store

import kvstrata.commands  # noqa: F401  (registers the commands)
from kvstrata.clock import ManualClock
from kvstrata.commands.registry import lookup
from kvstrata.engine.entry import ENTRY_OVERHEAD
from kvstrata.engine.policy import create_policy
from kvstrata.engine.store import LATE, Store
from kvstrata.engine.tiers.ssd import SsdTier
from kvstrata.server.prefetch import FIRST_BATCH, PREDICTED_PRIORITY, Prefetcher

VALUE = b"v" * 100


def make_store(tmp_path: Path) -> Store:
    clock = ManualClock()
    ssd = SsdTier(str(tmp_path / "ssd"), 1 << 30, fsync="no", threaded=False)
    store = Store(8 * (3 + len(VALUE) + ENTRY_OVERHEAD), policy=create_policy("lru", clock=clock), clock=clock,
                  ssd=ssd)
    for i in range(12):
        store.put(b"k%02d" % i, VALUE)
    store.make_room(store.dram.budget)  # everything on SSD
    clock.advance(60.0)
    return store


class GatedLoad:
    """The server's load (begin_load, read_lower in the caller, finish_load), held at a gate to freeze a batch
    in flight."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.batches: list[list[bytes]] = []

    async def __call__(self, keys: list[bytes]) -> bool:
        self.batches.append(list(keys))
        self.started.set()
        await self.gate.wait()
        ticket = self.store.begin_load(self.store.missing(keys))
        return self.store.finish_load(ticket, self.store.read_lower(ticket))


def test_client_prefetches_go_before_predicted_ones(tmp_path: Path) -> None:
    store = make_store(tmp_path)

    async def main() -> list[list[bytes]]:
        load = GatedLoad(store)
        pf = Prefetcher(store, load, batch=2)
        pf.submit([b"k00", b"k01"], PREDICTED_PRIORITY)
        pf.submit([b"k02", b"k03"], 0)
        load.gate.set()
        task = asyncio.create_task(pf.run())
        while len(pf):
            await asyncio.sleep(0)  # yield to the queue's task until it has drained (no timing involved)
        while pf.in_flight([b"k00", b"k01"]):
            await asyncio.sleep(0)
        task.cancel()
        return load.batches

    assert asyncio.run(asyncio.wait_for(main(), 10)) == [[b"k02", b"k03"], [b"k00", b"k01"]]
    assert store.stats.prefetch_issued == 4


def test_a_command_waits_for_a_batch_in_flight_and_takes_over_queued_keys(tmp_path: Path) -> None:
    store = make_store(tmp_path)

    async def main() -> None:
        load = GatedLoad(store)
        pf = Prefetcher(store, load, batch=2)
        pf.submit([b"k00", b"k01", b"k02", b"k03"], PREDICTED_PRIORITY)
        task = asyncio.create_task(pf.run())
        await load.started.wait()
        assert pf.in_flight([b"k00"]) and pf.in_flight([b"k03"])
        claim = asyncio.create_task(pf.claim([b"k00", b"k03"]))  # k00 is loading, k03 still queued
        await asyncio.sleep(0)
        assert not claim.done()  # waiting for the batch holding k00
        assert not pf.in_flight([b"k03"])  # taken over: the command will read it itself
        load.gate.set()
        await claim
        assert store.prefetched.get(b"k00") == LATE
        assert store.get(b"k00") is not None
        while pf.in_flight([b"k02"]):
            await asyncio.sleep(0)
        task.cancel()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert store.stats.prefetch_used == 1 and store.stats.prefetch_late == 1
    assert b"k03" not in store.dram.entries  # never prefetched
    assert store.stats.prefetch_issued == 3  # k00, k01, k02


class RacedLoad:
    """The server's load, with a write of ``key`` landing on the SSD tier while the first ``races`` loads are
    in flight (between the loader's read and its installation)."""

    def __init__(self, store: Store, key: bytes, races: int) -> None:
        self.store = store
        self.key = key
        self.races = races
        self.calls = 0
        self.racer_sync_reads = 0  # the racing write's own synchronous read (it is not the prefetcher's)

    async def __call__(self, keys: list[bytes]) -> bool:
        self.calls += 1
        ticket = self.store.begin_load(self.store.missing(keys))
        found = self.store.read_lower(ticket)
        if self.calls <= self.races:
            before = self.store.sync_reads
            self.store.set_expire(self.key, 10_000_000_000_000 + self.calls)  # an SSD write of the key
            self.racer_sync_reads += self.store.sync_reads - before
        return self.store.finish_load(ticket, found)


def _drain(store: Store, load: RacedLoad, keys: list[bytes]) -> Prefetcher:
    async def main() -> Prefetcher:
        pf = Prefetcher(store, load, batch=8)
        pf.submit(keys)
        task = asyncio.create_task(pf.run())
        while len(pf) or pf.in_flight(keys):
            await asyncio.sleep(0)
        task.cancel()
        return pf

    return asyncio.run(asyncio.wait_for(main(), 10))


def test_a_prefetch_raced_by_a_write_is_loaded_again(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    load = RacedLoad(store, b"k01", races=1)
    before = store.sync_reads
    pf = _drain(store, load, [b"k00", b"k01"])
    assert load.calls == 2 and pf.stale_batches == 0
    # The promoted entry is the one the racing write produced, not the one the stale load read.
    assert store.dram.entries[b"k01"].expire_at == 10_000_000_000_001
    assert store.sync_reads - before == load.racer_sync_reads


def test_a_prefetch_always_raced_is_given_up_without_reading_on_the_loop(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    load = RacedLoad(store, b"k01", races=10)
    before = store.sync_reads
    pf = _drain(store, load, [b"k00", b"k01"])
    assert pf.stale_batches == 1
    assert b"k01" not in store.dram.entries and b"k00" not in store.dram.entries
    # Promotion never fell back to reading LMDB on the event loop.
    assert store.sync_reads - before == load.racer_sync_reads
    assert store.get(b"k01", touch=False).expire_at == 10_000_000_000_000 + load.calls


def test_batches_start_small_and_double_while_the_queue_stays_busy(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    f = FIRST_BATCH
    keys = [b"k%02d" % i for i in range(7 * f)]  # those past k11 are absent: harmless, counted

    async def main() -> list[list[bytes]]:
        load = GatedLoad(store)
        load.gate.set()
        pf = Prefetcher(store, load, batch=4 * f)
        pf.submit(keys, PREDICTED_PRIORITY)
        task = asyncio.create_task(pf.run())
        while len(pf) or pf.in_flight(keys):
            await asyncio.sleep(0)
        task.cancel()
        return load.batches

    # The first keys come up after a load of FIRST_BATCH, not behind a whole batch; then twice, four times as many.
    assert asyncio.run(asyncio.wait_for(main(), 10)) == [keys[:f], keys[f:3 * f], keys[3 * f:]]
    assert f < 4 * f <= 64


def test_predicted_keys_load_nearest_expected_use_first(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    due = {b"k00": 30, b"k01": 10, b"k02": 20, b"k03": 10}

    async def main() -> list[list[bytes]]:
        load = GatedLoad(store)
        load.gate.set()
        pf = Prefetcher(store, load, batch=2)
        pf.submit([b"k00", b"k01", b"k02", b"k03"], PREDICTED_PRIORITY, due.__getitem__)
        task = asyncio.create_task(pf.run())
        while len(pf) or pf.in_flight(list(due)):
            await asyncio.sleep(0)
        task.cancel()
        return load.batches

    # Earliest due first; equal dues keep the order they were submitted in.
    assert asyncio.run(asyncio.wait_for(main(), 10)) == [[b"k01", b"k03"], [b"k02", b"k00"]]


def test_a_single_key_load_queues_what_follows_before_the_read(tmp_path: Path) -> None:
    chain = [b"k%02d" % i for i in range(6)]
    store = chain_store(SsdTier(str(tmp_path / "ssd"), 1 << 30, fsync="no", threaded=False), 8, chain, VALUE)

    async def main() -> list[list[bytes]]:
        load = GatedLoad(store)
        pf = Prefetcher(store, load)
        task = asyncio.create_task(pf.run())
        get, mget, tier = (lookup(name) for name in (b"get", b"tair.kv.mget", b"tair.kv.tier"))
        assert get is not None and mget is not None and tier is not None
        pf.expect(mget, [chain[0], chain[1]], 2)  # a multi-key read loads its own keys: nothing predicted for it
        pf.expect(tier, [chain[0]], 2)  # nor for a command that does not read the value
        await asyncio.sleep(0)
        assert not len(pf) and not load.batches and store.predictor.expects == 0
        pf.expect(get, [chain[0]], 2)  # a GET about to load the chain's first chunk
        await load.started.wait()
        load.gate.set()
        while pf.in_flight(chain[1:]):
            await asyncio.sleep(0)
        task.cancel()
        return load.batches

    assert [key for batch in asyncio.run(asyncio.wait_for(main(), 10)) for key in batch] == chain[1:]
    assert all(key in store.dram.entries for key in chain[1:]) and chain[0] not in store.dram.entries


class Logged:
    """``store.promote`` recording each promotion with the event-loop turn it ran in (``turn``: bumped by a ticker
    task once per turn), and signalling the first one (``first``)."""

    def __init__(self, store: Store) -> None:
        self.events: list[tuple[str, bytes, int]] = []
        self.turn = 0
        self.first = asyncio.Event()
        promote = store.promote

        def logged(key: bytes, *, sync: bool = True) -> bool:
            done = promote(key, sync=sync)
            self.events.append(("promote", key, self.turn))
            self.first.set()
            return done

        store.promote = logged  # type: ignore[method-assign]

    async def tick(self) -> None:
        while True:
            self.turn += 1
            await asyncio.sleep(0)


def test_a_late_read_is_released_when_its_own_key_is_up_not_after_the_batch(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    log = Logged(store)

    async def main() -> None:
        load = GatedLoad(store)
        pf = Prefetcher(store, load, batch=2)
        pf.submit([b"k00", b"k01"], PREDICTED_PRIORITY)  # one batch (FIRST_BATCH keys), k00 first
        task = asyncio.create_task(pf.run())
        await load.started.wait()

        async def reader() -> None:
            await pf.claim([b"k01"])  # k01 is in the batch being loaded: a late read
            log.events.append(("reader", b"k01", log.turn))
            assert b"k01" in store.dram.entries and store.get(b"k01") is not None

        late = asyncio.create_task(reader())
        await asyncio.sleep(0)
        assert not late.done()
        load.gate.set()
        await late
        while pf.in_flight([b"k00"]):
            await asyncio.sleep(0)
        task.cancel()

    asyncio.run(asyncio.wait_for(main(), 10))
    # The key a read waits for comes up first and releases that read before the rest of the batch is promoted.
    assert [e[:2] for e in log.events] == [("promote", b"k01"), ("reader", b"k01"), ("promote", b"k00")]
    assert store.stats.prefetch_used == 1 and store.stats.prefetch_late == 1
    assert b"k00" in store.dram.entries


def test_a_batch_is_promoted_one_key_per_event_loop_turn(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    log = Logged(store)
    keys = [b"k00", b"k01"]

    async def main() -> None:
        load = GatedLoad(store)
        load.gate.set()
        pf = Prefetcher(store, load, batch=2)
        ticker = asyncio.create_task(log.tick())
        pf.submit(keys, PREDICTED_PRIORITY)
        task = asyncio.create_task(pf.run())
        while len(pf) or pf.in_flight(keys):
            await asyncio.sleep(0)
        task.cancel()
        ticker.cancel()

    asyncio.run(asyncio.wait_for(main(), 10))
    # Other connections are served between two promotions: never the whole batch in one turn.
    assert [e[1] for e in log.events] == keys
    assert log.events[0][2] < log.events[1][2]
    assert all(k in store.dram.entries for k in keys) and store.dram.used <= store.dram.budget


def test_a_key_written_between_two_promotions_is_not_brought_back_from_the_batch(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    log = Logged(store)
    keys = [b"k00", b"k01", b"k02", b"k03"]
    new = b"n" * 100

    async def main() -> None:
        load = GatedLoad(store)
        load.gate.set()
        pf = Prefetcher(store, load, batch=4)
        pf.batch = 4
        pf.submit(keys[:2], PREDICTED_PRIORITY)  # the first batch: FIRST_BATCH keys

        async def writer() -> None:
            await log.first.wait()  # runs in the turn after the first promotion, before the second
            store.delete(b"k01")  # its SSD record goes
            store.put(b"k00", new)  # overwritten in DRAM (k00 was promoted), then pushed back to SSD
            store.make_room(store.dram.budget)
            assert b"k00" not in store.dram.entries

        w = asyncio.create_task(writer())
        task = asyncio.create_task(pf.run())
        while len(pf) or pf.in_flight(keys) or not w.done():
            await asyncio.sleep(0)
        await w
        task.cancel()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert store.get(b"k01") is None  # deleted: the batch's record is never resurrected
    assert store.get(b"k00").value == new  # type: ignore[union-attr]
    assert store.dram.used <= store.dram.budget
