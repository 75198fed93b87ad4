"""Large two-phase commits copied and verified off the event loop, over real sockets: the stored bytes, what
other clients see meanwhile (they are answered; a write of the same key comes first), refusals, and a writer
that dies with commits in flight (everything it held comes back).

"In flight" is read from ``INFO memory``'s ``stage_commits_in_flight``: a reply that shows it above zero was
given by the server *while* a commit's copy ran, which an inline commit can never produce.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import xxhash
from tests.integration.polling import wait_for
from tests.integration.support import memory_info as _info
from tests.integration.support import unix_server as _start

from kvstrata.client.arena import ArenaClient, Ref
from kvstrata.client.fast import RespError
from kvstrata.client.stage import StageWriter

pytestmark = pytest.mark.kvstrata_only

KB = 1024
MB = 1024 * KB
_CFG = {"dram-size": "256mb", "stage-size": "128mb"}


def _sum(data: bytes) -> bytes:
    return b"%016x" % xxhash.xxh3_64_intdigest(data)


def _staged(w: StageWriter, value: bytes) -> int:
    [(rid, off)] = w.reserve([len(value)])
    w.write(off, [value])
    return rid


def test_large_commit_is_stored_byte_identical_off_the_loop(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **_CFG)
    tcp = srv.client()
    big = os.urandom(40 * MB + 3)
    small = os.urandom(1 * MB)
    w = StageWriter(path)
    try:
        ver = int(w.call(b"TAIR.KV.COMMIT", b"big", 0, _staged(w, big), _sum(big)))
        assert _info(tcp)["stage_commits_offloaded"] == 1
        int(w.call(b"TAIR.KV.COMMIT", b"small", 0, _staged(w, small), _sum(small)))
        info = _info(tcp)
        assert info["stage_commits_offloaded"] == 1  # a small commit stays on the loop
        assert info["stage_commits_in_flight"] == 0 and info["stage_reserved_bytes"] == 0
        # Scribbling on the segment after the reply changes nothing: the server stored its own verified copy.
        w.view[:MB] = b"\xee" * MB
        assert tcp.get(b"big") == big and tcp.get(b"small") == small
        assert int(tcp.execute_command("TAIR.KV.VERSION", b"big")) == ver
        c = ArenaClient(path)
        try:
            lease, [ref] = c.mgetref([b"big"])
            assert isinstance(ref, Ref) and ref.version == ver
            assert ref.checksum == xxhash.xxh3_64_intdigest(big) and bytes(c.value(ref)) == big
            c.release(lease, now=True)
        finally:
            c.close()
        # SUMAT on a large value (the codec header's self-checksum): verified in the thread as inline.
        body = bytearray(os.urandom(8 * MB))
        body[32:40] = bytes(8)
        digest = xxhash.xxh3_64_intdigest(bytes(body))
        [(rid, off)] = w.reserve([len(body)])
        assert w.write(off, [body], sum_at=32) == digest
        assert int(w.call(b"TAIR.KV.COMMIT", b"self", 0, rid, b"%016x" % digest, b"SUMAT", 32)) > 0
        body[32:40] = digest.to_bytes(8, "little")
        assert tcp.get(b"self") == bytes(body)
    finally:
        w.close()


def test_corrupted_large_commit_is_refused_and_gives_everything_back(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **_CFG)
    tcp = srv.client()
    old = os.urandom(4 * MB)
    tcp.set(b"k", old)
    ver = int(tcp.execute_command("TAIR.KV.VERSION", b"k"))
    base = _info(tcp)["dram_used"]
    new = os.urandom(24 * MB)
    w = StageWriter(path)
    try:
        for flip in (0, 12 * MB + 5, len(new) - 1):  # torn first piece, middle, last byte
            rid = _staged(w, new)
            w.view[flip] ^= 0xFF
            with pytest.raises(RespError, match="checksum mismatch"):
                w.call(b"TAIR.KV.COMMIT", b"k", 0, rid, _sum(new))
            info = _info(tcp)
            assert info["stage_reserved_bytes"] == 0 and info["stage_commits_in_flight"] == 0
            assert info["dram_used"] == base
        assert tcp.get(b"k") == old and int(tcp.execute_command("TAIR.KV.VERSION", b"k")) == ver
        info = _info(tcp)
        assert info["stage_checksum_failures"] == 3 and info["stage_commits_offloaded"] == 3
        # The room in the segment came back: the whole segment can be reserved again.
        [(rid, _)] = w.reserve([w.size])
        assert int(w.call(b"TAIR.KV.UNRESERVE", rid)) == 1
    finally:
        w.close()


class _Watcher:
    """A second client polling INFO in a thread: what it saw while the writer's commits ran."""

    def __init__(self, srv) -> None:
        self.r = srv.client()
        self.stop = threading.Event()
        self.seen = 0  # INFO replies showing a commit in flight
        self.pongs_during = 0  # PINGs answered between two such replies
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        r = self.r
        while not self.stop.is_set():
            if _info(r)["stage_commits_in_flight"] > 0:
                self.seen += 1
                assert r.ping() is True
                if _info(r)["stage_commits_in_flight"] > 0:
                    self.pongs_during += 1

    def __enter__(self) -> _Watcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def test_other_clients_are_answered_during_a_large_commit(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **_CFG)
    tcp = srv.client()
    value = os.urandom(24 * MB)
    w = StageWriter(path)
    try:
        with _Watcher(srv) as watch:
            rounds = 0
            while rounds < 20:  # rounds until the watcher was answered mid-commit (usually the first)
                rounds += 1
                rids = [_staged(w, value) for _ in range(4)]
                w.send_many([(b"TAIR.KV.COMMIT", b"p%d" % i, 0, rid, _sum(value)) for i, rid in enumerate(rids)])
                vers = [int(w.read_reply()) for _ in rids]
                assert vers == sorted(vers)  # this client's replies stay in order
                if watch.pongs_during:
                    break
        assert watch.pongs_during > 0, f"no reply to another client while a commit ran ({rounds} rounds)"
        assert all(tcp.get(b"p%d" % i) == value for i in range(4))
    finally:
        w.close()


def test_a_write_of_the_same_key_during_a_large_commit_comes_first(make_server, sockdir) -> None:
    """The committed value becomes visible (and gets its version) when its verification is done: a SET or DEL of
    the key by another client while the copy runs is ordered before it, and a CAS commit sees its version moved."""
    srv, path = _start(make_server, sockdir, **_CFG)
    tcp = srv.client()
    value = os.urandom(48 * MB)
    w = StageWriter(path)
    try:
        checked = set()
        for _ in range(30):
            if checked == {"set", "del", "cas"}:
                break
            kind = next(k for k in ("set", "del", "cas") if k not in checked)
            tcp.set(b"k", b"before")
            before = int(tcp.execute_command("TAIR.KV.VERSION", b"k"))
            rid = _staged(w, value)
            extra = (b"VER", before) if kind == "cas" else ()
            w.send(b"TAIR.KV.COMMIT", b"k", 0, rid, _sum(value), *extra)
            wait_for(lambda: _info(tcp)["stage_commits_in_flight"] > 0 or _info(tcp)["stage_reservations"] == 0,
                     what="commit taken")
            if kind == "del":
                tcp.delete(b"k")
                other = None
            else:
                tcp.set(b"k", b"other")
                other = int(tcp.execute_command("TAIR.KV.VERSION", b"k"))
            during = _info(tcp)["stage_commits_in_flight"] > 0  # the write was answered while the copy ran
            try:
                reply: object = int(w.read_reply())
            except RespError as exc:
                reply = exc
            if not during:
                continue  # the commit ended before the write: inconclusive round, try again
            checked.add(kind)
            if kind == "cas":
                assert isinstance(reply, RespError), reply  # the version it expected was replaced meanwhile
                assert tcp.get(b"k") == b"other"
                continue
            assert isinstance(reply, int)
            assert tcp.get(b"k") == value  # the commit came last
            assert other is None or reply > other
            assert int(tcp.execute_command("TAIR.KV.VERSION", b"k")) == reply
        assert checked == {"set", "del", "cas"}, f"only {checked} could be seen during a commit"
    finally:
        w.close()


_DYING_WRITER = textwrap.dedent("""
    import os, sys, xxhash
    from kvstrata.client.stage import StageWriter
    w = StageWriter(sys.argv[1])
    v = os.urandom(16 << 20)
    digest = b"%016x" % xxhash.xxh3_64_intdigest(v)
    cmds = []
    for i in range(6):
        [(rid, off)] = w.reserve([len(v)])
        w.write(off, [v])
        cmds.append((b"TAIR.KV.COMMIT", b"d%d" % i, 0, rid, digest))
    sys.stdout.buffer.write(v[:64])
    sys.stdout.flush()
    w.send_many(cmds)
    sys.stdin.read()
""")


def _taken(r) -> dict | None:
    """INFO memory once a commit is in flight or every reservation was taken, else None."""
    i = _info(r)
    return i if i["stage_commits_in_flight"] > 0 or i["stage_reservations"] == 0 else None


def test_a_writer_killed_mid_commit_leaks_nothing(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **_CFG)
    tcp = srv.client()
    base = _info(tcp)["dram_used"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    killed_mid = False
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", _DYING_WRITER, path], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env)
        try:
            head = proc.stdout.read(64)
            info = wait_for(lambda: _taken(tcp), what="a commit in flight")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            # Killed while one commit copied and later ones waited behind it (still reserved).
            mid = info["stage_commits_in_flight"] > 0 and info["stage_reservations"] > 0
            killed_mid = killed_mid or mid
        finally:
            if proc.poll() is None:
                proc.kill()
        info = wait_for(lambda: (i := _info(tcp))["stage_segments"] == 0 and i["stage_commits_in_flight"] == 0
                        and i, what="dead writer's segment closed")
        assert info["stage_reservations"] == 0 and info["stage_reserved_bytes"] == 0
        # What was committed before the connection was gone is stored whole; the rest never ran.
        stored = [k for k in (b"d%d" % i for i in range(6)) if tcp.exists(k)]
        assert all(tcp.getrange(k, 0, 63) == head and tcp.strlen(k) == 16 * MB for k in stored)
        assert len(stored) < 6 or not mid
        if stored:
            tcp.delete(*stored)
        assert _info(tcp)["dram_used"] == base
        if killed_mid:
            break
    assert killed_mid, "the writer never died with a commit in flight"


def test_large_commits_with_an_ssd_tier_overwrite_demoted_keys_in_order(make_server, sockdir, tmp_path) -> None:
    """The tiered command path: a large commit suspends, the key is loaded again before it is stored."""
    srv, path = _start(make_server, sockdir, **{"dram-size": "12mb", "essd-path": str(tmp_path / "ssd")})
    tcp = srv.client()
    vals = [os.urandom(4 * MB) for _ in range(4)]
    w = StageWriter(path)
    try:
        vers = [int(w.call(b"TAIR.KV.COMMIT", b"s%d" % i, 0, _staged(w, v), _sum(v))) for i, v in enumerate(vals)]
        wait_for(lambda: tcp.execute_command("TAIR.KV.TIER", "s0") == b"ssd", what="s0 demoted")
        new = os.urandom(4 * MB)
        ver = int(w.call(b"TAIR.KV.COMMIT", b"s0", 0, _staged(w, new), _sum(new)))
        assert ver > vers[0] and tcp.get(b"s0") == new
        assert int(tcp.execute_command("TAIR.KV.VERSION", b"s0")) == ver
        assert all(tcp.get(b"s%d" % i) == vals[i] for i in range(1, 4))
        info = _info(tcp)
        assert info["stage_commits_offloaded"] == 5 and info["stage_commits_in_flight"] == 0
        assert info["stage_reserved_bytes"] == 0
    finally:
        w.close()


def test_a_large_commit_that_fits_the_budget_is_not_counted_twice(make_server, sockdir) -> None:
    """Under noeviction nothing can be moved out: a commit whose reservation fit must be stored, i.e. the reserved
    bytes are given back before the value is charged its slot, also when the copy ran in a thread."""
    srv, path = _start(make_server, sockdir, **{"dram-size": "40mb", "stage-size": "64mb",
                                               "maxmemory-policy": "noeviction"})
    tcp = srv.client()
    tcp.set(b"resident", os.urandom(12 * MB))
    value = os.urandom(24 * MB)
    w = StageWriter(path)
    try:
        ver = int(w.call(b"TAIR.KV.COMMIT", b"fits", 0, _staged(w, value), _sum(value)))
        assert ver > 0 and tcp.get(b"fits") == value
        info = _info(tcp)
        assert info["stage_commits_offloaded"] == 1 and info["dram_used"] <= info["dram_budget"]
    finally:
        w.close()


def test_the_offload_threshold_is_a_setting(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **_CFG, **{"stage-offload-min": "16mb"})
    tcp = srv.client()
    value = os.urandom(8 * MB)
    w = StageWriter(path)
    try:
        assert int(w.call(b"TAIR.KV.COMMIT", b"a", 0, _staged(w, value), _sum(value))) > 0
        assert _info(tcp)["stage_commits_offloaded"] == 0  # below the configured threshold: inline
        assert tcp.config_set("stage-offload-min", "4mb")
        assert int(w.call(b"TAIR.KV.COMMIT", b"b", 0, _staged(w, value), _sum(value))) > 0
        assert _info(tcp)["stage_commits_offloaded"] == 1
        assert tcp.get(b"a") == value and tcp.get(b"b") == value
        with pytest.raises(Exception, match="stage-offload-min"):
            tcp.config_set("stage-offload-min", "lots")
    finally:
        w.close()
