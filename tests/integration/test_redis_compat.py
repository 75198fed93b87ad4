"""Redis 7 compatibility of introspection commands, checked the same way against kvstrata and a real
redis-server (``KVSTRATA_TEST_TARGET=redis``): CONFIG SET error texts and order, CLIENT KILL filters and
errors, CLIENT REPLY ON|OFF|SKIP, CLIENT LIST qbuf of the running command.

The expectations were read off redis-server 7.0.15; each case fails on either target if the two differ."""

import pytest
from tests.integration.polling import wait_for

SET_FAILED = "ERR CONFIG SET failed (possibly related to argument '{}') - {}"


# --------------------------------------------------------------------------------------------------------------
# CONFIG SET
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "error"), [
    (("foo", "bar"), "ERR Unknown option or number of arguments for CONFIG SET - 'foo'"),
    (("timeout", "5", "foo", "1"), "ERR Unknown option or number of arguments for CONFIG SET - 'foo'"),
    (("databases", "3"), SET_FAILED.format("databases", "can't set immutable config")),
    # the first problem found wins: an immutable name before an unknown one
    (("databases", "3", "foo", "1"), SET_FAILED.format("databases", "can't set immutable config")),
    (("foo", "1", "databases", "3"), "ERR Unknown option or number of arguments for CONFIG SET - 'foo'"),
    (("timeout", "5", "TIMEOUT", "6"), SET_FAILED.format("TIMEOUT", "duplicate parameter")),
    (("maxmemory", "10mb", "MaxMemory", "20mb"), SET_FAILED.format("MaxMemory", "duplicate parameter")),
    (("timeout", "5", "timeout", "6", "foo", "1"), SET_FAILED.format("timeout", "duplicate parameter")),
    # value errors name the parameter, not the spelling
    (("TIMEOUT", "abc"), SET_FAILED.format("timeout", "argument couldn't be parsed into an integer")),
    (("MAXMEMORY", "lots"), SET_FAILED.format("maxmemory", "argument must be a memory value")),
    (("timeout", "-1"), SET_FAILED.format("timeout", "argument must be between 0 and 2147483647 inclusive")),
    (("hz", "99999999999"), SET_FAILED.format("hz", "argument must be between 0 and 2147483647 inclusive")),
    (("maxclients", "0"), SET_FAILED.format("maxclients", "argument must be between 1 and 4294967295 inclusive")),
    (("slowlog-log-slower-than", "-2"),
     SET_FAILED.format("slowlog-log-slower-than", "argument must be between -1 and 9223372036854775807 inclusive")),
    (("slowlog-max-len", "-1"),
     SET_FAILED.format("slowlog-max-len", "argument must be between 0 and 9223372036854775807 inclusive")),
    (("latency-monitor-threshold", "-1"),
     SET_FAILED.format("latency-monitor-threshold", "argument must be between 0 and 9223372036854775807 inclusive")),
    (("slowlog-max-len", "99999999999999999999"),
     SET_FAILED.format("slowlog-max-len", "argument couldn't be parsed into an integer")),
    (("proto-max-bulk-len", "1000"),
     SET_FAILED.format("proto-max-bulk-len", "argument must be between 1048576 and 9223372036854775807 inclusive")),
    (("client-query-buffer-limit", "1000"), SET_FAILED.format(
        "client-query-buffer-limit", "argument must be between 1048576 and 9223372036854775807 inclusive")),
    (("protected-mode", "maybe"), SET_FAILED.format("protected-mode", "argument must be 'yes' or 'no'")),
    (("loglevel", "loud"), SET_FAILED.format(
        "loglevel", "argument(s) must be one of the following: debug, verbose, notice, warning")),
])
def test_config_set_errors_as_redis(raw, resp, args, error):
    c = raw()
    before = c.cmd("CONFIG", "GET", "timeout", "maxmemory", "slowlog-max-len")
    assert c.cmd("CONFIG", "SET", *args) == resp.Error(error)
    assert c.cmd("CONFIG", "GET", "timeout", "maxmemory", "slowlog-max-len") == before  # nothing changed
    assert c.cmd("PING") == "PONG"


def test_config_set_writes_back_what_config_get_gives(raw, resp, server):
    """Every parameter CONFIG GET lists (but the ones Redis itself cannot change at runtime) can be set to the
    value it has; the values stay the same (Redis's "CONFIG sanity" test)."""
    c = raw()
    port = str(server.port)
    assert c.cmd("CONFIG", "SET", "port", port, "save", "", "appendonly", "no", "bind", "127.0.0.1") == "OK"
    assert c.cmd("CONFIG", "GET", "port") == [b"port", port.encode()]
    assert c.cmd("CONFIG", "SET", "databases", "1") == resp.Error(
        SET_FAILED.format("databases", "can't set immutable config"))
    skip = {"databases", "cluster-enabled", "aclfile", "requirepass", "daemonize", "dir", "logfile", "pidfile",
            "unixsocket", "unixsocketperm", "supervised", "dbfilename", "appendfilename", "appenddirname",
            "replicaof", "slaveof", "io-threads", "io-threads-do-reads", "set-proc-title", "syslog-enabled",
            "syslog-ident", "syslog-facility", "tcp-backlog", "always-show-logo", "disable-thp", "rdbchecksum",
            "enable-protected-configs", "enable-debug-command", "enable-module-command", "oom-score-adj",
            "oom-score-adj-values", "cluster-config-file", "cluster-port", "socket-mark-id", "bio-cpulist",
            "server-cpulist", "aof-rewrite-cpulist", "bgsave-cpulist", "client-default-resp"}
    before = c.cmd("CONFIG", "GET", "*")
    values = {k.decode(): v for k, v in zip(before[::2], before[1::2], strict=True)}
    for name, value in values.items():
        if name.replace("_", "-") not in skip and not name.startswith("tls-"):
            assert (name, c.cmd("CONFIG", "SET", name, value)) == (name, "OK")
    assert c.cmd("CONFIG", "GET", "*") == before


def test_config_hz_is_brought_into_range(raw):
    c = raw()
    for given, used in (("0", b"1"), ("100000", b"500"), ("10", b"10")):
        assert c.cmd("CONFIG", "SET", "hz", given) == "OK"
        assert c.cmd("CONFIG", "GET", "hz") == [b"hz", used]


def test_config_set_failure_restores_earlier_values(raw, resp):
    c = raw()
    assert c.cmd("CONFIG", "SET", "timeout", "0") == "OK"
    assert c.cmd("CONFIG", "SET", "timeout", "7", "hz", "-1") == resp.Error(
        SET_FAILED.format("hz", "argument must be between 0 and 2147483647 inclusive"))
    assert c.cmd("CONFIG", "GET", "timeout") == [b"timeout", b"0"]
    assert c.cmd("CONFIG", "SET", "timeout", "7", "slowlog-max-len", "64") == "OK"
    assert c.cmd("CONFIG", "GET", "timeout") == [b"timeout", b"7"]
    assert c.cmd("CONFIG", "SET", "timeout", "0", "slowlog-max-len", "128") == "OK"


# --------------------------------------------------------------------------------------------------------------
# CLIENT KILL
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "error"), [
    (("TYPE", "foo"), "ERR Unknown client type 'foo'"),
    (("TYPE", "normal", "USER", "nobody"), "ERR No such user 'nobody'"),
    (("ID", "0"), "ERR client-id should be greater than 0"),
    (("ID", "abc"), "ERR client-id should be greater than 0"),
    (("SKIPME", "maybe"), "ERR syntax error"),
    (("NOSUCHFILTER", "10"), "ERR syntax error"),
    (("TYPE",), "ERR No such client"),  # one argument: the old form, an address
    (("TYPE", "normal", "ID"), "ERR syntax error"),
    (("1.2.3.4:5",), "ERR No such client"),
])
def test_client_kill_errors(raw, resp, args, error):
    c = raw()
    assert c.cmd("CLIENT", "KILL", *args) == resp.Error(error)
    assert c.cmd("PING") == "PONG"


def test_client_kill_filters(raw):
    me, other = raw(), raw()
    other_id = other.cmd("CLIENT", "ID")
    for kind in ("master", "replica", "slave", "pubsub", "PubSub"):
        assert me.cmd("CLIENT", "KILL", "TYPE", kind) == 0
    assert me.cmd("CLIENT", "KILL", "USER", "default", "ID", str(other_id + 1000)) == 0
    assert other.cmd("PING") == "PONG"
    assert me.cmd("CLIENT", "KILL", "TYPE", "Normal", "USER", "default", "ID", str(other_id)) == 1
    other.read_until_closed()
    assert me.cmd("PING") == "PONG"


def test_client_kill_self_replies_then_closes(raw):
    c = raw()
    assert c.cmd("CLIENT", "KILL", "ID", str(c.cmd("CLIENT", "ID")), "SKIPME", "no") == 1
    assert c.read_until_closed() == b""
    c = raw()
    addr = next(f.split("=", 1)[1] for f in c.cmd("CLIENT", "INFO").decode().split() if f.startswith("addr="))
    c.send(b"CLIENT KILL " + addr.encode() + b"\r\nPING\r\n")
    assert c.read_until_closed() == b"+OK\r\n"  # the PING after it never runs


@pytest.mark.kvstrata_only
def test_client_kill_maxage(raw, resp):
    """MAXAGE is Redis 7.4's (7.0 answers a syntax error); texts and behaviour as in Redis 7.4."""
    c = raw()
    assert c.cmd("CLIENT", "KILL", "MAXAGE", "str") == resp.Error("ERR maxage is not an integer or out of range")
    assert c.cmd("CLIENT", "KILL", "MAXAGE", "9999999999999999999") == resp.Error(
        "ERR maxage is not an integer or out of range")
    assert c.cmd("CLIENT", "KILL", "MAXAGE", "-1") == resp.Error("ERR maxage should be greater than 0")
    old = raw()
    old_id = old.cmd("CLIENT", "ID")
    assert c.cmd("CLIENT", "KILL", "ID", str(old_id), "MAXAGE", "100000") == 0
    wait_for(lambda: int(old.cmd("CLIENT", "INFO").decode().split(" age=")[1].split(" ")[0]) >= 1,
             what="a client one second old")
    assert c.cmd("CLIENT", "KILL", "ID", str(old_id), "MAXAGE", "1") == 1
    old.read_until_closed()


# --------------------------------------------------------------------------------------------------------------
# CLIENT REPLY
# --------------------------------------------------------------------------------------------------------------


def test_client_reply_on_off_skip(raw, resp):
    c = raw()
    assert c.cmd("CLIENT", "REPLY", "maybe") == resp.Error("ERR syntax error")
    assert c.cmd("CLIENT", "REPLY", "ON") == "OK"
    script = [
        ("CLIENT", "REPLY", "OFF"), ("PING",), ("SET", "k", "v"), ("NOSUCH",), ("GET",),
        ("CLIENT", "REPLY", "SKIP"),  # no effect while off
        ("CLIENT", "REPLY", "ON"),  # +OK
        ("CLIENT", "REPLY", "SKIP"), ("GET", "k"), ("ECHO", "a"),  # $1 a
        ("CLIENT", "REPLY", "SKIP"), ("CLIENT", "REPLY", "SKIP"), ("NOSUCH",), ("ECHO", "b"),  # $1 b
        ("CLIENT", "REPLY", "SKIP"), ("CLIENT", "REPLY", "ON"),  # ON clears the skip and answers: +OK
        ("CLIENT", "REPLY", "SKIP"), ("RESET",),  # RESET's own reply is skipped
        ("CLIENT", "REPLY", "OFF"), ("RESET",),  # RESET turns replies on again: +RESET
        ("GET", "k"),  # $1 v
    ]
    c.send(b"".join(resp.encode(*cmd) for cmd in script))
    assert [c.read_raw() for _ in range(6)] == [
        b"+OK\r\n", b"$1\r\na\r\n", b"$1\r\nb\r\n", b"+OK\r\n", b"+RESET\r\n", b"$1\r\nv\r\n"]
    assert c.nothing_pending()


@pytest.mark.kvstrata_only
def test_client_reply_off_then_kill_self_closes_silently(raw, resp):
    """Redis 7.0 leaves this connection open and deaf (close-after-reply with no reply to write never fires);
    kvstrata closes it."""
    c = raw()
    c.send(resp.encode("CLIENT", "REPLY", "OFF") + resp.encode("CLIENT", "KILL", "SKIPME", "no", "ID",
                                                                  str(c.cmd("CLIENT", "ID"))))
    assert c.read_until_closed() == b""
    c = raw()
    c.send(resp.encode("CLIENT", "REPLY", "OFF") + resp.encode("QUIT") + resp.encode("PING"))
    assert c.read_until_closed() == b""


def test_client_reply_resp3(server, resp):
    c = server.raw()
    try:
        assert isinstance(c.cmd("HELLO", "3"), dict)
        c.send(resp.encode("CLIENT", "REPLY", "SKIP") + resp.encode("CLIENT", "INFO") + resp.encode("ECHO", "x"))
        assert c.read_raw() == b"$1\r\nx\r\n"
        assert c.nothing_pending()
    finally:
        c.close()


# --------------------------------------------------------------------------------------------------------------
# CLIENT LIST / CLIENT INFO: the running command counts in qbuf and argv-mem
# --------------------------------------------------------------------------------------------------------------


def _fields(line):
    return dict(item.split("=", 1) for item in line.strip().split(" "))


def test_client_list_counts_running_command(raw):
    me, idle = raw(), raw()
    idle_id = idle.cmd("CLIENT", "ID")
    my_id = me.cmd("CLIENT", "ID")
    # "*2\r\n$6\r\nclient\r\n$4\r\nlist\r\n" is 26 bytes; argv-mem is the argument bytes, 6 + 4
    lines = {int(f["id"]): f for f in map(_fields, me.cmd("CLIENT", "LIST").decode().splitlines())}
    assert (lines[my_id]["qbuf"], lines[my_id]["argv-mem"], lines[my_id]["cmd"]) == ("26", "10", "client|list")
    assert (lines[idle_id]["qbuf"], lines[idle_id]["argv-mem"]) == ("0", "0")
    mine = _fields(me.cmd("CLIENT", "INFO").decode())
    assert (mine["qbuf"], mine["argv-mem"], mine["cmd"]) == ("26", "10", "client|info")
    # CLIENT LIST ID <me> 2 3: the bytes of the request as sent, and its argument bytes
    args = ("CLIENT", "LIST", "ID", str(my_id), "2", "3")
    only = _fields(me.cmd(*args).decode())
    assert int(only["qbuf"]) == len(f"*{len(args)}\r\n") + sum(len(f"${len(a)}\r\n{a}\r\n") for a in args)
    assert int(only["argv-mem"]) == sum(map(len, args))


# --------------------------------------------------------------------------------------------------------------
# INCRBYFLOAT: long double arithmetic and "%.17Lf" digits, as Redis
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("start", "delta", "expected"), [
    ("100001.5", "0.1", b"100001.60000000000000142"),
    ("1.5", "0.1", b"1.6"),
    ("0.1", "0.2", b"0.3"),
    ("5.0e3", "2.0e4", b"25000"),
    ("1", "1e-17", b"1.00000000000000001"),
    ("0", "-1e-18", b"0"),
    ("-1.5", "1.5", b"0"),
    ("0", "1e400", b"10000000000000000000281880683947586514586453433629052038625910693539685534008629862039363994848"
                   b"3241605220940539273176162002958227772592557340238289765933406610177974474345461739178624481166"
                   b"7497172377894382439159333804747067502624668440135923751360383034373548550524495596497902182503"
                   b"8280091068414947402456898653040951017512658092615827588920183472511643316591362664138176309734"
                   b"806343732497430221946880"),
])
def test_incrbyfloat_digits(raw, start, delta, expected):
    c = raw()
    assert c.cmd("SET", "f", start) == "OK"
    assert c.cmd("INCRBYFLOAT", "f", delta) == expected
    assert c.cmd("GET", "f") == expected


@pytest.mark.parametrize(("start", "delta", "error"), [
    ("0", "1e5000", "ERR value is not a valid float"),  # overflows a long double
    ("0", "1e-5000", "ERR value is not a valid float"),  # underflows to zero
    ("0", "abc", "ERR value is not a valid float"),
    ("1e4932", "1e4932", "ERR increment would produce NaN or Infinity"),
    ("0", "inf", "ERR increment would produce NaN or Infinity"),
])
def test_incrbyfloat_errors(raw, resp, start, delta, error):
    c = raw()
    assert c.cmd("SET", "f", start) == "OK"
    assert c.cmd("INCRBYFLOAT", "f", delta) == resp.Error(error)
    assert c.cmd("GET", "f") == start.encode()


def test_substr_is_getrange(raw, resp):
    c = raw()
    assert c.cmd("SET", "k", "Hello World") == "OK"
    for start, end in (("0", "4"), ("-3", "-1"), ("5", "3"), ("0", "-100"), ("-100", "100")):
        assert c.cmd("SUBSTR", "k", start, end) == c.cmd("GETRANGE", "k", start, end)
    assert c.cmd("SUBSTR", "k", "0", "4") == b"Hello"
    assert c.cmd("SUBSTR", "nokey", "0", "1") == b""
    assert c.cmd("SUBSTR", "k", "a", "1") == resp.Error("ERR value is not an integer or out of range")
    assert c.cmd("SUBSTR", "k", "0") == resp.Error("ERR wrong number of arguments for 'substr' command")


# --------------------------------------------------------------------------------------------------------------
# COPY
# --------------------------------------------------------------------------------------------------------------


def test_copy(raw, resp):
    c = raw()
    assert c.cmd("SET", "a", "1", "EX", "100") == "OK"
    assert c.cmd("SET", "b", "2") == "OK"
    assert c.cmd("COPY", "a", "c") == 1
    assert c.cmd("GET", "c") == b"1"
    assert 99 <= c.cmd("TTL", "c") <= 100  # the expiry comes along
    assert c.cmd("COPY", "a", "b") == 0  # exists, no REPLACE
    assert c.cmd("GET", "b") == b"2"
    assert c.cmd("COPY", "a", "b", "REPLACE", "DB", "0") == 1
    assert c.cmd("GET", "b") == b"1"
    assert c.cmd("APPEND", "a", "x") == 2  # the copy has its own bytes
    assert c.cmd("GET", "b") == b"1"
    assert c.cmd("COPY", "nokey", "x") == 0
    assert c.cmd("EXISTS", "x") == 0
    assert c.cmd("PERSIST", "a") == 1
    assert c.cmd("COPY", "a", "p") == 1
    assert c.cmd("TTL", "p") == -1


@pytest.mark.parametrize(("args", "error"), [
    (("a", "a"), "ERR source and destination objects are the same"),
    (("nokey", "nokey"), "ERR source and destination objects are the same"),
    (("a", "d", "DB", "1"), "ERR DB index is out of range"),
    (("a", "a", "DB", "1"), "ERR DB index is out of range"),  # options first
    (("a", "d", "DB", "abc"), "ERR value is not an integer or out of range"),
    (("a", "d", "DB", "99999999999"), "ERR value is out of range, value must between -2147483648 and 2147483647"),
    (("a", "d", "DB"), "ERR syntax error"),
    (("a", "d", "FOO"), "ERR syntax error"),
    (("a",), "ERR wrong number of arguments for 'copy' command"),
])
def test_copy_errors(raw, resp, args, error):
    c = raw()
    assert c.cmd("SET", "a", "1") == "OK"
    assert c.cmd("COPY", *args) == resp.Error(error)
    assert c.cmd("EXISTS", "d") == 0
