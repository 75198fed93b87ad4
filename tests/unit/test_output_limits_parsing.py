"""Unit tests for kvstrata.output_limits: parsing as Redis's updateClientOutputBufferLimit, merging with the
limits in force (in every configuration layer), and when a client is closed (hard limit, soft limit for more
than its seconds) with the clock given."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstrata.config import build_config
from kvstrata.output_limits import DEFAULT, Limit, OutputLimits, merge, parse
from kvstrata.sizes import parse_memory

NAME = "client-output-buffer-limit"


@pytest.mark.parametrize("text,expected", [
    ("0", 0), ("1024", 1024), ("1b", 1), ("2k", 2000), ("2K", 2000), ("2kb", 2048), ("3m", 3_000_000),
    ("3MB", 3 * 1024**2), ("1g", 10**9), ("1G", 10**9), ("1gB", 1024**3),
])
def test_parse_memory_reads_as_memtoull(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "+1", "1.5mb", "1 mb", " 1", "1tb", "mb", "１", "0x10"])
def test_parse_memory_refuses_what_memtoull_refuses(text):
    with pytest.raises(ValueError):
        parse_memory(text)


def test_parse_names_only_the_classes_given():
    assert parse("pubsub 1mb 2k +5 SLAVE 0 0 0") == {"pubsub": Limit(1024**2, 2000, 5),
                                                      "replica": Limit(0, 0, 0)}
    assert parse("") == {}
    assert parse("normal 1 1 1 normal 2 2 2") == {"normal": Limit(2, 2, 2)}  # the last one, as Redis


def test_a_bare_size_is_every_class_hard_limit():
    assert parse("4mb") == parse(4 * 1024**2) == dict.fromkeys(("normal", "replica", "pubsub"),
                                                                 Limit(4 * 1024**2, 0, 0))


@pytest.mark.parametrize("text,message", [
    ("normal 1 1", "Wrong number"), ("1mb 2mb", "Wrong number"), ("master 1 1 1", "Invalid client class"),
    ("normal 1 1 -1", "Error in hard"), ("normal 1 1 1.0", "Error in hard"), ("normal x 1 1", "Error in hard"),
])
def test_parse_refuses_with_redis_text(text, message):
    with pytest.raises(ValueError, match=message):
        parse(text)


def test_merge_replaces_only_the_classes_named():
    merged = merge(DEFAULT, parse("pubsub 1 2 3"))
    assert merged == OutputLimits(normal=DEFAULT.normal, replica=DEFAULT.replica, pubsub=Limit(1, 2, 3))
    assert str(merged) == "normal 1073741824 0 0 slave 268435456 67108864 60 pubsub 1 2 3"
    assert merge(merged, DEFAULT) is DEFAULT
    assert merged.lowest("pubsub") == 1 and DEFAULT.lowest("normal") == 1024**3
    assert merge(DEFAULT, parse("normal 0 0 0")).lowest("normal") == 0


def test_every_layer_merges_into_the_one_below(tmp_path: Path):
    path = tmp_path / "kvstrata.toml"
    path.write_text(f'{NAME} = "normal 10mb 0 0"\n')
    cfg = build_config({NAME: "replica 1 1 1"}, {"KVSTRATA_CLIENT_OUTPUT_BUFFER_LIMIT": "pubsub 2 2 2"}, str(path))
    assert str(cfg.get(NAME)) == "normal 10485760 0 0 slave 1 1 1 pubsub 2 2 2"


def test_the_hard_limit_closes_at_once():
    hard = Limit(100, 0, 0)
    assert hard.passed(99, 0.0, 5.0) == (False, 0.0)
    assert hard.passed(100, 0.0, 5.0) == (True, 0.0)


def test_the_soft_limit_closes_only_past_its_seconds():
    soft = Limit(0, 100, 2)
    assert soft.passed(100, 0.0, 10.0) == (False, 10.0)  # the first time only starts the clock
    assert soft.passed(5000, 10.0, 12.0) == (False, 10.0)  # 2 s is not more than 2 s
    assert soft.passed(99, 10.0, 12.5) == (False, 0.0)  # under it again: the clock stops
    assert soft.passed(100, 0.0, 13.0) == (False, 13.0)
    assert soft.passed(100, 13.0, 15.01) == (True, 13.0)
    assert Limit(0, 100, 0).passed(100, 20.0, 20.001) == (True, 20.0)
    assert Limit(0, 0, 0).passed(10**12, 0.0, 1.0) == (False, 0.0)
