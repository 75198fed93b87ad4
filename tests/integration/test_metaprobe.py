"""EXISTS, TYPE and the TTL family on a tiered node probe record headers (INFO tier_ssd ``probes``) instead of
reading values (``reads``), and answer exactly as before for keys in DRAM, on SSD, expired, missing.

Commands are pipelined with ``INFO tier_ssd`` in one send, so INFO shows what they read before the next reply.
"""

import time

import pytest
from polling import wait_for
from tests.conftest import encode_command
from tests.integration.support import tier, tier_info

pytestmark = pytest.mark.kvstrata_only

KB = 1024


@pytest.fixture
def node(make_server, tmp_path):
    # 64 KB of DRAM: the first keys written are on SSD once the later ones are in. No predictor: the only LMDB
    # reads are the commands' own.
    srv = make_server({"essd-path": str(tmp_path / "ssd"), "dram-size": "64kb", "prefetch-predict": "no",
                       "prefetch-protect": "0"})
    r = srv.client()
    r.set("ttl", b"t" * (4 * KB), ex=1000)
    r.set("short", b"s" * (4 * KB), px=2000)
    r.set("short2", b"s" * (4 * KB), px=2000)
    short_gone = time.time() + 2.0
    for i in range(40):
        r.set(f"k{i:02d}", bytes([i]) * (4 * KB))
    wait_for(lambda: tier_info(r, "ssd")["pending"] == 0, what="the SSD writer to drain")
    assert all(tier(r, k) == "ssd" for k in ("ttl", "short", "short2", "k00", "k01", "k02"))
    wait_for(lambda: time.time() > short_gone + 0.05, what="'short' to be past its expiry")
    return srv


def _ssd(info_reply: bytes) -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in info_reply.decode().split("\r\n") if ":" in line)
    return {"reads": int(fields["reads"]), "probes": int(fields["probes"]), "absent": int(fields["key_filter_absent"])}


def test_metadata_commands_probe_instead_of_reading(node, raw):
    conn = raw(node)
    before = _ssd(conn.cmd("INFO", "tier_ssd"))
    commands = [
        ("EXISTS", "k00", "k01", "k02", "k39", "short2", "nosuch"),
        ("TYPE", "k00"), ("TYPE", "nosuch"), ("TTL", "ttl"), ("PTTL", "k01"), ("TTL", "short"),
        ("EXPIRETIME", "ttl"), ("PEXPIRETIME", "k02"), ("PTTL", "k39"),
    ]
    conn.send(b"".join(encode_command(*c) for c in commands) + encode_command("INFO", "tier_ssd"))
    replies = [conn.read_reply() for _ in commands]
    after = _ssd(conn.read_reply())
    assert replies[0] == 4  # three on SSD, one in DRAM; 'short2' expired on SSD; one missing
    assert replies[1:3] == ["string", "none"]
    assert 995 <= replies[3] <= 1000
    assert replies[4:6] == [-1, -2]
    assert abs(replies[6] - (time.time() + 1000)) <= 5
    assert replies[7:] == [-1, -1]
    assert after["reads"] == before["reads"]  # no value read from the SSD
    # Each key below DRAM once per command that named it: EXISTS 5 (k39 is in DRAM), then 7 single keys; a key
    # with no record ('nosuch', twice) probed, or answered by the key filter without a probe.
    ruled_out = after["absent"] - before["absent"]
    assert ruled_out <= 2
    assert after["probes"] - before["probes"] + ruled_out == 5 + 7
    r = node.client()
    assert tier(r, "k00") == "ssd"  # a probe brings nothing up
    assert [r.get(k) for k in ("k00", "k01", "short")] == [bytes([0]) * (4 * KB), bytes([1]) * (4 * KB), None]


def test_a_write_after_the_probe_wins(node, raw):
    """A key changed in memory after it went down (its SSD write still queued or just applied) answers with the
    new state, as a load would."""
    r = node.client()
    conn = raw(node)
    conn.send(encode_command("DEL", "k00") + encode_command("EXISTS", "k00", "k01")
              + encode_command("PEXPIRE", "k01", "50000") + encode_command("PTTL", "k01")
              + encode_command("TYPE", "k00"))
    assert conn.read_reply() == 1
    assert conn.read_reply() == 1
    assert conn.read_reply() == 1
    assert 49_000 < conn.read_reply() <= 50_000
    assert conn.read_reply() == "none"
    assert r.exists("k00", "k01", "k02") == 2
