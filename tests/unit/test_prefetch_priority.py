"""A client's load never waits behind prefetching: the server's real loads (its loader threads, a real LMDB SSD tier),
with the reads of chosen keys held at a gate in the loader thread to freeze them in flight; the order in which
loads complete is what is checked, never how long they took."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from kvstrata.clock import ManualClock
from kvstrata.config import build_config
from kvstrata.engine.entry import ENTRY_OVERHEAD
from kvstrata.engine.policy import create_policy
from kvstrata.engine.store import LoadTicket, Store
from kvstrata.engine.tiers.ssd import SsdTier
from kvstrata.server.app import Server
from kvstrata.server.prefetch import FIRST_BATCH, MAX_BATCH, PREDICTED_PRIORITY

VALUE = b"v" * 100
DEADLINE = 20.0


class Gates:
    """Holds the loader thread's read of a load that includes a gated key until that key's gate opens."""

    def __init__(self, store: Store) -> None:
        self.gates: dict[bytes, threading.Event] = {}
        self.entered: list[bytes] = []  # gated keys whose read a loader thread has started (list.append: atomic)
        read = store.read_lower

        def gated(ticket: LoadTicket, probe: bool = False) -> dict[bytes, Any]:
            for key in ticket.keys:
                gate = self.gates.get(key)
                if gate is not None:
                    self.entered.append(key)
                    gate.wait(DEADLINE)
            return read(ticket, probe)

        store.read_lower = gated  # type: ignore[method-assign]

    def hold(self, key: bytes) -> threading.Event:
        gate = self.gates[key] = threading.Event()
        return gate


def _server(tmp_path: Path, keys: int = 24) -> tuple[Server, Store]:
    clock = ManualClock()
    ssd = SsdTier(str(tmp_path / "ssd"), 1 << 30, fsync="no", threaded=False)
    store = Store(64 * (3 + len(VALUE) + ENTRY_OVERHEAD), policy=create_policy("lru", clock=clock), clock=clock,
                  ssd=ssd)
    for i in range(keys):
        store.put(b"k%02d" % i, VALUE)
    store.make_room(store.dram.budget)  # everything on SSD
    assert not store.dram.entries
    # Every load through a loader thread (whose reads these tests gate), none on the event loop.
    srv = Server(build_config({"ssd-inline-max": "0"}, {}), store=store)
    return srv, store


async def _until(cond: Any, what: str) -> None:
    """Yield to the loop (and the loader threads' completions) until ``cond()``; a deadline, not a timing."""
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while not cond():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def test_a_clients_load_never_queues_behind_a_prefetch_batch_in_the_loader(tmp_path: Path) -> None:
    srv, store = _server(tmp_path)
    gates = Gates(store)

    async def main() -> None:
        srv.loop = asyncio.get_running_loop()
        pf = srv.prefetcher
        runner = asyncio.create_task(pf.run())
        held = gates.hold(b"k01")
        pf.submit([b"k01", b"k02"], PREDICTED_PRIORITY)
        await _until(lambda: b"k01" in pf._loading, "the prefetch batch in its loader thread")
        # One client's load held in a loader thread too: with one pool of loader threads for both, a second
        # client's load would wait for one of the two to finish.
        other = gates.hold(b"k10")
        entered = gates.entered
        first = asyncio.create_task(srv.load([b"k10"]))
        await _until(lambda: b"k10" in entered, "the first client's load in its loader thread")
        assert await srv.load([b"k11"])  # done while the prefetch batch and the first load are still held
        assert b"k11" in store._overlay  # type: ignore[operator]
        assert pf.in_flight([b"k01"]) and not first.done()
        store.end_command()
        other.set()
        held.set()
        assert await first
        store.end_command()
        await _until(lambda: not pf.in_flight([b"k01", b"k02"]), "the prefetch batch landed")
        runner.cancel()

    asyncio.run(asyncio.wait_for(main(), DEADLINE))
    assert b"k01" in store.dram.entries and b"k02" in store.dram.entries


def test_prefetch_loads_at_most_max_batch_keys_at_a_time(tmp_path: Path) -> None:
    srv, store = _server(tmp_path, keys=40)
    sizes: list[int] = []

    async def main() -> None:
        srv.loop = asyncio.get_running_loop()
        pf = srv.prefetcher
        load = pf._load

        async def recording(keys: list[bytes]) -> bool:
            sizes.append(len(keys))
            return await load(keys)

        pf._load = recording  # type: ignore[method-assign]
        keys = [b"k%02d" % i for i in range(40)]
        pf.submit(keys, PREDICTED_PRIORITY)
        runner = asyncio.create_task(pf.run())
        await _until(lambda: not len(pf) and not pf._loading, "the prefetch queue drained")
        runner.cancel()

    asyncio.run(asyncio.wait_for(main(), DEADLINE))
    # A read arriving while its key loads waits for one such load; a batch's promotion holds the loop as long.
    assert sum(sizes) == 40 and sizes[0] == FIRST_BATCH and max(sizes) == MAX_BATCH, sizes
