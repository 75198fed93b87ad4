"""Differential protocol fuzzer (issue 13): random and mutated RESP and inline input, to kvstrata and Redis.

Every example is sent to a kvstrata server and to a real redis-server on fresh connections, whole or in pieces
down to one byte, and the write side is then shut: both servers answer what they parsed and close, so the two
byte streams must be identical (the same replies, the same protocol error, the same silent close). After each
example both must still serve another client within SERVE_DEADLINE, and at the end kvstrata's RSS must not have
grown beyond a bound.

Inputs: valid commands from a set both servers implement alike, mutated (bytes flipped, inserted, dropped,
truncated), every byte value, huge and negative lengths, long lines, inline commands. An example whose parsed
command names include a command outside that set (one kvstrata does not have, or that would change the servers'
state in ways the comparison does not cover) is skipped; which commands ran is decided with kvstrata's parser.

The whole run is bounded in time (KVSTRATA_FUZZ_SECONDS, 35 s by default) so that CI stays fast; set it higher
(and HYPOTHESIS examples with KVSTRATA_FUZZ_EXAMPLES) for a longer search.
"""

from __future__ import annotations

import os
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import ServerProc
from tests.integration.hostile import MIB, SERVE_DEADLINE, Outcome, Prober, rss

from kvstrata.errors import ProtocolError
from kvstrata.protocol.parser import RequestParser

pytestmark = pytest.mark.kvstrata_only  # a comparison of the two servers

BUDGET = float(os.environ.get("KVSTRATA_FUZZ_SECONDS", "35"))
EXAMPLES = int(os.environ.get("KVSTRATA_FUZZ_EXAMPLES", "2000"))
RSS_GROWTH = 64 * MIB

# Commands whose replies kvstrata gives exactly as Redis does, for any arguments.
SAFE = {b"ping", b"echo", b"set", b"get", b"del", b"exists", b"strlen", b"append", b"incr", b"decr", b"mget",
        b"incrby", b"getdel", b"getset", b"setnx", b"msetnx", b"mset", b"unlink", b"touch", b"getrange"}


@pytest.fixture(scope="module")
def servers():
    kv = ServerProc(target="kvstrata").start()
    rd = ServerProc(target="redis").start()
    known = set()
    for srv in (kv, rd):
        c = srv.raw()
        known |= {bytes(n).lower() for n in c.cmd("COMMAND", "LIST")}
        c.close()
    started = time.monotonic()
    yield kv, rd, known - SAFE, started, rss(kv.proc.pid)
    kv.stop()
    rd.stop()


def half_closed_exchange(port: int, data: bytes, piece: int, limit: float = 10.0) -> Outcome:
    """Send ``data`` in ``piece``-byte sends (0: at once), shut the write side, read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            step = piece or len(data) or 1
            for i in range(0, len(data), step):
                s.sendall(data[i : i + step])
            s.shutdown(socket.SHUT_WR)
        except OSError:  # the server closed first (a protocol error): what it sent is still to be read
            pass
        out = bytearray()
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            except TimeoutError:
                raise AssertionError(f"no close within {limit}s after EOF; got {bytes(out[:200])!r}") from None
            if not chunk:
                break
            out += chunk
        return Outcome(bytes(out), True)


def _bulk(arg: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


def _frame(args: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(map(_bulk, args))


KEYS = st.sampled_from([b"k", b"k2", b"n", b""])
VALUES = st.one_of(st.binary(max_size=24), st.sampled_from([b"1", b"-7", b"9223372036854775807", b"1.5", b"x"]))


@st.composite
def command(draw) -> list[bytes]:
    name = draw(st.sampled_from(sorted(SAFE)))
    if draw(st.booleans()):
        name = name.upper()
    args = draw(st.lists(st.one_of(KEYS, VALUES), max_size=4))
    return [name, *args]


@st.composite
def valid_input(draw) -> bytes:
    cmds = draw(st.lists(command(), min_size=1, max_size=4))
    parts = []
    for args in cmds:
        if draw(st.integers(0, 3)) == 0:
            parts.append(b" ".join(a if a and a.isalnum() else b'"' + a.hex().encode() + b'"' for a in args)
                         + draw(st.sampled_from([b"\r\n", b"\n"])))
        else:
            parts.append(_frame(args))
    return b"".join(parts)


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(draw(valid_input()))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "dup"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete" and data:
            del data[at : at + draw(st.integers(1, 4))]
        elif op == "truncate":
            del data[at:]
        elif op == "dup":
            data[at:at] = data[at : at + draw(st.integers(1, 8))]
    return bytes(data)


HEADERS = st.sampled_from([
    b"*-1\r\n", b"*0\r\n", b"*-5\r\n", b"*2147483648\r\n", b"*1048577\r\n", b"*+1\r\n", b"*01\r\n", b"* 1\r\n",
    b"*1\r\n$-1\r\n", b"*1\r\n$-7\r\n", b"*1\r\n$2147483648\r\n", b"*1\r\n$536870913\r\n", b"*1\r\n$01\r\n",
    b"*1\r\n$+4\r\nPING\r\n", b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$536870912\r\n", b"*1\r\n:4\r\n", b"*1\r\n*1\r\n",
    b"$4\r\nPING\r\n", b"*1\r\n$4\r\nPINGxx", b"*1\r\n$4\r\nPING", b"*2\r\n$4\r\nECHO\r\n$3\r\nabc\n\n",
])


@st.composite
def long_line(draw) -> bytes:
    # Well below or well above the 64 KiB limit: near it, whether Redis has seen more than 64 KiB without a
    # newline depends on how the bytes were split into reads, for Redis as for kvstrata.
    size = draw(st.sampled_from([60_000, 200_000]))
    fill = draw(st.sampled_from([b"a", b" ", b"\x00", b"*"]))
    head = draw(st.sampled_from([b"", b"*", b"*1\r\n$", b"ECHO "]))
    return head + fill * size + draw(st.sampled_from([b"", b"\r\n"]))


FUZZ_INPUT = st.one_of(
    valid_input(),
    mutated(),
    mutated(),
    st.binary(max_size=64),
    st.lists(st.integers(0, 255), max_size=40).map(lambda bs: bytes(bs) + b"\r\n"),
    st.tuples(HEADERS, st.one_of(st.just(b""), valid_input())).map(b"".join),
    long_line(),
)


def _commands_of(data: bytes) -> list[bytes]:
    parser = RequestParser()
    try:
        parser.feed(data)
    except ProtocolError:
        pass
    return [bytes(cmd[0]).lower() for cmd in parser.commands() if cmd]


def _flush(srv: ServerProc) -> None:
    c = srv.client()
    c.flushall()
    c.close()


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(data=FUZZ_INPUT, piece=st.sampled_from([0, 0, 1, 2, 3, 7, 64]))
def test_same_answer_as_redis(servers, data, piece):
    kv, rd, unsafe, started, _ = servers
    if time.monotonic() - started > BUDGET:
        return  # the time budget is spent: the remaining examples pass without running
    if any(name in unsafe for name in _commands_of(data)):
        return
    if piece == 1 and len(data) > 2000:
        piece = 997  # one byte at a time only for short inputs (long lines would take minutes)
    for srv in (kv, rd):
        _flush(srv)
    got = half_closed_exchange(kv.port, data, piece)
    want = half_closed_exchange(rd.port, data, piece)
    assert got.reply == want.reply, f"input {data[:200]!r} piece {piece}: kvstrata {got} / redis {want}"
    assert kv.alive()
    probe = Prober(kv.port)
    try:
        assert probe.ping_seconds() < SERVE_DEADLINE
    finally:
        probe.close()


def test_memory_after_fuzzing(servers):
    kv, _, _, _, before = servers
    assert rss(kv.proc.pid) - before < RSS_GROWTH
