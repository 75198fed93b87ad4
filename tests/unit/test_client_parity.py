"""The sync and asyncio SDK clients offer the same operations with the same parameters.

Every public method of ``KVCacheClient`` must exist on ``AsyncKVCacheClient`` (as a coroutine, or an async
context manager where the sync one is a context manager) with the same parameter names, kinds and defaults, and
the other way round; their constructors too. The only differences allowed are listed in ``EXCEPTIONS`` with the
reason (docs/sdk.md, "asyncio"). A parameter or method added to one client only fails here.
"""

from __future__ import annotations

import inspect
from typing import Any

from kvstrata.client import AsyncKVCacheClient, KVCacheClient

# (method, parameter or None for the whole method) -> why it differs.
EXCEPTIONS: dict[tuple[str, str | None], str] = {
    ("close", None): "asyncio closes with `await aclose()` (and `async with`)",
    ("aclose", None): "asyncio closes with `await aclose()` (and `async with`)",
    ("retrieve_chunks", "reuse_buffers"): "views of per-thread receive buffers: a synchronous-thread notion",
}


def _public(cls: type) -> dict[str, Any]:
    return {name: getattr(cls, name) for name in dir(cls)
            if not name.startswith("_") and callable(getattr(cls, name))}


def _params(fn: Any) -> dict[str, tuple[Any, Any]]:
    """Parameter name -> (kind, default), private ones (``_into``) left out."""
    return {p.name: (p.kind, p.default) for p in inspect.signature(fn).parameters.values()
            if not p.name.startswith("_")}


def test_both_clients_have_the_same_methods() -> None:
    sync, aio = _public(KVCacheClient), _public(AsyncKVCacheClient)
    only_sync = {n for n in set(sync) - set(aio) if (n, None) not in EXCEPTIONS}
    only_async = {n for n in set(aio) - set(sync) if (n, None) not in EXCEPTIONS}
    assert not only_sync, f"on KVCacheClient only: {sorted(only_sync)}"
    assert not only_async, f"on AsyncKVCacheClient only: {sorted(only_async)}"


def test_both_clients_take_the_same_parameters() -> None:
    sync, aio = _public(KVCacheClient), _public(AsyncKVCacheClient)
    pairs = [(n, sync[n], aio[n]) for n in sorted(set(sync) & set(aio))]
    pairs.append(("__init__", KVCacheClient.__init__, AsyncKVCacheClient.__init__))
    drift = []
    for name, s, a in pairs:
        ps, pa = _params(s), _params(a)
        for p in sorted(set(ps) | set(pa)):
            if ps.get(p) != pa.get(p) and (name, p) not in EXCEPTIONS:
                drift.append(f"{name}({p}): sync {ps.get(p)} vs asyncio {pa.get(p)}")
        # The order of positional parameters matters to callers too.
        order_s = [p for p, (k, _) in ps.items() if k <= inspect.Parameter.POSITIONAL_OR_KEYWORD
                   and (name, p) not in EXCEPTIONS]
        order_a = [p for p, (k, _) in pa.items() if k <= inspect.Parameter.POSITIONAL_OR_KEYWORD
                   and (name, p) not in EXCEPTIONS]
        if order_s != order_a:
            drift.append(f"{name}: positional order {order_s} vs {order_a}")
    assert not drift, "the clients drifted:\n" + "\n".join(drift)


def test_asyncio_operations_are_awaitable() -> None:
    for name in _public(KVCacheClient):
        if (name, None) in EXCEPTIONS:
            continue
        sync, aio = getattr(KVCacheClient, name), getattr(AsyncKVCacheClient, name)
        if inspect.isgeneratorfunction(inspect.unwrap(sync)):  # a context manager: async context manager
            assert inspect.isasyncgenfunction(inspect.unwrap(aio)), name
        elif name not in ("keys", "tail_keys", "ttl_ms", "encode_chunk", "concat"):  # pure planning, no I/O: shared
            assert inspect.iscoroutinefunction(aio), f"AsyncKVCacheClient.{name} is not a coroutine"
        else:
            assert sync is aio, f"{name} should be the one shared planning method"


def test_exceptions_are_real() -> None:
    """Each listed exception still differs (a stale entry would hide a future drift)."""
    sync, aio = _public(KVCacheClient), _public(AsyncKVCacheClient)
    for (name, param) in EXCEPTIONS:
        if param is None:
            assert (name in sync) != (name in aio), name
        else:
            assert (param in _params(sync[name])) != (param in _params(aio[name])), (name, param)
