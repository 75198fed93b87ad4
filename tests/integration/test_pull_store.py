"""Pull stores over a real Unix socket with real ``process_vm_readv``: the server copies values straight out of the
connecting process's memory (``TAIR.KV.PULL``). Strided KV byte-identical to a SET of the same value through every
read path, versions and compare-and-set, refusals (a bad address, TCP, the budget, the kernel's ptrace rules)
that store nothing and give everything back, the SDK falling back to staging, and a forked child that cannot make
the server read anything but the process that connected.
"""

from __future__ import annotations

import asyncio
import json
import logging
import mmap
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import redis
import xxhash
from tests.integration.polling import wait_for
from tests.integration.support import memory_info as _info
from tests.integration.support import unix_server as _start

from kvstrata.client.arena import ArenaClient, Ref
from kvstrata.client.codec import CHECKSUM_OFFSET
from kvstrata.client.fast import FastClient, RespError
from kvstrata.client.keys import Namespace
from kvstrata.client.pull_store import PullUnavailable, PullWriter, address
from kvstrata.client.sdk import AsyncKVCacheClient, KVCacheClient
from kvstrata.client.stage import StageWriter

pytestmark = pytest.mark.kvstrata_only

MB = 1024 * 1024
SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _pull(w: FastClient, key: bytes, buf: bytes | bytearray | np.ndarray, *opts: object, head: bytes = b"") -> int:
    mv = memoryview(buf).cast("B")
    return int(w.call(b"TAIR.KV.PULL", key, 0, head, 1, address(mv), mv.nbytes, *opts))


def test_strided_kv_pulled_by_the_sdk_reads_back_as_a_set_of_the_same_value(make_server, sockdir) -> None:
    # The 4 MiB chunks are pulled in a worker thread (stage-offload-min 2 MiB) with the copy helper (4 pieces of 1
    # MiB; on a server with two CPUs), the 1.5 MiB ones inline.
    srv, path = _start(make_server, sockdir, **{"dram-size": "128mb", "pull-store": "yes"})
    tcp = srv.client()
    rng = np.random.default_rng(3)
    c = KVCacheClient(f"unix://{path}", Namespace("pull", kv_dtype="float32"))
    reader = ArenaClient(path)
    try:
        assert isinstance(c._stager(), PullWriter)
        for shape in ((8, 2, 4, 3 * 256 + 17, 64), (6, 2, 2, 2 * 256, 64)):
            kv = rng.standard_normal(shape, dtype=np.float32)
            tokens = list(range(shape[3]))
            chunks = shape[3] // 256
            before = _info(tcp)["pull_stores"]
            assert c.store(tokens, kv, skip_existing=False) == chunks
            assert _info(tcp)["pull_stores"] == before + chunks
            keys = c.keys(tokens)
            for i, key in enumerate(keys):
                chunk = kv[:, :, :, i * 256:(i + 1) * 256]
                assert not chunk.flags.c_contiguous  # pulled as its runs, one range per layer, K/V and head
                ref_key = b"ref:" + key
                tcp.execute_command("TAIR.KV.SETEX", ref_key, 0,
                                    b"".join(bytes(p) for p in c.encode_chunk(np.ascontiguousarray(chunk))))
                expected = tcp.get(ref_key)
                assert tcp.get(key) == expected
                assert tcp.execute_command("TAIR.KV.MGET", key, ref_key) == [expected, expected]
                lease, [ref] = reader.mgetref([key])
                assert isinstance(ref, Ref) and bytes(reader.value(ref)) == expected
                assert ref.checksum == xxhash.xxh3_64_intdigest(expected)
                reader.release(lease, now=True)
            n, got = c.retrieve(tokens)
            assert n == chunks * 256 and np.array_equal(got, kv[:, :, :, :n])
        # One PULL a value, the ranges as decimal arguments (what a writer sends a server from before MPULL and the
        # packed form): the same values, byte for byte.
        writer = c._stager()
        assert isinstance(writer, PullWriter) and writer.packed and writer.multi  # the stores above: MPULL
        writer.packed = writer.multi = False
        kv = rng.standard_normal((4, 2, 2, 2 * 256, 64), dtype=np.float32)
        tokens = list(range(1000, 1000 + 2 * 256))
        assert c.store(tokens, kv, skip_existing=False) == 2
        n, got = c.retrieve(tokens)
        assert n == 2 * 256 and np.array_equal(got, kv)
        info = _info(tcp)
        assert info["pull_failures"] == 0 and info["pulls_in_flight"] == 0 and info["stage_reserved_bytes"] == 0
        assert info["stage_commits"] == 0  # nothing went through a staging segment
    finally:
        reader.close()
        c.close()


def test_pull_versions_cas_and_self_checksum(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb", "pull-store": "yes"})
    tcp = srv.client()
    w = PullWriter(path)
    try:
        a, b = os.urandom(3 * MB + 5), os.urandom(200_000)
        v1 = _pull(w, b"k", a)
        v2 = _pull(w, b"k", b)
        assert v2 > v1 and int(tcp.execute_command("TAIR.KV.VERSION", b"k")) == v2
        with pytest.raises(RespError, match="VERMISMATCH"):
            _pull(w, b"k", a, b"VER", v1)
        assert tcp.get(b"k") == b
        v3 = _pull(w, b"k", a, b"VER", v2)
        assert v3 > v2 and tcp.get(b"k") == a
        # MGETREF's checksum is the hash of the stored bytes (the server's digest of its own copy).
        reader = ArenaClient(path)
        try:
            lease, [ref] = reader.mgetref([b"k"])
            assert isinstance(ref, Ref) and ref.version == v3 and ref.checksum == xxhash.xxh3_64_intdigest(a)
            reader.release(lease, now=True)
        finally:
            reader.close()
        # An inline head with a self-checksum field (the codec header's): hashed as zeros, then holding the digest.
        head = bytearray(os.urandom(40))
        head[CHECKSUM_OFFSET:CHECKSUM_OFFSET + 8] = b"\xff" * 8
        _pull(w, b"h", a, b"SUMAT", CHECKSUM_OFFSET, head=bytes(head))
        head[CHECKSUM_OFFSET:CHECKSUM_OFFSET + 8] = bytes(8)
        digest = xxhash.xxh3_64_intdigest(bytes(head) + a)
        head[CHECKSUM_OFFSET:CHECKSUM_OFFSET + 8] = digest.to_bytes(8, "little")
        assert tcp.get(b"h") == bytes(head) + a
        with pytest.raises(RespError, match="SUMAT"):
            _pull(w, b"h2", a, b"SUMAT", 36, head=bytes(head))
        assert tcp.exists(b"h2") == 0
    finally:
        w.close()


def test_bad_addresses_are_refused_and_nothing_is_stored(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb", "stage-offload-min": "1mb", "pull-store": "yes"})
    tcp = srv.client()
    w = PullWriter(path)
    try:
        old = os.urandom(MB)
        _pull(w, b"k", old)
        base = _info(tcp)["dram_used"]
        # Unmapped in this process: the first piece fails (inline, small) ...
        with pytest.raises(RespError, match="EFAULT"):
            w.call(b"TAIR.KV.PULL", b"k", 0, b"", 1, 4096, 100_000)
        # ... or a later one, after 4 MiB that could be read (off the loop, a short read).
        good = np.ones(4 * MB, np.uint8)
        m = mmap.mmap(-1, 2 * MB)
        hole = address(m)
        m.close()  # now unmapped
        with pytest.raises(RespError, match="EFAULT"):
            w.call(b"TAIR.KV.PULL", b"k", 0, b"", 2, address(good), good.nbytes, hole, MB)
        with pytest.raises(RespError, match="invalid PULL range"):
            w.call(b"TAIR.KV.PULL", b"k", 0, b"", 1, -5, 10)
        with pytest.raises(RespError, match="names 2 ranges"):
            w.call(b"TAIR.KV.PULL", b"k", 0, b"", 2, address(good), 10)
        # The packed form (RANGES: u64 pairs): the same refusals, and its own for a malformed blob.
        packed = np.array([[address(good), good.nbytes], [hole, MB]], "<u8").tobytes()
        with pytest.raises(RespError, match="EFAULT"):
            w.call(b"TAIR.KV.PULL", b"k", 0, b"", b"RANGES", packed)
        for blob, match in ((packed[:-3], "16 bytes a range"), (np.array([2**64 - 8, 16], "<u8").tobytes(),
                            "invalid PULL range"), (np.array([4096, 2**48], "<u8").tobytes(), "invalid PULL range")):
            with pytest.raises(RespError, match=match):
                w.call(b"TAIR.KV.PULL", b"k", 0, b"", b"ranges", blob)
        with pytest.raises(RespError, match="needs the packed ranges"):
            w.call(b"TAIR.KV.PULL", b"k", 0, b"", b"RANGES")
        for ttl in (-1, 2**63 - 1):  # an expiry time past 64 bits, as by SETEX
            with pytest.raises(RespError, match="invalid expire time in 'tair.kv.pull' command"):
                w.call(b"TAIR.KV.PULL", b"k", ttl, b"", 1, address(good), 10)
        assert tcp.get(b"k") == old  # the old value stays
        info = _info(tcp)
        assert info["dram_used"] == base and info["pulls_in_flight"] == 0 and info["stage_reserved_bytes"] == 0
        assert info["pull_failures"] == 3
        assert tcp.ping() and w.call(b"PING") == b"PONG"
        # The connection and the server carry on; both forms store (the packed one with options after it).
        assert _pull(w, b"k2", good) > 0 and tcp.get(b"k2") == good.tobytes()
        parts = np.array([[address(good) + 10, 20], [address(good) + MB, 5]], "<u8").tobytes()
        assert int(w.call(b"TAIR.KV.PULL", b"k3", 0, b"hd", b"RANGES", parts, b"VER", 0)) > 0
        assert tcp.get(b"k3") == b"hd" + good[10:30].tobytes() + good[MB:MB + 5].tobytes()
        assert w.packed  # the probe found the packed form
    finally:
        w.close()


def test_a_connection_looks_its_peer_up_once_and_gives_it_back_when_it_closes(make_server, sockdir) -> None:
    """The pidfd of the connecting process is kept for the connection's pulls (not opened per PULL) and closed
    with the connection, also when the connection goes away while a pull still copies."""
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb", "stage-offload-min": "1mb", "pull-store": "yes"})
    tcp = srv.client()
    pid = srv.proc.pid

    def pidfds() -> int:
        n = 0
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                n += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[pidfd]"
            except OSError:
                pass  # closed while listed
        return n

    assert pidfds() == 0
    data = np.random.default_rng(5).integers(0, 256, 3 * MB, dtype=np.uint8)
    for round_ in range(3):
        w = PullWriter(path)
        for i in range(4):
            assert _pull(w, b"k%d" % i, data) > 0
        assert pidfds() == 1  # one per connection, however many pulls
        if round_ == 2:  # gone with a pull in flight (off the loop): the pull keeps its own reference
            w.sock.sendall(b"*7\r\n$12\r\nTAIR.KV.PULL\r\n$2\r\nkz\r\n$1\r\n0\r\n$0\r\n\r\n$1\r\n1\r\n"
                           + b"$%d\r\n%d\r\n" % (len(str(address(data))), address(data))
                           + b"$%d\r\n%d\r\n" % (len(str(data.nbytes)), data.nbytes))
        w.close()
        wait_for(lambda: pidfds() == 0, timeout=10, what="the connection's pidfd closed")
        assert all(tcp.get(b"k%d" % i) == data.tobytes() for i in range(4))
    assert tcp.ping()


def test_mpull_stores_each_value_and_answers_per_value(make_server, sockdir) -> None:
    """TAIR.KV.MPULL: one worker run for several values; a value that cannot be read is an error element and the
    others are stored; malformed input refuses the whole command before anything moves."""
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb", "stage-offload-min": "1mb", "pull-store": "yes"})
    tcp = srv.client()
    w = PullWriter(path)
    try:
        assert w.multi and w.call(b"TAIR.KV.MPULL", -1) == []  # the probe: no values, no error
        rng = np.random.default_rng(9)
        data = [rng.integers(0, 256, n, dtype=np.uint8) for n in (3 * MB, 100_000, 2 * MB + 7)]
        m = mmap.mmap(-1, MB)
        hole = address(m)
        m.close()  # now unmapped

        def packed(*pairs: int) -> bytes:
            return np.array(pairs, "<u8").tobytes()

        good = [packed(address(d), d.nbytes) for d in data]
        tcp.set(b"m1", b"old")
        base = _info(tcp)
        reply = w.call(b"TAIR.KV.MPULL", -1, b"m0", 0, b"h0", good[0], b"m1", 0, b"", packed(hole, 4096),
                       b"m2", 60_000, b"", good[1], b"m3", 0, b"h3", good[2])
        assert isinstance(reply[0], int) and isinstance(reply[2], int) and isinstance(reply[3], int)
        assert isinstance(reply[1], RespError) and "EFAULT" in str(reply[1])
        assert tcp.get(b"m0") == b"h0" + data[0].tobytes() and tcp.get(b"m2") == data[1].tobytes()
        assert tcp.get(b"m3") == b"h3" + data[2].tobytes() and tcp.get(b"m1") == b"old"
        assert 0 < tcp.pttl(b"m2") <= 60_000 and tcp.ttl(b"m0") == -1
        assert int(tcp.execute_command("TAIR.KV.VERSION", b"m3")) == reply[3]
        info = _info(tcp)
        assert info["pull_stores"] == base["pull_stores"] + 3 and info["pull_failures"] == base["pull_failures"] + 1
        assert info["pulls_in_flight"] == 0 and info["stage_reserved_bytes"] == 0
        # Malformed: refused whole, nothing stored.
        for args, match in (((b"m4", 0, b""), "takes sum_at"), ((b"m4", 0, b"", good[0][:-1]), "16 bytes a range"),
                            ((b"m4", -5, b"", good[0]), "invalid expire"),
                            ((b"m4", 0, b"", good[0], b"m5", 0, b"", packed(1, 2**48)), "invalid PULL range")):
            with pytest.raises(RespError, match=match):
                w.call(b"TAIR.KV.MPULL", -1, *args)
        with pytest.raises(RespError, match="outside the head"):
            w.call(b"TAIR.KV.MPULL", 4, b"m4", 0, b"short", good[1])
        assert tcp.exists(b"m4", b"m5") == 0
        assert _info(tcp)["stage_reserved_bytes"] == 0
        # Over TCP: refused as PULL is.
        with pytest.raises(redis.ResponseError, match="only on the Unix socket"):
            tcp.execute_command("TAIR.KV.MPULL", -1, b"m6", 0, b"", good[1])
        assert w.call(b"PING") == b"PONG"
        # ACL: every value's key is checked (positions 2, 6, 10, ...), not the sum_at, TTLs, heads or blobs; one
        # key outside the user's patterns refuses the whole command, and nothing is stored.
        tcp.execute_command("ACL", "SETUSER", "t", "on", ">pw", "~m*", "+@all")
        t = FastClient(unix_path=path, username="t", password="pw")
        try:
            with pytest.raises(RespError, match="NOPERM"):
                t.call(b"TAIR.KV.MPULL", -1, b"m7", 0, b"", good[1], b"other", 0, b"", good[1])
            assert tcp.exists(b"m7", b"other") == 0
            assert t.call(b"TAIR.KV.MPULL", -1, b"m7", 0, b"", good[1])[0] > 0
            assert tcp.get(b"m7") == data[1].tobytes()
        finally:
            t.close()
    finally:
        w.close()


def test_pull_is_refused_over_tcp_and_when_disabled(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb", "pull-store": "yes"})
    tcp = srv.client()
    buf = os.urandom(100_000)
    with pytest.raises(Exception, match="only on the Unix socket"):
        tcp.execute_command("TAIR.KV.PULL", b"k", 0, b"", 1, address(buf), len(buf))
    with pytest.raises(Exception, match="only on the Unix socket"):
        tcp.execute_command("TAIR.KV.PULLPROBE", address(buf), 100)
    assert tcp.exists(b"k") == 0
    tcp.config_set("pull-store", "no")
    raw = FastClient(unix_path=path)
    try:
        with pytest.raises(RespError, match="pull stores are disabled"):
            _pull(raw, b"k", buf)
        with pytest.raises(PullUnavailable, match="disabled"):
            PullWriter(path)
        assert tcp.exists(b"k") == 0
    finally:
        raw.close()


def test_too_large_a_pull_gets_oom_like_a_set(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "32mb", "pull-store": "yes"})
    tcp = srv.client()
    w = PullWriter(path)
    try:
        big = np.ones(40 * MB, np.uint8)
        with pytest.raises(redis.exceptions.OutOfMemoryError):  # redis-py's class for -OOM
            tcp.set(b"s", big.tobytes())
        base = _info(tcp)["dram_used"]
        with pytest.raises(RespError, match="OOM"):
            _pull(w, b"k", big)
        info = _info(tcp)
        assert tcp.exists(b"k") == 0 and info["dram_used"] == base and info["stage_reserved_bytes"] == 0
        # What fits is stored and charged like a SET of it.
        v = _pull(w, b"k", big[:8 * MB])
        assert v > 0 and _info(tcp)["dram_used"] > base + 8 * MB
    finally:
        w.close()


def test_sdk_falls_back_to_staging_when_pulls_are_refused(make_server, sockdir, caplog) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb", "pull-store": "no"})
    tcp = srv.client()
    kv = np.random.default_rng(5).standard_normal((4, 2, 2, 512, 64), dtype=np.float32)
    tokens = list(range(512))
    c = KVCacheClient(f"unix://{path}", Namespace("fallback", kv_dtype="float32"))
    try:
        with caplog.at_level(logging.DEBUG, logger="kvstrata.client"):
            assert c.store(tokens, kv, skip_existing=False) == 2
            assert c.store(tokens, kv, skip_existing=False) == 2
        why = [r for r in caplog.records if "does not pull" in r.getMessage()]
        assert len(why) == 1 and "disabled" in why[0].getMessage()  # logged once, with the reason...
        assert why[0].levelno == logging.DEBUG  # ...at DEBUG: pull-store no is the server's default
        assert isinstance(c._stager(), StageWriter)
        info = _info(tcp)
        assert info["pull_stores"] == 0 and info["stage_commits"] == 4
        n, got = c.retrieve(tokens)
        assert n == 512 and np.array_equal(got, kv)
        # Pulls refused in the middle of a client's life (CONFIG SET): that batch and the next are staged.
        tcp.config_set("pull-store", "yes")
        d = KVCacheClient(f"unix://{path}", Namespace("fallback2", kv_dtype="float32"))
        try:
            assert d.store(tokens, kv, skip_existing=False) == 2 and _info(tcp)["pull_stores"] == 2
            tcp.config_set("pull-store", "no")
            kv2 = kv + 1
            assert d.store(tokens, kv2, skip_existing=False) == 2
            assert isinstance(d._stager(), StageWriter) and _info(tcp)["stage_commits"] == 6
            n, got = d.retrieve(tokens)
            assert n == 512 and np.array_equal(got, kv2)
        finally:
            d.close()
    finally:
        c.close()


def test_a_forked_child_cannot_make_the_server_read_anything_but_the_connecting_process(make_server,
                                                                                       sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb", "pull-store": "yes"})
    tcp = srv.client()
    w = PullWriter(path)
    try:
        buf = np.full(MB, 7, np.uint8)  # the parent's bytes
        r, wr = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: same connection, same addresses, its own bytes
            code = 1
            try:
                os.close(r)
                buf[:] = 9
                out = {"same_address": _pull(w, b"k", buf)}
                own = mmap.mmap(-1, 64 * MB)  # mapped in the child only
                own.write(b"\x05" * MB)
                try:
                    _pull(w, b"own", np.frombuffer(own, np.uint8, MB))
                    out["own"] = "stored"
                except RespError as exc:
                    out["own"] = str(exc)
                os.write(wr, json.dumps(out).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(wr)
        with os.fdopen(r, "rb") as f:
            out = json.loads(f.read())
        assert os.waitpid(pid, 0)[1] == 0
        # The server read the process that connected (the parent), never the child that sent the command.
        assert out["same_address"] > 0 and tcp.get(b"k") == bytes([7]) * MB
        assert "EFAULT" in out["own"] and tcp.exists(b"own") == 0
    finally:
        w.close()


_NOT_PERMITTED = textwrap.dedent("""
    import ctypes, json, os, sys
    import numpy as np
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: only CAP_SYS_PTRACE may read this process
    from kvstrata.client.fast import FastClient, RespError
    from kvstrata.client.keys import Namespace
    from kvstrata.client.pull_store import address
    from kvstrata.client.sdk import AsyncKVCacheClient, KVCacheClient
    path = sys.argv[1]
    out = {}
    raw = FastClient(unix_path=path)
    buf = bytes(range(256)) * 4096
    try:
        raw.call(b"TAIR.KV.PULL", b"k", 0, b"", 1, address(buf), len(buf))
        out["raw"] = "stored"
    except RespError as exc:
        out["raw"] = str(exc)
    out["exists"] = raw.call(b"EXISTS", b"k")
    kv = np.random.default_rng(2).standard_normal((4, 2, 2, 512, 64), dtype=np.float32)
    c = KVCacheClient("unix://" + path, Namespace("eperm", kv_dtype="float32"))
    out["stored"] = c.store(list(range(512)), kv, skip_existing=False)
    out["pull_off"] = bool(getattr(c, "_pull_off", False))
    n, got = c.retrieve(list(range(512)))
    out["exact"] = bool(n == 512 and np.array_equal(got, kv))
    c.close()
    print(json.dumps(out))
""")


def _without_ptrace_capability() -> None:
    """In the server's process before exec: drop CAP_SYS_PTRACE from the bounding set, so that a server started by
    root cannot read a non-dumpable process either (as an unprivileged one cannot; there the call fails, harmless)."""
    import ctypes

    ctypes.CDLL(None).prctl(24, 19, 0, 0, 0)  # PR_CAPBSET_DROP, CAP_SYS_PTRACE


def test_kernel_refusal_is_noperm_and_the_sdk_stages_instead(sockdir) -> None:
    # A server that may not read the client: the client made itself non-dumpable (PR_SET_DUMPABLE 0), and the
    # server has no CAP_SYS_PTRACE (dropped before exec when the tests run as root).
    path = os.path.join(sockdir, "kv.sock")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC)}
    proc = subprocess.Popen([sys.executable, "-m", "kvstrata", "serve", "--port", str(port), "--bind", "127.0.0.1",
                             "--unixsocket", path, "--http-port", "0",
                             "--dram-size", "64mb", "--pull-store", "yes", "--loglevel", "warning"],
                            env=env, cwd=sockdir, preexec_fn=_without_ptrace_capability, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"server exited: {proc.stderr.read().decode(errors='replace')}")
            try:
                with FastClient(unix_path=path, timeout=2) as f:
                    return f.call(b"PING") == b"PONG"
            except OSError:
                return False

        wait_for(ready, timeout=30, what="the server on its Unix socket")
        done = subprocess.run([sys.executable, "-c", _NOT_PERMITTED, path], env=env, capture_output=True,
                              timeout=120, check=True)
        out = json.loads(done.stdout.decode().strip().splitlines()[-1])
        assert out["raw"].startswith("NOPERM") and "nothing was stored" in out["raw"]
        assert out["exists"] == 0
        assert out == {**out, "stored": 2, "pull_off": True, "exact": True}
        with FastClient(unix_path=path) as f:
            info = f.call(b"INFO", b"memory").decode()
        stats = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        assert stats["pull_stores"] == "0" and int(stats["stage_commits"]) == 2 and stats["pulls_in_flight"] == "0"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_async_client_pulls_too_and_the_environment_turns_it_off(make_server, sockdir, monkeypatch) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb", "pull-store": "yes"})
    tcp = srv.client()
    kv = np.random.default_rng(9).standard_normal((4, 2, 2, 512, 64), dtype=np.float32)
    tokens = list(range(512))

    async def go(model: str) -> np.ndarray:
        c = AsyncKVCacheClient(f"unix://{path}", Namespace(model, kv_dtype="float32"))
        try:
            assert await c.store(tokens, kv) == 2
            n, out = await c.retrieve(tokens)
            assert n == 512
            return out
        finally:
            await c.aclose()

    assert np.array_equal(asyncio.run(go("async-pull")), kv)
    info = _info(tcp)
    assert info["pull_stores"] == 2 and info["stage_commits"] == 0
    monkeypatch.setenv("KVSTRATA_PULL_STORE", "0")
    assert np.array_equal(asyncio.run(go("async-staged")), kv)
    info = _info(tcp)
    assert info["pull_stores"] == 2 and info["stage_commits"] == 2
    # stage_writes=False keeps every store on the socket, pulls included.
    monkeypatch.delenv("KVSTRATA_PULL_STORE")
    with KVCacheClient(f"unix://{path}", Namespace("socket", kv_dtype="float32"), stage_writes=False) as c:
        assert c._stager() is None and c.store(tokens, kv) == 2
    info = _info(tcp)
    assert info["pull_stores"] == 2 and info["stage_commits"] == 2
