"""OBJECT: ENCODING as Redis reports it for values SET stored, FREQ refused with Redis's text under an LRU policy,
nil for missing keys, Redis's errors for unknown subcommands and wrong arities (run against both targets); REFCOUNT
and IDLETIME as kvstrata defines them (values never shared, no access time kept)."""

import pytest

VALUES = {
    "0": "int", "9999": "int", "-1": "int", "9223372036854775807": "int", "-9223372036854775808": "int",
    "9223372036854775808": "embstr", "-9223372036854775809": "embstr", "12345678901234567890": "embstr",
    "-0": "embstr", "01": "embstr", "+1": "embstr", " 1": "embstr", "1 ": "embstr", "1.5": "embstr", "": "embstr",
    "x" * 44: "embstr", "x" * 45: "raw", "1" * 21: "embstr", "1" * 45: "raw",
}


def test_encoding_as_redis(r):
    for i, (value, expected) in enumerate(VALUES.items()):
        r.set(f"o{i}", value)
        assert r.object("encoding", f"o{i}") == expected.encode(), value
    r.set("bin", b"\xd9\xa1")  # Arabic-Indic digits: not an integer to Redis
    assert r.object("encoding", "bin") == b"embstr"
    assert r.object("encoding", "missing") is None


def test_freq_and_missing_keys_as_redis(r, expect_error):
    r.config_set("maxmemory-policy", "allkeys-lru")
    r.set("k", "v")
    with expect_error("ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that "
                      "when switching between policies at runtime LRU and LFU data will take some time to adjust."):
        r.object("freq", "k")
    for sub in ("freq", "idletime", "refcount", "encoding"):
        assert r.execute_command("OBJECT", sub, "missing") is None
    with expect_error("ERR unknown subcommand 'bogus'. Try OBJECT HELP."):
        r.execute_command("OBJECT", "bogus", "k")
    for args in (("k", "extra"), ()):
        with expect_error("ERR wrong number of arguments for 'object|encoding' command"):
            r.execute_command("OBJECT", "encoding", *args)
    assert r.execute_command("OBJECT", "HELP")[0].startswith(b"OBJECT <subcommand>")


@pytest.mark.kvstrata_only
def test_refcount_and_idletime_on_kvstrata(r, expect_error):
    r.set("small", "5")  # Redis: 2147483647, a shared integer; kvstrata never shares a value
    assert r.object("refcount", "small") == 1
    with expect_error("ERR idle time not tracked: kvstrata's eviction policies rank keys by counts of accesses, not "
                      "by a clock, and keep no access time per key"):
        r.object("idletime", "small")
