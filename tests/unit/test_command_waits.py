"""Commands declare their keys and waits in the table, and a handler that must wait returns a typed wait with a
continuation (it never raises to be run again)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvstrata.commands.context import ClientState, Context
from kvstrata.commands.registry import REGISTRY, KeySpec, lookup
from kvstrata.commands.tairkv import kv_mget, kv_setex
from kvstrata.commands.waits import Commit, Suspend
from kvstrata.config import Config
from kvstrata.engine.store import Store
from kvstrata.engine.tiers.ssd import SsdTier


def spec(name: str):
    found = lookup(name.encode())
    assert found is not None
    return found


@pytest.mark.parametrize(("argv", "keys"), [
    ("GET a", ["a"]),
    ("MSET a 1 b 2", ["a", "b"]),
    ("RENAME a b", ["a", "b"]),
    ("DEL a b c", ["a", "b", "c"]),
    ("SET a 1 EX 10 GET", ["a"]),
    ("TAIR.KV.MGET a b CONSISTENCY_LEVEL STRONG WITHVERSIONS", ["a", "b"]),
    ("TAIR.KV.MGET a WITHVERSIONS", ["a"]),
    ("TAIR.KV.PREFETCH a b PRIORITY 5", ["a", "b"]),
    ("TAIR.KV.PREFETCH PRIORITY", ["PRIORITY"]),  # one key that happens to be spelled like the option
    ("DBSIZE", []),
])
def test_keys_come_from_the_key_specs_or_the_extraction_function(argv: str, keys: list[str]) -> None:
    args = [a.encode() for a in argv.split()]
    assert spec(argv.split()[0].lower()).keys(args) == [k.encode() for k in keys]


def test_waits_are_declared() -> None:
    assert not spec("tair.kv.prefetch").load_keys([b"x", b"a", b"b"])  # queued, never loaded before the reply
    assert spec("get").load_keys([b"get", b"a"]) == [b"a"]
    assert spec("dbsize").settle
    assert not any(s.settle for n, s in REGISTRY.items() if n != b"dbsize")
    meta = {n for n, s in REGISTRY.items() if s.load == "meta"}  # record headers probed, never values loaded
    assert meta == {b"exists", b"type", b"ttl", b"pttl", b"expiretime", b"pexpiretime", b"watch"} | {
        b"setex", b"psetex", b"setnx", b"mset", b"msetnx", b"tair.kv.setex", b"restore"  # never read the old value
    }
    assert spec("set").probes([b"set", b"k", b"v", b"EX", b"5"])
    assert not spec("set").probes([b"set", b"k", b"v", b"get"])  # SET ... GET answers the old value
    assert not spec("get").probes([b"get", b"k"])
    assert spec("exists").load_keys([b"exists", b"a", b"b"]) == [b"a", b"b"]


def test_key_spec_ranges() -> None:
    args = [b"cmd", b"k1", b"v1", b"k2", b"v2", b"opt"]
    assert KeySpec(1, 0).find(args) == [b"k1"]
    assert KeySpec(1, -2, 2).find(args) == [b"k1", b"k2"]
    assert KeySpec.from_range(1, 3, 2, write=True) == KeySpec(1, 2, 2, ("RW", "update"))


def test_strong_read_returns_a_commit_wait_and_a_continuation(tmp_path: Path) -> None:
    ssd = SsdTier(str(tmp_path / "ssd"), 1 << 30, fsync="no", threaded=True)
    delivered: list[Any] = []
    arrived = threading.Event()

    def deliver(fn: Any) -> None:  # the writer's completions are held back, so the write stays in flight
        delivered.append(fn)
        arrived.set()

    ssd.set_delivery(deliver)
    try:
        store = Store(1 << 20, ssd=ssd, durability="write-through")
        ctx = Context(store, Config(), ClientState(id=1))
        store.put(b"k", b"v1")
        sus = kv_mget(ctx, [b"TAIR.KV.MGET", b"k", b"CONSISTENCY_LEVEL", b"STRONG"])
        assert isinstance(sus, Suspend) and isinstance(sus.wait, Commit)
        assert sus.wait.seq == ssd.enqueued_seq and sus.reload
        # The held completions are handed over as they come until the write is committed (the writer may commit
        # the write and the barrier after it in one batch or in two).
        deadline = time.monotonic() + 10
        while ssd.committed_seq < sus.wait.seq:
            assert arrived.wait(max(0.0, deadline - time.monotonic())), "the writer's completions"
            arrived.clear()
            while delivered:
                delivered.pop(0)()
        assert ssd.committed_seq >= sus.wait.seq
        assert sus.then(None) == [b"v1"]  # the continuation answers once the write is committed
        # Nothing in flight: the same command answers at once.
        assert kv_mget(ctx, [b"TAIR.KV.MGET", b"k", b"CONSISTENCY_LEVEL", b"STRONG"]) == [b"v1"]
    finally:
        ssd.close()


def test_a_handler_reports_its_waits_in_the_state_it_is_given(tmp_path: Path) -> None:
    """The command's state travels in the context (``ctx.command``), one per run; the Store keeps no per-command
    fields of its own."""
    ssd = SsdTier(str(tmp_path / "ssd"), 1 << 30, fsync="no", threaded=False)
    try:
        store = Store(1 << 20, ssd=ssd, durability="write-through")
        ctx = Context(store, Config(), ClientState(id=7))
        assert ctx.command is store.command
        first = ctx.command = store.begin_command(7)
        assert kv_setex(ctx, [b"TAIR.KV.SETEX", b"k", b"0", b"v"]) == 1
        assert first.ack_seq == ssd.enqueued_seq > 0 and first.stream == 7
        second = ctx.command = store.begin_command(8)
        assert second is not first and second.ack_seq == 0 and first.ack_seq == ssd.enqueued_seq
        assert not any(hasattr(store, name) for name in ("ack_seq", "pool_ack", "stream"))
    finally:
        ssd.close()
