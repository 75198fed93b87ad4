"""Shared fixtures: start the server under test (kvstrata or a real redis-server) and talk to it.

The target is chosen by the environment variable ``KVSTRATA_TEST_TARGET``:

* ``kvstrata`` (default): ``python -m kvstrata serve`` from this checkout;
* ``redis``: the real ``redis-server`` binary, which is how every expectation in ``tests/integration`` was
  verified (Redis 7.0).

Both are started with the same configuration, given as a dict ``{"requirepass": "pw", ...}`` that becomes
``--requirepass pw`` on the command line of either program.  The Redis target additionally runs with
``--databases 1`` because kvstrata has a single database.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis._parsers.base import BaseParser
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvstrata.bench.procs import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("kvstrata", "redis")
TARGET = os.environ.get("KVSTRATA_TEST_TARGET", "kvstrata").strip().lower() or "kvstrata"
HOST = "127.0.0.1"
STARTUP_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
REPLY_TIMEOUT = 10.0

# Arguments the Redis target always gets, so that it behaves like kvstrata's fixed design: no persistence,
# one database.
REDIS_BASE_ARGS = ("--save", "", "--appendonly", "no", "--databases", "1")


def pytest_configure(config):
    if TARGET not in TARGETS:
        raise pytest.UsageError(f"KVSTRATA_TEST_TARGET must be one of {TARGETS}, not {TARGET!r}")
    config.addinivalue_line(
        "markers", "kvstrata_only: exercises kvstrata-specific behaviour; skipped when the target is redis"
    )


def pytest_report_header(config):
    return f"kvstrata integration target: {TARGET}"


def pytest_collection_modifyitems(config, items):
    if TARGET == "kvstrata":
        return
    skip = pytest.mark.skip(reason=f"kvstrata-specific behaviour; target is {TARGET}")
    for item in items:
        if "kvstrata_only" in item.keywords:
            item.add_marker(skip)


# --------------------------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------------------------


def config_args(config: dict | None) -> list[str]:
    """``{"maxmemory": "2mb"}`` -> ``["--maxmemory", "2mb"]`` (the same spelling for both targets)."""
    args: list[str] = []
    for name, value in (config or {}).items():
        args += [f"--{name}", str(value)]
    return args


def server_command(target: str, port: int, config: dict | None, workdir: str | None = None) -> list[str]:
    if target == "kvstrata":
        return [sys.executable, "-m", "kvstrata", "serve", "--port", str(port), "--bind", HOST,
                *config_args(config)]
    # A directory of its own: redis-server loads any dump.rdb in its working directory (a BGSAVE left one).
    where = ["--dir", workdir] if workdir and "dir" not in (config or {}) else []
    return ["redis-server", "--port", str(port), "--bind", HOST, *REDIS_BASE_ARGS, *where, *config_args(config)]


def _answers_ping(port: int) -> bool:
    """True once the server replies to PING (``+PONG``, or ``-NOAUTH`` when a password is required)."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as s:
            s.settimeout(0.5)
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(256)
                if not chunk:
                    return False
                data += chunk
    except OSError:
        return False
    return data.startswith((b"+PONG", b"-NOAUTH"))


class ServerProc:
    """One server process (kvstrata or redis-server) on 127.0.0.1 and a free port."""

    def __init__(self, config: dict | None = None, target: str = TARGET) -> None:
        self.config = dict(config or {})
        self.target = target
        self.host = HOST
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.NamedTemporaryFile(prefix=f"{target}-", suffix=".log", delete=False)
        self.workdir: str | None = None  # redis-server's --dir, removed at stop()
        self.log_path = Path(self._log.name)

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self, timeout: float = STARTUP_TIMEOUT) -> ServerProc:
        for attempt in range(3):
            self.port = free_port()
            self._spawn()
            if self._wait_ready(timeout):
                return self
            status = self.proc.poll()
            self._reap()
            log = self.log_text()
            # Another process may have grabbed the port between free_port() and bind(): try a new one.
            if attempt < 2 and status is not None and "in use" in log.lower():
                continue
            what = (f"exited with status {status} before answering PING" if status is not None
                    else f"did not answer PING within {timeout:.0f}s")
            pytest.fail(
                f"{self.target} on port {self.port} {what}\n"
                f"command: {self.argv}\n--- server output ---\n{log}",
                pytrace=False,
            )
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        if self.target == "redis" and self.workdir is None:
            self.workdir = tempfile.mkdtemp(prefix="redis-target-")
        self.argv = server_command(self.target, self.port, self.config, self.workdir)
        env = dict(os.environ)
        if self.target == "kvstrata":
            src = str(REPO_ROOT / "src")
            env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._log.write(f"$ {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env,
            cwd=tempfile.gettempdir(),
        )

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if _answers_ping(self.port):
                return True
            time.sleep(0.02)  # poll interval
        return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _reap(self) -> int | None:
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT)
        return proc.returncode

    def stop(self) -> None:
        """SIGTERM, wait, then SIGKILL. Fails the test if the server had died on its own before."""
        crashed = self.proc is not None and self.proc.poll() is not None
        code = self._reap()
        self._log.close()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if crashed:
            pytest.fail(f"{self.target} on port {self.port} exited on its own (status {code})\n"
                        f"--- server output ---\n{self.log_text()}", pytrace=False)
        with contextlib.suppress(OSError):
            self.log_path.unlink()

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- clients ----------------------------------------------------------------------------------------------
    def client(self, protocol: int = 2, **kwargs) -> redis.Redis:
        """A redis-py client that never retries (so a closed connection shows up as an error)."""
        kwargs.setdefault("decode_responses", False)
        kwargs.setdefault("socket_timeout", REPLY_TIMEOUT)
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        return redis.Redis(host=self.host, port=self.port, protocol=protocol, **kwargs)

    def raw(self, timeout: float = REPLY_TIMEOUT) -> RawConn:
        return RawConn(self.port, timeout=timeout)


def _make_factory():
    started: list[ServerProc] = []

    def make(config: dict | None = None) -> ServerProc:
        srv = ServerProc(config)
        started.append(srv)
        return srv.start()

    def stop_all() -> None:
        errors = []
        for srv in reversed(started):
            try:
                srv.stop()
            except BaseException as exc:  # report every failure, but stop every server
                errors.append(exc)
        if errors:
            raise errors[0]

    return make, stop_all


@pytest.fixture(scope="module")
def server():
    """A server with the default configuration, shared by the tests of one module."""
    srv = ServerProc().start()
    yield srv
    srv.stop()


@pytest.fixture
def make_server():
    """Factory ``make_server({"requirepass": "pw"}) -> ServerProc``; the servers stop after the test."""
    make, stop_all = _make_factory()
    yield make
    stop_all()


@pytest.fixture(scope="module")
def module_make_server():
    """Like ``make_server`` but the servers live until the end of the module."""
    make, stop_all = _make_factory()
    yield make
    stop_all()


@pytest.fixture(scope="module")
def acl_server(module_make_server):
    """A server whose default user has a password (``adminpw``), shared by the ACL tests of one module."""
    return module_make_server({"requirepass": "adminpw"})


@pytest.fixture
def admin(acl_server):
    """The default user on ``acl_server``, with the keyspace, the other users and ACL LOG emptied first."""
    r = acl_server.client(password="adminpw")
    r.flushall()
    for name in r.acl_users():
        if name not in (b"default", "default"):
            r.acl_deluser(name)
    r.acl_log_reset()
    yield r
    r.close()


@contextlib.contextmanager
def twin_servers() -> Iterator[tuple[ServerProc, ServerProc]]:
    """A kvstrata server and a redis-server side by side (the differential tests), both stopped at the end."""
    kv = ServerProc(target="kvstrata").start()
    try:
        rd = ServerProc(target="redis").start()
        try:
            yield kv, rd
        finally:
            rd.stop()
    finally:
        kv.stop()


@pytest.fixture(scope="module")
def pair():
    """A kvstrata server and a redis-server side by side: a raw connection to each."""
    with twin_servers() as (kv, rd):
        yield kv.raw(), rd.raw()


@pytest.fixture(scope="module")
def cluster():
    """A 3-master Redis/Valkey Cluster for the pool tests, one per test module."""
    from kvstrata.bench.cluster import LocalCluster

    c = LocalCluster(masters=3).start()
    yield c
    c.stop()


@pytest.fixture
def pool_client(cluster):
    """A cluster client of ``cluster``, to look at the pool's records directly."""
    rc = redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0], socket_timeout=5)
    yield rc
    rc.close()


@pytest.fixture
def r(server):
    """RESP2 client on the shared server; the keyspace is empty at the start of each test."""
    client = server.client(protocol=2)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def r3(server):
    """RESP3 client (HELLO 3) on the shared server; the keyspace is empty at the start of each test."""
    client = server.client(protocol=3)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def raw(server):
    """Factory of raw-socket connections: ``raw()`` to the shared server, ``raw(other_server)`` elsewhere.

    The shared server's keyspace is emptied first.
    """
    conns: list[RawConn] = []
    first = server.raw()
    conns.append(first)
    assert first.cmd_raw("FLUSHALL") == b"+OK\r\n"

    def connect(srv: ServerProc | None = None, timeout: float = REPLY_TIMEOUT) -> RawConn:
        conn = (srv or server).raw(timeout=timeout)
        conns.append(conn)
        return conn

    yield connect
    for conn in conns:
        conn.close()


# --------------------------------------------------------------------------------------------------------------
# redis-cli
# --------------------------------------------------------------------------------------------------------------


def redis_cli(port: int, *args: str, input: bytes | None = None, timeout: float = 15.0) -> str:
    """Run the real ``redis-cli`` against 127.0.0.1:port and return its stdout (decoded)."""
    proc = subprocess.run(
        ["redis-cli", "-h", HOST, "-p", str(port), *args],
        input=input, capture_output=True, timeout=timeout, check=False,
    )
    return proc.stdout.decode(errors="replace")


@pytest.fixture(name="redis_cli")
def redis_cli_fixture():
    return redis_cli


# --------------------------------------------------------------------------------------------------------------
# Exact error texts through redis-py
# --------------------------------------------------------------------------------------------------------------


def error_text(exc: BaseException) -> str:
    """The full error line the server sent (redis-py strips known prefixes such as ``ERR``)."""
    code = getattr(exc, "status_code", None)
    return f"{code} {exc}" if code else str(exc)


@contextlib.contextmanager
def expect_error(full: str, exc_type: type[BaseException] = redis.ResponseError):
    """Expect a server error whose full text (as after ``-`` on the wire) is exactly ``full``.

    ``pytest.raises(..., match=...)`` checks the message redis-py keeps; the prefix is checked as well.
    """
    code, _, rest = full.partition(" ")
    message = rest if code in BaseParser.EXCEPTION_CLASSES else full
    with pytest.raises(exc_type, match="^" + re.escape(message) + "$") as info:
        yield info
    assert error_text(info.value) == full


@pytest.fixture(name="expect_error")
def expect_error_fixture():
    """``with expect_error("ERR syntax error"): r.set(...)``."""
    return expect_error


# --------------------------------------------------------------------------------------------------------------
# A raw RESP connection, for exact replies and malformed input
# --------------------------------------------------------------------------------------------------------------


class RespError:
    """An error reply, returned (not raised) by ``RawConn``: compare ``reply == RespError("ERR ...")``."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RespError) and other.message == self.message

    def __hash__(self) -> int:
        return hash(self.message)

    def __repr__(self) -> str:
        return f"RespError({self.message!r})"


class SimpleString(str):
    """A ``+...`` reply (equal to the plain str)."""


class Verbatim(bytes):
    """A RESP3 ``=`` reply; ``fmt`` is the three-letter format (``txt``)."""

    fmt: str = ""


class Push(list):
    """A RESP3 ``>`` reply."""


class ConnectionClosed(Exception):
    pass


def encode_command(*args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif isinstance(arg, int | float):
            arg = repr(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


@pytest.fixture
def resp():
    """The raw-reply types, for tests: ``resp.Error("ERR ...")``, ``resp.Simple``, ``resp.Verbatim``,
    ``resp.Push`` and ``resp.encode(*args)``."""
    return types.SimpleNamespace(Error=RespError, Simple=SimpleString, Verbatim=Verbatim, Push=Push,
                                 encode=encode_command, Closed=ConnectionClosed)


class _Incomplete(Exception):
    pass


class RawConn:
    """A plain socket speaking RESP2/RESP3, with a parser that keeps the exact bytes of each reply."""

    def __init__(self, port: int, host: str = HOST, timeout: float = REPLY_TIMEOUT) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.timeout = timeout
        self.buf = b""
        self.eof = False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def cmd(self, *args):
        """Send one command as a RESP array and return its parsed reply."""
        self.send(encode_command(*args))
        return self.read_reply()

    def cmd_raw(self, *args) -> bytes:
        self.send(encode_command(*args))
        return self.read_raw()

    def inline(self, line: bytes) -> bytes:
        self.send(line)
        return self.read_raw()

    # -- reading ----------------------------------------------------------------------------------------------
    def _fill(self, deadline: float) -> None:
        if self.eof:
            raise ConnectionClosed(f"connection closed; unparsed bytes: {self.buf!r}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no complete reply within the deadline; have {self.buf[:200]!r}")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError(f"no complete reply within the deadline; have {self.buf[:200]!r}") from None
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
            raise ConnectionClosed(f"connection closed; unparsed bytes: {self.buf!r}")
        self.buf += chunk

    def _read_frame(self, timeout: float | None):
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            try:
                value, end = _parse(self.buf, 0)
            except _Incomplete:
                self._fill(deadline)
                continue
            frame, self.buf = self.buf[:end], self.buf[end:]
            return value, frame

    def read_reply(self, timeout: float | None = None):
        return self._read_frame(timeout)[0]

    def read_raw(self, timeout: float | None = None) -> bytes:
        """The exact bytes of the next reply."""
        return self._read_frame(timeout)[1]

    def read_until_closed(self, timeout: float = 5.0) -> bytes:
        """Everything the server sends until it closes the connection; fails if it stays open."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            try:
                self._fill(deadline)
            except ConnectionClosed:
                break
            except TimeoutError:
                raise AssertionError(
                    f"server did not close the connection within {timeout}s; got {self.buf!r}"
                ) from None
        data, self.buf = self.buf, b""
        return data

    def nothing_pending(self, wait: float = 0.2) -> bool:
        """True when no byte arrives within ``wait`` seconds and the connection is still open."""
        if self.buf:
            return False
        self.sock.settimeout(wait)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(self.timeout)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return False


def _line(buf: bytes, pos: int) -> tuple[bytes, int]:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    return buf[pos:end], end + 2


def _parse(buf: bytes, pos: int):
    if pos >= len(buf):
        raise _Incomplete
    kind = buf[pos:pos + 1]
    line, pos = _line(buf, pos + 1)
    if kind == b"+":
        return SimpleString(line.decode(errors="surrogateescape")), pos
    if kind == b"-":
        return RespError(line.decode(errors="surrogateescape")), pos
    if kind in (b":", b"("):
        return int(line), pos
    if kind in (b"$", b"=", b"!"):
        n = int(line)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            raise _Incomplete
        data = buf[pos:pos + n]
        pos += n + 2
        if kind == b"=":
            out = Verbatim(data[4:])
            out.fmt = data[:3].decode()
            return out, pos
        if kind == b"!":
            return RespError(data.decode(errors="surrogateescape")), pos
        return data, pos
    if kind == b"_":
        return None, pos
    if kind == b"#":
        return line == b"t", pos
    if kind == b",":
        return float(line), pos
    if kind in (b"*", b"~", b">"):
        n = int(line)
        if n < 0:
            return None, pos
        items = []
        for _ in range(n):
            item, pos = _parse(buf, pos)
            items.append(item)
        return (Push(items) if kind == b">" else items), pos
    if kind in (b"%", b"|"):
        n = int(line)
        out = {}
        for _ in range(n):
            key, pos = _parse(buf, pos)
            value, pos = _parse(buf, pos)
            out[key if not isinstance(key, list) else tuple(key)] = value
        if kind == b"|":  # an attribute precedes the real reply
            return _parse(buf, pos)
        return out, pos
    raise ValueError(f"unknown RESP type byte {kind!r} in {buf[:100]!r}")


@pytest.fixture
def sockdir():
    d = tempfile.mkdtemp(prefix="kvs-")  # short: a Unix socket path has at most 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def helper():
    """A one-thread executor, as the server's copy helper (kvstrata.engine.copyalong)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    yield pool
    pool.shutdown(wait=True)
