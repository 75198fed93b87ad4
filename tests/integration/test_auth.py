"""requirepass: NOAUTH before AUTH, WRONGPASS texts, AUTH / HELLO AUTH, RESET, and limits before AUTH."""

import pytest
import redis

PASSWORD = "s3cret pass"  # a space in it: passwords are opaque arguments
NOAUTH = "NOAUTH Authentication required."
WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."
HELLO_NOAUTH = (
    "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO{} AUTH <user> <pass> "
    "option can be used to authenticate the client and select the RESP protocol version at the same time"
)
# Redis 7.0 writes "the HELLO AUTH <user> <pass> option", Redis 7.2 "the HELLO <proto> AUTH <user> <pass> option".
HELLO_NOAUTH_TEXTS = (HELLO_NOAUTH.format(""), HELLO_NOAUTH.format(" <proto>"))


@pytest.fixture(scope="module")
def auth_server(module_make_server):
    return module_make_server({"requirepass": PASSWORD})


@pytest.fixture
def authed(auth_server):
    """A redis-py client that authenticates on connect; the keyspace starts empty."""
    client = auth_server.client(password=PASSWORD)
    client.flushall()
    yield client
    client.close()


@pytest.mark.parametrize(
    "args",
    [["PING"], ["GET", "k"], ["SET", "k", "v"], ["DBSIZE"], ["CLIENT", "ID"], ["SELECT", "0"], ["ECHO", "a"],
     ["CONFIG", "GET", "maxmemory"], ["INFO"], ["KEYS", "*"], ["FLUSHALL"]],
)
def test_commands_before_auth(auth_server, authed, raw, resp, args):
    authed.set("k", "original")
    c = raw(auth_server)
    assert c.cmd(*args) == resp.Error(NOAUTH)
    assert c.cmd_raw("PING") == b"-NOAUTH Authentication required.\r\n"  # the connection stays open
    assert authed.get("k") == b"original"


def test_unknown_command_and_arity_are_checked_before_auth(auth_server, raw, resp):
    # Redis looks the command up and checks its arity before it checks authentication.
    c = raw(auth_server)
    assert c.cmd("nosuchcommand", "x") == resp.Error(
        "ERR unknown command 'nosuchcommand', with args beginning with: 'x' ")
    assert c.cmd("GET") == resp.Error("ERR wrong number of arguments for 'get' command")
    assert c.cmd("PING") == resp.Error(NOAUTH)


def test_inline_before_auth(auth_server, raw):
    c = raw(auth_server)
    assert c.inline(b"PING\r\n") == b"-NOAUTH Authentication required.\r\n"
    assert c.inline(b"SET k v\r\n") == b"-NOAUTH Authentication required.\r\n"


def test_redis_py_without_password(auth_server, expect_error):
    client = auth_server.client()
    try:
        with expect_error(NOAUTH, redis.AuthenticationError):
            client.get("k")
    finally:
        client.close()


def test_wrong_password(auth_server, raw, resp):
    c = raw(auth_server)
    assert c.cmd_raw("AUTH", "nope") == b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    assert c.cmd("AUTH", "default", "nope") == resp.Error(WRONGPASS)
    assert c.cmd("AUTH", "someone", PASSWORD) == resp.Error(WRONGPASS)
    assert c.cmd("AUTH", "") == resp.Error(WRONGPASS)
    assert c.cmd("AUTH", PASSWORD.upper()) == resp.Error(WRONGPASS)
    assert c.cmd("PING") == resp.Error(NOAUTH)


def test_redis_py_wrong_password(auth_server, expect_error):
    client = auth_server.client(password="nope")
    try:
        with expect_error(WRONGPASS, redis.AuthenticationError):
            client.ping()
    finally:
        client.close()


def test_auth_then_commands_work(auth_server, authed, raw):
    c = raw(auth_server)
    assert c.cmd_raw("AUTH", PASSWORD) == b"+OK\r\n"
    assert c.cmd_raw("SET", "k", "v") == b"+OK\r\n"
    assert c.cmd("GET", "k") == b"v"
    assert authed.get("k") == b"v"
    # Authenticating again (right or wrong) keeps the session usable with the right password.
    assert c.cmd_raw("AUTH", "default", PASSWORD) == b"+OK\r\n"
    assert c.cmd_raw("PING") == b"+PONG\r\n"


def test_failed_auth_after_success_keeps_session(auth_server, raw, resp):
    c = raw(auth_server)
    assert c.cmd_raw("AUTH", PASSWORD) == b"+OK\r\n"
    assert c.cmd("AUTH", "wrong") == resp.Error(WRONGPASS)
    assert c.cmd_raw("PING") == b"+PONG\r\n"


def test_auth_pipelined_with_commands(auth_server, raw, resp):
    c = raw(auth_server)
    c.send(resp.encode("GET", "k") + resp.encode("AUTH", PASSWORD) + resp.encode("SET", "k", "1")
           + resp.encode("GET", "k"))
    assert c.read_reply() == resp.Error(NOAUTH)
    assert c.read_raw() == b"+OK\r\n"
    assert c.read_raw() == b"+OK\r\n"
    assert c.read_raw() == b"$1\r\n1\r\n"


def test_auth_syntax(auth_server, raw, resp):
    c = raw(auth_server)
    assert c.cmd("AUTH") == resp.Error("ERR wrong number of arguments for 'auth' command")
    assert c.cmd("AUTH", "a", "b", "c") == resp.Error("ERR syntax error")


def test_redis_py_with_password(authed):
    assert authed.ping() is True
    assert authed.set("k", "v") is True
    assert authed.get("k") == b"v"


def test_hello_before_auth(auth_server, raw, resp):
    c = raw(auth_server)
    for args in (["HELLO"], ["HELLO", "3"], ["HELLO", "2", "SETNAME", "x"]):
        reply = c.cmd(*args)
        assert isinstance(reply, resp.Error) and reply.message in HELLO_NOAUTH_TEXTS, reply
    assert c.cmd("HELLO", "3", "AUTH", "default", "wrong") == resp.Error(WRONGPASS)
    assert c.cmd("HELLO", "2", "AUTH", "nobody", PASSWORD) == resp.Error(WRONGPASS)
    assert c.cmd("PING") == resp.Error(NOAUTH)


def test_hello_3_auth(auth_server, raw):
    c = raw(auth_server)
    reply = c.cmd("HELLO", "3", "AUTH", "default", PASSWORD)
    assert isinstance(reply, dict)
    assert reply[b"proto"] == 3
    assert isinstance(reply[b"id"], int)
    assert c.cmd_raw("GET", "nope") == b"_\r\n"
    assert c.cmd_raw("PING") == b"+PONG\r\n"


def test_hello_auth_setname(auth_server, raw):
    c = raw(auth_server)
    reply = c.cmd("HELLO", "2", "AUTH", "default", PASSWORD, "SETNAME", "authed-client")
    assert isinstance(reply, list) and b"proto" in reply
    assert c.cmd("CLIENT", "GETNAME") == b"authed-client"


def test_redis_py_resp3_with_password(auth_server):
    client = auth_server.client(protocol=3, password=PASSWORD)
    try:
        assert client.ping() is True
        assert client.set("k3", "v") is True
        assert client.get("k3") == b"v"
    finally:
        client.close()


def test_reset_deauthenticates(auth_server, raw, resp):
    c = raw(auth_server)
    assert c.cmd_raw("AUTH", PASSWORD) == b"+OK\r\n"
    assert c.cmd_raw("PING") == b"+PONG\r\n"
    assert c.cmd_raw("RESET") == b"+RESET\r\n"
    assert c.cmd("PING") == resp.Error(NOAUTH)
    assert c.cmd_raw("AUTH", PASSWORD) == b"+OK\r\n"
    assert c.cmd_raw("PING") == b"+PONG\r\n"


def test_quit_and_reset_before_auth(auth_server, raw):
    c = raw(auth_server)
    assert c.cmd_raw("RESET") == b"+RESET\r\n"
    assert c.cmd_raw("QUIT") == b"+OK\r\n"
    assert c.read_until_closed() == b""


@pytest.mark.parametrize(
    "data,reply",
    [
        (b"*11\r\n", b"-ERR Protocol error: unauthenticated multibulk length\r\n"),
        (b"*1\r\n$16385\r\n", b"-ERR Protocol error: unauthenticated bulk length\r\n"),
    ],
)
def test_request_limits_before_auth(auth_server, authed, raw, data, reply):
    authed.set("sentinel", "intact")
    c = raw(auth_server)
    c.send(data)
    assert c.read_until_closed() == reply
    assert authed.get("sentinel") == b"intact"


def test_request_limits_lifted_after_auth(auth_server, authed, raw, resp):
    c = raw(auth_server)
    # Within the limits before AUTH: up to 10 arguments and 16 KiB bulk strings.
    assert c.cmd("ECHO", "x" * 16384) == resp.Error(NOAUTH)
    assert c.cmd("MSET", *["a"] * 9) == resp.Error(NOAUTH)
    assert c.cmd_raw("AUTH", PASSWORD) == b"+OK\r\n"
    big = b"y" * 100_000
    assert c.cmd_raw("SET", "big", big) == b"+OK\r\n"
    args = [x for i in range(50) for x in (f"k{i}", "v")]
    assert c.cmd_raw("MSET", *args) == b"+OK\r\n"
    assert authed.get("big") == big


@pytest.mark.parametrize("auth", [
    ["AUTH", PASSWORD], ["HELLO", "2", "AUTH", "default", PASSWORD], ["AUTH", "wrong", PASSWORD],
], ids=["auth", "hello", "auth-twice"])
def test_pipelined_auth_lifts_the_limits_for_what_follows(auth_server, authed, raw, auth):
    """As Redis parses each command after the one before it ran: AUTH and a large value sent in one write (Redis's
    MIGRATE sends AUTH, SELECT and its RESTOREs so) is accepted; after a failed AUTH the limits hold."""
    from tests.conftest import encode_command

    c = raw(auth_server)
    big = b"y" * 100_000
    wrong_first = auth[1] == "wrong"
    first = [["AUTH", "wrong"]] if wrong_first else []
    auths = first + [["AUTH", PASSWORD] if wrong_first else auth]
    c.send(b"".join(encode_command(*a) for a in auths) + encode_command("SET", "big", big)
           + encode_command("STRLEN", "big"))
    replies = [c.read_raw() for _ in range(len(auths) + 2)]
    assert replies[-2:] == [b"+OK\r\n", b":100000\r\n"], replies
    assert authed.get("big") == big
    d = raw(auth_server)
    d.send(encode_command("AUTH", "wrong") + encode_command("SET", "big", b"z" * 20_000))
    assert d.read_until_closed() == (b"-" + WRONGPASS.encode() + b"\r\n"
                                     b"-ERR Protocol error: unauthenticated bulk length\r\n")
    assert authed.get("big") == big


def test_auth_without_password_configured(r, expect_error):
    with expect_error(
        "ERR AUTH <password> called without any password configured for the default user. "
        "Are you sure your configuration is correct?",
        redis.AuthenticationError,
    ):
        r.execute_command("AUTH", "anything")
    assert r.ping() is True


def test_redis_cli_with_password(auth_server, authed, redis_cli):
    assert redis_cli(auth_server.port, "--no-auth-warning", "-a", PASSWORD, "set", "cli", "yes") == "OK\n"
    assert authed.get("cli") == b"yes"
    assert redis_cli(auth_server.port, "get", "cli") == "NOAUTH Authentication required.\n\n"
