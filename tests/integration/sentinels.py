"""A real Sentinel setup for the pool tests: a master (``LocalCluster(standalone=True)``), one replica
(``--replicaof``) and ``n`` sentinels (``redis-server sentinel.conf --sentinel``, or ``$KVSTRATA_POOL_SERVER``,
e.g. valkey-server), all on free loopback ports. ``password`` is the data nodes' ``requirepass``/``masterauth``
(and the sentinels' ``auth-pass``); ``sentinel_password`` the sentinels' own ``requirepass``.
Waits are polls with a deadline.
"""

from __future__ import annotations

import signal
import subprocess
import time

from kvstrata.bench.cluster import HOST, LocalCluster, _cli, free_port, server_binary, wait_ping


class LocalSentinel:
    def __init__(self, sentinels: int = 1, *, service: str = "mymaster", password: str = "",
                 sentinel_password: str = "", down_after_ms: int = 1000, failover_timeout_ms: int = 3000) -> None:
        self.n = sentinels
        self.service = service
        self.password = password
        self.sentinel_password = sentinel_password
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.master = LocalCluster(standalone=True, password=password)
        self.replica_port = 0
        self.sentinel_ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    # ---- addresses ----
    def url(self, *, service: str | None = None, extra_hosts: tuple[str, ...] = ()) -> str:
        auth = f":{self.password}@" if self.password else ""
        hosts = ",".join([*extra_hosts, *(f"{HOST}:{p}" for p in self.sentinel_ports)])
        query = f"?sentinel_password={self.sentinel_password}" if self.sentinel_password else ""
        return f"redis-sentinel://{auth}{hosts}/{service or self.service}{query}"

    def _sentinel_cli(self, *args: str) -> str:
        return _cli(self.sentinel_ports[0], *args, timeout=2.0, password=self.sentinel_password)

    def master_port(self) -> int:
        """The master's port as the (first) sentinel sees it now."""
        out = self._sentinel_cli("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service).split()
        return int(out[1]) if len(out) == 2 else 0

    # ---- lifecycle ----
    def _spawn(self, args: list[str], port: int) -> None:
        path = self.master.dir / f"{port}.log"
        log = open(path, "ab")
        self.procs.append(subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
        log.close()
        wait_ping(port, self.procs[-1], path)

    def start(self, timeout: float = 30.0) -> LocalSentinel:
        self.master.start()
        try:
            self._start_rest(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_rest(self, timeout: float) -> None:
        mport = self.master.ports[0]
        taken = {mport}
        self.replica_port = free_port(taken)
        taken.add(self.replica_port)
        rdir = self.master.dir / "replica"
        rdir.mkdir()
        args = [server_binary(), "--port", str(self.replica_port), "--bind", HOST, "--save", "", "--appendonly",
                "no", "--dir", str(rdir), "--protected-mode", "no", "--replicaof", HOST, str(mport)]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        self._spawn(args, self.replica_port)
        # Synced before the sentinels start: their first INFO of the master then lists the replica.
        self.wait(lambda: "master_link_status:up" in _cli(self.replica_port, "INFO", "replication",
                                                          password=self.password), timeout, "the replica's sync")
        for _ in range(self.n):
            port = free_port(taken)
            taken.add(port)
            self.sentinel_ports.append(port)
            conf = self.master.dir / f"sentinel-{port}.conf"
            lines = [f"port {port}", f"bind {HOST}", "protected-mode no", f"dir {self.master.dir}",
                     f"sentinel monitor {self.service} {HOST} {mport} {self.n // 2 + 1}",
                     f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
                     f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}"]
            if self.password:
                lines.append(f"sentinel auth-pass {self.service} {self.password}")
            if self.sentinel_password:
                lines.append(f"requirepass {self.sentinel_password}")
            conf.write_text("\n".join(lines) + "\n")
            self._spawn([server_binary(), str(conf), "--sentinel"], port)
        # Ready: every sentinel knows the replica (so it can be promoted).
        for port in self.sentinel_ports:
            self.wait(lambda port=port: str(self.replica_port) in _cli(
                port, "SENTINEL", "REPLICAS", self.service, password=self.sentinel_password),
                timeout, "the sentinels to find the replica")

    @staticmethod
    def wait(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise RuntimeError(f"sentinel setup: timed out after {timeout}s waiting for {what}")
            time.sleep(0.05)  # poll interval

    def kill_master(self) -> None:
        """SIGKILL the original master (the sentinels then promote the replica)."""
        self.master.kill(0)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        self.procs = []
        self.master.stop()  # also removes the directory
