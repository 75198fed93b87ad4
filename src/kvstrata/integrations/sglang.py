"""SGLang HiCache L3 storage backend: kvstrata as the storage tier of SGLang's hierarchical cache.

Load it in SGLang with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name": "kvstrata",
        "module_path": "kvstrata.integrations.sglang", "class_name": "KvstrataHiCacheStorage",
        "url": "redis://127.0.0.1:6379", "interface_v1": 1}'

``interface_v1: 1`` makes SGLang call the zero-copy ``batch_get_v1``/``batch_set_v1`` (values are received
straight into, and sent straight from, the registered host memory pool); without it SGLang uses the older
``batch_get``/``batch_set`` with one flat tensor per page. Both paths store the same objects, so either finds what
the other wrote.

Objects and keys (``docs/sglang.md`` has the full table): a page of an MHA model is two objects, K and V; a page
of an MLA model is one object; a page of a hybrid model's extra pool (v2 calls) is one object. Their keys are
SGLang's page hash plus the suffixes SGLang's Mooncake backend uses, after a tag of the host pool's layout (heads,
head dim, dtype, page size, memory layout, TP size for MHA), so writers of different layouts never share keys::

    {key_prefix}{namespace}_{layout}_{page_hash}_{tp_rank}_k   MHA, K   ({tp_rank}_{pp_rank} when pp_size > 1)
    {key_prefix}{namespace}_{layout}_{page_hash}_{tp_rank}_v   MHA, V
    {key_prefix}{namespace}_{layout}_{page_hash}__k            MLA      (_{pp_rank}_k when pp_size > 1)
    {key_prefix}{namespace}_{layout}_{page_hash}_{tp_rank}_{pool}   extra pool (mamba, swa, indexer, ...)

A page is restored all together or not at all: ``batch_exists`` counts a page only if every one of its objects
exists with the length the registered pool needs (another length is a miss, rewritten by the next set), and a read reports a page as loaded only if every object arrived with the expected length. A page with one
object missing (evicted, deleted) is a miss, so SGLang sees a shorter hit, never half a page.

The client speaks RESP over one socket per thread through ``kvstrata.client.fast.FastClient`` (the transport the
SDK reads with): writes go out with ``socket.sendmsg`` straight from the host pool's memory (no copy into a
request buffer) and values are received with ``recvmsg_into`` straight into their page's segments in the host
pool. Reads send TAIR.KV.MGET to a kvstrata server and MGET to plain Redis (the SDK's probe decides, once).
Small commands are pipelined: one round trip per batch. The connection is ``sglang_conn``'s, the layout
tags ``sglang_layout``'s; this module maps SGLang's calls onto them.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvstrata.client.fast import RespError
from kvstrata.client.resp import PROBE, mget_command, probe_says_plain
from kvstrata.engine.stats import Counters
from kvstrata.integrations.sglang_conn import KvstrataError, RespConnection, _view, parse_url
from kvstrata.integrations.sglang_layout import _page_object_sizes, _PoolKeys, layout_tag, pool_layout

try:  # The real abstract class, when SGLang is installed (always the case inside SGLang).
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo

    SGLANG_AVAILABLE = True
except ImportError:  # pragma: no cover - exercised only without sglang
    _Base = object  # type: ignore[assignment,misc]
    HiCacheStorageExtraInfo = Any  # type: ignore[assignment,misc]
    SGLANG_AVAILABLE = False

logger = logging.getLogger(__name__)

DEFAULT_URL = "redis://127.0.0.1:6379"
DEFAULT_KEY_PREFIX = "hicache:"


@dataclass
class _Object:
    """One stored object of a page: its key and the memory segments (address, length) that hold its bytes."""

    key: bytes
    segments: list[tuple[int, int]]

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.segments)


@dataclass
class _Counters(Counters):
    """Cumulative counters since the backend started (``get_stats().kvstrata``)."""

    exists_queries: int = 0
    exists_pages: int = 0
    exists_hit_pages: int = 0
    get_pages: int = 0
    get_hit_pages: int = 0
    get_partial_pages: int = 0
    get_bytes: int = 0
    set_pages: int = 0
    set_skipped_pages: int = 0
    set_failed_pages: int = 0
    set_bytes: int = 0
    errors: int = 0


@dataclass
class KvstrataStorageMetrics:
    """The fields of SGLang's ``StorageMetrics`` (used when that class cannot be imported)."""

    prefetch_pgs: list[int] = field(default_factory=list)
    backup_pgs: list[int] = field(default_factory=list)
    prefetch_bandwidth: list[float] = field(default_factory=list)
    backup_bandwidth: list[float] = field(default_factory=list)


@dataclass
class KvstrataPoolTransferResult:
    """The fields of SGLang's ``PoolTransferResult`` (used when that class cannot be imported)."""

    kv_hit_pages: int
    extra_pool_hit_pages: dict[str, int]
    restorable_prefix_pages: list[int] | None = None


def _split_results(groups: list[tuple[str, list[Any]]], flat: list[bool]) -> dict[str, list[bool]]:
    out: dict[str, list[bool]] = {}
    i = 0
    for name, pages in groups:
        out[name] = flat[i:i + len(pages)]
        i += len(pages)
    return out


def _cfg_get(storage_config: Any, name: str, default: Any) -> Any:
    value = getattr(storage_config, name, default) if storage_config is not None else default
    return default if value is None else value


class KvstrataHiCacheStorage(_Base):
    """SGLang ``HiCacheStorage`` on a kvstrata (or any Redis-protocol) server.

    Constructed by SGLang's ``StorageBackendFactory`` as ``KvstrataHiCacheStorage(storage_config, kwargs)`` for
    ``--hicache-storage-backend dynamic``. Extra-config keys (``--hicache-storage-backend-extra-config``):

    ``url``            ``redis://[user:password@]host:port[/db]`` (default ``redis://127.0.0.1:6379``; the
                       environment variable ``KVSTRATA_URL`` is used when the key is absent); ``rediss://``
                       for TLS, with redis-py's ``?ssl_ca_certs=...&ssl_certfile=...&ssl_keyfile=...``
    ``key_prefix``     prefix of every key (default ``hicache:``), so ``clear`` deletes only HiCache objects
    ``extra_backend_tag``  an extra namespace component (as for SGLang's Mooncake backend)
    ``timeout``        socket timeout in seconds (default 30)
    ``skip_existing``  do not rewrite pages whose objects all exist (default true)
    ``check_server``   PING the server when the backend is created (default true)
    ``username``       overrides the user in ``url`` (an ACL user, e.g. one restricted to ``~hicache:*``)
    ``password``       overrides the password in ``url``
    ``interface_v1``   read by SGLang itself: 1 selects ``batch_get_v1``/``batch_set_v1``
    """

    def __init__(self, storage_config: Any = None, kwargs: dict | None = None, **extra: Any) -> None:
        extra_config = dict(_cfg_get(storage_config, "extra_config", {}) or {})
        for source in (kwargs or {}, extra):
            extra_config.update({k: v for k, v in source.items() if k not in extra_config})
        self.storage_config = storage_config
        self.extra_config = extra_config
        if _cfg_get(storage_config, "should_split_heads", False):
            raise NotImplementedError("kvstrata HiCache backend: tp_lcm_size (split heads) is not supported")
        if _cfg_get(storage_config, "dcp_size", 1) > 1:
            raise NotImplementedError("kvstrata HiCache backend: decode context parallelism is not supported")
        self.is_mla = bool(_cfg_get(storage_config, "is_mla_model", False))
        self.tp_rank = int(_cfg_get(storage_config, "tp_rank", 0))
        self.tp_size = int(_cfg_get(storage_config, "tp_size", 1))
        self.pp_rank = int(_cfg_get(storage_config, "pp_rank", 0))
        self.pp_size = int(_cfg_get(storage_config, "pp_size", 1))
        self.cp_rank = int(_cfg_get(storage_config, "attn_cp_rank", 0))
        self.cp_size = int(_cfg_get(storage_config, "attn_cp_size", 1))
        self.enable_storage_metrics = bool(_cfg_get(storage_config, "enable_storage_metrics", False))
        # Suffixes as in SGLang's Mooncake backend; context parallelism adds HiCacheFile's `_cp{rank}_{size}`.
        pp = f"_{self.pp_rank}" if self.pp_size > 1 else ""
        cp = f"_cp{self.cp_rank}_{self.cp_size}" if self.cp_size > 1 else ""
        self.mha_suffix = f"{self.tp_rank}{pp}{cp}"
        self.mla_suffix = f"{self.pp_rank}{cp}" if self.pp_size > 1 else cp.lstrip("_")
        parts = []
        if extra_config.get("extra_backend_tag") is not None:
            parts.append(str(extra_config["extra_backend_tag"]))
        model_name = _cfg_get(storage_config, "model_name", None)
        if model_name:
            parts.append("-".join(str(model_name).split("/")))
        self.namespace = "_".join(parts)
        self.key_prefix = str(extra_config.get("key_prefix", DEFAULT_KEY_PREFIX))
        # _base_prefix: this model's objects in every layout (what clear() deletes); _prefix adds the KV pool's
        # layout tag once a host pool is registered (layout_tag).
        self._base_prefix = f"{self.key_prefix}{self.namespace}_" if self.namespace else self.key_prefix
        self._prefix = self._base_prefix
        self.layout: dict[str, Any] = {}
        self.object_sizes: list[int] | None = None  # bytes of each object of one KV page, once known
        self._pools: dict[str, _PoolKeys] = {}
        self.skip_existing = bool(extra_config.get("skip_existing", True))
        self.url = str(extra_config.get("url") or os.environ.get("KVSTRATA_URL") or DEFAULT_URL)
        self._conn_args = parse_url(self.url)
        if extra_config.get("username") is not None:
            self._conn_args["username"] = str(extra_config["username"])
        if extra_config.get("password") is not None:
            self._conn_args["password"] = str(extra_config["password"])
        self._timeout = float(extra_config.get("timeout", 30.0))
        # Whether the server lacks TAIR.KV.* (plain Redis): decided once, on the first connection, by the SDK's
        # probe. Reads send TAIR.KV.MGET to kvstrata (as the SDK reads: its consistency level and ACL rules),
        # MGET to Redis.
        self._plain: bool | None = None
        # SGLang calls from its prefetch and backup threads at once: one connection per thread.
        # A thread's connection lives in its thread-local slot; _conns only lets close() reach the live ones (a
        # finished thread's connection is freed, and its socket closed, with the thread).
        self._local = threading.local()
        self._conns: weakref.WeakSet[RespConnection] = weakref.WeakSet()
        self._lock = threading.Lock()  # guards _conns and the counters
        self.mem_pool_host: Any = None
        self.counters = _Counters()
        self._prefetch_pgs: list[int] = []
        self._backup_pgs: list[int] = []
        self._prefetch_bw: list[float] = []
        self._backup_bw: list[float] = []
        if extra_config.get("check_server", True):
            self._connection().call(b"PING")  # fail at startup, not on the first request
        logger.info("kvstrata HiCache backend: %s, key prefix %r, %s", self._redacted_url(), self._prefix,
                    "MLA" if self.is_mla else "MHA")

    # -- connection -------------------------------------------------------------------------------------------
    def _redacted_url(self) -> str:
        a = self._conn_args
        scheme = "rediss" if a.get("ssl_context") is not None else "redis"
        return f"{scheme}://{a['host']}:{a['port']}/{a['db']}"

    def _connection(self) -> RespConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = RespConnection(**self._conn_args, timeout=self._timeout)
            if self._plain is None:
                # The probe's key is under this backend's prefix, where an ACL user restricted to it may ask.
                reply = conn.pipeline([(PROBE, f"{self.key_prefix}kvstrata-probe".encode())])[0]
                self._plain = probe_says_plain(str(reply)) if isinstance(reply, KvstrataError) else False
            self._local.conn = conn
            with self._lock:
                self._conns.add(conn)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            conn.close()
            with self._lock:
                self._conns.discard(conn)

    def _run(self, fn: Any, default: Any) -> Any:
        """Run ``fn(conn)`` on this thread's connection; on an I/O or protocol error drop the connection (it
        reconnects on next use) and answer ``default``: to SGLang a failed storage call is a miss."""
        try:
            return fn(self._connection())
        except (OSError, ConnectionError, ValueError, RespError) as exc:  # KvstrataError is a RespError
            self._count(errors=1)
            logger.warning("kvstrata HiCache backend: %s: %s", type(exc).__name__, exc)
            self._drop_connection()
            return default

    def close(self) -> None:
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for conn in conns:
            conn.close()

    # -- keys and memory --------------------------------------------------------------------------------------
    def object_names(self) -> tuple[str, ...]:
        return ("k",) if self.is_mla else ("k", "v")

    def object_keys(self, page_hash: str) -> list[bytes]:
        """The keys of one page's objects, in the order the page's bytes are laid out (K then V)."""
        if self.is_mla:
            return [f"{self._prefix}{page_hash}_{self.mla_suffix}_k".encode()]
        base = f"{self._prefix}{page_hash}_{self.mha_suffix}"
        return [f"{base}_k".encode(), f"{base}_v".encode()]

    def _expected(self, keys: list[bytes]) -> list[tuple[bytes, int | None]]:
        sizes = self.object_sizes if self.object_sizes and len(self.object_sizes) == len(keys) else [None] * len(keys)
        return list(zip(keys, sizes, strict=True))

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super_register = getattr(super(), "register_mem_pool_host", None)
        if super_register is not None:
            super_register(mem_pool_host)
        self.mem_pool_host = mem_pool_host
        self.layout = pool_layout(mem_pool_host, "mla" if self.is_mla else "mha",
                                  None if self.is_mla else self.tp_size)
        self.object_sizes = _page_object_sizes(mem_pool_host, len(self.object_names()))
        self._prefix = f"{self._base_prefix}{layout_tag(self.layout)}_"

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """A hybrid model's extra host pool (Mamba/SWA states, DSA indexer, draft KV): its pages are stored as one
        object each, under this backend's namespace, the pool's name and its own layout tag."""
        super_register = getattr(super(), "register_mem_host_pool_v2", None)
        if super_register is not None:
            super_register(host_pool, host_pool_name)
        name = str(getattr(host_pool_name, "value", host_pool_name))
        if name == "kv":
            if self.mem_pool_host is None:
                self.register_mem_pool_host(host_pool)
            return
        layout = pool_layout(host_pool, name, self.tp_size)
        self._pools[name] = _PoolKeys(host_pool, f"{self._base_prefix}{layout_tag(layout)}_",
                                      f"_{self.mha_suffix}_{name}", layout)

    def _page_objects(self, keys: Sequence[str], host_indices: torch.Tensor) -> list[list[_Object]]:
        """Each page's objects with the host-pool segments that hold them (from ``get_page_buffer_meta``).

        MHA pools give pointers alternating K, V (one pair per page, or per layer in ``layer_first``): K is the
        concatenation of the K segments, V of the V segments. MLA pools give one or more segments per page: one
        object, their concatenation.
        """
        pool = self.mem_pool_host
        if pool is None:
            raise RuntimeError("register_mem_pool_host() was not called")
        if not keys:
            return []
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        if ptrs and isinstance(ptrs[0], list | tuple):  # already grouped per key
            ptrs = [p for group in ptrs for p in group]
            sizes = [s for group in sizes for s in group]
        per_page = len(ptrs) // len(keys)
        if per_page * len(keys) != len(ptrs) or per_page == 0:
            raise ValueError(f"host pool gave {len(ptrs)} buffers for {len(keys)} pages")
        nobj = len(self.object_names())
        if per_page % nobj:
            raise ValueError(f"host pool gave {per_page} buffers per page; an MHA page needs K/V pairs")
        pages = []
        for i, page_hash in enumerate(keys):
            seg = list(zip(ptrs[i * per_page:(i + 1) * per_page], sizes[i * per_page:(i + 1) * per_page],
                           strict=True))
            objs = [_Object(k, seg[j::nobj]) for j, k in enumerate(self.object_keys(page_hash))]
            pages.append(objs)
        return pages

    def _tensor_objects(self, page_hash: str, tensor: torch.Tensor) -> list[_Object]:
        """A flat page tensor (``get_data_page(flat=True)``: K bytes then V bytes) as the page's objects."""
        if not tensor.is_contiguous():
            raise ValueError("page tensors must be contiguous")
        if tensor.device.type != "cpu":
            raise ValueError("page tensors must be in host memory")
        nbytes = tensor.numel() * tensor.element_size()
        keys = self.object_keys(page_hash)
        if nbytes % len(keys):
            raise ValueError(f"a page of {nbytes} bytes cannot be split into {len(keys)} equal objects")
        part = nbytes // len(keys)
        base = tensor.data_ptr()
        return [_Object(k, [(base + j * part, part)]) for j, k in enumerate(keys)]

    # -- the protocol operations on objects -------------------------------------------------------------------
    def _exists_pages(self, conn: RespConnection, pages: list[list[tuple[bytes, int | None]]]) -> list[bool]:
        """Per page: every object is stored with the length this backend's pool needs (any length when not
        known). An object of another length (a writer of another layout, a truncated value) makes the page a
        miss, and a miss is what the next batch_set rewrites."""
        replies = conn.pipeline([(b"STRLEN", k) for objs in pages for k, _ in objs])
        out, i = [], 0
        for objs in pages:
            got = replies[i:i + len(objs)]
            out.append(all(isinstance(r, int) and r > 0 and (n is None or r == n)
                           for r, (_, n) in zip(got, objs, strict=True)))
            i += len(objs)
        return out

    def _count(self, **deltas: int) -> None:
        with self._lock:
            self.counters.add(**deltas)

    def _read_pages(self, conn: RespConnection, pages: list[list[_Object]]) -> list[bool]:
        """One TAIR.KV.MGET (MGET on plain Redis) for every object of every page; each value lands straight in
        its segments. A page is True only if every one of its objects arrived with its full length."""
        keys = [o.key for objs in pages for o in objs]
        if not keys:
            return []
        command = mget_command(bool(self._plain))
        conn.sendv([conn.encode([command, *keys])])
        header = conn._line()
        if header[:1] == b"-":
            raise KvstrataError(header[1:].decode(errors="replace"))
        if header[:1] != b"*" or int(header[1:]) != len(keys):
            raise ConnectionError(f"{command.decode()} answered {header[:80]!r} for {len(keys)} keys")
        results = []
        partial = 0
        for objs in pages:
            ok = [conn.read_bulk_into(o.segments, o.nbytes) for o in objs]
            partial += any(ok) and not all(ok)
            results.append(all(ok))
        if partial:
            self._count(get_partial_pages=partial)
        return results

    def _write_pages(self, conn: RespConnection, pages: list[list[_Object]]) -> list[bool]:
        """One MSET per page (its objects are stored together, atomically), pipelined; values are sent from
        their segments with vectored writes."""
        if not pages:
            return []
        parts: list[bytes | memoryview] = []
        for objs in pages:
            parts.append(b"*%d\r\n$4\r\nMSET\r\n" % (1 + 2 * len(objs)))
            for o in objs:
                parts.append(b"$%d\r\n%s\r\n$%d\r\n" % (len(o.key), o.key, o.nbytes))
                parts.extend(_view(a, n) for a, n in o.segments)
                parts.append(b"\r\n")
        conn.sendv(parts)
        out = []
        for _ in pages:
            reply = conn.read_reply()
            if isinstance(reply, KvstrataError):
                logger.warning("kvstrata HiCache backend: write refused: %s", reply)
            out.append(reply == b"OK")
        return out

    def _get(self, pages: list[list[_Object]]) -> list[bool]:
        start = time.perf_counter()
        results = self._run(lambda c: self._read_pages(c, pages), [False] * len(pages))
        elapsed = time.perf_counter() - start
        nbytes = sum(o.nbytes for objs, ok in zip(pages, results, strict=True) if ok for o in objs)
        self._count(get_pages=len(pages), get_hit_pages=sum(results), get_bytes=nbytes)
        if self.enable_storage_metrics and pages:
            with self._lock:
                self._prefetch_pgs.append(len(pages))
                self._prefetch_bw.append(nbytes / max(elapsed, 1e-9) / 2**30)
        return results

    def _set(self, pages: list[list[_Object]]) -> list[bool]:
        def work(conn: RespConnection) -> list[bool]:
            present = (self._exists_pages(conn, [[(o.key, o.nbytes) for o in objs] for objs in pages])
                       if self.skip_existing else [False] * len(pages))
            todo = [i for i, p in enumerate(present) if not p]
            written = self._write_pages(conn, [pages[i] for i in todo])
            out = list(present)
            for i, ok in zip(todo, written, strict=True):
                out[i] = ok
            nbytes = sum(o.nbytes for i, ok in zip(todo, written, strict=True) if ok for o in pages[i])
            self._count(set_skipped_pages=len(pages) - len(todo), set_bytes=nbytes)
            return out

        start = time.perf_counter()
        results = self._run(work, [False] * len(pages))
        elapsed = time.perf_counter() - start
        self._count(set_pages=len(pages), set_failed_pages=len(pages) - sum(results))
        if self.enable_storage_metrics and pages:
            nbytes = sum(o.nbytes for objs in pages for o in objs)
            with self._lock:
                self._backup_pgs.append(len(pages))
                self._backup_bw.append(nbytes / max(elapsed, 1e-9) / 2**30)
        return results

    # -- HiCacheStorage: zero-copy interface (SGLang uses it with "interface_v1": 1) --------------------------
    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        """Read pages straight into the host pool at ``host_indices``; True per page fully restored."""
        if not keys:
            return []
        return self._get(self._page_objects(keys, host_indices))

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        """Store pages straight from the host pool at ``host_indices``; True per page stored (or present)."""
        if not keys:
            return []
        return self._set(self._page_objects(keys, host_indices))

    # -- HiCacheStorage: tensor interface ---------------------------------------------------------------------
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        """Read one page into ``target_location`` (a flat page tensor, e.g. ``get_dummy_flat_data_page()``) and
        return it, or None when the page is not (completely) stored."""
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> list[torch.Tensor | None]:
        if not keys:
            return []
        if target_locations is None:
            if self.mem_pool_host is None:
                raise ValueError("batch_get needs target tensors or a registered host pool")
            target_locations = [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys]
        pages = [self._tensor_objects(k, t) for k, t in zip(keys, target_locations, strict=True)]
        results = self._get(pages)
        return [t if ok else None for t, ok in zip(target_locations, results, strict=True)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        """Store one page given as a flat tensor (``get_data_page(flat=True)``)."""
        if value is None:
            value = target_location
        if value is None:
            return False
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        if values is None:
            values = target_locations
        if not keys or values is None:
            return False
        tensors = [v.contiguous() for v in values]  # keep copies alive while their memory is sent
        pages = [self._tensor_objects(k, t) for k, t in zip(keys, tensors, strict=True)]
        return all(self._set(pages))

    # -- HiCacheStorage: existence ----------------------------------------------------------------------------
    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        """The number of consecutive pages, from the first, whose objects all exist (SGLang's hit length)."""
        if not keys:
            return 0
        present = self._run(lambda c: self._exists_pages(c, [self._expected(self.object_keys(k)) for k in keys]),
                            [False] * len(keys))
        hit = present.index(False) if False in present else len(keys)
        self._count(exists_queries=1, exists_pages=len(keys), exists_hit_pages=hit)
        return hit

    # -- HiCacheStorage: hybrid pools (v2) --------------------------------------------------------------------
    def _pool_keys(self, name: str) -> _PoolKeys:
        pool = self._pools.get(name)
        if pool is None:
            raise ValueError(f"host pool {name!r} was not registered (register_mem_host_pool_v2)")
        return pool

    def _transfer_pages(self, transfer: Any) -> list[list[_Object]]:
        """The objects (with their host-pool segments) of one ``PoolTransfer``'s pages."""
        name = str(getattr(transfer.name, "value", transfer.name))
        keys = list(transfer.keys or [])
        if name == "kv":
            return self._page_objects(keys, transfer.host_indices)
        pool = self._pool_keys(name)
        if not keys:
            return []
        ptrs, sizes = pool.pool.get_page_buffer_meta(transfer.host_indices)
        if ptrs and isinstance(ptrs[0], list | tuple):
            ptrs = [p for group in ptrs for p in group]
            sizes = [s for group in sizes for s in group]
        per_page = len(ptrs) // len(keys)
        if per_page == 0 or per_page * len(keys) != len(ptrs):
            raise ValueError(f"host pool {name!r} gave {len(ptrs)} buffers for {len(keys)} pages")
        return [[_Object(pool.key(k), list(zip(ptrs[i * per_page:(i + 1) * per_page],
                                               sizes[i * per_page:(i + 1) * per_page], strict=True)))]
                for i, k in enumerate(keys)]

    def batch_exists_v2(self, keys: list[str], pool_transfers: list[Any] | None = None,
                        extra_info: HiCacheStorageExtraInfo | None = None) -> Any:
        """The usable prefix for a hybrid model: the KV hit, shortened to where every extra pool can serve it.

        ``all_pages`` pools must hold every page of the prefix; ``trailing_pages`` pools (Mamba/SWA states) only
        the last ``len(transfer.keys)`` pages before the stop point, so several stop points can be valid: all of
        them are returned (``restorable_prefix_pages``) for SGLang to intersect across ranks. ``block_groups``
        pools never gate the KV hit; kvstrata reports no hit for them."""
        kv_pages = self.batch_exists(keys, extra_info) if keys else 0
        hits: dict[str, int] = {"kv": kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        transfers = [t for t in pool_transfers or [] if str(getattr(t.name, "value", t.name)) != "kv"]
        checked = []
        for t in transfers:
            policy = str(getattr(t.hit_policy, "value", t.hit_policy))
            if policy in ("all_pages", "trailing_pages") and restorable:
                pool = self._pool_keys(str(getattr(t.name, "value", t.name)))
                checked.append((t, policy, [[(pool.key(k), None)] for k in keys[:kv_pages]]))
        present = self._run(lambda c: [self._exists_pages(c, objs) for _, _, objs in checked],
                            [[False] * kv_pages for _ in checked])
        for (t, policy, _), have in zip(checked, present, strict=True):
            if policy == "all_pages":
                stop = have.index(False) if False in have else kv_pages
                ok = set(range(1, stop + 1))
            else:
                window = max(1, len(t.keys or []))
                ok = {n for n in range(1, kv_pages + 1) if all(have[max(0, n - window):n])}
            if ok:
                hits[str(getattr(t.name, "value", t.name))] = max(ok)
            restorable = [n for n in restorable if n in ok]
        final = restorable[-1] if restorable else 0
        result_cls = getattr(sys.modules.get("sglang.srt.mem_cache.hicache_storage"), "PoolTransferResult",
                             KvstrataPoolTransferResult)
        return result_cls(final, hits, restorable)

    def batch_get_v2(self, transfers: list[Any],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        """Read every transfer's pages into its host pool in one TAIR.KV.MGET; per pool name, True per page
        restored."""
        groups = [(str(getattr(t.name, "value", t.name)), self._transfer_pages(t)) for t in transfers]
        flat = self._get([p for _, pages in groups for p in pages])
        return _split_results(groups, flat)

    def batch_set_v2(self, transfers: list[Any],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        """Store every transfer's pages from its host pool (pages present with the right lengths are skipped)."""
        groups = [(str(getattr(t.name, "value", t.name)), self._transfer_pages(t)) for t in transfers]
        flat = self._set([p for _, pages in groups for p in pages])
        return _split_results(groups, flat)

    # -- housekeeping -----------------------------------------------------------------------------------------
    def clear(self) -> bool:
        """Delete every object of this backend's namespace (``key_prefix`` + model); other keys stay. Refused
        (False) when the namespace is empty: that would delete every key on the node."""
        if not self._base_prefix:
            logger.warning("kvstrata HiCache backend: clear() refused: no key_prefix and no model name")
            return False
        pattern = self._base_prefix.replace("\\", "\\\\")
        for ch in "*?[]":
            pattern = pattern.replace(ch, "\\" + ch)
        pattern += "*"

        def work(conn: RespConnection) -> bool:
            cursor = b"0"
            while True:
                cursor, found = conn.call(b"SCAN", cursor, b"MATCH", pattern.encode(), b"COUNT", b"1000")
                if found:
                    conn.call(b"UNLINK", *found)
                if cursor == b"0":
                    return True

        ok = bool(self._run(work, False))
        if ok:
            logger.info("kvstrata HiCache backend: cleared %r*", self._base_prefix)
        return ok

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` (pages and GiB/s per batch since the last call, when
        ``enable_storage_metrics``), with the cumulative counters as ``.kvstrata`` (a dict)."""
        # Inside SGLang its metrics module is loaded already; elsewhere (tests, scripts) importing it would pull in
        # SGLang's model configs, so the local copy of its fields is used.
        collector = sys.modules.get("sglang.srt.observability.metrics_collector")
        metrics = getattr(collector, "StorageMetrics", KvstrataStorageMetrics)()
        with self._lock:
            metrics.prefetch_pgs.extend(self._prefetch_pgs)
            metrics.backup_pgs.extend(self._backup_pgs)
            metrics.prefetch_bandwidth.extend(self._prefetch_bw)
            metrics.backup_bandwidth.extend(self._backup_bw)
            for lst in (self._prefetch_pgs, self._backup_pgs, self._prefetch_bw, self._backup_bw):
                lst.clear()
            metrics.kvstrata = self.counters.as_dict()
        return metrics


__all__ = ["KvstrataHiCacheStorage", "KvstrataPoolTransferResult", "KvstrataStorageMetrics", "RespConnection",
           "SGLANG_AVAILABLE", "layout_tag", "parse_url", "pool_layout"]
