"""Saves: checkpoints of write-back DRAM to the SSD tier, as Redis's snapshots are to its RDB file.

Under write-back a value reaches the SSD tier when it is demoted, so a crash (kill -9, the OOM killer) loses what
was only in DRAM. A save queues every DRAM entry without an SSD copy (``Entry.on_ssd``) to the SSD writer and
waits for its commit (fsynced as ``fsync`` says): every write acknowledged before the save started then survives
a crash. An entry keeps its mark until it is overwritten, so each save writes what changed since the last one,
not the whole data set.

- ``SAVE`` queues everything at once and answers once it is committed (other clients are served meanwhile).
- ``BGSAVE`` answers at once; a task queues the DRAM keys a slice at a time, between other clients' commands.
- Save points (``save "<seconds> <changes> ..."``) start a background save from the server's cycle, as Redis's
  serverCron does; a failed one is tried again after ``RETRY_DELAY``.
- ``LASTSAVE`` and INFO ``persistence`` report the last completed save and the changes since.

From the first save (or with save points configured) on, what reached the SSD tier stays there
(``Store.keep_below``): a key read back into DRAM keeps its record and a write to it goes to the SSD too, so a
save keeps each key it wrote, with its last value, not only until the key is next read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from kvstrata.config import save_points
from kvstrata.engine.entry import Entry

log = logging.getLogger("kvstrata.saves")

# DRAM keys queued per turn of the event loop: a large DRAM is checkpointed without holding up other clients.
SLICE = 4096
# Redis's CONFIG_BGSAVE_RETRY_DELAY: save points retry a failed save no sooner than this (seconds).
RETRY_DELAY = 5.0


@dataclass(slots=True)
class SaveRun:
    """One save from its start: store.changes then, and what DRAM held (parallel lists), to check it by."""

    base: int
    keys: list[bytes]
    entries: list[Entry]


class Saves:
    """The server's saves: the one in progress, the last one's outcome, the changes since."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.store = server.store
        # As Redis: the data found at startup counts as saved.
        self.last_save = int(time.time())
        self.last_ok = True
        self.last_try = 0.0  # monotonic start of the last save tried
        self.last_duration = -1  # seconds the last background save took (-1: none yet)
        self.count = 0  # saves completed
        self.scheduled = False  # BGSAVE inside EXEC: started by the next cycle, as Redis does
        self.started: float | None = None  # monotonic start of the background save in progress
        self._base = self.store.changes  # store.changes when the last completed save started
        self.configured()

    def configured(self) -> None:
        """Save points asked for (at startup, CONFIG SET save): saved copies are kept from now on."""
        if save_points(self.server.config.get("save")):
            self.keep()

    def keep(self) -> None:
        """From the first save (or save points) on, what reached the SSD tier stays there (``Store.keep_below``):
        a key read back into DRAM keeps its record, a write to it goes to the SSD too, so a save keeps every key it
        wrote until the key is deleted, not only until it is next read. Never undone: saved data stays saved."""
        if self.store.ssd is not None:
            self.store.keep_below = True

    @property
    def changes(self) -> int:
        """Writes since the last completed save started (Redis's rdb_changes_since_last_save); none under
        write-through, where every acknowledged write is on the SSD tier already."""
        return 0 if self.store.write_through else self.store.changes - self._base

    @property
    def running(self) -> bool:
        return self.started is not None

    def begin(self) -> SaveRun:
        """A save starts (SAVE, or a background one): saved copies are kept from now on, and what it must write is
        noted to check it by once committed (``finish``)."""
        self.keep()
        dram = self.store.dram.entries
        return SaveRun(self.store.changes, list(dram), list(dram.values()))

    def finish(self, run: SaveRun) -> str | None:
        """The save committed: recorded as the last save if everything it started with is on the SSD tier; else
        why not (the save failed): writes failed (a full or failing disk), or the tier evicted some of them to make
        room (its budget is below the data's)."""
        ssd = self.store.ssd
        failed = len(ssd.stuck) + len(ssd.retrying) if ssd is not None else 0
        reason = None
        if failed:
            reason = (f"{failed} writes to the SSD tier failed ({ssd.degraded or 'being retried'}); they are held "
                      "in memory")
        elif evicted := self.store.unsaved(run.keys, run.entries):
            reason = (f"the SSD tier evicted {evicted} of the values it was saving to make room (essd-size is "
                      "below the data's size); they are held in memory only")
        self.last_ok = reason is None
        if reason is None:
            self.last_save = int(time.time())
            self._base = max(self._base, run.base)
            self.count += 1
        return reason

    def start(self) -> None:
        """Start a background save (the caller checked that none runs and that there is an SSD tier)."""
        self.scheduled = False
        self.started = self.last_try = time.monotonic()  # running from now on: a second BGSAVE is refused
        task = asyncio.ensure_future(self._background(self.begin()))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def _background(self, run: SaveRun) -> None:
        store = self.store
        t0 = time.monotonic()
        reason: str | None = "stopped"
        try:
            for i in range(0, len(run.keys), SLICE):
                store.checkpoint_keys(run.keys[i:i + SLICE])
                await asyncio.sleep(0)
            await self.server.wait_commit(store.ssd.barrier(sync=True))
            reason = self.finish(run)
        finally:
            self.started = None
            self.last_duration = round(time.monotonic() - t0)
            if reason is not None:
                self.last_ok = False
                log.warning("background save failed: %s", reason)
            else:
                log.info("background save done in %.3f s", time.monotonic() - t0)

    def due(self, now: float) -> bool:
        """Whether the server's cycle should start a background save now: BGSAVE SCHEDULE asked for one, or a save
        point is reached (as Redis: ``changes`` writes and ``seconds`` since the last save; after a failure not
        before RETRY_DELAY)."""
        if self.running or self.store.ssd is None:
            return False
        if self.scheduled:
            return True
        points = save_points(self.server.config.get("save"))
        if not points or (not self.last_ok and now - self.last_try < RETRY_DELAY):
            return False
        changes = self.changes
        elapsed = time.time() - self.last_save
        return any(changes >= c and elapsed >= s for s, c in points)
