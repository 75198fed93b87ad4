"""Typed waits: what a handler returns when it cannot answer before some I/O has happened.

A handler never blocks and never raises to be run again. It returns ``Suspend(wait, then)``: the server performs
``wait`` off the event loop (or waits for a writer thread to report), then calls ``then(result)`` on the loop,
which returns the reply or another ``Suspend``. State the continuation needs lives in its closure, not on the
connection or the engine. ``reload`` asks the server to load the command's keys from the lower tiers again
before ``then`` runs (they may have left the SSD's pending writes meanwhile); ``cancel`` releases what the
continuation holds (watch tickets) when it will never run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Commit:
    """The SSD writer has committed everything up to ``seq``. Result: None."""

    seq: int


@dataclass(slots=True)
class PoolAck:
    """The pool writer has sent write ``seq`` (and the SSD writer committed ``ssd_seq``, when set). Result: None.
    A pool that fails meanwhile ends the wait too (it is marked degraded; the write stays local)."""

    seq: int
    ssd_seq: int = 0


@dataclass(slots=True)
class PoolVersions:
    """Compare ``local`` ({key: local version, 0 when absent}) with the pool's, in a worker thread.

    Result: ``(newer, raced)``: the pool records newer than the local copies, and whether this node wrote or
    deleted one of the keys in the pool while the check ran (then ``newer`` may be out of date).
    """

    local: dict[bytes, int]


@dataclass(slots=True)
class Offload:
    """Run ``run()`` in a worker thread: CPU work on buffers that releases the GIL (a large two-phase commit's
    copy and hash), so the loop serves the other clients meanwhile. Result: what ``run`` returns. What it reads
    and writes must stay alive until it has returned, also when the continuation never runs: ``cancel`` then
    has to leave that to the thread (``kvstrata.engine.staging.CommitJob.abandon``)."""

    run: Callable[[], Any]


@dataclass(slots=True)
class Await:
    """Run the coroutine ``start()`` returns on the event loop: network I/O with another server (MIGRATE), which
    waits on sockets, not on a thread. Result: what the coroutine returns."""

    start: Callable[[], Awaitable[Any]]


Wait = Commit | PoolAck | PoolVersions | Offload | Await


@dataclass(slots=True)
class Suspend:
    wait: Wait
    then: Callable[[Any], Any]
    reload: bool = False
    cancel: Callable[[], None] | None = None

    def release(self) -> None:
        if self.cancel is not None:
            self.cancel()
            self.cancel = None
