"""The planning layer shared by the sync and the asyncio client: parameters, keys, TTLs, encoding, the local tier.

``_Base`` holds what ``KVCacheClient`` and ``AsyncKVCacheClient`` do alike and without I/O: the keys of a
token prefix, TTL classes, which chunks a store covers and in what batches, the commands of a read window
(PREFETCH of the next window with this window's MGET), decoding a window's values into the leading usable
chunks, the local tier, and the counters (``ClientStats``). The clients add the transport.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvstrata.client.codec import (
    CodecError,
    FormatVersionError,
    check_codec,
    decode,
    default_codec,
    prepare_parts,
    seal_parts,
)
from kvstrata.client.copypool import copy_threads as checked_copy_threads
from kvstrata.client.keys import DEFAULT_CHUNK_SIZE, Namespace, chunk_keys, tail_keys
from kvstrata.client.local import LocalTier
from kvstrata.client.resp import PROBE, mget_command
from kvstrata.engine.entry import Entry

log = logging.getLogger("kvstrata.client")

DEFAULT_BATCH_SIZE = 64
DEFAULT_PREFETCH_WINDOW = 4
# Seconds; None = no expiry. Session context ages in minutes, user profiles in a day, shared knowledge never.
DEFAULT_TTL_CLASSES: dict[str, float | None] = {"session": 30 * 60.0, "profile": 24 * 3600.0, "shared": None}
DEFAULT_TTL_CLASS = "session"
# clear(): keys asked for per SCAN page, and deleted per DEL.
CLEAR_BATCH = 1000

KV = Any  # a numpy array or a torch tensor
KVSource = KV | Callable[[int, int], KV]


@dataclass
class ClientStats:
    lookups: int = 0
    hit_chunks: int = 0
    miss_chunks: int = 0
    stored_chunks: int = 0
    skipped_chunks: int = 0
    local_hits: int = 0
    corrupt: int = 0
    refused: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    store_errors: int = 0  # stores an integration gave up on (counted by it, e.g. the transformers generator)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["errors"] = list(self.errors[-10:])
        return d


class _Base:
    """Parameters, keys, TTLs, encoding and the local tier shared by the sync and asyncio clients."""

    def __init__(self, namespace: Namespace | str, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 batch_size: int = DEFAULT_BATCH_SIZE, prefetch_window: int = DEFAULT_PREFETCH_WINDOW,
                 compression: str | None = None, fp8_scale: str = "head",
                 ttl_classes: dict[str, float | None] | None = None, default_ttl_class: str = DEFAULT_TTL_CLASS,
                 local_tier: LocalTier | int | None = None, shard_key: str | None = None,
                 overlap: bool = True, copy_threads: int | None = None) -> None:
        if chunk_size <= 0 or batch_size <= 0 or prefetch_window < 0:
            raise ValueError("chunk_size and batch_size must be positive, prefetch_window >= 0")
        self.namespace = namespace if isinstance(namespace, Namespace) else Namespace(model=str(namespace))
        self.chunk_size = chunk_size
        # The Redis Cluster hash tag of every key (a session's user or document id): see chunk_keys.
        self.shard_key = shard_key
        self.batch_size = batch_size
        self.prefetch_window = prefetch_window
        # retrieve_chunks: fetch window i+1 while window i is decoded (False: one batch after the other).
        self.overlap = overlap
        # A window's PREFETCH is a hint: once refused by the server's ACL, reads go on without it (_hint_refused).
        self._prefetch_refused = False
        # Threads that share a large restore's copy into the caller's memory (kvstrata.client.copypool); 1: the
        # calling thread alone. The pool itself belongs to the synchronous client, which does the copies.
        self.copy_threads = checked_copy_threads(copy_threads)
        self.compression = check_codec(compression) if compression else default_codec()
        if fp8_scale not in ("tensor", "head"):
            raise ValueError("fp8_scale must be 'tensor' or 'head'")
        self.fp8_scale = fp8_scale
        self.ttl_classes = dict(DEFAULT_TTL_CLASSES)
        self.ttl_classes.update(ttl_classes or {})
        if default_ttl_class not in self.ttl_classes:
            raise ValueError(f"unknown TTL class {default_ttl_class!r}")
        self.default_ttl_class = default_ttl_class
        self.local = LocalTier(local_tier) if isinstance(local_tier, int) else local_tier
        self.stats = ClientStats()
        self._stats_lock = threading.Lock()

    # ---- keys and TTLs ----
    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        """The keys of the full chunks of ``tokens`` (a partial last chunk has none)."""
        return chunk_keys(tokens, self.namespace, self.chunk_size, self.shard_key)

    def tail_keys(self, tokens: Sequence[int], keys: Sequence[bytes] | None = None,
                  longest_only: bool = False) -> list[bytes]:
        """The keys a tail chunk of ``tokens`` (its tokens after the last full chunk) may have, the tail of ``r``
        tokens at ``r - 1`` (``kvstrata.client.keys.tail_keys``); ``keys``: ``self.keys(tokens)``, when known;
        ``longest_only``: only the tail of them all."""
        return tail_keys(tokens, self.namespace, self.chunk_size, self.shard_key, keys, longest_only)

    def ttl_ms(self, ttl_class: str | None = None, ttl: float | None = None) -> int:
        """Milliseconds for TAIR.KV.SETEX (0 = no expiry): ``ttl`` seconds if given (0 = none), else the class's."""
        if ttl is not None:
            return max(0, int(ttl * 1000))
        name = ttl_class or self.default_ttl_class
        if name not in self.ttl_classes:
            raise ValueError(f"unknown TTL class {name!r}; known: {', '.join(self.ttl_classes)}")
        seconds = self.ttl_classes[name]
        return 0 if seconds is None else max(1, int(seconds * 1000))

    def _window(self) -> int:
        """Chunks per MGET when reads overlap decoding.

        One prefetch window: the PREFETCH sent with window i's MGET then covers exactly window i+1, which the
        server has a whole fetch-and-decode of window i to promote. It is also small enough (4 by default) that a
        prefix of a few to tens of chunks splits into several windows, so that only the first fetch and the
        last decode are not hidden. No prefetch (0) still reads in windows of the default size."""
        return max(1, min(self.batch_size, self.prefetch_window or DEFAULT_PREFETCH_WINDOW))

    # ---- read planning (shared by the sync and the asyncio client) ----
    def _plan_window(self, keys: list[bytes], start: int, size: int) -> tuple[list[bytes], list[bytes]]:
        """The keys of the read window at ``start`` (at most ``size``) and the keys to prefetch with it: the
        ``prefetch_window`` keys after it."""
        batch = keys[start:start + size]
        end = start + len(batch)
        return batch, keys[end:end + self.prefetch_window]

    def _window_commands(self, keys: list[bytes], ahead: list[bytes],
                         plain: bool) -> tuple[list[Any] | None, list[Any]]:
        """(PREFETCH of ``ahead`` or None, the MGET of ``keys``): one read window, sent in one write. Replies on
        one connection come back in order, so the server has queued the prefetch before it answers the MGET.
        Plain Redis gets no PREFETCH and a plain MGET, and so does a user whose PREFETCH was refused."""
        hint = ahead and not plain and not self._prefetch_refused
        return ([b"TAIR.KV.PREFETCH", *ahead] if hint else None), [mget_command(plain), *keys]

    def _hint_refused(self, exc: BaseException) -> None:
        """The error reply to a read window's PREFETCH: the read goes on without it (a prefetch only hints at
        what comes next). Refused by ACL (NOPERM: a user allowed to read but not to move data between tiers),
        this client stops sending it, and says so once."""
        from kvstrata.client.rediserrors import acl_refused

        if acl_refused(exc):
            if not self._prefetch_refused:
                log.info("kvstrata: TAIR.KV.PREFETCH refused (%s); reading without prefetch hints", exc)
            self._prefetch_refused = True
        else:
            log.debug("kvstrata: a read window's PREFETCH failed (%s); read without it", exc)

    def _probe_command(self) -> list[Any]:
        """The capability probe (``resp.PROBE``) on a key of this namespace: its error reply means a server
        without TAIR.KV.*."""
        return [PROBE, self.namespace.prefix + b"probe"]

    @staticmethod
    def _plain_from_probe(reply: Any) -> bool:
        """Whether the probe's reply says plain Redis (``resp.probe_says_plain``): a plain error reply (Redis's
        "unknown command") does; an answer, or -NOPERM (the server knows the command, its ACL refused it), does
        not; any other failure (connection, authentication, loading...) is raised."""
        import redis

        from kvstrata.client.rediserrors import acl_refused

        if isinstance(reply, Exception) and acl_refused(reply):
            return False
        if isinstance(reply, Exception) and type(reply) is not redis.ResponseError:
            raise reply
        return isinstance(reply, redis.ResponseError)

    # ---- store planning (shared by the sync and the asyncio client) ----
    def _store_todo(self, tokens: Sequence[int], start: int, keys: list[bytes] | None,
                    tail: bool = False) -> tuple[list[bytes], list[int]]:
        """The keys of ``tokens`` (``keys`` when the caller has them) and the indexes of the chunks a store from
        token ``start`` covers, before the existence check; with ``tail``, the tokens after the last full chunk
        are one more chunk, under the last of their ``tail_keys``."""
        keys = self.keys(tokens) if keys is None else keys
        if tail and len(tokens) % self.chunk_size:
            keys = [*keys, *self.tail_keys(tokens, keys, longest_only=True)]
        return keys, list(range(start // self.chunk_size, len(keys)))

    def _batches(self, items: list[Any], size: int | None = None) -> Iterator[list[Any]]:
        """``items`` (chunk indexes or keys) in batches of ``size`` (default ``batch_size``): one pipelined
        EXISTS, one pipelined write, one DEL or PREFETCH per batch."""
        size = size or self.batch_size
        for b in range(0, len(items), size):
            yield items[b:b + size]

    @staticmethod
    def _scan_command(cursor: Any, pattern: bytes) -> list[Any]:
        """One page of ``clear``'s SCAN; its reply is (next cursor, keys), the cursor 0 after the last page."""
        return ["SCAN", cursor, "MATCH", pattern, "COUNT", CLEAR_BATCH]

    @staticmethod
    def _leading(found: Sequence[Any]) -> int:
        """How many of one EXISTS batch's answers, from the first, said yes (a prefix ends at its first miss)."""
        return next((j for j, f in enumerate(found) if not f), len(found))

    @staticmethod
    def _longest_tail(candidates: list[bytes], found: Sequence[Any]) -> tuple[int, bytes | None]:
        """(r, key) of the longest of a sequence's tail keys (``tail_keys``) whose EXISTS said yes, or (0, None)."""
        r = next((r for r in range(len(candidates), 0, -1) if found[r - 1]), 0)
        return r, candidates[r - 1] if r else None

    def _tail_span(self, tokens: Sequence[int], j: int) -> Sequence[int]:
        """The tokens up to the longest tail that may follow ``j`` full chunks (less than a chunk after them)."""
        return tokens[:j * self.chunk_size + min(self.chunk_size - 1, len(tokens) - j * self.chunk_size)]

    def _with_tail(self, j: int, r: int, key: bytes | None) -> tuple[int, bytes | None]:
        """``lookup_tail``'s answer: ``j`` full chunks and a tail of ``r`` tokens under ``key``."""
        return j * self.chunk_size + r, key

    @staticmethod
    def _absent_of(batch: list[int], found: Sequence[Any]) -> list[int]:
        """The chunks of ``batch`` whose EXISTS said no."""
        return [i for i, f in zip(batch, found, strict=True) if not f]

    def _count_skipped(self, keys: list[bytes], start: int, todo: list[int]) -> None:
        self._count(skipped_chunks=max(0, len(keys) - start // self.chunk_size - len(todo)))

    def _chunk_parts(self, kv: KVSource, i: int, strided: bool = False, end: int | None = None) -> list[Any]:
        """Chunk ``i`` of ``kv`` encoded, its checksum not yet filled in (``seal_parts``, or the staging copy;
        ``strided``: a strided raw chunk as the array itself, for the staging copy, ``codec.prepare_parts``).
        ``end``: with a tail chunk, the number of tokens (where it stops short of ``chunk_size``); None otherwise
        (a caller that gives only keys, as the vLLM connector, stores full chunks with no tokens at all)."""
        cs = self.chunk_size
        stop = (i + 1) * cs if end is None else min((i + 1) * cs, end)
        return self.encode_chunk(self._chunk_value(kv, i * cs, stop), sealed=False, strided=strided)

    def _sealed(self, key: bytes, parts: list[Any], ttl_ms: int) -> list[Any]:
        """``parts`` sealed, and kept in the local tier when there is one."""
        parts = seal_parts(parts)
        self._local_put(key, parts, ttl_ms)
        return parts

    @staticmethod
    def _store_command(key: bytes, ttl_ms: int, parts: list[Any], plain: bool) -> list[Any]:
        """The write of one chunk (its value given as unjoined parts): TAIR.KV.SETEX, or SET [PX] on plain
        Redis."""
        if plain:
            return ["SET", key, parts] + (["PX", ttl_ms] if ttl_ms else [])
        return ["TAIR.KV.SETEX", key, ttl_ms, parts]

    @staticmethod
    def _raise_first(replies: Sequence[Any]) -> None:
        """A pipeline's first error reply, raised (after every reply was read: the connection stays in step)."""
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply

    # ---- encoding ----
    def _layout(self) -> str:
        return self.namespace.layout

    def _chunk_value(self, kv: KVSource, start: int, end: int) -> Any:
        if callable(kv):
            return kv(start, end)
        layout = self._layout()
        axis = layout.index("T") if "T" in layout else 0
        arr = kv
        index = [slice(None)] * len(arr.shape)
        index[axis] = slice(start, end)
        return arr[tuple(index)]

    def encode_chunk(self, value: Any, *, sealed: bool = True, strided: bool = False) -> list[Any]:
        """``[header, payload...]``; ``sealed=False`` leaves the header's checksum to be filled in while the
        parts are copied into place (a two-phase write: one pass over the tensor instead of two)."""
        parts = prepare_parts(value, self.compression, self._layout(), fp8_scale=self.fp8_scale, strided=strided)
        return seal_parts(parts) if sealed else parts

    def _decode(self, key: bytes, value: Any) -> np.ndarray | None:
        try:
            arr, _ = decode(value)
            return arr
        except FormatVersionError as exc:
            self._error("refused", f"{key.decode()}: {exc}")
        except CodecError as exc:
            self._error("corrupt", f"{key.decode()}: {exc}")
        return None

    def _decode_window(self, keys: list[bytes], values: Sequence[Any], out: list[np.ndarray]) -> int:
        """Decode one MGET's values in order into ``out``; returns how many were usable (fewer than ``keys``:
        the prefix ends at the first missing or undecodable value, the rest is never decoded)."""
        for n, (key, value) in enumerate(zip(keys, values, strict=True)):
            arr = None if value is None else self._decode(key, value)
            if arr is None:
                return n
            self._received(key, value)
            self._count(bytes_received=len(value))
            out.append(arr)
        return len(keys)

    def _received(self, key: bytes, value: Any) -> None:
        """A value read from the server was usable (the sync client remembers its size and fills the local tier)."""

    def _error(self, kind: str, message: str) -> None:
        with self._stats_lock:
            setattr(self.stats, kind, getattr(self.stats, kind) + 1)
            self.stats.errors.append(message)
        log.warning("kvstrata: chunk treated as a miss: %s", message)

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for k, v in deltas.items():  # ClientStats also holds a list (errors): not a Counters
                setattr(self.stats, k, getattr(self.stats, k) + v)

    # ---- local tier ----
    def _local_get(self, key: bytes) -> Any | None:
        if self.local is None:
            return None
        entry = self.local.get(key)
        if entry is None:
            return None
        if entry.expired(int(time.time() * 1000)):
            self.local.delete(key)
            return None
        return entry.value

    def _local_put(self, key: bytes, parts: list[Any], ttl_ms: int) -> None:
        if self.local is not None:
            value = b"".join(bytes(p) if isinstance(p, memoryview) else p for p in parts)
            self.local.put(key, Entry(value, 0, int(time.time() * 1000) + ttl_ms if ttl_ms else 0))

    def _local_prefix(self, keys: list[bytes], i: int, out: list[np.ndarray]) -> int:
        """Decode the chunks from ``i`` on that the local tier holds into ``out``, up to the first it lacks (an
        undecodable one is dropped from the tier); returns the index past the last."""
        while i < len(keys):
            value = self._local_get(keys[i])
            if value is None:
                break
            arr = self._decode(keys[i], value)
            if arr is None:
                assert self.local is not None
                self.local.delete(keys[i])
                break
            out.append(arr)
            i += 1
        return i

    def _local_absent(self, keys: list[bytes], idx: list[int]) -> list[int]:
        """The chunks of ``idx`` the local tier lacks (``store(skip_existing=True)`` without a server)."""
        return [i for i in idx if self._local_get(keys[i]) is None]

    def _local_leading(self, keys: list[bytes]) -> int:
        n = 0
        if self.local is not None:
            while n < len(keys) and self._local_get(keys[n]) is not None:
                n += 1
        return n

    @staticmethod
    def concat(chunks: list[np.ndarray], layout: str) -> np.ndarray | None:
        if not chunks:
            return None
        if len(chunks) == 1:
            return chunks[0]
        return np.concatenate(chunks, axis=layout.index("T") if "T" in layout else 0)
