"""Unit test of kvstrata.server.client_eviction.limit_of: a maxmemory-clients setting in bytes, as Redis's
getClientEvictionLimit computes it (a percentage of maxmemory, a floor of 128 KiB, 0 off)."""

from __future__ import annotations

from kvstrata.config import Config
from kvstrata.server.client_eviction import MIN_LIMIT, limit_of


def test_limit_of_bytes_percentages_and_the_floor():
    assert limit_of("0", 10**9) == 0
    assert limit_of("1048576", 0) == 1048576
    assert limit_of("10%", 10**9) == 10**8
    assert limit_of("100%", 10**9) == 10**9
    assert limit_of("1", 10**9) == MIN_LIMIT == 128 * 1024
    assert limit_of("1%", 1000) == MIN_LIMIT


def test_settings_as_config_keeps_them():
    cfg = Config()
    for raw, kept in (("5%", "5%"), ("0%", "0"), ("2mb", "2097152"), (4096, "4096"), ("", "0")):
        cfg.set("maxmemory-clients", raw)
        assert cfg.get("maxmemory-clients") == kept
