"""Helpers the integration test modules share: KV tensors for the SDK tests, recognisable values, the tier of a
key, a tier's INFO, a parameter's CONFIG SET/GET texts against Redis's."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import redis


def make_kv(n_tokens: int, seed: int = 0, layers: int = 2, heads: int = 2, dim: int = 8) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((layers, 2, heads, n_tokens, dim)).astype(np.float32)


def value_for(key: str | bytes, size: int) -> bytes:
    """A distinct, recognisable value of ``size`` bytes for ``key`` (the key, a bar, then bytes 0..255 repeated)."""
    head = key.encode() if isinstance(key, str) else key
    return (head + b"|" + bytes(range(256)) * (size // 256 + 1))[:size]


def tier(r: Any, key: Any) -> str | None:
    """``TAIR.KV.TIER key`` as "dram", "ssd", "pool" or None."""
    reply = r.execute_command("TAIR.KV.TIER", key)
    return None if reply is None else reply.decode()


def tier_info(r: Any, name: str) -> dict[str, Any]:
    """``INFO tier_<name>`` as a dict."""
    return r.info(f"tier_{name}")


def unix_server(make_server: Any, sockdir: str, **cfg: str) -> tuple[Any, str]:
    """A kvstrata server (``make_server``) also listening on a Unix socket in ``sockdir``: (server, socket path)."""
    path = os.path.join(sockdir, "kv.sock")
    srv = make_server({"unixsocket": path, "http-port": "0", **cfg})
    return srv, path


def pool_info(r: Any) -> dict[str, Any]:
    """``INFO tier_pool`` as a dict."""
    return tier_info(r, "pool")


def memory_info(r: Any) -> dict[str, Any]:
    """``INFO memory`` as a dict."""
    return r.info("memory")


def refused(fn: Any) -> bool:
    """Whether ``fn()`` got an error reply (redis-py's ResponseError) instead of an answer."""
    import redis

    try:
        fn()
    except redis.ResponseError:
        return True
    return False



def once_the_pool_has_room(write: Any, timeout: float = 15.0) -> Any:
    """``write()``'s reply once a pool at maxmemory takes it. Redis refuses every write while its used memory is
    above the limit, and that memory counts the query buffers its clients keep for a while after large writes
    (an idle one is shrunk within seconds): a small write right after a pool filled up may be refused for that
    alone. Each refusal meanwhile must be the maxmemory one (a refused write, never an outage)."""
    import time

    import redis

    deadline = time.monotonic() + timeout
    while True:
        try:
            return write()
        except redis.ResponseError as exc:
            assert "did not take the write" in str(exc) and "maxmemory" in str(exc), str(exc)
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)  # poll interval: Redis shrinks idle query buffers in its cron


def reply_text(client: Any, *args: Any) -> Any:
    """A command's reply, an error as ``-<text>`` and bytes as text: what two servers answered, to compare."""
    import redis

    try:
        reply = client.execute_command(*args)
    except redis.ResponseError as exc:
        return f"-{exc}"
    return reply.decode("latin-1") if isinstance(reply, bytes) else reply


def config_texts_as_redis(r: Any, name: str, shown: list[tuple[str, str]], refused: list[tuple[str, str]]) -> None:
    """CONFIG SET ``name`` to each accepted value, which CONFIG GET then shows as given in ``shown``; each refused
    value fails with Redis's ``CONFIG SET failed ...`` text and its message, and leaves the value as it was. The
    caller restores the value."""
    for value, text in shown:
        assert r.config_set(name, value), value
        assert r.config_get(name) == {name: text}, value
    kept = r.config_get(name)
    prefix = f"CONFIG SET failed (possibly related to argument '{name}') - "
    for value, message in refused:
        with pytest.raises(redis.ResponseError) as exc:
            r.config_set(name, value)
        assert str(exc.value) == prefix + message, value
        assert r.config_get(name) == kept, value
