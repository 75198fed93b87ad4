"""Connection-level guards exercised with the real Connection class and a recording transport (no network):
protected mode and maxclients decide before any command is read."""

from __future__ import annotations

from kvstrata.config import build_config
from kvstrata.server.app import Server
from kvstrata.server.connection import Connection


class RecordingTransport:
    def __init__(self, peer: tuple[str, int]) -> None:
        self.peer = peer
        self.written: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str) -> object:
        return {"peername": self.peer, "sockname": ("0.0.0.0", 6379)}.get(name)

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def writelines(self, parts: list[bytes]) -> None:
        self.written.append(b"".join(bytes(p) for p in parts))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def connect(server: Server, peer: tuple[str, int]) -> tuple[Connection, RecordingTransport]:
    conn = Connection(server)
    transport = RecordingTransport(peer)
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def send(conn: Connection, data: bytes) -> None:
    buf = conn.get_buffer(len(data))
    buf[: len(data)] = data
    conn.buffer_updated(len(data))


def test_protected_mode_refuses_non_loopback_clients_without_password():
    server = Server(build_config({"bind": "0.0.0.0"}, {}))
    conn, transport = connect(server, ("10.1.2.3", 50000))
    assert transport.closed
    assert transport.written and transport.written[0].startswith(b"-DENIED")
    assert conn.client.id not in server.clients


def test_protected_mode_lets_loopback_clients_in():
    server = Server(build_config({"bind": "0.0.0.0"}, {}))
    conn, transport = connect(server, ("127.0.0.1", 50000))
    assert not transport.closed
    send(conn, b"*1\r\n$4\r\nPING\r\n")
    assert transport.written == [b"+PONG\r\n"]


def test_password_lifts_protected_mode_but_requires_auth():
    server = Server(build_config({"bind": "0.0.0.0", "requirepass": "s3cret"}, {}))
    conn, transport = connect(server, ("10.1.2.3", 50000))
    assert not transport.closed
    send(conn, b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\nb\r\n")
    assert transport.written[-1].startswith(b"-NOAUTH")
    send(conn, b"*2\r\n$4\r\nAUTH\r\n$6\r\ns3cret\r\n")
    assert transport.written[-1] == b"+OK\r\n"


def test_protected_mode_off_lets_anyone_in():
    server = Server(build_config({"bind": "0.0.0.0", "protected-mode": "no"}, {}))
    _, transport = connect(server, ("10.1.2.3", 50000))
    assert not transport.closed


def test_maxclients_refuses_the_extra_client():
    server = Server(build_config({"maxclients": "1"}, {}))
    first, t1 = connect(server, ("127.0.0.1", 1))
    _, t2 = connect(server, ("127.0.0.1", 2))
    assert not t1.closed
    assert t2.closed and t2.written[0].startswith(b"-ERR max number of clients reached")
    assert list(server.clients) == [first.client.id]
