"""The wire protocol over raw sockets: pipelining, inline commands, malformed input, and the real redis-cli."""

import pytest

PROTO_MAX_BULK_LEN = 512 * 1024 * 1024


def healthy(server, r, key=b"sentinel", value=b"intact"):
    """A fresh connection works and data written earlier by another client is still there."""
    c = server.raw()
    try:
        assert c.cmd_raw("PING") == b"+PONG\r\n"
        assert c.cmd("GET", key) == value
    finally:
        c.close()
    assert r.get(key) == value


# --------------------------------------------------------------------------------------------------------------
# Pipelining
# --------------------------------------------------------------------------------------------------------------


def test_pipeline_1000_commands_in_one_write(r, raw, resp):
    c = raw()
    n = 1000
    c.send(b"".join(resp.encode("SET", f"key:{i}", f"value:{i}") for i in range(n)))
    assert [c.read_raw() for _ in range(n)] == [b"+OK\r\n"] * n
    c.send(b"".join(resp.encode("GET", f"key:{i}") for i in range(n)))
    for i in range(n):
        value = f"value:{i}".encode()
        assert c.read_raw() == b"$%d\r\n%s\r\n" % (len(value), value)
    assert r.dbsize() == n
    assert c.nothing_pending()


def test_pipeline_mixed_replies_keep_order(raw, resp):
    c = raw()
    cmds = [("SET", "a", "1"), ("INCR", "a"), ("GET", "nope"), ("GET",), ("INCR", "a"), ("foo",), ("MGET", "a")]
    c.send(b"".join(resp.encode(*cmd) for cmd in cmds))
    assert [c.read_raw() for _ in cmds] == [
        b"+OK\r\n",
        b":2\r\n",
        b"$-1\r\n",
        b"-ERR wrong number of arguments for 'get' command\r\n",
        b":3\r\n",
        b"-ERR unknown command 'foo', with args beginning with: \r\n",
        b"*1\r\n$1\r\n3\r\n",
    ]


def test_pipeline_large_values(raw, resp):
    c = raw()
    value = b"x" * (256 * 1024)
    c.send(b"".join(resp.encode("SET", f"big{i}", value) for i in range(8)) + resp.encode("STRLEN", "big7"))
    assert [c.read_raw() for _ in range(8)] == [b"+OK\r\n"] * 8
    assert c.read_raw() == b":%d\r\n" % len(value)
    c.send(b"".join(resp.encode("GET", f"big{i}") for i in range(8)))
    for _ in range(8):
        assert c.read_reply() == value


def test_command_split_across_writes(raw, resp):
    c = raw()
    data = resp.encode("SET", "split", "hello world") + resp.encode("GET", "split")
    for i in range(len(data)):  # one byte per write
        c.send(data[i:i + 1])
    assert c.read_raw() == b"+OK\r\n"
    assert c.read_raw() == b"$11\r\nhello world\r\n"


def test_redis_py_pipeline(r):
    pipe = r.pipeline(transaction=False)
    for i in range(500):
        pipe.set(f"k{i}", i)
        pipe.incr(f"k{i}", 1 - i)
    results = pipe.execute()
    assert results == [True, 1] * 500
    assert r.get("k499") == b"1"


# --------------------------------------------------------------------------------------------------------------
# Inline commands
# --------------------------------------------------------------------------------------------------------------


def test_inline_commands(r, raw):
    c = raw()
    assert c.inline(b"PING\r\n") == b"+PONG\r\n"
    assert c.inline(b"SET a b\r\n") == b"+OK\r\n"
    assert c.inline(b"GET a\r\n") == b"$1\r\nb\r\n"
    assert c.inline(b"ping\n") == b"+PONG\r\n"  # a bare LF ends an inline command too
    assert c.inline(b"   SET    spaced     value  \r\n") == b"+OK\r\n"
    assert r.get("spaced") == b"value"
    assert c.inline(b'SET q "hello world"\r\n') == b"+OK\r\n"
    assert r.get("q") == b"hello world"
    assert c.inline(b"SET s 'single quoted'\r\n") == b"+OK\r\n"
    assert r.get("s") == b"single quoted"
    assert c.inline(b'SET e "a\\x41\\n"\r\n') == b"+OK\r\n"
    assert r.get("e") == b"aA\n"
    assert c.inline(b"ECHO \"\"\r\n") == b"$0\r\n\r\n"


def test_inline_empty_lines_are_ignored(raw):
    c = raw()
    c.send(b"\r\n\r\n\n")
    assert c.inline(b"PING\r\n") == b"+PONG\r\n"
    assert c.nothing_pending()


def test_inline_pipelined_and_mixed_with_resp(raw, resp):
    c = raw()
    c.send(b"SET x 1\r\nINCR x\r\n" + resp.encode("INCR", "x") + b"GET x\r\n")
    assert [c.read_raw() for _ in range(4)] == [b"+OK\r\n", b":2\r\n", b":3\r\n", b"$1\r\n3\r\n"]


def test_inline_errors_keep_connection(raw):
    c = raw()
    assert c.inline(b"GET\r\n") == b"-ERR wrong number of arguments for 'get' command\r\n"
    assert c.inline(b"NOSUCH a b\r\n") == b"-ERR unknown command 'NOSUCH', with args beginning with: 'a' 'b' \r\n"
    # At the top level only '*' starts a RESP request: anything else is an inline command.
    assert c.inline(b"$5\r\n") == b"-ERR unknown command '$5', with args beginning with: \r\n"
    assert c.inline(b"+PING\r\n") == b"-ERR unknown command '+PING', with args beginning with: \r\n"
    assert c.inline(b"\xff\xfe\r\n") == b"-ERR unknown command '\xff\xfe', with args beginning with: \r\n"
    assert c.inline(b"PING\r\n") == b"+PONG\r\n"


def test_empty_multibulk_is_ignored(raw):
    c = raw()
    c.send(b"*0\r\n*-1\r\n")
    assert c.inline(b"*1\r\n$4\r\nPING\r\n") == b"+PONG\r\n"
    assert c.nothing_pending()


# --------------------------------------------------------------------------------------------------------------
# Malformed input
# --------------------------------------------------------------------------------------------------------------

MALFORMED = [
    (b"*abc\r\n", b"-ERR Protocol error: invalid multibulk length\r\n"),
    (b"*3000000000\r\n", b"-ERR Protocol error: invalid multibulk length\r\n"),
    (b"*1\r\n$abc\r\n", b"-ERR Protocol error: invalid bulk length\r\n"),
    (b"*1\r\n$-1\r\n", b"-ERR Protocol error: invalid bulk length\r\n"),
    (b"*2\r\n$3\r\nGET\r\n$-5\r\n", b"-ERR Protocol error: invalid bulk length\r\n"),
    (b"*1\r\n$9999999999\r\n", b"-ERR Protocol error: invalid bulk length\r\n"),
    (b"*1\r\n$%d\r\n" % (PROTO_MAX_BULK_LEN + 1), b"-ERR Protocol error: invalid bulk length\r\n"),
    (b"*1\r\n:1\r\n", b"-ERR Protocol error: expected '$', got ':'\r\n"),
    (b"*2\r\n$4\r\nECHO\r\n+hi\r\n", b"-ERR Protocol error: expected '$', got '+'\r\n"),
    (b'ECHO "unbalanced\r\n', b"-ERR Protocol error: unbalanced quotes in request\r\n"),
    (b"x" * (64 * 1024 + 1), b"-ERR Protocol error: too big inline request\r\n"),
]


@pytest.mark.parametrize("data,reply", MALFORMED, ids=lambda v: repr(v[:24]) if isinstance(v, bytes) else None)
def test_malformed_input_closes_connection(server, r, raw, data, reply):
    r.set("sentinel", "intact")
    c = raw()
    c.send(data)
    got = c.read_until_closed()
    assert got.startswith(b"-ERR Protocol error")
    assert got == reply
    healthy(server, r)


def test_protocol_error_after_valid_commands(server, r, raw):
    r.set("sentinel", "intact")
    c = raw()
    c.send(b"*1\r\n$4\r\nPING\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*1\r\n:7\r\n*1\r\n$4\r\nPING\r\n")
    assert c.read_until_closed() == b"+PONG\r\n+OK\r\n-ERR Protocol error: expected '$', got ':'\r\n"
    assert r.get("k") == b"v"
    healthy(server, r)


def test_bulk_above_configured_proto_max_bulk_len(make_server):
    srv = make_server({"proto-max-bulk-len": "1mb"})
    writer = srv.client()
    try:
        writer.set("sentinel", "intact")
        c = srv.raw()
        c.send(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % (1024 * 1024 + 1))
        assert c.read_until_closed() == b"-ERR Protocol error: invalid bulk length\r\n"
        c.close()
        c = srv.raw()
        value = b"z" * (1024 * 1024)  # exactly the limit is fine
        assert c.cmd_raw("SET", "k", value) == b"+OK\r\n"
        assert c.cmd("STRLEN", "k") == len(value)
        c.close()
        healthy(srv, writer)
    finally:
        writer.close()


def test_garbage_bytes_do_not_hurt_the_server(server, r, raw):
    r.set("sentinel", "intact")
    c = raw()
    c.send(b"\x00\xff")
    c.close()
    c = raw()
    c.send(b"\x00\xff\x00\xff\xfe\xfd" * 100)
    c.close()
    healthy(server, r)


@pytest.mark.parametrize(
    "data",
    [
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\nabc",
        b"*3\r\n$3\r\nSET\r\n$1\r\nk",
        b"*3\r\n$3\r\nSE",
        b"*3\r\n",
        b"*3",
        b"SET k incomplete-inline",
        b"*1\r\n$512\r\n",
    ],
    ids=repr,
)
def test_truncated_frame_then_close(server, r, raw, data):
    r.set("sentinel", "intact")
    c = raw()
    c.send(data)
    assert c.nothing_pending()  # the server waits for the rest of the frame
    c.close()
    healthy(server, r)
    assert r.exists("k") == 0


def test_many_connections_open_and_close(server, r, raw):
    r.set("sentinel", "intact")
    conns = [raw() for _ in range(50)]
    for i, c in enumerate(conns):
        c.send(b"*3\r\n$3\r\nSET\r\n$%d\r\nc%d\r\n$1\r\nv\r\n" % (len(str(i)) + 1, i))
    for c in conns:
        assert c.read_raw() == b"+OK\r\n"
    for c in conns:
        c.close()
    assert r.dbsize() == 51
    healthy(server, r)


# --------------------------------------------------------------------------------------------------------------
# redis-cli
# --------------------------------------------------------------------------------------------------------------


def test_redis_cli_set_get(server, r, redis_cli):
    assert redis_cli(server.port, "set", "a", "b") == "OK\n"
    assert redis_cli(server.port, "get", "a") == "b\n"
    assert r.get("a") == b"b"
    assert redis_cli(server.port, "ping") == "PONG\n"
    assert redis_cli(server.port, "incr", "n") == "1\n"
    assert redis_cli(server.port, "get", "missing") == "\n"
    assert redis_cli(server.port, "mget", "a", "missing", "n") == "b\n\n1\n"
    assert redis_cli(server.port, "dbsize") == "2\n"


def test_redis_cli_error_output(server, redis_cli):
    out = redis_cli(server.port, "get")
    assert out == "ERR wrong number of arguments for 'get' command\n\n"


def test_redis_cli_pipe(server, r, redis_cli, resp):
    n = 2000
    payload = b"".join(resp.encode("SET", f"p{i}", f"v{i}") for i in range(n))
    out = redis_cli(server.port, "--pipe", input=payload)
    assert "All data transferred" in out
    assert f"errors: 0, replies: {n}" in out
    assert r.dbsize() == n
    assert r.get("p1999") == b"v1999"
