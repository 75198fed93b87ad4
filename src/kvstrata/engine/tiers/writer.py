"""The write queue shared by tiers whose writes must stay off the event loop (SSD, pool).

Operations are numbered as they are queued; one background thread takes everything waiting and hands it to the
tier's ``_process(batch)`` as one batch (group commit). ``threaded=False`` applies each operation at once on
the caller's thread, which unit tests use to stay deterministic.
"""

from __future__ import annotations

import queue
import threading
from typing import Any


class BatchWriter:
    enqueued_seq: int
    queued_bytes: int

    def _start_writer(self, threaded: bool, name: str, max_batch_bytes: int | None = None) -> None:
        self.enqueued_seq = 0
        self.queued_bytes = 0
        self._threaded = threaded
        self._max_batch_bytes = max_batch_bytes
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._writer, name=name, daemon=True)
            self._thread.start()

    def _process(self, batch: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError

    def _enqueue(self, op: tuple[Any, ...], nbytes: int = 0) -> int:
        """Queue ``(seq, nbytes, *op)``; returns its sequence number."""
        self.enqueued_seq += 1
        self.queued_bytes += nbytes
        op = (self.enqueued_seq, nbytes, *op)
        if self._threaded:
            self._queue.put(op)
        else:
            self._process([op])
        return self.enqueued_seq

    def _writer(self) -> None:
        limit = self._max_batch_bytes
        while True:
            op = self._queue.get()
            if op is None:
                return
            batch = [op]
            stop = False
            nbytes = op[1]
            while limit is None or nbytes < limit:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
                nbytes += nxt[1]
            self._process(batch)
            if stop:
                return

    def _stop_writer(self, timeout: float) -> None:
        """Let the thread finish what is queued, then stop it."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=timeout)
            self._thread = None
