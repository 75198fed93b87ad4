"""Large values end to end: byte-exact round trips in random TCP fragments, a pipelined random stream against a
model, streamed MGET, the output-buffer limit, and the zero-copy client (kvstrata.client.fast)."""

from __future__ import annotations

import random
import socket
import time

import numpy as np
import pytest

from kvstrata.client.fast import FastClient, RespError, ValueTooLarge

pytestmark = pytest.mark.kvstrata_only

KB = 1024
MB = 1024 * KB
T = 64 * KB  # large-value-threshold


def _cmd(*args: bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%b\r\n" % (len(a), a))
    return b"".join(out)


def _send_fragmented(sock: socket.socket, data: bytes, rng: random.Random) -> None:
    """Send in random fragment sizes: single bytes, a few bytes, and larger pieces up to 256 KiB."""
    view = memoryview(data)
    while view:
        r = rng.random()
        if r < 0.3:
            k = rng.randint(1, 8)
        elif r < 0.6:
            k = rng.randint(9, 4096)
        else:
            k = rng.randint(4097, 256 * KB)
        sock.sendall(view[:k])
        view = view[k:]


def _rand(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


@pytest.fixture
def fast(server):
    c = FastClient(server.host, server.port, timeout=30)
    c.call(b"FLUSHALL")
    yield c
    c.close()


SIZES = [0, 1, 2, T - 3, T - 2, T - 1, T, T + 1, T + 2, 2 * T - 1, 100_000, MB - 1, MB, MB + 1, 3 * MB + 7]


def test_round_trips_in_random_fragments(server, fast) -> None:
    rng = random.Random(5)
    sizes = SIZES + [rng.randint(0, 2 * MB) for _ in range(12)]
    values = {b"v:%d:%d" % (i, n): _rand(rng, n) for i, n in enumerate(sizes)}
    with socket.create_connection((server.host, server.port), timeout=30) as s:
        payload = b"".join(_cmd(b"SET", k, v) for k, v in values.items())
        _send_fragmented(s, payload, rng)
        w = FastClient.__new__(FastClient)  # read the replies with the fast client's parser on this socket
        w.sock = s
        w._rbuf = bytearray(256 * KB)
        w._rview = memoryview(w._rbuf)
        w._start = w._end = 0
        assert [w.read_reply() for _ in values] == [b"OK"] * len(values)
    buf = bytearray(4 * MB)
    for k, v in values.items():
        assert fast.get_into(k, buf) == len(v)
        assert buf[: len(v)] == v
        assert fast.call(b"STRLEN", k) == len(v)
        assert fast.get(k) == v
        if len(v) > 10:
            assert fast.call(b"GETRANGE", k, b"3", b"9") == v[3:10]
    # APPEND to a pooled value sees its exact bytes.
    k = b"v:%d:%d" % (SIZES.index(MB), MB)
    assert fast.call(b"APPEND", k, b"tail") == MB + 4
    assert fast.get(k) == values[k] + b"tail"


def test_every_fragment_size_from_one_byte_across_the_threshold(server, fast) -> None:
    """A value of exactly the threshold sent in fragments of 1, 2, 3, ... bytes at every position."""
    rng = random.Random(7)
    value = _rand(rng, T)
    frame = _cmd(b"SET", b"t", value)
    for frag in (1, 2, 3, 5, 7, 13, 64, 1000, T - 1, T, T + 1):
        with socket.create_connection((server.host, server.port), timeout=30) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            head = frame[:40]
            for i in range(0, len(head), 1):
                s.sendall(head[i : i + 1])  # the header byte by byte
            view = memoryview(frame)[40:]
            while view:
                s.sendall(view[:frag] if frag < 4096 else view[: frag * 4])
                view = view[frag if frag < 4096 else frag * 4 :]
            assert s.recv(16) == b"+OK\r\n"
        assert fast.get(b"t") == value


def test_pipelined_random_stream_matches_a_model(server, fast) -> None:
    rng = random.Random(11)
    keys = [b"m:%d" % i for i in range(12)]
    model: dict[bytes, bytes] = {}
    commands: list[tuple[bytes, ...]] = []
    expected: list[object] = []
    for _ in range(300):
        op = rng.choice(["set", "set", "get", "get", "mget", "del"])
        if op == "set":
            k = rng.choice(keys)
            n = rng.choice([0, 1, 100, T - 1, T, T + 1, rng.randint(T, 600 * KB)])
            v = _rand(rng, n)
            model[k] = v
            commands.append((b"SET", k, v))
            expected.append(b"OK")
        elif op == "get":
            k = rng.choice(keys)
            commands.append((b"GET", k))
            expected.append(model.get(k))
        elif op == "mget":
            ks = rng.sample(keys, rng.randint(1, 6))
            commands.append((b"MGET", *ks))
            expected.append([model.get(k) for k in ks])
        else:
            ks = rng.sample(keys, rng.randint(1, 3))
            commands.append((b"DEL", *ks))
            expected.append(sum(1 for k in ks if model.pop(k, None) is not None))
    payload = b"".join(_cmd(*c) for c in commands)
    with socket.create_connection((server.host, server.port), timeout=30) as s:
        w = FastClient.__new__(FastClient)
        w.sock = s
        w._rbuf = bytearray(256 * KB)
        w._rview = memoryview(w._rbuf)
        w._start = w._end = 0
        # Send everything (fragmented) from one side while reading every reply: replies can exceed socket buffers.
        import threading

        sender = threading.Thread(target=_send_fragmented, args=(s, payload, random.Random(3)))
        sender.start()
        got = [w.read_reply() for _ in commands]
        sender.join()
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g == e, f"command {i} {commands[i][0]!r}"
    for k in keys:
        assert fast.get(k) == model.get(k)


def test_mget_and_tair_kv_mget_of_many_large_values(server, fast) -> None:
    rng = random.Random(13)
    values = [_rand(rng, 2 * MB + i) for i in range(40)]  # 80 MB: streamed in batches
    keys = [b"big:%d" % i for i in range(len(values))]
    assert fast.mset(dict(zip(keys, values, strict=True))) == b"OK"
    bufs = [bytearray(3 * MB) for _ in keys]
    assert fast.mget_into(keys, bufs) == [len(v) for v in values]
    assert all(b[: len(v)] == v for b, v in zip(bufs, values, strict=True))
    reply = fast.call(b"TAIR.KV.MGET", *keys[:10], b"nope")
    assert reply == [*values[:10], None]
    assert fast.call(b"MGET", *keys) == values


def test_get_into_numpy_and_memoryview(fast) -> None:
    arr = np.arange(1_000_000, dtype=np.float32)
    assert fast.set(b"arr", arr) == b"OK"
    out = np.empty_like(arr)
    assert fast.get_into(b"arr", out) == arr.nbytes
    assert np.array_equal(out, arr)
    view = memoryview(bytearray(arr.nbytes + 10))[5:]
    assert fast.get_into(b"arr", view) == arr.nbytes
    assert view[: arr.nbytes] == arr.tobytes()
    assert fast.get_into(b"missing", out) is None
    with pytest.raises(ValueTooLarge):
        fast.get_into(b"arr", bytearray(10))
    assert fast.call(b"PING") == b"PONG"  # still in sync
    with pytest.raises(RespError):
        fast.call(b"NOSUCHCOMMAND")
    res = fast.get_many_into([b"arr", b"missing"], [out, bytearray(4)])
    assert res == [arr.nbytes, None]
    assert fast.set_many([(b"a", b"1"), (b"b", bytes(200 * KB))]) == [b"OK", b"OK"]


def test_pool_reuses_buffers_for_overwritten_values(server, fast) -> None:
    rng = random.Random(17)
    for _ in range(6):
        assert fast.set(b"reuse", _rand(rng, 4 * MB)) == b"OK"
    info = fast.call(b"INFO", b"memory").decode()
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    # Large values land in the shared-memory arena (docs/dataplane.md), which replaced the buffer pool: every
    # value got a slot, and the overwritten ones' slots were reused (at most the current value and one
    # waiting to be freed are allocated).
    assert int(fields["arena_hits"]) >= 6
    assert int(fields["arena_allocated_bytes"]) <= 2 * 4 * MB


def test_stuck_client_is_disconnected_at_the_output_limit(make_server) -> None:
    srv = make_server({"client-output-buffer-limit": "16mb"})
    value = random.Random(19).randbytes(MB)
    with FastClient(srv.host, srv.port, timeout=30) as good:
        assert good.set(b"big", value) == b"OK"
        stuck = socket.create_connection((srv.host, srv.port), timeout=30)
        try:
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * KB)
            gets = _cmd(b"GET", b"big") * 200  # 200 MB of replies, never read
            deadline = time.monotonic() + 30
            closed = False
            stuck.settimeout(1.0)
            try:
                stuck.sendall(gets)
            except OSError:
                closed = True
            buf = bytearray(MB)
            while not closed:
                assert time.monotonic() < deadline, "the stuck client was not disconnected"
                # Other clients keep being served meanwhile.
                assert good.get_into(b"big", buf) == MB and buf == value
                info = good.call(b"INFO", b"stats").decode()
                closed = "client_output_buffer_limit_disconnections:1" in info
            clients = good.call(b"CLIENT", b"LIST").decode().strip().splitlines()
            assert len(clients) == 1
            assert good.get_into(b"big", buf) == MB and buf == value
        finally:
            stuck.close()


@pytest.mark.slow
def test_a_200_mb_value(server, fast) -> None:
    rng = np.random.default_rng(23)
    value = rng.integers(0, 256, 200 * MB, dtype=np.uint8)
    assert fast.set(b"huge", value) == b"OK"
    out = np.empty_like(value)
    assert fast.get_into(b"huge", out) == value.nbytes
    assert np.array_equal(out, value)
    assert fast.call(b"STRLEN", b"huge") == value.nbytes
    assert fast.call(b"DEL", b"huge") == 1
