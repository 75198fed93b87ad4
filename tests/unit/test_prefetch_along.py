"""A GET about to load a chain's first chunk loads the next predicted chunks with it (Prefetcher.expect's
``along``): they come up from that one load after the command's reply (from the next event-loop turn on), and the
rest of the walk is queued."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from tests.unit.chain_support import chain_store

import kvstrata.commands  # noqa: F401  (registers the commands)
from kvstrata.commands.registry import CommandSpec, lookup
from kvstrata.engine.store import Store
from kvstrata.engine.tiers.ssd import SsdTier
from kvstrata.server.prefetch import Prefetcher

VALUE = b"v" * 100


def _store(tmp_path: Path, chain: list[bytes]) -> Store:
    """A chain written by one stream, read through by another, then all of it demoted to SSD."""
    return chain_store(SsdTier(str(tmp_path / "ssd"), 1 << 30, fsync="no", threaded=False), 12, chain, VALUE)


def _load(store: Store, keys: list[bytes]) -> bool:
    ticket = store.begin_load(store.missing(keys))
    return store.finish_load(ticket, store.read_lower(ticket))


def _setup(tmp_path: Path) -> tuple[list[bytes], Store, CommandSpec]:
    """A six-chunk chain learnt and demoted (_store), and the GET command a reader sends."""
    chain = [b"k%02d" % i for i in range(6)]
    get = lookup(b"get")
    assert get is not None
    return chain, _store(tmp_path, chain), get


def _loader(store: Store) -> Callable[[list[bytes]], Awaitable[bool]]:
    """The prefetcher's load: the keys read at once, handed back after one loop turn."""
    return lambda keys: asyncio.sleep(0, result=_load(store, keys))


def test_a_get_loads_the_next_chunks_with_its_own_and_queues_the_rest(tmp_path: Path) -> None:
    chain, store, get = _setup(tmp_path)

    async def main() -> tuple[list[bytes], list[list[bytes]]]:
        batches: list[list[bytes]] = []

        async def load(keys: list[bytes]) -> bool:
            batches.append(list(keys))
            return _load(store, keys)

        pf = Prefetcher(store, load)
        along = pf.expect(get, [chain[0]], 2, along=2)
        assert pf.in_flight(chain[3:]) and not pf.in_flight(along)  # only the rest is queued
        # The command: its load (its own chunk and those along), its read, its end.
        assert _load(store, [chain[0], *along])
        store.command.stream = 2
        assert store.get(chain[0]) is not None
        assert store.predictor.pending
        pf.submit_predicted()
        store.end_command()
        # Not before the reply (which goes out in this turn): from the next turns, from the command's load.
        assert not any(k in store.dram.entries for k in along) and pf.in_flight(along)
        while pf.in_flight(along):
            await asyncio.sleep(0)
        assert all(k in store.dram.entries for k in along)  # promoted from the command's load, not read again
        task = asyncio.create_task(pf.run())
        while pf.in_flight(chain[3:]) or len(pf):
            await asyncio.sleep(0)
        task.cancel()
        return along, batches

    along, batches = asyncio.run(asyncio.wait_for(main(), 10))
    assert along == chain[1:3]
    assert [k for b in batches for k in b] == chain[3:]  # the queue loads only the rest
    assert all(k in store.dram.entries for k in chain[1:])
    assert store.stats.prefetch_issued == len(chain) - 1
    for key in chain[1:]:
        assert store.get(key) is not None
    assert store.stats.prefetch_used == len(chain) - 1 and store.stats.prefetch_late == 0


def test_without_along_nothing_is_held_back(tmp_path: Path) -> None:
    chain, store, get = _setup(tmp_path)

    async def main() -> list[bytes]:
        pf = Prefetcher(store, _loader(store))
        along = pf.expect(get, [chain[0]], 2)
        assert pf.in_flight(chain[1:])
        return along

    assert asyncio.run(asyncio.wait_for(main(), 10)) == []


def test_a_chunk_deleted_before_its_along_promotion_is_not_brought_back(tmp_path: Path) -> None:
    chain, store, get = _setup(tmp_path)

    async def main() -> list[bytes]:
        pf = Prefetcher(store, _loader(store))
        along = pf.expect(get, [chain[0]], 2, along=2)
        assert _load(store, [chain[0], *along])
        store.command.stream = 2
        assert store.get(chain[0]) is not None
        pf.submit_predicted()
        store.end_command()
        store.delete(along[1])  # another client's DEL, after the GET's reply, before the promotion
        while pf.in_flight(along):
            await asyncio.sleep(0)
        return along

    along = asyncio.run(asyncio.wait_for(main(), 10))
    assert store.get(along[1]) is None  # the GET's record of it is stale: never resurrected
