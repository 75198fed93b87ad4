"""A large value's copy shared with a helper thread, hashed in order by the calling thread as its pieces land.

Used by pull stores' ``process_vm_readv`` into an arena slot (``kvstrata.engine.pull``), while the client waits
for its reply. One thread's copy is bound by the misses one core keeps in flight, not by the memory: on a
2-vCPU Intel VM a second copying thread made pulls 1.4x and restores 1.6-1.8x faster (BENCHMARKS.md, "Restore on
an Intel host"), and the hash (xxh3, ~48 GB/s on warm bytes there) keeps up with two copiers. Work is taken, not
assigned: the caller and the helper each take the next piece not yet taken, so a helper that starts late (its
executor busy with another value) only copies less, and one that never starts leaves the whole copy to the
caller. The caller hashes piece k as soon as it has landed, whoever copied it, so the digest is the same
sequential xxh3 as a copy on one thread.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

MIN_SHARED_PIECES = 4  # fewer pieces are copied by the caller alone (handing work over costs ~50 us)


def copy_along(count: int, copy: Callable[[int], None], hash_piece: Callable[[int], None], helper: Any) -> None:
    """``copy(i)`` for every piece ``i < count``, by this thread and a thread of ``helper`` (an executor) at once;
    ``hash_piece(i)`` on this thread in order, each once piece ``i`` has landed. Without a helper, or below
    ``MIN_SHARED_PIECES``, this thread copies and hashes each piece in turn. An exception from a ``copy`` stops
    the copies not yet started and is raised (the first piece's, in order) once the helper is done with the
    destination: on return or raise, nothing writes into it any more."""
    if helper is None or count < MIN_SHARED_PIECES:
        for i in range(count):
            copy(i)
            hash_piece(i)
        return
    taken = itertools.count()  # next() on it is atomic under the GIL: each piece is taken once
    done = [threading.Event() for _ in range(count)]
    errors: dict[int, BaseException] = {}
    stop = [False]

    def take_one() -> bool:
        i = next(taken)
        if i >= count:
            return False
        try:
            if not stop[0]:
                copy(i)
        except Exception as exc:
            errors[i] = exc
            stop[0] = True
        finally:
            done[i].set()
        return True

    def help_out() -> None:
        while take_one():
            pass

    fut = helper.submit(help_out)
    try:
        for k in range(count):
            while not done[k].is_set():
                if not take_one():
                    done[k].wait()
            if stop[0]:
                raise errors[min(errors)]  # pieces after a failed one may have been skipped: none is hashed
            hash_piece(k)
    finally:
        stop[0] = True
        if not fut.cancel():
            fut.result()
