"""Two-phase writes end to end over real sockets: a writer's own writable staging segment (SCM_RIGHTS),
reservations, commits verified by checksum, and what readers (GET over TCP, MGETREF through the arena, the SDK)
see afterwards; bounds, dead writers, the DRAM budget and demotion to the SSD.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading

import numpy as np
import pytest
import redis
import xxhash
from tests.integration.polling import wait_for
from tests.integration.support import make_kv
from tests.integration.support import memory_info as _info
from tests.integration.support import unix_server as _start

from kvstrata.client.arena import ArenaClient, Ref
from kvstrata.client.fast import RespError
from kvstrata.client.keys import Namespace
from kvstrata.client.sdk import AsyncKVCacheClient, KVCacheClient
from kvstrata.client.stage import StageUnavailable, StageWriter

pytestmark = pytest.mark.kvstrata_only

KB = 1024
MB = 1024 * KB


def _sum(data: bytes) -> bytes:
    return b"%016x" % xxhash.xxh3_64_intdigest(data)


def test_committed_values_are_seen_by_every_reader_with_their_version(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tcp = srv.client()
    vals = {b"big": os.urandom(3 * MB + 5), b"mid": os.urandom(200 * KB), b"small": b"tiny value"}
    w = StageWriter(path)
    try:
        # The value may come in several parts (a codec header and the tensor's runs): written back to back.
        items = [(k, 0, [v[:7], memoryview(v)[7:]]) for k, v in vals.items()]
        versions = w.put_many(items)
        assert all(isinstance(v, int) and v > 0 for v in versions), versions
        for (k, v), ver in zip(vals.items(), versions, strict=True):
            assert tcp.get(k) == v  # over TCP
            assert int(tcp.execute_command("TAIR.KV.VERSION", k)) == ver
        c = ArenaClient(path)
        try:
            lease, refs = c.mgetref(list(vals))
            for (k, v), ver, ref in zip(vals.items(), versions, refs, strict=True):
                assert isinstance(ref, Ref), k
                assert bytes(c.value(ref)) == v and ref.version == ver
                assert ref.checksum == xxhash.xxh3_64_intdigest(v)
            c.release(lease, now=True)
        finally:
            c.close()
        # Scribbling on the segment after the commit changes nothing stored: the server stored its own copy.
        w.view[:] = b"\xee" * w.size
        assert tcp.get(b"big") == vals[b"big"]
        # An overwrite through the segment gets a newer version; a TTL is kept.
        ver2 = w.put_many([(b"mid", 60_000, [b"new bytes" * 30_000])])[0]
        assert ver2 > versions[1] and tcp.get(b"mid") == b"new bytes" * 30_000
        assert 0 < tcp.pttl(b"mid") <= 60_000
        info = _info(tcp)
        assert info["stage_commits"] == 4 and info["stage_reservations"] == 0 and info["stage_reserved_bytes"] == 0
    finally:
        w.close()


def test_bad_checksum_is_refused_and_the_old_value_stays(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tcp = srv.client()
    old = os.urandom(1 * MB)
    tcp.set(b"k", old)
    ver = int(tcp.execute_command("TAIR.KV.VERSION", b"k"))
    w = StageWriter(path)
    try:
        new = os.urandom(1 * MB)
        [(rid, off)] = w.reserve([len(new)])
        w.write(off, [new])
        with pytest.raises(RespError, match="checksum mismatch"):
            w.call(b"TAIR.KV.COMMIT", b"k", 0, rid, _sum(new[:-1] + b"\0"))
        assert tcp.get(b"k") == old and int(tcp.execute_command("TAIR.KV.VERSION", b"k")) == ver
        # The reservation ended with the refused commit: committing it again is refused too.
        with pytest.raises(RespError, match="unknown reservation"):
            w.call(b"TAIR.KV.COMMIT", b"k", 0, rid, _sum(new))
        # A torn write (the checksum of bytes the writer did not finish writing) is refused the same way.
        [(rid, off)] = w.reserve([len(new)])
        w.view[off:off + len(new)] = new
        w.view[off + 1000] ^= 0xFF
        with pytest.raises(RespError, match="checksum mismatch"):
            w.call(b"TAIR.KV.COMMIT", b"new-key", 0, rid, _sum(new))
        assert tcp.exists(b"new-key") == 0
        for bad in (b"xyz", b"0" * 17, b""):
            [(rid, _)] = w.reserve([10])
            with pytest.raises(RespError, match="invalid checksum"):
                w.call(b"TAIR.KV.COMMIT", b"k", 0, rid, bad)
            w.call(b"TAIR.KV.UNRESERVE", rid)
        with pytest.raises(RespError, match="syntax"):
            w.call(b"TAIR.KV.COMMIT", b"k", 0, 1, b"00", b"BOGUS")
        # An expiry time past 64 bits (the tiers store it as signed 64-bit milliseconds) is refused, as by SETEX.
        [(rid, _)] = w.reserve([10])
        for ttl in (-1, 2**63 - 1):
            with pytest.raises(RespError, match="invalid expire time in 'tair.kv.commit' command"):
                w.call(b"TAIR.KV.COMMIT", b"k", ttl, rid, _sum(bytes(10)))
        w.call(b"TAIR.KV.UNRESERVE", rid)
        # SUMAT: a value carrying its own checksum (computed with that field zeroed), like the codec's header.
        body = bytearray(os.urandom(300 * KB))
        body[32:40] = bytes(8)
        digest = xxhash.xxh3_64_intdigest(bytes(body))
        [(rid, off)] = w.reserve([len(body)])
        assert w.write(off, [body], sum_at=32) == digest
        assert bytes(w.view[off + 32:off + 40]) == digest.to_bytes(8, "little")  # filled in by the writer
        w.view[off + 32] ^= 1  # the field does not hold the checksum the commit names
        with pytest.raises(RespError, match="own field holds"):
            w.call(b"TAIR.KV.COMMIT", b"self", 0, rid, b"%016x" % digest, b"SUMAT", 32)
        [(rid, off)] = w.reserve([len(body)])
        with pytest.raises(RespError, match="outside the value"):
            w.call(b"TAIR.KV.COMMIT", b"self", 0, rid, b"%016x" % digest, b"SUMAT", len(body) - 4)
        [(rid, off)] = w.reserve([len(body)])
        w.write(off, [body], sum_at=32)
        assert w.call(b"TAIR.KV.COMMIT", b"self", 0, rid, b"%016x" % digest, b"SUMAT", 32) > 0
        stored = tcp.get(b"self")
        assert stored[40:] == bytes(body[40:]) and stored[32:40] == digest.to_bytes(8, "little")
        info = _info(tcp)
        assert info["stage_checksum_failures"] == 3 and info["stage_reservations"] == 0
        assert tcp.get(b"k") == old
    finally:
        w.close()


def test_segments_are_per_writer_and_only_on_the_unix_socket(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, requirepass="pw", **{"stage-size": "8mb"})
    with pytest.raises(redis.ResponseError, match="only with clients on the Unix socket"):
        srv.client(password="pw").execute_command("TAIR.KV.STAGE")
    with pytest.raises(StageUnavailable, match="NOAUTH"):
        StageWriter(path)
    a, b = StageWriter(path, password="pw"), StageWriter(path, password="pw")
    try:
        assert a.size == b.size == 8 * MB
        a.view[:4] = b"AAAA"
        assert bytes(b.view[:4]) != b"AAAA"  # each writer has a memfd of its own
        # The writer cannot resize its segment (sealed), so it cannot fault the server's accesses.
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(b"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n")
            assert s.recv(64) == b"+OK\r\n"
            s.sendall(b"*1\r\n$13\r\nTAIR.KV.STAGE\r\n")
            data, fds, _, _ = socket.recv_fds(s, 1024, 4)
            assert data == b"+%d\r\n" % (8 * MB) and len(fds) == 1
            try:
                assert fcntl.fcntl(fds[0], fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR
                with pytest.raises(PermissionError):
                    os.ftruncate(fds[0], 16 * MB)
            finally:
                os.close(fds[0])
        # A reservation is its owner's: another writer cannot commit it.
        [(rid, off)] = a.reserve([100])
        a.view[off:off + 100] = b"x" * 100
        with pytest.raises(RespError, match="unknown reservation"):
            b.call(b"TAIR.KV.COMMIT", b"k", 0, rid, _sum(b"x" * 100))
        assert a.call(b"TAIR.KV.COMMIT", b"k", 0, rid, _sum(b"x" * 100)) > 0
    finally:
        a.close()
        b.close()
    srv2, path2 = _start(make_server, tempfile.mkdtemp(prefix="kvs-"), **{"stage-size": "0"})
    with pytest.raises(StageUnavailable, match="disabled"):
        StageWriter(path2)


def test_reservation_bounds(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"stage-size": "4mb", "stage-max-reservations": "3",
                                               "dram-size": "64mb"})
    tcp = srv.client()
    w = StageWriter(path)
    try:
        with pytest.raises(redis.ResponseError, match="no staging segment"):
            redis.Redis(unix_socket_path=path).execute_command("TAIR.KV.RESERVE", 100)
        got = w.reserve([100, 100])
        assert len(got) == 2 and got[0][1] != got[1][1]
        with pytest.raises(RespError, match="too many reservations"):
            w.reserve([100, 100])  # all or none: 3 + 1 > 3
        assert _info(tcp)["stage_reservations"] == 2
        w.call(b"TAIR.KV.UNRESERVE", *[rid for rid, _ in got])
        with pytest.raises(RespError, match="segment full"):
            w.reserve([3 * MB, 2 * MB])
        assert _info(tcp)["stage_reservations"] == 0  # the first one was given back with the refusal
        with pytest.raises(RespError, match="must be positive"):
            w.reserve([0])
        with pytest.raises(RespError, match="not an integer"):
            w.reserve([b"abc"])
        # A value larger than the segment cannot be staged; put_many says so before reserving anything.
        assert not w.fits(5 * MB) and w.fits(4 * MB)
        with pytest.raises(ValueError, match="does not fit"):
            w.put_many([(b"huge", 0, [b"\0" * (5 * MB)])])
        # Waves: values that together exceed the segment go through it a segment at a time.
        vals = [os.urandom(1536 * KB) for _ in range(5)]
        vers = w.put_many([(b"w%d" % i, 0, [v]) for i, v in enumerate(vals)])
        assert all(isinstance(v, int) for v in vers)
        assert [tcp.get(b"w%d" % i) for i in range(5)] == vals
        info = _info(tcp)
        assert info["stage_reservations"] == 0 and info["stage_reserved_bytes"] == 0
    finally:
        w.close()


_DYING_WRITER = textwrap.dedent("""
    import sys
    from kvstrata.client.stage import StageWriter
    w = StageWriter(sys.argv[1])
    w.reserve([1 << 20, 1 << 20, 300000])
    print("reserved", flush=True)
    sys.stdin.read()
""")


def test_reservations_of_a_dead_or_idle_writer_end(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "16mb", "stage-reserve-ms": "300"})
    tcp = srv.client()
    base = _info(tcp)["dram_used"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", _DYING_WRITER, path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline().strip() == b"reserved"
        info = _info(tcp)
        assert info["stage_segments"] == 1 and info["stage_reservations"] == 3
        assert info["dram_used"] >= base + 2 * MB + 300_000  # reserved bytes are charged to the budget
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    info = wait_for(lambda: (i := _info(tcp))["stage_segments"] == 0 and i, what="dead writer's segment closed")
    assert info["stage_reservations"] == 0 and info["stage_reserved_bytes"] == 0 and info["dram_used"] == base
    # A writer that reserves and never commits: its reservations expire (stage-reserve-ms).
    w = StageWriter(path)
    try:
        [(rid, off)] = w.reserve([500 * KB])
        w.view[off:off + 10] = b"0123456789"
        wait_for(lambda: _info(tcp)["stage_reservations"] == 0, what="reservation expired")
        assert _info(tcp)["dram_used"] == base
        with pytest.raises(RespError, match="unknown reservation"):
            w.call(b"TAIR.KV.COMMIT", b"late", 0, rid, _sum(bytes(w.view[off:off + 500 * KB])))
        assert tcp.exists(b"late") == 0
    finally:
        w.close()


def test_budget_is_never_exceeded(make_server, sockdir) -> None:
    """Without a lower tier: reservations and commits evict as writes do, and refuse what cannot fit."""
    srv, path = _start(make_server, sockdir, **{"dram-size": "4mb", "stage-size": "16mb"})
    tcp = srv.client()
    w = StageWriter(path)
    try:
        with pytest.raises(RespError, match="OOM"):
            w.reserve([5 * MB])  # more than the whole budget
        assert _info(tcp)["stage_reservations"] == 0
        vals = {}
        for i in range(12):  # 12 x 700 KB through a 4 MB budget: earlier keys are evicted
            v = os.urandom(700 * KB)
            vals[b"e%d" % i] = v
            assert isinstance(w.put_many([(b"e%d" % i, 0, [v])])[0], int)
            info = _info(tcp)
            assert info["dram_used"] <= info["dram_budget"], info
        assert tcp.get(b"e11") == vals[b"e11"]
        kept = [k for k in vals if tcp.exists(k)]
        assert 0 < len(kept) < 12 and all(tcp.get(k) == vals[k] for k in kept)
        # Reserved bytes are unmovable: with 3 MB reserved, a 2 MB SET cannot fit beside them.
        got = w.reserve([1536 * KB, 1536 * KB])
        info = _info(tcp)
        assert info["dram_used"] <= info["dram_budget"] and info["stage_reserved_bytes"] >= 3 * MB
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            tcp.set(b"big", b"\0" * (2 * MB))
        w.call(b"TAIR.KV.UNRESERVE", *[rid for rid, _ in got])
        tcp.set(b"big", b"\0" * (2 * MB))
        info = _info(tcp)
        assert info["dram_used"] <= info["dram_budget"]
    finally:
        w.close()


def test_committed_values_demote_to_ssd_and_read_back(make_server, sockdir, tmp_path) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "2mb", "essd-path": str(tmp_path / "ssd")})
    tcp = srv.client()
    vals = {b"s%d" % i: os.urandom(700 * KB) for i in range(6)}  # 4.2 MB through 2 MB of DRAM
    w = StageWriter(path)
    try:
        vers = w.put_many([(k, 0, [v]) for k, v in vals.items()])
        assert all(isinstance(v, int) for v in vers), vers
        w.view[:] = b"\0" * w.size  # the segment's bytes are not what was stored
    finally:
        w.close()
    wait_for(lambda: tcp.execute_command("TAIR.KV.TIER", "s0") == b"ssd", what="s0 demoted")
    wait_for(lambda: _info(tcp)["arena_waiting_writers"] == 0, what="demotions written")
    for (k, v), ver in zip(vals.items(), vers, strict=True):
        assert tcp.get(k) == v
        assert int(tcp.execute_command("TAIR.KV.VERSION", k)) == ver
    info = _info(tcp)
    assert info["dram_used"] <= info["dram_budget"]


def test_sdk_stores_through_the_segment(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "128mb", "stage-size": "8mb"})
    ns = Namespace("m", kv_dtype="float32")
    kv = make_kv(1024, layers=4, heads=4, dim=64)  # strided chunks: sent as their runs
    tokens = list(range(1024))
    for url in (f"unix://{path}", f"redis://127.0.0.1:{srv.port}"):
        with KVCacheClient(url, ns, chunk_size=256, stage_writes=True) as c:
            c.clear()
            assert c.store(tokens, kv) == 4
            assert c._tls.stage is not None  # stored through the segment, not the socket
            # The codec checksum was filled in during the copy (SUMAT); MGETREF reports the whole value's xxh3.
            ac = ArenaClient(path)
            try:
                lease, refs = ac.mgetref(c.keys(tokens)[:1])
                assert refs[0].checksum == xxhash.xxh3_64_intdigest(bytes(ac.value(refs[0])))
                ac.release(lease, now=True)
            finally:
                ac.close()
            n, out = c.retrieve(tokens)
            assert n == 1024 and np.array_equal(out, kv)
    info = _info(srv.client())
    assert info["stage_commits"] == 8
    # With stage_writes=False stores go over the socket (reads still go through the arena); so do they with
    # local_plane=False.
    before = _info(srv.client())["stage_commits"]
    with KVCacheClient(f"unix://{path}", ns, chunk_size=256, stage_writes=False) as c:
        c.clear()
        assert c.store(tokens, kv) == 4
        n, out = c.retrieve(tokens)
        assert n == 1024 and np.array_equal(out, kv) and getattr(c._tls, "stage", None) is None
        assert c._tls.arena is not None
    assert _info(srv.client())["stage_commits"] == before
    with KVCacheClient(f"unix://{path}", ns, chunk_size=256, local_plane=False) as c:
        c.clear()
        assert c.store(tokens, kv) == 4
        n, out = c.retrieve(tokens)
        assert n == 1024 and np.array_equal(out, kv) and getattr(c._tls, "stage", None) is None
    assert _info(srv.client())["stage_commits"] == before


def _value(key: int, gen: int, n: int, mark: bytes = b"ok") -> bytes:
    head = b"%08d%08d%s" % (key, gen, mark)
    return head + bytes([gen % 251]) * (n - len(head))


def test_readers_never_see_refused_or_half_written_values_under_churn(make_server, sockdir) -> None:
    """A writer commits overwrites through its segment (every fifth one with bytes that do not match their
    checksum) in a budget that evicts, while an arena reader and a TCP reader check every value they see."""
    srv, path = _start(make_server, sockdir, **{"dram-size": "8mb", "stage-size": "4mb"})
    n_keys, size = 24, 400 * KB  # 9.6 MB of values in an 8 MB budget: writes evict
    stop = threading.Event()
    errors: list[str] = []
    seen = [0, 0]  # arena reads, TCP reads

    def valid(key: bytes, data: bytes) -> bool:
        k, gen = int(data[:8]), int(data[8:16])
        return b"k%d" % k == key and data == _value(k, gen, len(data))

    def writer() -> None:
        w = StageWriter(path)
        rng = np.random.default_rng(1)
        gen = 1
        try:
            while not stop.is_set():
                k = gen - 1 if gen <= n_keys else int(rng.integers(n_keys))  # every key once, then at random
                good = _value(k, gen, size + int(rng.integers(0, 50 * KB)))
                [(rid, off)] = w.reserve([len(good)])
                if gen % 5 == 0:  # poisoned: the bytes are not the ones the checksum names
                    w.write(off, [_value(k, gen, len(good), b"XX")])
                else:
                    w.write(off, [good])
                try:
                    w.call(b"TAIR.KV.COMMIT", b"k%d" % k, 0, rid, _sum(good))
                    if gen % 5 == 0:
                        errors.append(f"gen {gen}: a commit with a wrong checksum was accepted")
                except RespError as exc:
                    if gen % 5 and "OOM" not in str(exc):
                        errors.append(f"writer: {exc}")
                gen += 1
        except Exception as exc:  # surfaced below
            errors.append(f"writer: {exc!r}")
        finally:
            w.close()

    def arena_reader() -> None:
        c = ArenaClient(path)
        rng = np.random.default_rng(2)
        try:
            while not stop.is_set():
                keys = [b"k%d" % int(k) for k in rng.choice(n_keys, 3, replace=False)]
                lease, refs = c.mgetref(keys)
                for key, ref in zip(keys, refs, strict=True):
                    if isinstance(ref, Ref):
                        data = bytes(c.value(ref))
                        if xxhash.xxh3_64_intdigest(data) != ref.checksum or not valid(key, data):
                            errors.append(f"arena {key!r}: bytes that were never committed")
                        seen[0] += 1
                c.release(lease)
        except Exception as exc:
            errors.append(f"arena reader: {exc!r}")
        finally:
            c.close()

    def tcp_reader() -> None:
        r = srv.client()
        rng = np.random.default_rng(3)
        while not stop.is_set():
            key = b"k%d" % int(rng.integers(n_keys))
            data = r.get(key)
            if data is not None:
                if not valid(key, data):
                    errors.append(f"tcp {key!r}: bytes that were never committed")
                seen[1] += 1
            info = _info(r)
            if info["dram_used"] > info["dram_budget"]:
                errors.append(f"over budget: {info['dram_used']} > {info['dram_budget']}")

    threads = [threading.Thread(target=f) for f in (writer, arena_reader, tcp_reader)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: (seen[0] >= 60 and seen[1] >= 60) or errors, timeout=60,
                 what="60 arena and 60 TCP reads under churn")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[:5]
    info = _info(srv.client())
    assert info["stage_checksum_failures"] > 0 and info["stage_commits"] > 0
    assert int(srv.client().info("stats").get("evicted_keys", 0)) > 0  # the churn really evicted


def test_sdk_halves_its_waves_to_fit_the_server_bounds(make_server, sockdir) -> None:
    """One reservation at a time (stage-max-reservations 1): the SDK's waves shrink until the server takes
    them and everything is stored through the segment. A chunk larger than the whole DRAM budget gets -OOM,
    as its TAIR.KV.SETEX would."""
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb", "stage-max-reservations": "1"})
    ns = Namespace("m", kv_dtype="float32")
    kv = make_kv(1024, layers=4, heads=4, dim=64)  # 4 chunks of 1 MB
    tokens = list(range(1024))
    with KVCacheClient(f"unix://{path}", ns, chunk_size=256, stage_writes=True) as c:
        assert c.store(tokens, kv) == 4
        assert c._tls.stage.max_wave == 1
        n, out = c.retrieve(tokens)
        assert n == 1024 and np.array_equal(out, kv)
    assert _info(srv.client())["stage_commits"] == 4
    srv2, path2 = _start(make_server, tempfile.mkdtemp(prefix="kvs-"), **{"dram-size": "512kb"})
    with KVCacheClient(f"unix://{path2}", ns, chunk_size=256, stage_writes=True) as c:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            c.store(tokens, kv)
        assert c._tls.stage is not None
    info = _info(srv2.client())
    assert info["stage_commits"] == 0 and info["stage_reserved_bytes"] == 0 and info["dram_used"] <= 512 * KB


def test_async_client_stores_through_the_segment_too(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    ns = Namespace("m-async", kv_dtype="float32")
    kv = make_kv(512, layers=4, heads=4, dim=64)
    tokens = list(range(512))

    async def go() -> tuple[int, int, np.ndarray | None]:
        c = AsyncKVCacheClient(f"unix://{path}", ns, stage_writes=True)
        try:
            stored = await c.store(tokens, kv)
            again = await c.store(tokens, kv)  # skip_existing: nothing new
            n, out = await c.retrieve(tokens)
            assert n == 512
            return stored, again, out
        finally:
            await c.aclose()

    stored, again, out = asyncio.run(go())
    assert stored == 2 and again == 0 and np.array_equal(out, kv)
    assert _info(srv.client())["stage_commits"] == 2


def test_acl_decides_who_may_stage_and_which_keys_a_commit_may_write(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    admin = srv.client()
    admin.execute_command("ACL", "SETUSER", "tenant", "on", ">pt", "~t:*", "+get", "+tair.kv.stage",
                          "+tair.kv.reserve", "+tair.kv.commit", "+tair.kv.unreserve")
    admin.execute_command("ACL", "SETUSER", "reader", "on", ">pr", "~*", "+get", "+tair.kv.arena")
    with pytest.raises(StageUnavailable, match="NOPERM"):
        StageWriter(path, username="reader", password="pr")
    w = StageWriter(path, username="tenant", password="pt")
    try:
        data = os.urandom(200 * KB)
        assert isinstance(w.put_many([(b"t:a", 0, [data])])[0], int)
        assert admin.get(b"t:a") == data
        [reply] = w.put_many([(b"other:a", 0, [data])])
        assert isinstance(reply, RespError) and "NOPERM" in str(reply)
        assert admin.exists(b"other:a") == 0
        info = _info(admin)
        assert info["stage_reservations"] == 0 and info["stage_reserved_bytes"] == 0
    finally:
        w.close()
