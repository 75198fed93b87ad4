"""The SSD tier on a filesystem that fills up: the server keeps answering, frees space by its policy, answers
errors where it cannot, and never returns a damaged value. Needs root to mount a small tmpfs (CI runs as root)."""

from __future__ import annotations

import os
import subprocess

import pytest
import redis
from polling import wait_for
from redis.exceptions import ConnectionError as RedisConnectionError

pytestmark = pytest.mark.kvstrata_only


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "fs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_filling_the_disk_keeps_the_server_answering_and_values_intact(make_server, small_fs):
    # Reads promote nothing (no promote-hits reached, no prefetching): a promotion would demote a DRAM entry whose
    # write, on the full disk, evicts records the read-back below may already have counted as readable.
    srv = make_server({"essd-path": str(small_fs / "ssd"), "essd-size": "1gb", "dram-size": "1mb",
                       "promote-hits": 1000, "prefetch-predict": "no"})
    r = redis.Redis(port=srv.port, socket_timeout=30)
    values: dict[str, bytes] = {}
    errors = 0
    for i in range(160):  # 160 x 256 KiB = 40 MiB into a 24 MiB filesystem
        value = os.urandom(256 * 1024)
        try:
            r.set(f"chunk:{i}", value)
            values[f"chunk:{i}"] = value
        except redis.ResponseError as exc:
            assert str(exc).startswith(("command not allowed", "SSD")), str(exc)
            errors += 1
    assert r.ping()
    # The SSD writer commits (and evicts to make room) behind the replies: let it finish, so the counts below
    # describe one settled state.
    wait_for(lambda: r.info("tier_ssd")["pending"] == 0 and r.info("tier_ssd")["queued_bytes"] == 0,
             timeout=30, what="the SSD writer to drain")
    assert len(values) > 60  # most writes were accepted: space was freed by evicting the oldest records
    readable = 0
    for key, value in values.items():
        got = r.get(key)
        if got is not None:
            assert got == value, f"{key} came back damaged"
            readable += 1
    ssd = r.info("tier_ssd")
    # What is gone was evicted by the last tier's policy (counted), not lost silently.
    assert readable + ssd["evictions"] >= len(values)
    recent = [k for k in list(values)[-3:]]
    assert all(r.get(k) == values[k] for k in recent)
    assert r.dbsize() == readable
    assert ssd["evictions"] > 0, "the filesystem never filled up: the test did not test anything"


def test_shutdown_refuses_to_lose_writes_the_disk_refused(make_server, small_fs):
    """A write the SSD tier could not take (a full disk, nothing left to evict) is held in memory and retried;
    SHUTDOWN says so instead of exiting and losing it, as Redis refuses when its save fails; FORCE goes anyway."""
    srv = make_server({"essd-path": str(small_fs / "ssd"), "essd-size": "1gb", "dram-size": "1mb"})
    r = redis.Redis(port=srv.port, socket_timeout=30)
    big = os.urandom(32 * 1024 * 1024)  # more than the whole 24 MiB filesystem: no eviction can make room
    try:
        r.execute_command("TAIR.KV.SETEX", "big", 0, big, "COLD_STORAGE")
    except redis.ResponseError as exc:
        pytest.fail(f"the write was refused before the disk was tried: {exc}")
    wait_for(lambda: r.info("tier_ssd")["write_errors"] > 0, timeout=30, what="the SSD write to fail")
    for args in ({}, {"now": True}, {"save": True}):
        with pytest.raises(redis.ResponseError, match="Errors trying to SHUTDOWN.*writes to the SSD tier failed"):
            r.shutdown(**args)
    assert r.get("big") == big  # still served from memory
    with pytest.raises(RedisConnectionError):
        r.execute_command("SHUTDOWN", "FORCE")
    assert srv.proc.wait(timeout=30) == 0
    assert "acknowledged writes could not be written to the SSD tier" in srv.log_text()
    srv._reap()
