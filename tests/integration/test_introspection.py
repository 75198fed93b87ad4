"""INFO and CLIENT as tools read them (issue 13): the sections and fields Redis prints, with live figures.

These run against either target (KVSTRATA_TEST_TARGET), so the expectations are Redis's own.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest
import redis
from tests.integration.polling import wait_for


def _fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.strip().split(" "))


# The CLIENT LIST / CLIENT INFO fields of Redis 7.0, in its order.
REDIS_CLIENT_FIELDS = ["id", "addr", "laddr", "fd", "name", "age", "idle", "flags", "db", "sub", "psub", "ssub",
                       "multi", "qbuf", "qbuf-free", "argv-mem", "multi-mem", "rbs", "rbp", "obl", "oll", "omem",
                       "tot-mem", "events", "cmd", "user", "redir", "resp"]


def test_info_has_cluster_and_cpu_sections(r, raw):
    text = raw().cmd("INFO").decode()
    assert "# Cluster\r\ncluster_enabled:0\r\n" in text
    assert "# CPU\r\n" in text
    cpu = r.info("cpu")
    for name in ("used_cpu_sys", "used_cpu_user", "used_cpu_sys_children", "used_cpu_user_children"):
        assert isinstance(cpu[name], float) and cpu[name] >= 0
    assert r.info("cluster") == {"cluster_enabled": 0}


def test_client_info_fields_in_redis_order(r):
    line = r.execute_command("CLIENT", "INFO").decode()
    names = [part.split("=", 1)[0] for part in line.strip().split(" ")]
    assert names[: len(REDIS_CLIENT_FIELDS)] == REDIS_CLIENT_FIELDS
    f = _fields(line)
    assert int(f["tot-mem"]) > 0
    assert f["cmd"] == "client|info"


def test_client_list_shows_a_pending_request_in_qbuf(server, r):
    """A client with half a command sent: its bytes are in qbuf (or argv-mem once parsed), and tot-mem counts
    them; once it leaves, it is gone from the list."""
    s = socket.create_connection((server.host, server.port), timeout=10)
    try:
        s.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100\r\n" + b"x" * 50)
        me = s.getsockname()

        def pending() -> dict[str, str] | None:
            for line in r.execute_command("CLIENT", "LIST").decode().splitlines():
                f = _fields(line)
                if f["addr"] == f"{me[0]}:{me[1]}" and int(f["qbuf"]) + int(f["argv-mem"]) >= 50:
                    return f
            return None

        f = wait_for(pending, timeout=10, what="the half-sent request in CLIENT LIST")
        assert int(f["tot-mem"]) >= int(f["qbuf"]) + int(f["argv-mem"])
    finally:
        s.close()


def test_info_clients_and_memory_fields(r):
    clients = r.info("clients")
    for name in ("connected_clients", "maxclients", "client_recent_max_input_buffer",
                 "client_recent_max_output_buffer", "blocked_clients"):
        assert isinstance(clients[name], int), name
    memory = r.info("memory")
    assert memory["used_memory_rss"] > 0
    assert isinstance(memory["mem_clients_normal"], int)


def test_info_memory_dataset_and_fragmentation(r):
    """The fields exporters chart beside used_memory: its overhead and dataset parts (which add up to it), the
    fragmentation ratio and bytes (resident memory against used_memory), the allocator's name."""
    r.set("frag:k", b"v" * 100_000)
    memory = r.info("memory")
    assert memory["used_memory_overhead"] + memory["used_memory_dataset"] == memory["used_memory"]
    assert memory["used_memory_dataset"] >= 100_000
    perc = float(memory["used_memory_dataset_perc"].rstrip("%"))
    assert 0 < perc <= 100
    ratio = float(memory["mem_fragmentation_ratio"])
    assert ratio > 0
    assert isinstance(memory["mem_fragmentation_bytes"], int)
    assert isinstance(memory["mem_allocator"], str) and memory["mem_allocator"]


@pytest.mark.kvstrata_only
def test_info_memory_and_memory_stats_agree(r):
    """MEMORY STATS with Redis's meanings, from the same figures as INFO: total.allocated is used_memory,
    peak.allocated its peak, clients.normal the clients' bytes; fragmentation is RSS over used_memory."""
    r.set("agree:k", b"v" * 300_000)
    memory = r.info("memory")
    stats = r.memory_stats()
    assert stats["total.allocated"] == memory["used_memory"]
    assert stats["peak.allocated"] >= memory["used_memory"]
    assert stats["dataset.bytes"] == memory["used_memory_dataset"]
    assert stats["overhead.total"] == memory["used_memory_overhead"]
    assert stats["clients.normal"] >= 8192  # this client's connection at least (its per-connection overhead)
    ratio = float(memory["mem_fragmentation_ratio"])
    expected = (memory["used_memory"] + memory["mem_fragmentation_bytes"]) / memory["used_memory"]
    assert abs(ratio - expected) < 0.01


def test_config_get_several_patterns(r):
    got = r.config_get("maxmemory")
    assert set(got) == {"maxmemory"}
    got = r.execute_command("CONFIG", "GET", "maxmemory", "MAXMEMORY", "maxmemory")
    names = got[::2] if isinstance(got, list) else list(got)
    assert names == [b"maxmemory"]  # the first spelling; the others are the same name
    got = r.execute_command("CONFIG", "GET", "MAXMEMORY", "maxmem*")
    names = got[::2] if isinstance(got, list) else list(got)
    assert b"MAXMEMORY" in names and b"maxmemory" not in names
    got = r.execute_command("CONFIG", "GET", "port", "PORT*", "nosuch")
    names = got[::2] if isinstance(got, list) else list(got)
    assert names == [b"port"]


def test_memory_purge_and_malloc_stats(r, raw):
    assert raw().cmd("MEMORY", "PURGE") == "OK"
    report = r.execute_command("MEMORY", "MALLOC-STATS")
    assert isinstance(report, bytes) and report  # jemalloc's report from Redis, a sentence from kvstrata
    assert b"MALLOC-STATS" in b"".join(r.execute_command("MEMORY", "HELP"))


@pytest.mark.kvstrata_only
def test_memory_purge_drops_the_free_receive_buffers(make_server):
    """Without the arena, large values are received into a pool of buffers that keeps freed ones for reuse;
    MEMORY PURGE gives them back."""
    c = make_server({"arena": "no"}).client()
    for i in range(3):
        c.set(f"k{i}", b"x" * (1 << 20))
    c.delete("k0", "k1")
    c.set("k3", b"y" * (1 << 20))  # the next large request takes the deleted values' buffers back
    assert int(c.info("memory")["buffer_pool_free_bytes"]) >= 1 << 20
    c.delete("k2")
    assert c.execute_command("MEMORY", "PURGE") == b"OK"
    assert int(c.info("memory")["buffer_pool_free_bytes"]) == 0
    assert c.get("k3") == b"y" * (1 << 20)
    c.set("k4", b"z" * (1 << 20))  # the pool refills on demand
    assert c.get("k4") == b"z" * (1 << 20) and c.exists("k0", "k1", "k2") == 0


def test_a_unix_socket_client_in_client_list(make_server, sockdir):
    """A client of the Unix socket: the socket's path as both addresses (``path:0``) and flag U, as in Redis."""
    path = os.path.join(sockdir, "s.sock")
    srv = make_server({"unixsocket": path})
    r = redis.Redis(unix_socket_path=path)
    me = r.client_info()
    assert (me["addr"], me["laddr"], me["flags"]) == (f"{path}:0", f"{path}:0", "U")
    tcp = srv.client()
    assert tcp.client_info()["flags"] == "N"
    assert r.client_kill_filter(addr=f"{path}:0", skipme=False) == 1
    r.close()


def test_info_fields_monitoring_tools_read(server, r):
    """The INFO fields dashboards and exporters chart (instantaneous rates, peak memory, the host's memory), on
    both targets: present, of Redis's types, and moving as the load does."""
    stop = threading.Event()

    def load() -> None:
        client = server.client()
        while not stop.is_set():
            client.set("k", "v" * 1000)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        stats = wait_for(lambda: (s := r.info("stats"))["instantaneous_ops_per_sec"] > 0 and s,
                         timeout=15, what="a nonzero command rate")
        assert stats["instantaneous_input_kbps"] > 0 and stats["instantaneous_output_kbps"] > 0
    finally:
        stop.set()
        worker.join(10)
    memory = r.info("memory")
    assert memory["used_memory_peak"] >= memory["used_memory"] > 0
    assert memory["used_memory_peak_human"] and memory["used_memory_rss_human"]
    assert memory["total_system_memory"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    peak = memory["used_memory_peak"]
    r.delete("k")
    assert r.info("memory")["used_memory_peak"] >= peak  # a peak stays
