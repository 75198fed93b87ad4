"""MONITOR: the lines every monitor gets, checked against real Redis too (what is shown, hidden and redacted, the
quoting of every byte, transactions, a Unix-socket client, the monitor's own commands); kvstrata's cut of long
arguments, and a monitor that does not read being closed at the output limit while the server goes on."""

from __future__ import annotations

import os
import re
import socket

import pytest
from polling import wait_for
from tests.conftest import encode_command

LINE = re.compile(rb"^(\d+)\.(\d{6}) \[0 ([^\]]+)\] (.*)$", re.S)


def monitor_lines(mon, n: int) -> list[tuple[str, bytes]]:
    """The next ``n`` monitor lines as (address, quoted arguments); the timestamps must be well formed."""
    out = []
    for _ in range(n):
        frame = mon.read_raw()
        assert frame.startswith(b"+") and frame.endswith(b"\r\n"), frame
        match = LINE.match(frame[1:-2])
        assert match, frame
        out.append((match.group(3).decode(), match.group(4)))
    return out


def unix_cmd(path: str, *args) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(encode_command(*args))
        return s.recv(1024)


def test_monitor_lines_as_redis(make_server, tmp_path, raw, resp):
    sock = str(tmp_path / "s.sock")
    srv = make_server({"unixsocket": sock})
    mon, c = raw(srv), raw(srv)
    assert c.cmd("CLIENT", "SETNAME", "worker") == "OK"
    assert mon.cmd("MONITOR") == "OK"
    every_byte = bytes(range(256))
    assert c.cmd("SET", "k", every_byte) == "OK"
    assert c.cmd("GET", "k") == every_byte
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("INCR", "n") == "QUEUED"
    assert c.cmd("SET", "m", "1", "EX", "100") == "QUEUED"
    assert c.cmd("EXEC") == [1, "OK"]
    # Refused before they ran: not shown. Admin commands: not shown. Credentials: redacted.
    assert isinstance(c.cmd("NOSUCH", "x"), resp.Error)
    assert isinstance(c.cmd("GET"), resp.Error)
    assert c.cmd("CONFIG", "GET", "maxclients") != []
    assert isinstance(c.cmd("CLIENT", "LIST"), bytes | str)
    assert isinstance(c.cmd("AUTH", "user", "secret"), resp.Error)
    assert c.cmd("HELLO", "2", "SETNAME", "w2") != []
    assert c.cmd("HELLO", "2", "AUTH", "default", "secret") != []  # the default user takes any password
    assert c.cmd("INCR", "k") == resp.Error("ERR value is not an integer or out of range")  # ran: shown
    assert unix_cmd(sock, "PING") == b"+PONG\r\n"
    lines = monitor_lines(mon, 11)
    tcp = {a for a, _ in lines[:-1]}
    assert len(tcp) == 1 and tcp.pop().startswith("127.0.0.1:")
    assert lines[-1][0] == f"unix:{sock}"
    quoted = b"".join(b"\\x%02x" % b for b in range(0, 7)) + b"\\a\\b\\t\\n" + b"\\x0b\\x0c\\r" + \
        b"".join(b"\\x%02x" % b for b in range(14, 32)) + b' !\\"' + bytes(range(35, 92)) + b"\\\\" + \
        bytes(range(93, 127)) + b"".join(b"\\x%02x" % b for b in range(127, 256))
    assert [a for _, a in lines] == [
        b'"SET" "k" "' + quoted + b'"', b'"GET" "k"', b'"MULTI"', b'"INCR" "n"', b'"SET" "m" "1" "EX" "100"',
        b'"EXEC"', b'"AUTH" "(redacted)" "(redacted)"', b'"HELLO" "2" "SETNAME" "w2"',
        b'"HELLO" "2" "AUTH" "(redacted)" "(redacted)"', b'"INCR" "k"', b'"PING"']

    # The monitor itself: no keys; its own commands after their replies; MONITOR again is ignored; RESET ends it.
    assert mon.cmd("GET", "k") == resp.Error("ERR Replica can't interact with the keyspace")
    mon.send(encode_command("MONITOR") + encode_command("PING"))
    assert mon.read_reply() == "PONG"
    assert monitor_lines(mon, 1)[0][1] == b'"PING"'
    assert mon.cmd("RESET") == "RESET"
    assert c.cmd("SET", "after", "1") == "OK"
    assert mon.cmd("GET", "after") == b"1"  # an ordinary client again, and no line came for the SET
    # MONITOR inside a transaction is refused when EXEC runs it.
    assert c.cmd("MULTI") == "OK"
    assert c.cmd("MONITOR") == "QUEUED"
    assert c.cmd("EXEC") == [resp.Error("ERR MONITOR isn't allowed for DENY BLOCKING client")]


@pytest.mark.kvstrata_only
def test_monitor_cuts_long_arguments_and_shows_in_client_list(make_server, raw):
    srv = make_server({})
    mon, c = raw(srv), raw(srv)
    assert mon.cmd("MONITOR") == "OK"
    assert b" flags=O " in c.cmd("CLIENT", "LIST")
    value = b"\x00" + b"v" * (1024 * 1024 - 1)
    assert c.cmd("SET", "big", value) == "OK"
    assert c.cmd("SET", "edge", b"e" * 1024) == "OK"  # at the limit: shown whole
    lines = [a for _, a in monitor_lines(mon, 2)]
    assert lines[0] == b'"SET" "big" "\\x00' + b"v" * 63 + b'"...(1048576 bytes)'
    assert lines[1] == b'"SET" "edge" "' + b"e" * 1024 + b'"'


@pytest.mark.kvstrata_only
def test_a_monitor_that_does_not_read_is_closed_at_the_output_limit(make_server, raw):
    srv = make_server({"client-output-buffer-limit": "1mb"})
    mon, c = raw(srv), raw(srv)
    mon.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    assert mon.cmd("MONITOR") == "OK"
    # ~4 KB of quoted text per SET (random bytes are mostly \xHH): far more than the kernel buffers and the limit.
    batch = b"".join(encode_command("SET", f"k{i}", os.urandom(1000)) for i in range(200))
    r = srv.client()

    def monitoring() -> bool:
        return any("O" in cl.get("flags", "") for cl in r.client_list())

    for _ in range(30):
        c.send(batch)
        for _ in range(200):
            assert c.read_reply() == "OK"
        if not monitoring():
            break
    wait_for(lambda: not monitoring(), timeout=15, what="the monitor to be closed")
    assert r.info("stats")["client_output_buffer_limit_disconnections"] >= 1
    assert r.set("still", "here") is True and r.get("still") == b"here"


@pytest.mark.kvstrata_only
def test_monitor_needs_every_key_under_acl(make_server, raw, resp):
    """A tenant allowed every command but only its own keys must not watch the other tenants' keys and values."""
    srv = make_server({"requirepass": "adminpw"})
    admin = raw(srv)
    assert admin.cmd("AUTH", "adminpw") == "OK"
    assert admin.cmd("ACL", "SETUSER", "tenant", "on", ">tpw", "~t:*", "+@all") == "OK"
    tenant = raw(srv)
    assert tenant.cmd("AUTH", "tenant", "tpw") == "OK"
    assert tenant.cmd("MONITOR") == resp.Error(
        "NOPERM this user has no permissions to access one of the keys used as arguments")
    assert tenant.cmd("SET", "t:1", "x") == "OK"  # still an ordinary client
    assert admin.cmd("MONITOR") == "OK"
    assert tenant.cmd("AUTH", "tenant", "tpw") == "OK"
    assert monitor_lines(admin, 1)[0][1] == b'"AUTH" "(redacted)" "(redacted)"'
