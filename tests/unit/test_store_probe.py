"""Metadata probes (EXISTS, TYPE, the TTL family with ``load="meta"``): the answers are the ones a full load gives,
for keys in DRAM, on SSD, expired on SSD, missing, and with writes still pending, and no value is read."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstrata.clock import ManualClock
from kvstrata.commands import keyspace
from kvstrata.commands.context import ClientState, Context
from kvstrata.config import Config
from kvstrata.engine.entry import ENTRY_OVERHEAD, Meta
from kvstrata.engine.policy import create_policy
from kvstrata.engine.store import Store
from kvstrata.engine.tiers.ssd import SsdTier
from kvstrata.engine.tiers.ssd_record import decode_meta, encode_record

VALUE = b"v" * 1000
SLOT = 8 + len(VALUE) + ENTRY_OVERHEAD
KEYS = [b"dram", b"ssd", b"ssd-ttl", b"ssd-expired", b"missing", b"pending-del", b"pending-set", b"pending-new"]
COMMANDS: list[tuple[str, Callable[[Context, list[bytes]], Any]]] = [
    ("exists", keyspace.exists), ("type", keyspace.type_), ("ttl", keyspace.ttl), ("pttl", keyspace.pttl),
    ("expiretime", keyspace.expiretime), ("pexpiretime", keyspace.pexpiretime),
]


def build(tmp_path: Path) -> tuple[Store, SsdTier]:
    """A Store with one key in each state; its SSD writer's completions are held, so later writes stay pending."""
    clock = ManualClock()
    ssd = SsdTier(str(tmp_path / "ssd"), 1 << 30, fsync="no", threaded=False)
    held: list[Callable[[], None]] = []
    ssd.set_delivery(held.append)
    store = Store(2 * SLOT, policy=create_policy("lru", clock=clock), clock=clock, ssd=ssd)
    now = clock.now_ms()
    store.put(b"ssd", VALUE)
    store.put(b"ssd-ttl", VALUE, now + 10_500)
    store.put(b"ssd-expired", VALUE, now + 100)
    store.put(b"pending-del", VALUE)
    store.put(b"pending-set", VALUE)
    store.make_room(store.dram.budget)  # everything so far goes down to the SSD
    store.put(b"dram", VALUE[:10], now + 5_000)
    for deliver in held:
        deliver()
    held.clear()
    assert ssd.settled and set(store.dram.entries) == {b"dram"}
    # Writes the writer has applied but whose completion the loop has not seen: ``pending`` holds them.
    store.delete(b"pending-del")
    store.put(b"pending-set", VALUE * 2, now + 60_000, cold=True)
    store.put(b"pending-new", VALUE[:3], cold=True)
    assert set(ssd.pending) == {b"pending-del", b"pending-set", b"pending-new"}
    clock.advance(0.2)  # ssd-expired is past its expiry, still on the SSD
    return store, ssd


def answers(store: Store, probe: bool) -> dict[tuple[str, bytes], Any]:
    """Each command's reply for each key, run the way the server runs it: keys probed (or loaded) off the loop
    first, into the next command's overlay."""
    ctx = Context(store=store, config=Config(), client=ClientState(id=1))
    out: dict[tuple[str, bytes], Any] = {}
    for name, handler in COMMANDS:
        for key in KEYS:
            ctx.command = store.begin_command(1)
            missing = store.missing([key])
            if missing:
                ticket = store.begin_load(missing)
                if probe:
                    assert store.finish_probe(ticket, store.probe_lower(ticket))
                    assert store.probed(key)
                else:
                    assert store.finish_load(ticket, store.read_lower(ticket))
            out[name, key] = handler(ctx, [name.encode(), key])
            store.end_command()
    return out


def test_probe_answers_as_a_full_load_does(tmp_path: Path) -> None:
    loaded_store, loaded_ssd = build(tmp_path / "load")
    probed_store, probed_ssd = build(tmp_path / "probe")
    reads = (loaded_ssd.reads, probed_ssd.reads)  # the writes' own lookups (is there an older copy below?)
    loaded = answers(loaded_store, probe=False)
    probed = answers(probed_store, probe=True)
    assert probed == loaded
    assert loaded["exists", b"ssd"] == 1 and loaded["exists", b"ssd-expired"] == 0
    assert loaded["exists", b"pending-del"] == 0 and loaded["exists", b"pending-new"] == 1
    assert loaded["ttl", b"ssd-ttl"] == 10 and loaded["pttl", b"ssd-ttl"] == 10_300
    assert loaded["ttl", b"pending-set"] == 60 and loaded["ttl", b"ssd"] == -1 and loaded["ttl", b"missing"] == -2
    assert str(loaded["type", b"dram"]) == str(probed["type", b"dram"])
    # The probe read headers only; the expired record was dropped by both, as a read drops it.
    assert probed_ssd.reads == reads[1] and probed_ssd.probes > 0
    assert loaded_ssd.reads > reads[0] and loaded_ssd.probes == 0
    for store in (loaded_store, probed_store):
        assert b"ssd-expired" in store.ssd.pending and store.stats.expired_keys == 1


def test_probe_counts_the_value_length_and_never_promotes(tmp_path: Path) -> None:
    store, ssd = build(tmp_path)
    reads = ssd.reads
    store.begin_command(1)
    ticket = store.begin_load(store.missing([b"ssd", b"ssd-ttl"]))
    assert store.finish_probe(ticket, store.probe_lower(ticket))
    found = store.probe(b"ssd")
    assert found == Meta(found.version, 0, len(VALUE)) and found.value_len == len(VALUE)
    assert store.probe(b"dram").value_len == 10  # DRAM: the entry itself
    assert store.probe(b"pending-set").value_len == 2 * len(VALUE)
    assert not store.loaded(b"ssd")  # a probe is no load: the predictor's keys are queued, not promoted from it
    store.end_command()
    assert b"ssd" not in store.dram.entries and ssd.reads == reads


def test_decode_meta_checks_the_header_and_the_long_key() -> None:
    key = b"x" * 500  # stored under its hash: the full key is in the record
    rec = b"".join(encode_record(key, b"abc", 7, 99, 1))
    assert decode_meta(key, rec) == Meta(7, 99, 3)
    assert decode_meta(b"y" * 500, rec) is None  # another key with the same hash
    assert decode_meta(key, b"XX" + rec[2:]).reason == "bad magic"  # type: ignore[union-attr]
    assert decode_meta(key, rec[:10]).reason == "short record"  # type: ignore[union-attr]
