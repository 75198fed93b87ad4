"""TAIR.KV.* commands on a tiered server: versioned SETEX (COLD_STORAGE, VER), MGET with consistency levels and
versions, PREFETCH, MARKHOT / UNMARKHOT pins, VERSION and TIER.

Waits on the server are polls with a deadline, never fixed sleeps.
"""


import pytest
import redis
from polling import wait_for
from tests.integration.support import tier, tier_info

pytestmark = pytest.mark.kvstrata_only

KB = 1024
SYNTAX = "syntax error"


# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture
def tiered(make_server, tmp_path):
    """``tiered({"dram-size": "16kb", ...}) -> ServerProc`` with an SSD tier in ``tmp_path/ssd``."""

    def start(config=None):
        cfg = {"essd-path": str(tmp_path / "ssd"), "dram-size": "64kb"}
        cfg.update(config or {})
        return make_server(cfg)

    return start


@pytest.fixture
def tr(tiered):
    """A client of a fresh tiered server (64kb DRAM, promote-hits 2)."""
    client = tiered().client()
    yield client
    client.close()


def kv(r, *args):
    return r.execute_command(*args)


def setex(r, key, value, ttl_ms=0, *opts):
    return kv(r, "TAIR.KV.SETEX", key, ttl_ms, value, *opts)


def version(r, key):
    return kv(r, "TAIR.KV.VERSION", key)




def fill(r, prefix, n, size=1000):
    """Write ``n`` filler keys of ``size`` bytes (pipelined) to push other keys out of DRAM."""
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.set(f"{prefix}{i}", b"f" * size)
    pipe.execute()


def demote(r, *keys):
    """Write filler until every key in ``keys`` lives on the SSD tier."""
    budget = r.info("memory")["maxmemory"]
    fill(r, "filler:", budget // 1000 + 10)
    assert [tier(r, k) for k in keys] == ["ssd"] * len(keys)


def error_of(call):
    with pytest.raises(redis.ResponseError) as info:
        call()
    return str(info.value)


# --------------------------------------------------------------------------------------------------------------
# TAIR.KV.SETEX and TAIR.KV.VERSION
# --------------------------------------------------------------------------------------------------------------


def test_setex_replies_with_increasing_versions(tr):
    v1 = setex(tr, "a", "1")
    assert isinstance(v1, int) and v1 > 0
    assert version(tr, "a") == v1
    v2 = setex(tr, "a", "2")
    v3 = setex(tr, "b", "3")
    assert v1 < v2 < v3
    assert version(tr, "a") == v2
    assert tr.get("a") == b"2"
    tr.set("a", "plain set")  # every write gives a new version
    assert version(tr, "a") > v3
    assert version(tr, "nope") is None
    tr.delete("b")
    assert version(tr, "b") is None


def test_setex_ttl_in_milliseconds(tr):
    setex(tr, "t", "v", 1500)
    assert 0 < tr.pttl("t") <= 1500
    setex(tr, "t", "v", 0)
    assert tr.pttl("t") == -1
    assert tr.get("t") == b"v"


def test_setex_errors(tr):
    assert error_of(lambda: setex(tr, "k", "v", -1)) == "invalid expire time in 'tair.kv.setex' command"
    assert error_of(lambda: setex(tr, "k", "v", "abc")) == "value is not an integer or out of range"
    assert error_of(lambda: setex(tr, "k", "v", 0, "BOGUS")) == SYNTAX
    assert error_of(lambda: setex(tr, "k", "v", 0, "VER")) == SYNTAX
    assert error_of(lambda: setex(tr, "k", "v", 0, "VER", "x")) == "value is not an integer or out of range"
    assert "wrong number of arguments" in error_of(lambda: kv(tr, "TAIR.KV.SETEX", "k", 0))
    assert tr.exists("k") == 0


def test_ttls_whose_expiry_time_does_not_fit_64_bits_are_refused_and_lose_nothing(tiered):
    """Expiry times are stored as signed 64-bit milliseconds. A ttl_ms that made a later one was acknowledged,
    then failed every SSD write batch it was in: at the restart that write and the acknowledged writes batched
    with it were gone. It is refused now, as Redis refuses such a SET PX; the largest ttl that fits is kept."""
    srv = tiered()
    r = srv.client()
    setex(r, "before", "1")
    for ttl in (2**63 - 1, 2**63 - 1 - r.time()[0] * 1000 + 10**9):
        assert error_of(lambda t=ttl: setex(r, "far", "v", t)) == "invalid expire time in 'tair.kv.setex' command"
        assert error_of(lambda t=ttl: kv(r, "TAIR.KV.MARKHOT", "x*", "PX", t)) \
            == "invalid expire time in 'tair.kv.markhot' command"
    assert r.exists("far") == 0
    setex(r, "far", "v", 2**62)  # ~146 million years: fits
    setex(r, "cold", "c", 2**62, "COLD_STORAGE")
    setex(r, "after", "2")
    assert r.save()
    assert r.info("tier_ssd")["write_errors"] == 0
    srv.stop()
    r = tiered().client()
    assert [r.get(k) for k in ("before", "far", "cold", "after")] == [b"1", b"v", b"c", b"2"]
    assert r.pttl("far") > 2**61 and r.pttl("cold") > 2**61


def test_setex_cold_storage_lands_on_ssd(tr):
    v = setex(tr, "c", b"cold", 0, "COLD_STORAGE")
    assert tier(tr, "c") == "ssd"
    assert version(tr, "c") == v
    assert tr.get("c") == b"cold"
    assert tr.dbsize() == 1
    # An existing DRAM key moves down.
    setex(tr, "d", b"warm")
    assert tier(tr, "d") == "dram"
    v2 = setex(tr, "d", b"now cold", 0, "cold_storage")
    assert v2 > v
    assert tier(tr, "d") == "ssd"
    assert tr.get("d") == b"now cold"
    assert tr.dbsize() == 2
    # With a TTL.
    setex(tr, "e", b"x", 60_000, "COLD_STORAGE")
    assert tier(tr, "e") == "ssd"
    assert 0 < tr.pttl("e") <= 60_000


def test_cold_storage_without_ssd_tier(make_server):
    r = make_server({"dram-size": "1mb"}).client()
    assert error_of(lambda: setex(r, "c", "v", 0, "COLD_STORAGE")) == (
        "COLD_STORAGE needs the SSD tier (start with --essd-path)")
    assert r.exists("c") == 0
    setex(r, "c", "v")
    assert tier(r, "c") == "dram"


def test_ver_mismatch_is_refused(tr):
    v = setex(tr, "k", "one")
    err = error_of(lambda: setex(tr, "k", "two", 0, "VER", v + 1))
    assert err.startswith("VERMISMATCH"), err
    assert tr.get("k") == b"one"
    assert version(tr, "k") == v
    v2 = setex(tr, "k", "two", 0, "VER", v)
    assert v2 > v
    assert tr.get("k") == b"two"
    # The old version no longer matches.
    assert error_of(lambda: setex(tr, "k", "three", 0, "VER", v)).startswith("VERMISMATCH")
    assert tr.get("k") == b"two"


def test_ver_zero_means_the_key_must_not_exist(tr):
    v = setex(tr, "new", "v", 0, "VER", 0)
    assert v > 0
    assert error_of(lambda: setex(tr, "new", "w", 0, "VER", 0)).startswith("VERMISMATCH")
    assert tr.get("new") == b"v"


def test_ver_on_ssd_resident_key(tr):
    v = setex(tr, "k", "one")
    demote(tr, "k")
    assert error_of(lambda: setex(tr, "k", "bad", 0, "VER", v - 1)).startswith("VERMISMATCH")
    assert tr.get("k") == b"one"
    assert version(tr, "k") == v
    v2 = setex(tr, "k", "two", 0, "VER", v, "COLD_STORAGE")
    assert v2 > v
    assert tier(tr, "k") == "ssd"
    assert tr.get("k") == b"two"
    assert version(tr, "k") == v2


def test_version_survives_demotion_and_promotion(tiered):
    r = tiered({"promote-hits": 1}).client()
    v = setex(r, "k", "one")
    demote(r, "k")
    assert version(r, "k") == v
    assert r.get("k") == b"one"  # promotes
    assert tier(r, "k") == "dram"
    assert version(r, "k") == v


# --------------------------------------------------------------------------------------------------------------
# TAIR.KV.MGET
# --------------------------------------------------------------------------------------------------------------


def test_mget_values_and_nils(tr):
    setex(tr, "a", "1")
    setex(tr, "b", "2", 0, "COLD_STORAGE")
    assert kv(tr, "TAIR.KV.MGET", "a", "nope", "b") == [b"1", None, b"2"]
    assert kv(tr, "TAIR.KV.MGET", "nope") == [None]


def test_mget_with_versions(tr):
    va = setex(tr, "a", "1")
    vb = setex(tr, "b", "2", 0, "COLD_STORAGE")
    assert kv(tr, "TAIR.KV.MGET", "a", "nope", "b", "WITHVERSIONS") == [[b"1", va], None, [b"2", vb]]
    assert kv(tr, "TAIR.KV.MGET", "a", "CONSISTENCY_LEVEL", "EVENTUAL", "WITHVERSIONS") == [[b"1", va]]
    assert kv(tr, "TAIR.KV.MGET", "b", "WITHVERSIONS", "CONSISTENCY_LEVEL", "strong") == [[b"2", vb]]


@pytest.mark.parametrize("level", ["STRONG", "EVENTUAL", "strong"])
def test_mget_consistency_levels(tr, level):
    setex(tr, "a", "1")
    setex(tr, "b", "2", 0, "COLD_STORAGE")
    assert kv(tr, "TAIR.KV.MGET", "a", "b", "c", "CONSISTENCY_LEVEL", level) == [b"1", b"2", None]


def test_mget_errors(tr):
    assert "CONSISTENCY_LEVEL must be STRONG or EVENTUAL" in error_of(
        lambda: kv(tr, "TAIR.KV.MGET", "a", "CONSISTENCY_LEVEL", "SOMETIMES"))
    assert "wrong number of arguments" in error_of(lambda: kv(tr, "TAIR.KV.MGET"))
    assert "wrong number of arguments" in error_of(lambda: kv(tr, "TAIR.KV.MGET", "WITHVERSIONS"))


def test_mget_across_tiers_with_versions(tiered):
    r = tiered({"dram-size": "32kb", "promote-hits": 100}).client()
    versions = {}
    for i in range(80):
        versions[f"k{i}"] = setex(r, f"k{i}", f"value-{i}".encode() * 50)
    keys = list(versions)
    assert tier(r, "k0") == "ssd" and tier(r, "k79") == "dram"
    reply = kv(r, "TAIR.KV.MGET", *keys, "WITHVERSIONS")
    assert reply == [[f"value-{i}".encode() * 50, versions[f"k{i}"]] for i in range(80)]


def test_mget_strong_sees_acknowledged_write_through_writes(tiered):
    srv = tiered({"durability": "write-through", "fsync": "always", "dram-size": "16kb"})
    r = srv.client()
    other = srv.client()
    pipe = r.pipeline(transaction=False)
    for i in range(50):
        pipe.execute_command("TAIR.KV.SETEX", f"k{i}", 0, f"v{i}".encode() * 100)
    pipe.execute_command("TAIR.KV.MGET", *[f"k{i}" for i in range(50)], "CONSISTENCY_LEVEL", "STRONG",
                         "WITHVERSIONS")
    *versions, reply = pipe.execute()
    assert reply == [[f"v{i}".encode() * 100, versions[i]] for i in range(50)]
    # Another client sees the same acknowledged data.
    assert kv(other, "TAIR.KV.MGET", *[f"k{i}" for i in range(50)], "CONSISTENCY_LEVEL", "STRONG",
              "WITHVERSIONS") == reply


# --------------------------------------------------------------------------------------------------------------
# TAIR.KV.PREFETCH
# --------------------------------------------------------------------------------------------------------------


def test_prefetch_moves_keys_to_dram(tiered):
    r = tiered({"promote-hits": 100}).client()
    for i in range(5):
        setex(r, f"p{i}", f"v{i}", 0, "COLD_STORAGE")
    setex(r, "warm", "w")
    assert kv(r, "TAIR.KV.PREFETCH", *[f"p{i}" for i in range(5)]) == 5
    wait_for(lambda: all(tier(r, f"p{i}") == "dram" for i in range(5)), what="prefetched keys in DRAM")
    assert [r.get(f"p{i}") for i in range(5)] == [f"v{i}".encode() for i in range(5)]
    # Keys already in DRAM are not queued.
    assert kv(r, "TAIR.KV.PREFETCH", "warm", "p0") == 0
    stats = r.info("stats")
    assert stats["prefetch_queued"] >= 5
    assert stats["prefetch_done"] >= 5
    assert tier_info(r, "ssd")["promotions"] >= 5


def test_prefetch_with_priority(tiered):
    r = tiered({"promote-hits": 100}).client()
    for i in range(3):
        setex(r, f"p{i}", "v", 0, "COLD_STORAGE")
    assert kv(r, "TAIR.KV.PREFETCH", "p0", "p1", "p2", "PRIORITY", 7) == 3
    try:
        wait_for(lambda: [tier(r, f"p{i}") for i in range(3)] == ["dram"] * 3, what="prefetched keys in DRAM")
    except AssertionError as exc:  # what the server saw, for a failure that only a loaded machine shows
        raise AssertionError(f"{exc}: tiers {[tier(r, f'p{i}') for i in range(3)]}, prefetch "
                             f"{r.info('prefetch')}, stats {r.info('stats')}, ssd {tier_info(r, 'ssd')}") from exc


def test_prefetch_of_demoted_keys_keeps_dram_within_budget(tiered):
    r = tiered({"dram-size": "32kb", "promote-hits": 100}).client()
    fill(r, "k", 100)  # k0.. demoted
    wanted = [f"k{i}" for i in range(10)]
    assert all(tier(r, k) == "ssd" for k in wanted)
    assert kv(r, "TAIR.KV.PREFETCH", *wanted) == 10
    wait_for(lambda: all(tier(r, k) == "dram" for k in wanted), what="prefetched keys in DRAM")
    assert r.info("memory")["used_memory"] <= 32 * KB
    assert r.dbsize() == 100


def test_prefetch_of_missing_keys_does_no_harm(tr):
    assert kv(tr, "TAIR.KV.PREFETCH", "nope1", "nope2") in (0, 2)
    assert tr.ping()
    assert tr.exists("nope1", "nope2") == 0
    assert "wrong number of arguments" in error_of(lambda: kv(tr, "TAIR.KV.PREFETCH"))


# --------------------------------------------------------------------------------------------------------------
# TAIR.KV.MARKHOT / TAIR.KV.UNMARKHOT
# --------------------------------------------------------------------------------------------------------------


def test_markhot_pins_keys_through_ten_times_the_budget(tiered):
    r = tiered({"dram-size": "64kb"}).client()
    hot = {f"hot:{i}": f"hot value {i}".encode() * 60 for i in range(10)}  # ~10 KB, under half the budget
    for k, v in hot.items():
        r.set(k, v)
    r.set("cold", "c")
    assert kv(r, "TAIR.KV.MARKHOT", "hot:*") == 10
    assert tier_info(r, "dram")["pinned_bytes"] > 0
    for round_ in range(10):  # 10x the DRAM budget, in rounds, checking the pins each time
        fill(r, f"f{round_}:", 66)
        assert [tier(r, k) for k in hot] == ["dram"] * 10, f"a pinned key was demoted in round {round_}"
        assert r.info("memory")["used_memory"] <= 64 * KB
    assert tier_info(r, "dram")["demotions"] > 500
    assert tier(r, "cold") == "ssd"
    assert {k: r.get(k) for k in hot} == hot
    # Unpinned, they compete again and get demoted by further writes.
    assert kv(r, "TAIR.KV.UNMARKHOT", "hot:*") == 10
    assert tier_info(r, "dram")["pinned_bytes"] == 0
    fill(r, "g", 140)
    assert [tier(r, k) for k in hot] == ["ssd"] * 10
    assert {k: r.get(k) for k in hot} == hot


def test_markhot_pins_keys_written_later(tiered):
    r = tiered({"dram-size": "32kb"}).client()
    assert kv(r, "TAIR.KV.MARKHOT", "hot:*") == 0
    r.set("hot:new", b"h" * 1000)
    fill(r, "f", 100)
    assert tier(r, "hot:new") == "dram"
    # Overwriting a pinned key keeps it pinned.
    r.set("hot:new", b"H" * 1000)
    fill(r, "g", 100)
    assert tier(r, "hot:new") == "dram"
    assert r.get("hot:new") == b"H" * 1000


def test_markhot_brings_ssd_keys_up(tiered):
    r = tiered({"promote-hits": 100}).client()
    for i in range(4):
        setex(r, f"hot:{i}", f"v{i}", 0, "COLD_STORAGE")
    setex(r, "other", "o", 0, "COLD_STORAGE")
    kv(r, "TAIR.KV.MARKHOT", "hot:*")
    wait_for(lambda: all(tier(r, f"hot:{i}") == "dram" for i in range(4)), what="hot keys brought to DRAM")
    assert tier(r, "other") == "ssd"
    wait_for(lambda: tier_info(r, "dram")["pinned_bytes"] > 0, what="the promoted hot keys to be pinned")
    fill(r, "f", 100)
    assert all(tier(r, f"hot:{i}") == "dram" for i in range(4))


def test_markhot_px_expires(tiered):
    r = tiered({"dram-size": "32kb"}).client()
    r.set("hot:a", b"a" * 1000)
    assert kv(r, "TAIR.KV.MARKHOT", "hot:*", "PX", 300) == 1
    assert tier_info(r, "dram")["pinned_bytes"] > 0
    fill(r, "f", 60)
    assert tier(r, "hot:a") == "dram"
    wait_for(lambda: tier_info(r, "dram")["pinned_bytes"] == 0, what="the PX pin to lapse")
    fill(r, "g", 60)
    assert tier(r, "hot:a") == "ssd"
    assert r.get("hot:a") == b"a" * 1000


def test_markhot_respects_hot_max_fraction(tiered):
    r = tiered({"dram-size": "64kb", "hot-max-fraction": 0.25}).client()
    for i in range(30):
        r.set(f"hot:{i}", b"h" * 1000)
    pinned = kv(r, "TAIR.KV.MARKHOT", "hot:*")
    assert 0 < pinned < 30
    dram = tier_info(r, "dram")
    assert dram["pinned_bytes"] <= 0.25 * 64 * KB
    assert r.info("stats")["pin_rejected"] > 0
    fill(r, "f", 200)
    assert r.info("memory")["used_memory"] <= 64 * KB
    in_dram = sum(tier(r, f"hot:{i}") == "dram" for i in range(30))
    assert in_dram >= pinned


def test_overwriting_pinned_key_respects_hot_max_fraction(tiered):
    r = tiered({"dram-size": "16kb", "hot-max-fraction": 0.5}).client()
    r.set("hot:a", b"p" * 1000)
    assert kv(r, "TAIR.KV.MARKHOT", "hot:*") == 1
    try:
        r.set("hot:a", b"P" * 12_000)
    except redis.ResponseError:
        pass
    assert tier_info(r, "dram")["pinned_bytes"] <= 0.5 * 16 * KB


def test_unmarkhot_of_unknown_pattern(tr):
    assert kv(tr, "TAIR.KV.UNMARKHOT", "never:*") == 0


def test_markhot_errors(tr):
    assert error_of(lambda: kv(tr, "TAIR.KV.MARKHOT", "p", "PX", 0)) == (
        "invalid expire time in 'tair.kv.markhot' command")
    assert error_of(lambda: kv(tr, "TAIR.KV.MARKHOT", "p", "EX", 10)) == SYNTAX
    assert error_of(lambda: kv(tr, "TAIR.KV.MARKHOT", "p", "PX")) == SYNTAX
    assert "wrong number of arguments" in error_of(lambda: kv(tr, "TAIR.KV.MARKHOT"))
    assert "wrong number of arguments" in error_of(lambda: kv(tr, "TAIR.KV.UNMARKHOT"))
