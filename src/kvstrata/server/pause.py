"""CLIENT PAUSE: hold clients' commands for a while, as Redis 7.0 does.

``WRITE`` holds every command that writes (and an EXEC whose transaction holds one); ``ALL`` holds every command,
CLIENT UNPAUSE and QUIT included (Redis 7.0: a pause ``ALL`` ends only at its deadline). A held command is not
refused: its connection waits (other clients are served meanwhile), then the command goes through every check
again and runs, unless the pause was made stronger or longer meanwhile. Pauses combine as Redis's do: the
stronger kind and the later end win. While paused, active expiry rests (keys past their TTL stay counted until
the pause ends, as in Redis); a read of an expired key still finds nothing. Operators pause a node to move its
keys away (MIGRATE, DUMP) or to stop writes during maintenance without closing connections.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from kvstrata.server.hangup import until_done_or_gone

OFF, WRITE, ALL = 0, 1, 2
KINDS = {b"write": WRITE, b"all": ALL}


def now_ms() -> int:
    return time.time_ns() // 1_000_000  # Redis measures a pause's end in wall-clock milliseconds


class ClientPause:
    """The server's pause: its kind, its end (Unix ms), and the connections waiting for it to end."""

    def __init__(self) -> None:
        self.kind = OFF
        self.end_ms = 0
        self._waiters: set[asyncio.Future[None]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def pause(self, end_ms: int, kind: int) -> None:
        """Pause until ``end_ms`` (a later end already set is kept) with ``kind`` (a stronger one is kept)."""
        self.kind = max(self.kind, kind)
        self.end_ms = max(self.end_ms, end_ms)
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        # Wake the held commands at the end even when nothing else happens (no CLIENT UNPAUSE).
        self._timer = loop.call_later(max(0.0, (self.end_ms - now_ms()) / 1000), self._elapsed)
        self.active()

    def unpause(self) -> None:
        self.kind = OFF
        self.end_ms = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake()

    def active(self) -> bool:
        """Whether clients are paused now (a pause whose end passed is ended here)."""
        if self.kind and now_ms() >= self.end_ms:
            self.unpause()
        return self.kind != OFF

    def holds(self, spec: Any, multi: list[Any] | None, is_exec: bool) -> bool:
        """Whether a command of ``spec`` must wait (``multi``: the client's queued transaction, for EXEC)."""
        if not self.active():
            return False
        if self.kind == ALL:
            return True
        return spec.write or (is_exec and multi is not None and any(q.write for q, _ in multi))

    async def wait(self, gone: Callable[[], bool]) -> None:
        """Until the pause ends (unpause or deadline), or ``gone()`` says the waiting client left (a client that
        gave up is dropped during the pause, as Redis frees it: server/hangup.py)."""
        while self.active():
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.add(fut)
            try:
                if not await until_done_or_gone(fut, gone):
                    return
            finally:
                self._waiters.discard(fut)

    def _elapsed(self) -> None:
        self._timer = None
        if not self.active():
            self._wake()
        else:  # made longer meanwhile without a new timer: wait again
            self._timer = asyncio.get_running_loop().call_later(max(0.0, (self.end_ms - now_ms()) / 1000),
                                                                self._elapsed)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
