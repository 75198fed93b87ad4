"""A Bloom filter of the keys the SSD tier holds, so that a read of a key it has never held is answered on the
event loop instead of in a loader thread.

A read whose record's place is unknown goes to a thread: without reading, a key with no record cannot be told
from one whose place was never learnt. A KV cache's misses are mostly of that kind (the chunks of a prompt never
seen), so each cost a thread hop. The filter answers "certainly not held" for them: no false negatives (every
key the tier may hold was added), false positives only cost the old way. Keys are never removed (a deleted
key's bits stay: a false positive, not an error); a filter that has taken more keys than it was sized for is
rebuilt from the tier. ``KeyFilter`` is the filter; ``KeyIndex`` keeps one up to date for a tier (startup scan,
every write, rebuilds, lookups, counters).

About 1.2 bytes a key at a 1% false-positive rate (k = 7 probes, 9.6 bits a key).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import numpy as np
import xxhash

PROBES = 7
BITS_PER_KEY = 9.6  # ~1% false positives with PROBES probes
MIN_KEYS = 1 << 16  # the smallest filter sized (77 KiB)


class KeyFilter:
    """A Bloom filter over byte strings: ``add``, ``add_many`` (vectorised), ``in``, ``merge``.

    Not thread-safe for writers: one thread adds (the tier's owner); readers on other threads only see bits set
    (a bit is never cleared), which is what a lookup needs.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(MIN_KEYS, capacity)
        nbits = -(-int(self.capacity * BITS_PER_KEY) // 8) * 8
        self.nbits = nbits
        self._bits = bytearray(nbits // 8)
        self.count = 0  # keys added (a key added twice counts twice: full() errs towards rebuilding early)

    @property
    def nbytes(self) -> int:
        return len(self._bits)

    def full(self) -> bool:
        """Whether it has taken more keys than it was sized for (its false-positive rate is rising)."""
        return self.count > self.capacity

    def _spots(self, key: bytes) -> tuple[int, int]:
        h = xxhash.xxh3_64_intdigest(key)
        return h & 0xFFFFFFFF, (h >> 32) | 1

    def add(self, key: bytes) -> None:
        h1, h2 = self._spots(key)
        bits, n = self._bits, self.nbits
        for i in range(PROBES):
            p = (h1 + i * h2) % n
            bits[p >> 3] |= 1 << (p & 7)
        self.count += 1

    def __contains__(self, key: bytes) -> bool:
        h1, h2 = self._spots(key)
        bits, n = self._bits, self.nbits
        for i in range(PROBES):
            p = (h1 + i * h2) % n
            if not bits[p >> 3] & (1 << (p & 7)):
                return False
        return True

    def add_many(self, keys: Iterable[bytes]) -> None:
        """``add`` for many keys at once (a scan of the tier): the probes are set with numpy."""
        digest = xxhash.xxh3_64_intdigest
        hashes = np.fromiter((digest(k) for k in keys), dtype=np.uint64)
        if not hashes.size:
            return
        h1 = hashes & np.uint64(0xFFFFFFFF)
        h2 = (hashes >> np.uint64(32)) | np.uint64(1)
        view = np.frombuffer(self._bits, dtype=np.uint8)
        n = np.uint64(self.nbits)
        for i in range(PROBES):
            p = (h1 + np.uint64(i) * h2) % n
            np.bitwise_or.at(view, (p >> np.uint64(3)).astype(np.intp),
                             np.left_shift(np.uint8(1), (p & np.uint64(7)).astype(np.uint8)))
        self.count += int(hashes.size)

    def merge(self, other: KeyFilter) -> None:
        """Add every key of ``other`` (a filter of the same size)."""
        if other.nbits != self.nbits:
            raise ValueError("only filters of the same size merge")
        view = np.frombuffer(self._bits, dtype=np.uint8)
        np.bitwise_or(view, np.frombuffer(other._bits, dtype=np.uint8), out=view)
        self.count += other.count


class KeyIndex:
    """The key filter of one tier, kept up to date: built by a scan of the tier (in a thread of its own when the
    tier's writer is threaded, else on the caller's), fed every key about to be written (``note``), rebuilt larger
    by another scan once it has taken more keys than it was sized for. None is in use (``ready`` False) until the
    first scan is in; meanwhile every unknown key is read, as without a filter.

    ``scan(capacity)``: every key the tier holds on disk in a new filter of that capacity, from any thread; None
    when the tier closed meanwhile or a page could not be read. ``size()``: keys a new filter is sized for.
    ``queued()``: keys written but not committed yet (a scan's snapshot may miss them: they go in first).

    Every change of the filters is made under one lock (by the owner's thread in the server; a caller on another
    thread, INFO from a tool, must not interleave with a write's add: a lost add would rule out a key the tier
    holds). Lookups read bits without it: a bit is never cleared.
    """

    def __init__(self, scan: Callable[[int], KeyFilter | None], size: Callable[[], int],
                 queued: Callable[[], Iterable[bytes]], threaded: bool, name: str = "kvstrata-ssd-keys") -> None:
        self._scan = scan
        self._size = size
        self._queued = queued
        self._threaded = threaded
        self._name = name
        self.current: KeyFilter | None = None
        # The next filter while a scan builds it (every key noted meanwhile goes into both); ``_scanned``: a
        # finished scan waiting to be merged into it by the owner's next call.
        self.filling: KeyFilter | None = None
        self._scanned: tuple[KeyFilter, KeyFilter | None] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()
        self._closed = False
        self.absent = 0  # keys answered "no record" by the filter (counted by the tier as it answers them)
        self.scans = 0
        # A scan failed (a damaged page): no more rebuilds, which would each fail again; the filter in use stays
        # correct, only less selective as it fills.
        self.stuck = False
        # ``ssd-key-filter``: whether lookups consult the filter. It is kept up to date either way, so that turning
        # lookups back on never meets a filter that missed a write.
        self.lookups = True

    def start(self) -> None:
        """Build a filter of ``size()`` keys from a scan. The keys queued and not committed yet go in first and
        those noted from now on as they come: the scan's snapshot, taken after this, holds every key committed
        before it."""
        nxt = KeyFilter(self._size())
        nxt.add_many(self._queued())
        self.filling = nxt
        self.scans += 1
        if not self._threaded:
            self._scanned = (nxt, self._scan(nxt.capacity))
            self.take_scan()
            return

        def run() -> None:
            self._scanned = (nxt, self._scan(nxt.capacity))  # taken up by the owner's next call (take_scan)

        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()

    def take_scan(self) -> None:
        """A finished scan: merged into the filter it was building, which is then the one in use."""
        if self._scanned is None:
            return
        with self._lock:
            self._take_scan_locked()

    def _take_scan_locked(self) -> None:
        if self._scanned is None:
            return
        nxt, scanned = self._scanned
        self._scanned = None
        self._thread = None
        self.filling = None
        if scanned is None:
            self.stuck = not self._closed
            return
        nxt.merge(scanned)
        self.current = nxt
        if nxt.full():
            self.start()

    def ready(self) -> bool:
        """Whether a filter is in use (takes up a finished scan)."""
        self.take_scan()
        return self.current is not None

    def note(self, key: bytes) -> None:
        """A key about to be written: into the filter in use and the one being built; a filter that has taken
        more keys than it was sized for is rebuilt larger."""
        with self._lock:
            self._take_scan_locked()
            filling = self.filling
            if filling is not None:
                filling.add(key)
            flt = self.current
            if flt is not None:
                flt.add(key)
                if filling is None and flt.full() and not self.stuck:
                    self.start()

    def ruled_out(self, key: bytes) -> bool:
        """Whether the filter says the tier holds no record of ``key`` (any thread). The caller counts the key in
        ``absent`` once it answers it so (a load declined after this check is answered by a thread)."""
        flt = self.current
        return flt is not None and self.lookups and key not in flt

    def info(self) -> dict[str, int]:
        """INFO ``tier_ssd``'s ``key_filter_*`` fields (a finished scan shows at once)."""
        self.ready()
        flt, filling = self.current, self.filling
        return {"key_filter": int(flt is not None), "key_filter_keys": flt.count if flt is not None else 0,
                "key_filter_bytes": (flt.nbytes if flt is not None else 0)
                + (filling.nbytes if filling is not None else 0),
                "key_filter_absent": self.absent, "key_filter_scans": self.scans}

    def close(self, timeout: float) -> None:
        """No more scans; wait for one running (the caller's ``scan`` must stop soon once its tier is closed: no
        read transaction may outlive the environment)."""
        self._closed = True
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
