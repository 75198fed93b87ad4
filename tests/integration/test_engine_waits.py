"""What commands wait for on a tiered node: PREFETCH replies at once and its keys are read from the SSD once;
TAIR.KV.MGET's option words are never loaded as keys.

Each test pipelines the command under test with ``INFO tier_ssd`` in one send: commands of one batch run back to
back unless one suspends for a load, so INFO shows exactly what was read before the first reply.
"""

import pytest
from polling import wait_for
from tests.conftest import encode_command
from tests.integration.support import tier, tier_info

pytestmark = pytest.mark.kvstrata_only

KB = 1024


@pytest.fixture
def node(make_server, tmp_path):
    # A 64 KB DRAM tier: the first keys written are on SSD once the later ones are in. No predictor, no
    # protection window: the only LMDB reads are the ones the commands under test cause.
    srv = make_server({"essd-path": str(tmp_path / "ssd"), "dram-size": "64kb", "prefetch-predict": "no",
                       "prefetch-protect": "0"})
    r = srv.client()
    for i in range(40):
        r.set(f"k{i:02d}", bytes([i]) * (4 * KB))
    wait_for(lambda: tier_info(r, "ssd")["pending"] == 0, what="the SSD writer to drain")
    assert all(tier(r, f"k{i:02d}") == "ssd" for i in range(8))
    return srv


def _reads(info_reply: bytes) -> int:
    for line in info_reply.decode().split("\r\n"):
        if line.startswith("reads:"):
            return int(line.split(":")[1])
    raise AssertionError("no reads field in INFO tier_ssd")


def test_prefetch_replies_before_loading_and_reads_each_key_once(node, raw):
    conn = raw(node)
    before = _reads(conn.cmd("INFO", "tier_ssd"))
    keys = [f"k{i:02d}" for i in range(8)]
    conn.send(encode_command("TAIR.KV.PREFETCH", *keys, "PRIORITY", "5") + encode_command("INFO", "tier_ssd"))
    assert conn.read_reply() == 8
    assert _reads(conn.read_reply()) == before  # nothing was read before the reply
    r = node.client()
    wait_for(lambda: all(tier(r, k) == "dram" for k in keys), what="the prefetched keys to reach DRAM")
    assert tier_info(r, "ssd")["reads"] - before == len(keys)  # each once; never "PRIORITY" nor "5"
    assert [r.get(k) for k in keys] == [bytes([i]) * (4 * KB) for i in range(8)]


def test_mget_option_words_are_not_loaded(node, raw):
    conn = raw(node)
    before = _reads(conn.cmd("INFO", "tier_ssd"))
    conn.send(encode_command("TAIR.KV.MGET", "k00", "k01", "k02", "CONSISTENCY_LEVEL", "STRONG", "WITHVERSIONS")
              + encode_command("INFO", "tier_ssd"))
    reply = conn.read_reply()
    assert [v[0] for v in reply] == [bytes([i]) * (4 * KB) for i in range(3)]
    assert all(v[1] > 0 for v in reply)
    assert _reads(conn.read_reply()) - before == 3


def test_command_getkeys_leaves_options_out(node, raw):
    conn = raw(node)
    got = conn.cmd("COMMAND", "GETKEYS", "TAIR.KV.MGET", "a", "b", "CONSISTENCY_LEVEL", "STRONG", "WITHVERSIONS")
    assert got == [b"a", b"b"]
    assert conn.cmd("COMMAND", "GETKEYS", "TAIR.KV.PREFETCH", "a", "PRIORITY", "3") == [b"a"]

