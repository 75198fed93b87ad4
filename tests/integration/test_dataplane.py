"""The local data plane end to end: the Unix socket, the arena descriptor (SCM_RIGHTS, read-only), reads by
reference under leases, churn while readers hold leases, crashed and idle lease holders, and the SDK's local path.
"""

from __future__ import annotations

import asyncio
import fcntl
import mmap
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
import redis
import xxhash
from tests.integration.polling import wait_for
from tests.integration.support import make_kv
from tests.integration.support import memory_info as _info
from tests.integration.support import unix_server as _start

from kvstrata.client.arena import ArenaClient, ArenaUnavailable, Ref
from kvstrata.client.keys import Namespace
from kvstrata.client.sdk import AsyncKVCacheClient, KVCacheClient

pytestmark = pytest.mark.kvstrata_only

KB = 1024
MB = 1024 * KB


def test_unix_socket_serves_redis_py_and_redis_cli(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, unixsocketperm="770")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o770
    r = redis.Redis(unix_socket_path=path)
    r.set("k", b"v" * 100_000)
    assert r.get("k") == b"v" * 100_000
    assert srv.client().get("k") == b"v" * 100_000  # the same keyspace over TCP
    out = subprocess.run(["redis-cli", "-s", path, "GET", "k"], capture_output=True, timeout=15, check=True)
    assert out.stdout.strip() == b"v" * 100_000
    assert r.config_get("unixsocket") == {"unixsocket": path}


def test_arena_descriptor_is_read_only_and_refs_point_at_the_values(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "32mb"})
    r = srv.client()
    big, small = os.urandom(3 * MB + 5), b"tiny"
    r.set("big", big)
    r.set("small", small)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(b"*1\r\n$13\r\nTAIR.KV.ARENA\r\n")
        data, fds, _, _ = socket.recv_fds(s, 1024, 4)
        assert data.startswith(b"+") and len(fds) == 1
        fd = fds[0]
        try:
            assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
            with pytest.raises(PermissionError):
                mmap.mmap(fd, int(data[1:-2]), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
    c = ArenaClient(path)
    try:
        lease, refs = c.mgetref([b"big", b"small", b"missing"])
        assert lease > 0 and refs[2] is None
        assert isinstance(refs[0], Ref) and bytes(c.value(refs[0])) == big
        assert bytes(c.value(refs[1])) == small  # a small value is copied into the arena to be referenced
        assert refs[0].checksum == xxhash.xxh3_64_intdigest(big)
        assert refs[0].version == int(r.execute_command("TAIR.KV.VERSION", "big"))
        with pytest.raises(TypeError):
            c.view[refs[0].offset] = 0  # the mapping is read-only
        assert c.call(b"TAIR.KV.RELEASE", lease) == 1
        assert c.call(b"TAIR.KV.RELEASE", lease) == 0
    finally:
        c.close()


def test_nosum_refs_skip_the_servers_hash_pass(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "32mb"})
    r = srv.client()
    big = os.urandom(2 * MB + 3)
    r.set("big", big)
    r.set("NOSUM", b"a key named like the option")
    c = ArenaClient(path)
    try:
        lease, refs = c.mgetref([b"big", b"missing"], checksums=False)
        assert isinstance(refs[0], Ref) and refs[0].checksum is None and refs[1] is None
        assert bytes(c.value(refs[0])) == big  # the same reference, only without the checksum
        assert _info(r)["arena_hashed_bytes"] == 0  # nothing was hashed for it
        lease2, refs2 = c.mgetref([b"big"])  # asked for: hashed once, then remembered
        assert refs2[0].offset == refs[0].offset and refs2[0].checksum == xxhash.xxh3_64_intdigest(big)
        assert _info(r)["arena_hashed_bytes"] == len(big)
        c.mgetref([b"big"])
        assert _info(r)["arena_hashed_bytes"] == len(big)
        # Raw RESP: NOSUM after LEASE, nil in the checksum field; a lone key named NOSUM is a key.
        raw = redis.Redis(unix_socket_path=path)
        lease3, (ref,) = raw.execute_command("TAIR.KV.MGETREF", "big", "LEASE", "5000", "nosum")
        assert lease3 > 0 and ref[3] is None and int(ref[1]) == len(big)
        lease4, (named,) = raw.execute_command("TAIR.KV.MGETREF", "NOSUM")
        assert named[3] is not None and int(named[1]) == len(b"a key named like the option")
        with pytest.raises(redis.ResponseError, match="invalid LEASE"):
            raw.execute_command("TAIR.KV.MGETREF", "big", "LEASE", "-1", "NOSUM")
        assert raw.execute_command("TAIR.KV.RELEASE", lease3, lease4) == 2
        c.release(lease)
        c.release(lease2, now=True)
        assert _info(r)["arena_leases"] == 1  # the third c.mgetref above, never released
    finally:
        c.close()


def test_mgetref_options_are_not_keys_for_acl_key_patterns(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir)
    admin = srv.client()
    admin.set("kv:a", b"a" * 300_000)
    admin.set("other:b", b"b" * 300_000)
    admin.execute_command("ACL", "SETUSER", "t", "on", ">pw", "~kv:*", "+@all")
    c = redis.Redis(unix_socket_path=path, username="t", password="pw")
    try:
        # LEASE, its milliseconds and NOSUM are checked as options, not as keys outside ~kv:*.
        lease, (ref,) = c.execute_command("TAIR.KV.MGETREF", "kv:a", "LEASE", "5000", "NOSUM")
        assert lease > 0 and int(ref[1]) == 300_000
        with pytest.raises(redis.exceptions.NoPermissionError, match="no permissions to access one of the keys"):
            c.execute_command("TAIR.KV.MGETREF", "kv:a", "other:b", "NOSUM")
        assert c.execute_command("TAIR.KV.RELEASE", lease) == 1
    finally:
        c.close()


def test_only_a_user_who_may_read_every_key_maps_the_arena(make_server, sockdir) -> None:
    # The mapping shows every value in DRAM, other tenants' too, and cannot be taken back once mapped: a user
    # restricted to some keys is refused the descriptor (whatever its command rules), and its SDK reads over
    # the socket instead, byte-identical.
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    admin = srv.client()
    admin.set("other:b", b"b" * 300_000)
    admin.execute_command("ACL", "SETUSER", "t", "on", ">pw", "~kvs:*", "+@all")
    admin.execute_command("ACL", "SETUSER", "all", "on", ">pw", "~*", "+@all")
    with pytest.raises(ArenaUnavailable, match="NOPERM"):
        ArenaClient(path, username="t", password="pw")
    log = [dict(zip(e[::2], e[1::2], strict=True)) for e in admin.execute_command("ACL", "LOG", "10")]
    assert any(e[b"username"] == b"t" and e[b"reason"] == b"key" for e in log)
    assert admin.execute_command("ACL", "DRYRUN", "t", "TAIR.KV.ARENA").startswith(b"This user has no permissions")
    assert admin.execute_command("ACL", "DRYRUN", "all", "TAIR.KV.ARENA") == b"OK"
    c = ArenaClient(path, username="all", password="pw")
    try:
        _, (ref,) = c.mgetref([b"other:b"], checksums=False)
        assert bytes(c.value(ref)) == b"b" * 300_000
    finally:
        c.close()
    ns = Namespace("m", kv_dtype="float32")
    kv = make_kv(512, layers=2, heads=2, dim=32)
    tokens = list(range(512))
    with KVCacheClient(f"unix://{path}", ns, username="t", password="pw") as sdk:
        sdk.store(tokens, kv)
        assert _info(admin)["stage_commits"] == 2  # its stores still went through its own staging segment
        n, out = sdk.retrieve(tokens)
        assert n == 512 and np.array_equal(out, kv)
        assert getattr(sdk._tls, "arena", None) is None and not sdk._arena_ok  # read over the socket


def test_arena_is_refused_over_tcp_before_auth_and_when_off(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, requirepass="pw")
    with pytest.raises(redis.ResponseError, match="only with clients on the Unix socket"):
        srv.client(password="pw").execute_command("TAIR.KV.ARENA")
    with pytest.raises(ArenaUnavailable, match="NOAUTH"):
        ArenaClient(path)
    c = ArenaClient(path, password="pw")
    assert c.size > 0
    c.close()
    srv2, path2 = _start(make_server, tempfile.mkdtemp(prefix="kvs-"), arena="no")
    with pytest.raises(ArenaUnavailable, match="arena is disabled"):
        ArenaClient(path2)


def test_lease_rules_per_client_and_errors(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"lease-max-per-client": "2"})
    r = redis.Redis(unix_socket_path=path)
    r.set("a", b"x" * 200_000)
    l1, _ = r.execute_command("TAIR.KV.MGETREF", "a", "LEASE", "5000")
    r.execute_command("TAIR.KV.MGETREF", "a")
    with pytest.raises(redis.ResponseError, match="too many leases"):
        r.execute_command("TAIR.KV.MGETREF", "a")
    other = redis.Redis(unix_socket_path=path)
    assert other.execute_command("TAIR.KV.RELEASE", l1) == 0  # not its lease
    with pytest.raises(redis.ResponseError, match="invalid LEASE"):
        other.execute_command("TAIR.KV.MGETREF", "a", "LEASE", "0")
    with pytest.raises(redis.ResponseError, match="not an integer"):
        other.execute_command("TAIR.KV.RELEASE", "abc")
    assert r.execute_command("TAIR.KV.RELEASE", l1) == 1
    assert r.ping()


def _value(key: int, gen: int, n: int) -> bytes:
    head = b"%08d%08d" % (key, gen)
    return head + bytes([gen % 251]) * (n - len(head))


def test_readers_see_only_their_leased_version_under_churn(make_server, sockdir) -> None:
    """Overwrites, deletes and evictions while readers hold leases and read through the mapping."""
    srv, path = _start(make_server, sockdir, **{"dram-size": "8mb"})
    n_keys, size = 24, 300 * KB  # 7.2 MB of values in an 8 MB budget: writes evict
    w = srv.client()
    for k in range(n_keys):
        w.set(b"k%d" % k, _value(k, 0, size))
    stop = threading.Event()
    errors: list[str] = []
    reads = [0]

    def writer() -> None:
        gen = 1
        rng = np.random.default_rng(1)
        while not stop.is_set():
            k = int(rng.integers(n_keys))
            try:
                if rng.random() < 0.2:
                    w.delete(b"k%d" % k)
                else:
                    w.set(b"k%d" % k, _value(k, gen, size + int(rng.integers(0, 100 * KB))))
            except redis.ResponseError as exc:  # -OOM while leased values fill DRAM is the rule, not a bug
                if "OOM" not in str(exc) and "memory" not in str(exc):
                    errors.append(f"writer: {exc}")
            gen += 1

    def reader(seed: int) -> None:
        c = ArenaClient(path, lease_ms=30_000)
        rng = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                keys = [b"k%d" % int(k) for k in rng.choice(n_keys, 4, replace=False)]
                lease, refs = c.mgetref(keys)
                first = [None if not isinstance(ref, Ref) else bytes(c.value(ref)) for ref in refs]
                # Let the writer run, then read again: a leased slot must not have been reused meanwhile.
                w2 = redis.Redis(unix_socket_path=path)
                w2.set(b"churn%d" % seed, os.urandom(400 * KB))
                w2.close()
                for key, ref, data in zip(keys, refs, first, strict=True):
                    if not isinstance(ref, Ref):
                        continue
                    again = bytes(c.value(ref))
                    if again != data or xxhash.xxh3_64_intdigest(again) != ref.checksum:
                        errors.append(f"{key!r}: bytes changed under a lease")
                    k, gen = int(data[:8]), int(data[8:16])
                    if b"k%d" % k != key or data != _value(k, gen, len(data)):
                        errors.append(f"{key!r}: not a version ever written")
                    reads[0] += 1
                c.release(lease)
        except Exception as exc:  # surfaced below
            errors.append(repr(exc))
        finally:
            c.close()

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(s,)) for s in (2, 3)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: reads[0] >= 100 or errors, timeout=60, what="100 leased reads under churn")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[:5]
    # Released slots are freed by the next background cycle: then nothing leased or dropped stays charged.
    info = wait_for(lambda: (i := _info(w))["arena_leases"] == 0 and i["arena_leased_dropped_bytes"] == 0 and i,
                    what="leases released and their slots freed")
    assert info["dram_used"] <= info["dram_budget"]
    assert int(w.info("stats").get("evicted_keys", 0)) > 0  # the churn really evicted


_CRASHER = """
import os, sys
from kvstrata.client.arena import ArenaClient
c = ArenaClient(sys.argv[1])
lease, refs = c.mgetref([b"held"], lease_ms=600000)
print(lease, flush=True)
os._exit(0)  # no release, no close: the process dies holding the lease
"""


def test_a_crashed_client_loses_its_leases_and_an_idle_one_expires(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "16mb"})
    r = srv.client()
    r.set("held", b"h" * 4 * MB)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", _CRASHER, path], capture_output=True, timeout=60, env=env,
                         check=True)
    assert int(out.stdout) > 0
    r.set("held", b"n" * 4 * MB)  # overwritten while (maybe still) leased: freed once the lease is gone
    wait_for(lambda: _info(r)["arena_leases"] == 0, what="the dead client's lease dropped")
    info = wait_for(lambda: (i := _info(r))["arena_leased_dropped_bytes"] == 0 and i, what="slot freed")
    assert info["dram_used"] < 4 * MB + 64 * KB  # only the new value is charged
    c = ArenaClient(path)
    try:
        c.mgetref([b"held"], lease_ms=100)  # never released: expires on its own
        assert _info(r)["arena_leases"] == 1
        wait_for(lambda: _info(r)["arena_leases"] == 0, what="the idle lease expired")
        assert c.call(b"PING") == b"PONG"
    finally:
        c.close()


def test_values_below_dram_are_loaded_into_the_arena(make_server, sockdir, tmp_path) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "2mb", "essd-path": str(tmp_path / "ssd")})
    r = redis.Redis(unix_socket_path=path)
    vals = {b"s%d" % i: os.urandom(700 * KB) for i in range(6)}  # 4.2 MB: most are demoted to SSD
    for k, v in vals.items():
        r.set(k, v)
    wait_for(lambda: r.execute_command("TAIR.KV.TIER", "s0") == b"ssd", what="s0 demoted")
    # The demoted values' slots are reused once the SSD writer has written them.
    wait_for(lambda: _info(r)["arena_waiting_writers"] == 0, what="demotions written")
    c = ArenaClient(path)
    try:
        # Two at a time fit beside what DRAM holds: each SSD value is loaded and copied into an arena slot.
        for pair in (list(vals)[:2], list(vals)[2:4], list(vals)[4:]):
            lease, refs = c.mgetref(pair)
            assert all(isinstance(ref, Ref) for ref in refs), refs
            for k, ref in zip(pair, refs, strict=True):
                assert bytes(c.value(ref)) == vals[k]
            c.release(lease, now=True)
            # Released slots stay charged until freed (after the writer has written what making room demoted).
            wait_for(lambda: _info(r)["arena_leased_dropped_bytes"] == 0, what="released slots freed")
        # All six do not fit in the 2 MB budget at once: those that cannot be placed come back inline.
        lease, refs = c.mgetref(list(vals))
        assert any(isinstance(ref, bytes) for ref in refs)
        for k, ref in zip(vals, refs, strict=True):
            assert bytes(c.value(ref)) == vals[k]
        c.release(lease, now=True)
    finally:
        c.close()
    info = wait_for(lambda: (i := _info(r))["arena_leases"] == 0 and i["arena_leased_dropped_bytes"] == 0 and i,
                    what="released and freed")
    assert info["dram_used"] <= info["dram_budget"]


def test_sdk_reads_through_the_arena_over_unix_and_loopback(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    ns = Namespace("m", kv_dtype="float32")
    kv = make_kv(1024, layers=4, heads=4, dim=64)
    tokens = list(range(1024))
    for url in (f"unix://{path}", f"redis://127.0.0.1:{srv.port}"):
        with KVCacheClient(url, ns) as c:
            c.store(tokens, kv)
            n, out = c.retrieve(tokens)
            assert n == 1024 and np.array_equal(out, kv)
            dst = np.zeros_like(kv)
            n, view = c.retrieve(tokens[:700], out=dst)
            assert n == 512 and np.array_equal(view, kv[:, :, :, :512]) and view.base is dst
            n, chunks = c.retrieve_chunks(tokens)
            assert n == 1024 and np.array_equal(np.concatenate(chunks, axis=3), kv)
            assert c._tls.arena is not None  # the arena was used, not the socket
            n, views = c.retrieve_chunks(tokens, reuse_buffers=True)  # views of the server's memory, leased
            assert n == 1024 and not views[0].flags.writeable
            assert np.array_equal(np.concatenate(views, axis=3), kv)
    with KVCacheClient(f"redis://127.0.0.1:{srv.port}", ns, local_plane=False) as c:
        n, out = c.retrieve(tokens)
        assert n == 1024 and np.array_equal(out, kv) and getattr(c._tls, "arena", None) is None
    info = _info(srv.client())
    assert info["arena_leases"] == 0
    # The SDK's arena reads ask with NOSUM: the server never hashed a value for them (values just stored have
    # no checksum yet, so asking would have hashed every one).
    assert info["arena_hashed_bytes"] == 0 and info["arena_leases_granted"] >= 8


def test_async_client_reads_through_the_arena_too(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    ns = Namespace("m-async", kv_dtype="float32")
    kv = make_kv(512, layers=4, heads=4, dim=64)
    tokens = list(range(512))

    async def go() -> tuple[int, np.ndarray | None, bool, int]:
        c = AsyncKVCacheClient(f"unix://{path}", ns)
        try:
            await c.store(tokens, kv)
            n, out = await c.retrieve(tokens)
            return n, out, c._local is not None, c.stats.hit_chunks
        finally:
            await c.aclose()

    n, out, used_arena, hits = asyncio.run(go())
    assert n == 512 and np.array_equal(out, kv)
    assert used_arena and hits == 2
    info = _info(srv.client())
    assert info["arena_leases"] == 0 and info["arena_hashed_bytes"] == 0
