"""kvstrata as LMCache's remote backend: LMCache 0.5.6 (in its own virtual environment, see docs/lmcache.md) stores
KV through ``remote_url: redis://`` at a real kvstrata server, another LMCache engine retrieves it bitwise equal,
and kvstrata's side sees the objects with their versions and TTLs (and applies a TTL set there).

The LMCache environment is ``$KVSTRATA_LMCACHE_VENV`` or ``~/.cache/kvstrata/lmcache-venv`` (scripts/test.sh
creates it); without it the module is skipped. Slow (~80 s on 2 shared cores), LMCache's imports and engine
start-up being most of it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from polling import wait_for

VENV = Path(os.environ.get("KVSTRATA_LMCACHE_VENV") or Path.home() / ".cache" / "kvstrata" / "lmcache-venv")
PYTHON = VENV / "bin" / "python"
WORKER = Path(__file__).resolve().parent.parent / "lmcache" / "remote_worker.py"

# The package directory, not an import: importing LMCache takes ~20 s here.
if not PYTHON.exists() or not any(VENV.glob("lib/python3*/site-packages/lmcache/__init__.py")):
    pytest.skip(f"no LMCache environment at {VENV} (scripts/test.sh creates it; docs/lmcache.md)",
                allow_module_level=True)

pytestmark = [pytest.mark.kvstrata_only, pytest.mark.slow]  # ~80 s: LMCache's start-up is most of it


class LMCache:
    """LMCache engines in one worker process of LMCache's environment, talking to ``url``."""

    def __init__(self, url: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of kvstrata's environment
        self.proc = subprocess.Popen([str(PYTHON), str(WORKER), url], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)

    def __call__(self, op: str, engine: str, seed: int, tokens: int):
        self.proc.stdin.write(json.dumps({"op": op, "engine": engine, "seed": seed, "tokens": tokens}) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline() or '{"error": "worker exited"}')
        assert "error" not in reply, reply["error"]
        return reply["result"]

    def close(self) -> None:
        try:
            self.proc.stdin.write('{"op": "quit"}\n')
            self.proc.stdin.flush()
            self.proc.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


@pytest.fixture(scope="module")
def srv(module_make_server):
    return module_make_server()


@pytest.fixture(scope="module")
def lmc(srv):
    worker = LMCache(f"redis://{srv.host}:{srv.port}")
    yield worker
    worker.close()


def test_lmcache_stores_and_retrieves_through_kvstrata_bitwise(srv, lmc):
    r = srv.client()
    r.flushall()
    assert lmc("store", "writer", 1, 600) == 512  # LMCache stores whole 256-token chunks
    keys = sorted(k.decode() for k in r.scan_iter(match="kvstrata-test/model@*"))
    assert len(keys) == 4  # two chunks, each a kv_bytes and a metadata object
    assert {k.rsplit("@", 1)[1].removeprefix("bfloat16") for k in keys} == {"kv_bytes", "metadata"}
    # Another engine (nothing local) reads it back from kvstrata.
    got = lmc("retrieve", "reader", 1, 600)
    assert got == {"tokens": 512, "equal": True, "rest_untouched": True}
    assert lmc("lookup", "reader", 2, 600) == 0  # other tokens: a miss
    # kvstrata's side: each object carries a version; LMCache writes kv_bytes before metadata.
    for chunk in {k.rsplit("bfloat16", 1)[0] for k in keys}:
        kv_ver = r.execute_command("TAIR.KV.VERSION", chunk + "bfloat16kv_bytes")
        meta_ver = r.execute_command("TAIR.KV.VERSION", chunk + "bfloat16metadata")
        assert 0 < kv_ver < meta_ver
        assert r.ttl(chunk + "bfloat16kv_bytes") == -1  # LMCache sets no TTL
    assert r.strlen(next(k for k in keys if k.endswith("kv_bytes"))) == 2 * 4 * 256 * 2 * 16 * 2
    r.close()


def test_a_ttl_set_on_kvstrata_expires_lmcache_chunks(srv, lmc):
    r = srv.client()
    r.flushall()
    assert lmc("store", "writer", 3, 300) == 256
    keys = list(r.scan_iter(match="kvstrata-test/model@*"))
    for k in keys:
        assert r.pexpire(k, 300)
        assert 0 < r.pttl(k) <= 300
    wait_for(lambda: r.exists(*keys) == 0, timeout=10, what="LMCache objects to expire")
    assert lmc("lookup", "reader", 3, 300) == 0
    assert lmc("retrieve", "reader", 3, 300)["tokens"] == 0
    r.close()
