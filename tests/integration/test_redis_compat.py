"""Redis 7 compatibility of introspection commands, checked the same way against kvstrata and a real
redis-server (``KVSTRATA_TEST_TARGET=redis``): CONFIG SET error texts and order, CLIENT KILL filters and
errors, CLIENT REPLY ON|OFF|SKIP, CLIENT LIST qbuf of the running command.

The expectations were read off redis-server 7.0.15; each case fails on either target if the two differ."""

import pytest

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


def test_config_set_failure_restores_earlier_values(raw, resp):
    c = raw()
    assert c.cmd("CONFIG", "SET", "timeout", "0") == "OK"
    assert c.cmd("CONFIG", "SET", "timeout", "7", "hz", "-1") == resp.Error(
        SET_FAILED.format("hz", "argument must be between 0 and 2147483647 inclusive"))
    assert c.cmd("CONFIG", "GET", "timeout") == [b"timeout", b"0"]
    assert c.cmd("CONFIG", "SET", "timeout", "7", "slowlog-max-len", "64") == "OK"
    assert c.cmd("CONFIG", "GET", "timeout") == [b"timeout", b"7"]
    assert c.cmd("CONFIG", "SET", "timeout", "0", "slowlog-max-len", "128") == "OK"
