"""Redis 7's latency-tracking and latency-tracking-info-percentiles (INFO latencystats) and acllog-max-len: their
CONFIG texts and checks, and what they change. Run against both targets."""

from __future__ import annotations

import pytest
import redis

from integration.support import config_texts_as_redis

NAME = "latency-tracking-info-percentiles"


def _latencystats(r: redis.Redis) -> dict[str, dict[str, float]]:
    """Command -> {label: µs} from INFO latencystats (as redis-py reads its ``p50=...,p99=...`` lines)."""
    prefix = "latency_percentiles_usec_"
    return {k[len(prefix):]: v for k, v in r.info("latencystats").items() if k.startswith(prefix)}


def test_percentiles_config_as_redis(r):
    between = "latency-tracking-info-percentiles parameters should sit between [0.0,100.0]"
    invalid = "Invalid latency-tracking-info-percentiles parameters"
    try:
        config_texts_as_redis(r, NAME, [
            ("50 99 99.9", "50 99 99.9"), ("0 100 99.99 12.5", "0 100 99.99 12.5"), ("", ""), ("1e1", "10"),
            (".5 5. +5", "0.5 5 5")], [
            ("abc", invalid), ("1_0", invalid), ("nan", invalid), ("50 101", between), ("-1", between),
            ("inf", between)])
    finally:
        r.config_set(NAME, "50 99 99.9")


def test_latencystats_shows_the_configured_percentiles(r):
    try:
        assert r.config_set(NAME, "50 99.99 0")
        r.set("k", "v")
        stats = _latencystats(r)["set"]
        assert list(stats) == ["p50", "p99.99", "p0"]
        assert 0 < stats["p0"] <= stats["p50"] <= stats["p99.99"]
    finally:
        r.config_set(NAME, "50 99 99.9")


def test_latency_tracking_off_records_nothing(r):
    try:
        assert r.config_get("latency-tracking") == {"latency-tracking": "yes"}
        assert r.config_set("latency-tracking", "no")
        r.strlen("never-timed")
        assert "strlen" not in _latencystats(r)
        assert r.config_set("latency-tracking", "yes")
        r.strlen("timed")
        assert "strlen" in _latencystats(r)
    finally:
        r.config_set("latency-tracking", "yes")


def test_acllog_max_len(r):
    try:
        assert r.config_get("acllog-max-len") == {"acllog-max-len": "128"}
        assert r.config_set("acllog-max-len", 2)
        r.acl_log_reset()
        for user in ("nobody1", "nobody2", "nobody3"):
            with pytest.raises(redis.AuthenticationError):
                r.execute_command("AUTH", user, "wrong")
        assert [e["username"] for e in r.acl_log()] == ["nobody3", "nobody2"]  # the newest, newest first
        with pytest.raises(redis.ResponseError, match="argument must be between 0 and"):
            r.config_set("acllog-max-len", -1)
    finally:
        r.config_set("acllog-max-len", 128)
        r.acl_log_reset()
