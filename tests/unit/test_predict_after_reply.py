"""A command's predictions are taken after its reply went out, and before anything else runs: a Connection over
a buffering transport (no socket) records what the transport held each time the prefetcher took them."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_connection_large import FakeTransport, _cmd, _feed

from kvstrata.config import build_config
from kvstrata.server.app import Server
from kvstrata.server.connection import Connection

VALUE = b"v" * 8192


def _server(tmp_path: Path) -> tuple[Server, Connection, FakeTransport, list[int]]:
    srv = Server(build_config({"essd-path": str(tmp_path / "ssd"), "dram-size": "64mb"}, {}))
    assert srv.store.predictor is not None
    conn = Connection(srv)
    t = FakeTransport()
    t.protocol = conn
    conn.connection_made(t)
    taken: list[int] = []  # bytes in the transport at each take
    prefetcher = srv.prefetcher
    submit = prefetcher.submit_predicted

    def recording() -> None:
        taken.append(t.size)
        submit()

    prefetcher.submit_predicted = recording  # type: ignore[method-assign]
    return srv, conn, t, taken


def _write(srv: Server, chain: list[bytes]) -> None:
    """Store a chain as one client would (in DRAM: a SET of a new key on a tiered server first checks the SSD,
    which needs the event loop this test does not run)."""
    store = srv.store
    store.begin_command(10_000)
    for key in chain:
        store.put(key, VALUE)
    store.end_command()


def test_a_gets_predictions_are_taken_after_its_reply_is_written(tmp_path: Path) -> None:
    srv, conn, t, taken = _server(tmp_path)
    chain = [b"kvs:ns:c-%02d" % i for i in range(6)]
    _write(srv, chain)
    size = t.size
    taken.clear()
    _feed(conn, _cmd(b"GET", chain[0]))
    assert t.size >= size + len(VALUE)
    assert taken == [t.size], (taken, size)  # taken once, with the whole reply already in the transport


def test_in_a_pipeline_each_commands_predictions_are_taken_before_the_next_runs(tmp_path: Path) -> None:
    srv, conn, t, taken = _server(tmp_path)
    chain = [b"kvs:ns:p-%02d" % i for i in range(6)]
    _write(srv, chain)
    base = t.size
    taken.clear()
    walks = srv.store.predictor.walks
    _feed(conn, _cmd(b"GET", chain[0]) + _cmd(b"GET", chain[1]) + _cmd(b"GET", chain[2]))
    # Three takes: the first two before the batch's replies were written (each before the next command ran:
    # nothing of the batch in the transport yet), the last once all three replies were.
    assert len(taken) == 3, taken
    assert taken[0] == taken[1] == base
    assert taken[2] == t.size >= base + 3 * len(VALUE)
    assert srv.store.predictor.walks == walks + 1  # one walk, continued by the next two reads
    assert not srv.store.predictor.pending
