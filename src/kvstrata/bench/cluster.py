"""A real Redis Cluster of local ``redis-server`` processes, for the pool tests and the pool benchmark.

``LocalCluster(masters=3).start()`` starts one process per master on free loopback ports (``cluster-enabled
yes``, config files in a temporary directory), joins them with ``redis-cli --cluster create ...
--cluster-replicas 0 --cluster-yes`` and waits, with a deadline, until every node reports ``cluster_state:ok``.
``kill(i)`` and ``restart(i)`` stop and bring back one master on the same port with the same node id;
``pause(i)``/``resume(i)`` SIGSTOP and SIGCONT it (a hung master). ``password`` sets ``requirepass`` (and
``masterauth``) on every node; ``maxmemory_policy`` the eviction policy. The server binary is ``redis-server``,
or ``$KVSTRATA_POOL_SERVER`` (e.g. ``valkey-server``: the pool tests run against Valkey 8 that way).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

HOST = "127.0.0.1"


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def server_binary() -> str:
    """The pool server program: ``redis-server`` unless ``KVSTRATA_POOL_SERVER`` names another (valkey-server)."""
    return os.environ.get("KVSTRATA_POOL_SERVER", "redis-server")


def _port_range() -> tuple[int, int]:
    """Where a node's port is drawn from: below the kernel's ephemeral range, bus port (+10000) included.

    A port drawn inside the ephemeral range can be taken between the draw and the node's bind by any outgoing
    connection (the other nodes' cluster bus links, the test's own clients); below it only an explicit bind can
    take it, and that holds for ``restart`` on the same port too.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    if low - 10000 - 10000 >= 1000:
        return 10000, low - 10000
    return 20000, 55535  # an unusual ephemeral range: fall back to the whole span (Redis needs port <= 55535)


def free_port(taken: set[int] | None = None) -> int:
    """A free loopback port whose cluster bus port (port + 10000) is free too, both outside the ephemeral range."""
    taken = taken or set()
    lo, hi = _port_range()
    for _ in range(1000):
        port = random.randrange(lo, hi)
        if port not in taken and port + 10000 not in taken and _free(port) and _free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _cli(port: int, *args: str, timeout: float = 10.0, password: str = "") -> str:
    auth = ["--no-auth-warning", "-a", password] if password else []
    proc = subprocess.run(["redis-cli", "-h", HOST, "-p", str(port), *auth, *args], capture_output=True,
                          timeout=timeout, check=False)
    return proc.stdout.decode(errors="replace")


def wait_ping(port: int, proc: subprocess.Popen[bytes] | None = None, log: Path | None = None,
              timeout: float = 15.0) -> None:
    """Wait until the server on ``port`` answers PING; fail at once, with its log's tail, if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_bytes()[-2000:].decode(errors="replace") if log is not None and log.exists() else ""
            raise RuntimeError(f"{server_binary()} on port {port} exited with {proc.returncode}: {tail}")
        with contextlib.suppress(OSError):
            with socket.create_connection((HOST, port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                    return
        time.sleep(0.02)  # poll interval
    raise RuntimeError(f"{server_binary()} on port {port} did not answer PING within {timeout}s")


class LocalCluster:
    def __init__(self, masters: int = 3, *, replicas: int = 0, node_timeout_ms: int = 1000, standalone: bool = False,
                 maxmemory: str = "0", password: str = "", maxmemory_policy: str = "noeviction") -> None:
        self.n = 1 if standalone else masters * (1 + replicas)
        self.replicas = 0 if standalone else replicas
        self.standalone = standalone
        self.node_timeout_ms = node_timeout_ms
        self.maxmemory = maxmemory
        self.password = password
        self.maxmemory_policy = maxmemory_policy
        self.dir = Path(tempfile.mkdtemp(prefix="kvstrata-cluster-"))
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes] | None] = []

    # ---- addresses ----
    @property
    def url(self) -> str:
        """The ``--pool`` value that reaches this cluster (or single server)."""
        auth = f":{self.password}@" if self.password else ""
        if self.standalone:
            return f"redis://{auth}{HOST}:{self.ports[0]}"
        return f"redis-cluster://{auth}" + ",".join(f"{HOST}:{p}" for p in self.ports)

    # ---- lifecycle ----
    def _spawn(self, i: int) -> None:
        port = self.ports[i]
        node_dir = self.dir / str(port)
        node_dir.mkdir(exist_ok=True)
        args = [server_binary(), "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no",
                "--dir", str(node_dir), "--maxmemory", self.maxmemory, "--protected-mode", "no",
                "--maxmemory-policy", self.maxmemory_policy]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        if not self.standalone:
            # Without full coverage the masters that are up keep serving their slots when one is down (a cache
            # pool: partial failure stays partial; docs/pool.md).
            args += ["--cluster-enabled", "yes", "--cluster-config-file", str(node_dir / "nodes.conf"),
                     "--cluster-node-timeout", str(self.node_timeout_ms),
                     "--cluster-require-full-coverage", "no"]
        log = open(node_dir / "server.log", "ab")
        self.procs[i] = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_ping(port, self.procs[i], node_dir / "server.log")

    def start(self, timeout: float = 30.0) -> LocalCluster:
        if shutil.which(server_binary()) is None or shutil.which("redis-cli") is None:
            raise RuntimeError("redis-server and redis-cli are needed (apt-get install redis-server redis-tools)")
        self.ports = []
        for _ in range(self.n):
            self.ports.append(free_port(set(self.ports)))
        self.procs = [None] * self.n
        try:
            for i in range(self.n):
                self._spawn(i)
            if not self.standalone:
                auth = ["--no-auth-warning", "-a", self.password] if self.password else []
                out = subprocess.run(
                    ["redis-cli", *auth, "--cluster", "create", *(f"{HOST}:{p}" for p in self.ports),
                     "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                    capture_output=True, timeout=timeout, check=False)
                if out.returncode != 0:
                    raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout.decode()} "
                                       f"{out.stderr.decode()}")
                self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def cluster_ok(self) -> bool:
        return all("cluster_state:ok" in _cli(p, "CLUSTER", "INFO", timeout=2.0, password=self.password)
                   for p in self.ports)

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every node says ``cluster_state:ok`` and agrees on the slot map."""
        if self.standalone:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.cluster_ok():
                return
            time.sleep(0.05)  # poll interval
        raise RuntimeError(f"cluster did not reach cluster_state:ok within {timeout}s")

    def kill(self, i: int) -> None:
        """SIGKILL master ``i`` (its data is lost; it keeps its node id in nodes.conf)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        self.procs[i] = None

    def pause(self, i: int) -> None:
        """SIGSTOP master ``i``: it keeps its connections open and answers nothing (a hung process)."""
        proc = self.procs[i]
        if proc is not None:
            proc.send_signal(signal.SIGSTOP)

    def resume(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None:
            proc.send_signal(signal.SIGCONT)

    def restart(self, i: int) -> None:
        """Start master ``i`` again on the same port with the same nodes.conf."""
        self._spawn(i)

    def stop(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a paused master must be able to exit
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            self.procs[i] = None
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- inspection ----
    def keyslot(self, key: bytes | str) -> int:
        name = key if isinstance(key, str) else key.decode()
        return int(_cli(self.ports[0], "CLUSTER", "KEYSLOT", name, password=self.password))

    def master_of_slot(self, slot: int) -> int:
        """The port of the master serving ``slot`` (from CLUSTER NODES)."""
        for line in _cli(self.ports[0], "CLUSTER", "NODES", password=self.password).splitlines():
            parts = line.split()
            if len(parts) < 9 or "master" not in parts[2]:
                continue
            port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
            for rng in parts[8:]:
                if rng.startswith("["):
                    continue
                lo, _, hi = rng.partition("-")
                if int(lo) <= slot <= int(hi or lo):
                    return port
        raise LookupError(f"no master serves slot {slot}")

    def index_of_port(self, port: int) -> int:
        return self.ports.index(port)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
