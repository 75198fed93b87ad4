"""Subcommands as first-class commands, checked against kvstrata and a real redis-server
(``KVSTRATA_TEST_TARGET=redis``): arity and unknown-subcommand errors, INFO commandstats rows per subcommand
(``cmdstat_config|get`` with calls, rejected and failed calls), COMMAND INFO/DOCS/LIST/GETKEYS/COUNT by
``container|sub`` names, ACL rules on subcommands (``-config|set``) and CLIENT LIST's ``cmd=``.

The expectations were read off redis-server 7.0.15; each case fails on either target if the two differ."""

import pytest


def arity(cmd):
    return f"ERR wrong number of arguments for '{cmd}' command"


def syntax(sub, container):
    """Redis's addReplySubcommandSyntaxError: a subcommand handler given more arguments than it takes."""
    return f"ERR unknown subcommand or wrong number of arguments for '{sub}'. Try {container} HELP."


def commandstats(c):
    """INFO commandstats as {name: (calls, rejected_calls, failed_calls)} (times left out: they vary)."""
    out = {}
    for line in c.cmd("INFO", "commandstats").decode().split("\r\n"):
        if line.startswith("cmdstat_"):
            name, _, fields = line.removeprefix("cmdstat_").partition(":")
            f = dict(kv.split("=") for kv in fields.split(","))
            out[name] = (int(f["calls"]), int(f["rejected_calls"]), int(f["failed_calls"]))
    return out


def as_map(reply):
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


@pytest.mark.parametrize(("args", "error"), [
    (("CONFIG",), arity("config")),
    (("CONFIG", "GET"), arity("config|get")),
    (("config", "set", "maxmemory"), arity("config|set")),
    (("CONFIG", "RESETSTAT", "x"), arity("config|resetstat")),
    (("CONFIG", "HELP", "x"), arity("config|help")),
    (("CLIENT", "HELP", "x"), arity("client|help")),
    (("CLIENT", "ID", "x"), arity("client|id")),
    (("MEMORY", "USAGE"), arity("memory|usage")),
    (("ACL", "WHOAMI", "x"), arity("acl|whoami")),
    (("COMMAND", "COUNT", "x"), arity("command|count")),
    (("COMMAND", "GETKEYS", "get"), arity("command|getkeys")),
    (("SLOWLOG", "LEN", "x"), arity("slowlog|len")),
    # variadic subcommands whose handler takes a bounded number of arguments
    (("SLOWLOG", "GET", "1", "2"), syntax("GET", "SLOWLOG")),
    (("slowlog", "get", "1", "2", "3"), syntax("get", "SLOWLOG")),
    (("ACL", "CAT", "read", "write"), syntax("CAT", "ACL")),
    (("acl", "GenPass", "64", "x"), syntax("GenPass", "ACL")),  # both names as sent
    # unknown subcommands: the container as sent, upper-cased; the name as sent, cut at 128 bytes
    (("config", "foo"), "ERR unknown subcommand 'foo'. Try CONFIG HELP."),
    (("cLiEnT", "NoSuch", "x"), "ERR unknown subcommand 'NoSuch'. Try CLIENT HELP."),
    (("MEMORY", "x" * 200), f"ERR unknown subcommand '{'x' * 128}'. Try MEMORY HELP."),
    (("LATENCY", "a\r\nb"), "ERR unknown subcommand 'a  b'. Try LATENCY HELP."),
])
def test_subcommand_errors_as_redis(raw, resp, args, error):
    c = raw()
    assert c.cmd(*args) == resp.Error(error)
    assert c.cmd("PING") == "PONG"


def test_commandstats_per_subcommand(raw):
    """Redis 7 counts a container's calls on the subcommand only; refusals before running (arity) are
    rejected_calls, errors from the handler failed_calls; an unknown subcommand and INFO itself (counted after it
    replies) do not show."""
    c = raw()
    assert c.cmd("CONFIG", "RESETSTAT") == "OK"
    assert c.cmd("CONFIG", "GET", "timeout") == [b"timeout", b"0"]
    assert isinstance(c.cmd("CLIENT", "LIST"), bytes)
    c.cmd("CLIENT", "ID")
    c.cmd("client", "id")
    c.cmd("CONFIG", "GET")  # wrong arity: rejected
    c.cmd("CONFIG")  # wrong arity of the container itself
    c.cmd("CONFIG", "NOSUCH")  # unknown: no row
    c.cmd("SLOWLOG", "GET", "1", "2")  # the handler's error: a failed call
    c.cmd("GET")
    assert commandstats(c) == {
        "config|resetstat": (1, 0, 0),
        "config|get": (1, 1, 0),
        "config": (0, 1, 0),
        "client|list": (1, 0, 0),
        "client|id": (2, 0, 0),
        "slowlog|get": (1, 0, 1),
        "get": (0, 1, 0),
    }
    stats = dict(line.split(":", 1) for line in c.cmd("INFO", "stats").decode().split("\r\n") if ":" in line)
    assert int(stats["total_commands_processed"]) == 1 + 1 + 1 + 2 + 1 + 1  # calls, INFO commandstats included
    latency = c.cmd("INFO", "latencystats").decode()
    assert "latency_percentiles_usec_client|id:" in latency and "latency_percentiles_usec_client:" not in latency


def test_commandstats_oom_refusal_is_a_rejected_call(raw, resp):
    c = raw()
    saved = c.cmd("CONFIG", "GET", "maxmemory", "maxmemory-policy")
    try:
        assert c.cmd("CONFIG", "SET", "maxmemory-policy", "noeviction", "maxmemory", "1") == "OK"
        assert c.cmd("CONFIG", "RESETSTAT") == "OK"
        assert c.cmd("SET", "k", "v") == resp.Error("OOM command not allowed when used memory > 'maxmemory'.")
        assert c.cmd("GET", "k") is None
        stats = commandstats(c)
        assert (stats["set"], stats["get"]) == ((0, 1, 0), (1, 0, 0))
    finally:
        assert c.cmd("CONFIG", "SET", *saved) == "OK"


def test_client_list_names_the_subcommand(raw):
    c = raw()
    c.cmd("CLIENT", "SETNAME", "subs")
    me = next(line for line in c.cmd("CLIENT", "LIST").decode().splitlines() if "name=subs " in line)
    assert " cmd=client|list " in me
    assert " cmd=client|info " in c.cmd("CLIENT", "INFO").decode()


def test_command_info_of_containers_and_subcommands(raw):
    c = raw()
    (config,) = c.cmd("COMMAND", "INFO", "config")
    name, arity_, flags, first, last, step, categories, tips, key_specs, subcommands = config
    assert (name, arity_, flags, first, last, step, key_specs) == (b"config", -2, [], 0, 0, 0, [])
    assert categories == ["@slow"]  # a container carries none of its subcommands' categories
    subs = {s[0]: s for s in subcommands}
    assert {b"config|get", b"config|set", b"config|resetstat", b"config|rewrite", b"config|help"} <= set(subs)
    assert (subs[b"config|get"][1], subs[b"config|set"][1], subs[b"config|resetstat"][1]) == (-3, -4, 2)
    assert {"@admin", "@slow", "@dangerous"} <= set(subs[b"config|get"][6])
    # a subcommand by its full name (any case); unknown names are nulls
    got, nosuch, no_sub, not_container = c.cmd("COMMAND", "INFO", "CONFIG|GET", "nosuch", "config|nosuch", "get|x")
    assert got[:2] == [b"config|get", -3] and got[9] == []
    assert (nosuch, no_sub, not_container) == (None, None, None)
    (usage,) = c.cmd("COMMAND", "INFO", "memory|usage")
    assert usage[:2] == [b"memory|usage", -3] and usage[3:6] == [2, 2, 1]


def test_command_docs_count_list_getkeys(raw):
    c = raw()
    docs = as_map(c.cmd("COMMAND", "DOCS", "config|get", "nosuch"))
    assert list(docs) == [b"config|get"]
    assert as_map(docs[b"config|get"])[b"group"] == b"server"
    container = as_map(as_map(c.cmd("COMMAND", "DOCS", "slowlog"))[b"slowlog"])
    assert {b"slowlog|get", b"slowlog|len", b"slowlog|reset", b"slowlog|help"} <= set(as_map(container[b"subcommands"]))
    # COMMAND and COMMAND COUNT: top-level commands only; COMMAND LIST: containers followed by their subcommands
    everything = c.cmd("COMMAND")
    assert c.cmd("COMMAND", "COUNT") == len(everything)
    assert not any(b"|" in info[0] for info in everything)
    names = c.cmd("COMMAND", "LIST")
    assert b"config|get" in names and names.index(b"config") < names.index(b"config|get")
    assert len(names) == len(everything) + sum(len(info[9]) for info in everything)
    assert sorted(c.cmd("COMMAND", "LIST", "FILTERBY", "PATTERN", "slowlog*")) == [
        b"slowlog", b"slowlog|get", b"slowlog|help", b"slowlog|len", b"slowlog|reset"]
    # a subcommand's key spec: MEMORY USAGE names one key
    assert c.cmd("COMMAND", "GETKEYS", "MEMORY", "USAGE", "k1") == [b"k1"]
    assert c.cmd("COMMAND", "GETKEYS", "MEMORY", "NOSUCH", "k1").message == "ERR Invalid command specified"
    assert c.cmd("COMMAND", "GETKEYS", "MEMORY", "USAGE").message == (
        "ERR Invalid number of arguments specified for command")


def test_acl_rules_on_subcommands(make_server, resp):
    """``+@all -config|set`` and ``+config|get`` alone; a refusal (NOPERM, NOAUTH) is a rejected call of the
    subcommand."""
    srv = make_server({"requirepass": "adminpw"})
    admin = srv.raw()
    try:
        assert admin.cmd("CONFIG", "GET", "maxmemory") == resp.Error("NOAUTH Authentication required.")
        assert admin.cmd("AUTH", "adminpw") == "OK"
        assert admin.cmd("CONFIG", "RESETSTAT") == "OK"
        assert admin.cmd("ACL", "SETUSER", "ops", "on", ">pw", "~*", "+@all", "-config|set") == "OK"
        assert admin.cmd("ACL", "SETUSER", "ro", "on", ">pw", "~*", "+config|get") == "OK"
        ops, ro = srv.raw(), srv.raw()
        assert ops.cmd("AUTH", "ops", "pw") == "OK" and ro.cmd("AUTH", "ro", "pw") == "OK"
        assert ops.cmd("CONFIG", "GET", "timeout") == [b"timeout", b"0"]
        assert ops.cmd("CONFIG", "SET", "timeout", "5") == resp.Error(
            "NOPERM this user has no permissions to run the 'config|set' command")
        assert ro.cmd("CONFIG", "GET", "timeout") == [b"timeout", b"0"]
        assert ro.cmd("CONFIG", "RESETSTAT") == resp.Error(
            "NOPERM this user has no permissions to run the 'config|resetstat' command")
        assert ro.cmd("CLIENT", "ID") == resp.Error(
            "NOPERM this user has no permissions to run the 'client|id' command")
        # ACL DRYRUN resolves the subcommand as the dispatcher does
        assert admin.cmd("ACL", "DRYRUN", "ops", "CONFIG", "SET", "timeout", "5") == (
            b"This user has no permissions to run the 'config|set' command")
        assert admin.cmd("ACL", "DRYRUN", "ops", "config", "get", "timeout") == "OK"
        assert admin.cmd("ACL", "DRYRUN", "ops", "CONFIG", "GET") == resp.Error(
            "ERR wrong number of arguments for 'config|get' command")
        assert admin.cmd("ACL", "DRYRUN", "ops", "CONFIG", "nosuch") == resp.Error("ERR Command 'CONFIG' not found")
        assert admin.cmd("ACL", "DRYRUN", "ro", "MEMORY", "USAGE", "k") == (
            b"This user has no permissions to run the 'memory|usage' command")
        rules = as_map(admin.cmd("ACL", "GETUSER", "ro"))[b"commands"].split()
        assert sorted(rules) == [b"+config|get", b"-@all"]
        stats = commandstats(admin)
        assert stats["config|set"] == (0, 1, 0)
        assert stats["config|get"] == (2, 0, 0)
        assert stats["config|resetstat"][1] == 1
        assert stats["client|id"] == (0, 1, 0)
        assert stats["acl|setuser"] == (2, 0, 0)
        ops.close()
        ro.close()
    finally:
        admin.close()

