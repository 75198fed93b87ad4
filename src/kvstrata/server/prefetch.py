"""The prefetch queue: a bounded priority queue of keys to promote from lower tiers, drained in the background.

Two producers: clients (``TAIR.KV.PREFETCH``, hot-key marking) and the engine's predictor, whose keys go in at
``PREDICTED_PRIORITY``, below every client request, nearest expected use first (the predictor's due access
number, so every reader's next chunk goes before any reader's far ones). One batch is loaded at a time (bounded
concurrency: the loader thread reads it, or the event loop when its records are in the page cache and short,
``Store.read_inline``), so prefetching never competes with more than one
batch of reads. Batches start small and double while the queue stays busy (``FIRST_BATCH`` up to ``batch``):
the chunks needed first land after a short load instead of behind a full batch. A command that needs a key
still waiting here takes it over (the key leaves the queue and the command reads it itself); one that needs a
key of the batch being loaded waits for that key instead of reading it twice, and the prefetch counts as late.
A loaded batch is promoted one key per event-loop turn, keys a command waits for first, and each key's waiters
are released as soon as it is up: a late read waits for its own key, not for the rest of the batch, and the loop
serves other connections between two promotions (``_promote``).

A GET about to load a chunk from below DRAM has its walk predicted before it runs (:meth:`Prefetcher.expect`),
so what follows loads right behind that chunk instead of after its reply.

The prefetcher loads on its own loader thread (the server's ``background`` loads), so a client's load never
queues behind a prefetch batch. Batches are at most ``MAX_BATCH`` keys: a read that arrives while its key is
loading waits for that batch's read only. (Holding every batch while any client's load was in flight was
measured and dropped: at the fast rate a client's load, a miss or a SET's probe, is nearly always in flight, and
prefetching starved.)
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kvstrata.commands.registry import CommandSpec
from kvstrata.engine.store import Store
from kvstrata.server.read_waits import ReadWaits

log = logging.getLogger("kvstrata.prefetch")

PREDICTED_PRIORITY = -1
EXPECTING = frozenset({"get"})
"""Commands whose load of a chunk below DRAM predicts, before they run, what their read will (Prefetcher.expect)."""
FIRST_BATCH = 2  # keys in the first batch after the queue was idle (doubling up to ``batch``)
MAX_BATCH = 8
"""Most keys one prefetch load reads (the default ``batch``): the read a late read waits for."""
ALONG = 4  # the default of the `prefetch-along` setting
"""Predicted chunks a GET's load of a chain's first chunk brings up with it (Prefetcher.expect)."""
LOAD_TRIES = 3  # loads of one batch raced by writes before the batch is given up


class Prefetcher:
    def __init__(self, store: Store, load: Callable[[list[bytes]], Awaitable[bool]], capacity: int = 65536,
                 batch: int = MAX_BATCH) -> None:
        self.store = store
        self._load = load
        self.capacity = capacity
        self.batch = batch
        self._heap: list[tuple[int, int, int, bytes]] = []  # (-priority, due access, sequence, key)
        self._queued: set[bytes] = set()
        self._loading: set[bytes] = set()
        # Per key of the batch in flight, the commands waiting for it (claim): released when it lands (_land).
        self._landing: dict[bytes, list[asyncio.Future[None]]] = {}
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self.dropped = 0
        # Chunks loaded with a GET's own chunk (expect), promoted from that load when the command ends.
        self.along = ALONG
        self._along: list[bytes] = []
        self._tasks: set[asyncio.Task[None]] = set()  # along promotions in progress (_promote_along)
        # Batches given up because every load of them was raced by a write.
        self.stale_batches = 0
        # What reads below DRAM waited for (INFO prefetch wait_*): the server's loads record theirs here too.
        self.waits = ReadWaits()

    def submit(self, keys: list[bytes], priority: int = 0, due: Callable[[bytes], int] | None = None) -> int:
        """Queue keys that are not already in DRAM or queued; higher priority goes first, then the earlier
        ``due`` (the access number a key is expected to be read at), then the order of submission. Returns how
        many."""
        if not self.store.lower:
            return 0
        queued = 0
        entries = self.store.dram.entries
        for key in keys:
            if key in entries or key in self._queued or key in self._loading:
                continue
            if len(self._queued) >= self.capacity:
                self.dropped += 1
                continue
            heapq.heappush(self._heap, (-priority, due(key) if due is not None else 0, next(self._seq), key))
            self._queued.add(key)
            queued += 1
        if queued:
            self.store.stats.prefetch_queued += queued
            self._wake.set()
        return queued

    def submit_predicted(self) -> None:
        """Queue what the predictor expects the clients to read next.

        Called while the command that made the prediction still holds what its load read (the overlay): keys whose
        state is known without a lower-tier read (an EXISTS batch of SSD-resident chunks announces exactly the
        keys it loaded; values still in the SSD writer's pending writes) and the chunks a GET loaded with its own
        (expect's ``along``) come up from that right after the reply (_promote_along), neither read a second time
        nor promoted on the reply's path. The others are queued.
        """
        predictor = self.store.predictor
        keys = predictor.take() if predictor is not None else []
        if self._along:
            along, self._along = self._along, []
            self._promote_along(along)
        self._submit_predicted(keys)

    def _promote_along(self, keys: list[bytes]) -> None:
        """Keys whose state is known now (the chunks a GET loaded with its own, expect; a command's overlay; the
        SSD writer's pending writes) come up after the command's reply, not before it: the records are kept from
        the command's load (under a watch, as a batch's between turns) and promoted from the next event-loop turn
        on. Meanwhile they count as loading: a read of one waits for it instead of loading it again. A key known
        from a pending write that commits meanwhile is queued to be loaded then (_promote's ``requeue``)."""
        store = self.store
        entries = store.dram.entries
        unknown = store.unknown(keys)
        keys = [k for k in keys if k not in entries and k not in self._loading and k not in unknown]
        if keys:
            self._hand_over(keys)

    def _hand_over(self, keys: list[bytes]) -> None:
        """_promote_along for ``keys`` already checked: not in DRAM, not loading, their state known."""
        store = self.store
        kept = store.keep_overlay(keys)  # None: no overlay, the keys are known from pending writes
        pending = {k for k in keys if kept is None or k not in kept[0]}
        store.stats.prefetch_queued += len(keys)
        store.stats.prefetch_predicted += len(keys)
        self._loading.update(keys)
        # A few chunks (a GET's along) all in the one turn after the reply: the reader asks for the first of them
        # next. More (a batch's worth from pending writes) one per turn, as a prefetch batch.
        spread = len(keys) > max(1, self.along)
        task = asyncio.get_running_loop().create_task(self._promote(keys, kept, spread=spread, requeue=pending))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _submit_predicted(self, keys: list[bytes]) -> None:
        """Queue predicted keys; those whose state is known without a lower-tier read (the overlay, the SSD
        writer's pending writes) come up right after the reply instead (_promote_along), not on its path."""
        store = self.store
        predictor = store.predictor
        if not keys or predictor is None:
            return
        later: list[bytes] = []
        now: list[bytes] = []
        entries = store.dram.entries
        unknown = store.unknown(keys)
        for key in keys:
            if key in entries:
                continue
            if key in self._queued or key in self._loading or key in unknown:
                later.append(key)
            elif key not in now:
                now.append(key)
        if now:
            self._hand_over(now)
        if later:
            store.stats.prefetch_predicted += self.submit(later, PREDICTED_PRIORITY, predictor.due_at)

    def expect(self, spec: CommandSpec, keys: list[bytes], sid: int, along: int = 0) -> list[bytes]:
        """A command of stream ``sid`` may have to load ``keys`` before it runs. For a GET of a chunk below DRAM
        (a chain read chunk by chunk) the predictor predicts now what that read will, so the rest of a returning
        chain loads right behind that chunk instead of after its reply. Other commands predict nothing early: a
        multi-key read loads its own keys, and a command that does not read the value (TAIR.KV.TIER, EXISTS)
        is not a reader about to go on.

        Returns the first ``along`` predicted chunks (not in DRAM, not queued or loading), which are not queued:
        the caller loads them with its own chunk, and they are promoted from that load right after the command's
        reply (submit_predicted, _promote_along), so the chunks a reader asks for right after its first are up
        by the time it asks, instead of landing while it waits for them (a late prefetch), and that reply does not
        wait for their promotion.
        """
        predictor = self.store.predictor
        if predictor is None or spec.full_name not in EXPECTING or len(keys) != 1 or keys[0] in self.store.dram.entries:
            return []
        predictor.expect(keys[0], sid)
        if not predictor.pending:
            return []
        predicted = predictor.take()
        picked: list[bytes] = []
        if along:
            entries, queued, loading = self.store.dram.entries, self._queued, self._loading
            for key in predicted:
                if key not in entries and key not in queued and key not in loading and key not in picked:
                    picked.append(key)
                    if len(picked) == along:
                        break
            if picked:
                self._along.extend(picked)
                predicted = [k for k in predicted if k not in picked]
        self._submit_predicted(predicted)
        return picked

    def __len__(self) -> int:
        return len(self._queued)

    def in_flight(self, keys: list[bytes]) -> bool:
        """Whether any of ``keys`` is queued or being loaded."""
        return any(k in self._queued or k in self._loading for k in keys)

    async def claim(self, keys: list[bytes]) -> None:
        """A command is about to read ``keys``: take queued ones back; for each one in the batch being loaded, wait
        until that key has landed (promoted, or given up), not for the whole batch."""
        queued = self._queued
        for key in keys:
            queued.discard(key)  # its heap entry is skipped when popped
        late = [k for k in keys if k in self._loading]
        if not late:
            return
        t0 = time.perf_counter_ns()
        loop = asyncio.get_running_loop()
        for key in late:
            if key not in self._loading:
                continue  # landed while this command waited for another of its keys
            # One future per waiting command: cancelling one (its client went away) leaves the others waiting.
            fut: asyncio.Future[None] = loop.create_future()
            self._landing.setdefault(key, []).append(fut)
            await fut
        self.waits.add("joined", (time.perf_counter_ns() - t0) // 1000)
        self.store.mark_late(late)

    def _land(self, key: bytes) -> None:
        """``key`` of the batch in flight is done with (promoted or not): release the commands waiting for it."""
        self._loading.discard(key)
        for fut in self._landing.pop(key, ()):
            if not fut.done():
                fut.set_result(None)

    async def _promote(self, keys: list[bytes], kept: tuple[dict[bytes, Any], Any] | None = None,
                       spread: bool = True, requeue: set[bytes] | None = None) -> None:
        """Promote a loaded batch one key per event-loop turn, keys a command waits for first.

        Each key's waiters are released as soon as it is up, and the loop serves other connections between two
        promotions (a promotion may demote victims: a batch at once held every connection for all of them). The
        batch's records are kept between turns under a watch of the SSD tier: a write or delete of a key meanwhile
        makes them stale, and the keys not promoted yet are then left to the readers (an overwritten key is never
        brought back from the record read before the write). ``kept``: records kept from a command's load, promoted
        from the next turn on; ``spread`` False: all in that one turn (the few chunks along a GET's load).
        ``requeue``: keys known from the SSD writer's pending writes when they were handed over; one whose write
        has been committed by its turn (its state is no longer known without a read) is queued to be loaded.
        """
        store = self.store
        rest = list(keys)
        again: list[bytes] = []
        try:
            if kept is not None:  # a task's first step: the command's reply went out in the turn that made it
                store.restore_overlay(kept)
                kept = None
            while rest:
                key = next((k for k in rest if k in self._landing), rest[0])
                rest.remove(key)
                t0 = time.perf_counter_ns()
                try:
                    if store.promote(key, sync=False):
                        store.stats.prefetch_done += 1
                    elif requeue and key in requeue and key not in store.dram.entries and not store.loaded(key):
                        again.append(key)
                except Exception:  # a failed prefetch must never stop the others (nor fail a command)
                    log.exception("prefetch of %r failed", key[:64])
                self.waits.add("promote", (time.perf_counter_ns() - t0) // 1000)
                self._land(key)
                if not rest:
                    break
                if not spread:
                    continue
                kept = store.keep_overlay(rest)
                store.end_command()
                await asyncio.sleep(0)  # one loop turn: the released readers and other connections go first
                if kept is not None:
                    store.restore_overlay(kept)  # False (stale): the rest come up only from pending writes
                    kept = None
        finally:
            if kept is not None:  # cancelled during a turn (shutdown): stop watching
                store.restore_overlay(kept, install=False)
            store.end_command()
            for key in rest:
                self._land(key)
        if again:
            predictor = store.predictor
            self.submit(again, PREDICTED_PRIORITY, predictor.due_at if predictor is not None else None)

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            size = min(FIRST_BATCH, self.batch)
            while self._heap:
                keys: list[bytes] = []
                while self._heap and len(keys) < size:
                    key = heapq.heappop(self._heap)[3]
                    if key in self._queued:
                        self._queued.discard(key)
                        keys.append(key)
                if not keys:
                    continue
                size = min(2 * size, self.batch)
                self._loading.update(keys)
                try:
                    # A load raced by a write is stale and not installed: it is read again, and after LOAD_TRIES
                    # only the keys whose state is known are promoted (a later read loads the others itself).
                    # Promotion never reads LMDB on the event loop. A load that succeeded may have known keys
                    # from the SSD writer's pending writes, which can commit between two promotions' turns: such
                    # a key is queued again (``requeue``), not dropped.
                    known = False
                    for _ in range(LOAD_TRIES):
                        if await self._load(keys):
                            known = True
                            break
                    else:
                        self.stale_batches += 1
                    await self._promote(keys, requeue=set(keys) if known else None)
                except Exception:  # a failed prefetch must never take the server down
                    log.exception("prefetch batch failed")
                finally:
                    self.store.end_command()
                    for key in keys:
                        if key in self._loading:
                            self._land(key)
