"""Unit tests for kvstrata.sizes and kvstrata.config: size parsing, the parameter table, and the precedence
defaults < TOML file < environment < flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstrata.config import (
    ALIASES,
    PARAMS,
    PARAMS_BY_NAME,
    Config,
    build_config,
    canonical,
    env_values,
    load_file,
)
from kvstrata.sizes import format_size, parse_size

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4

# ----------------------------------------------------------------------------------------------------------------
# parse_size / format_size
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    ("512mb", 512 * MiB),
    ("512MB", 512 * MiB),
    ("512Mb", 512 * MiB),
    ("16G", 16 * GiB),  # upper-case single letter: binary, as in flags and env vars
    ("16g", 16 * 1000**3),  # Redis: k/m/g are powers of 1000
    ("1gb", GiB),
    ("1GB", GiB),
    ("100", 100),
    ("0", 0),
    ("100b", 100),
    ("100B", 100),
    ("1.5gb", int(1.5 * GiB)),
    ("1.5G", int(1.5 * GiB)),
    ("1k", 1000),
    ("1K", KiB),
    ("1kb", KiB),
    ("2m", 2 * 1000**2),
    ("2M", 2 * MiB),
    ("1t", 1000**4),
    ("1T", TiB),
    ("1tb", TiB),
    ("  64mb  ", 64 * MiB),
    ("64 mb", 64 * MiB),
    ("4096", 4096),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("value", [0, 1, 4096, 16 * GiB])
def test_parse_size_passes_ints_through(value):
    assert parse_size(value) == value


@pytest.mark.parametrize("text", ["", "   ", "abc", "mb", "-1", "-1mb", "1.5.5", "12xb", "1 2", "1pb", "1e3",
                                  "0x10", "1,5gb", "gb1", "+5"])
def test_parse_size_rejects_bad_input(text):
    with pytest.raises(ValueError, match="argument must be a memory value"):
        parse_size(text)


def test_parse_size_rejects_negative_int():
    with pytest.raises(ValueError):
        parse_size(-1)


def test_parse_size_exact_for_large_integers():
    assert parse_size("9007199254740993") == 9007199254740993
    assert parse_size("9007199254740993b") == 9007199254740993


@pytest.mark.parametrize("n,text", [(0, "0B"), (1023, "1023B"), (1024, "1.00K"), (1536, "1.50K"),
                                    (MiB, "1.00M"), (3 * GiB, "3.00G"), (2 * TiB, "2.00T"), (5000 * TiB, "5000.00T")])
def test_format_size(n, text):
    assert format_size(n) == text


# ----------------------------------------------------------------------------------------------------------------
# Config and its table
# ----------------------------------------------------------------------------------------------------------------


def test_defaults():
    cfg = Config()
    assert cfg.port == 6379
    assert cfg.bind == "127.0.0.1"
    assert cfg.requirepass is None
    assert cfg.protected_mode is True
    assert cfg.maxmemory_policy == "allkeys-lru"
    assert cfg.eviction_policy == "lru-k"
    assert cfg.essd_path == ""
    assert cfg.essd_size == 16 * GiB
    assert cfg.proto_max_bulk_len == 512 * MiB
    assert cfg.large_value_threshold == 64 * KiB
    assert cfg.hot_max_fraction == 0.5
    # default DRAM budget: a quarter of RAM, between 64 MiB and 4 GiB
    assert 64 * MiB <= cfg.dram_size <= 4 * GiB
    assert cfg.get("dram-size") == cfg.dram_size


def test_every_param_has_a_default_value_and_unique_name():
    cfg = Config()
    assert len(PARAMS_BY_NAME) == len(PARAMS)
    for p in PARAMS:
        assert p.name in cfg.values
        assert p.name == canonical(p.name)


def test_attribute_and_get_access():
    cfg = Config()
    cfg.set("port", "7000")
    assert cfg.port == 7000
    assert cfg.get("port") == 7000
    assert cfg.get("PORT") == 7000
    assert cfg.get("large_value_threshold") == 64 * KiB
    with pytest.raises(AttributeError):
        _ = cfg.no_such_param


def test_canonical_names_and_maxmemory_alias():
    assert ALIASES["maxmemory"] == "dram-size"
    assert canonical("maxmemory") == "dram-size"
    assert canonical(" MaxMemory ") == "dram-size"
    assert canonical("dram_size") == "dram-size"
    assert canonical("Hot_Max_Fraction") == "hot-max-fraction"


def test_set_parses_values():
    cfg = Config()
    cfg.set("dram-size", "512mb")
    assert cfg.dram_size == 512 * MiB
    cfg.set("maxmemory", "1gb")
    assert cfg.dram_size == GiB
    assert cfg.get("maxmemory") == GiB
    cfg.set("protected-mode", "no")
    assert cfg.protected_mode is False
    cfg.set("protected-mode", "YES")
    assert cfg.protected_mode is True
    cfg.set("maxmemory-policy", "NoEviction")
    assert cfg.maxmemory_policy == "noeviction"
    cfg.set("hot-max-fraction", "0.25")
    assert cfg.hot_max_fraction == 0.25
    cfg.set("requirepass", "secret")
    assert cfg.requirepass == "secret"
    cfg.set("requirepass", "")
    assert cfg.requirepass is None


@pytest.mark.parametrize("name,raw", [
    ("port", "abc"),
    ("port", "1.5"),
    ("dram-size", "lots"),
    ("protected-mode", "maybe"),
    ("maxmemory-policy", "volatile-lru"),
    ("eviction-policy", "lfu"),
    ("hot-max-fraction", "half"),
    ("appendonly", "yes"),
])
def test_set_rejects_bad_values(name, raw):
    cfg = Config()
    before = cfg.get(name)
    with pytest.raises(ValueError):
        cfg.set(name, raw)
    assert cfg.get(name) == before


def test_set_unknown_param():
    cfg = Config()
    with pytest.raises(ValueError, match="^Unknown option or number of arguments for CONFIG SET - 'nope'$"):
        cfg.set("nope", "1")
    with pytest.raises(ValueError, match="Unknown option"):
        cfg.set("nope", "1", runtime=True)


@pytest.mark.parametrize("name", ["port", "bind", "eviction-policy", "essd-path", "large-value-threshold",
                                  "databases", "lru-k"])
def test_runtime_set_refuses_immutable(name):
    cfg = Config()
    before = cfg.get(name)
    with pytest.raises(ValueError, match=f"^can't set immutable config '{name}'$"):
        cfg.set(name, "1", runtime=True)
    assert cfg.get(name) == before


def test_runtime_set_accepts_mutable_and_startup_set_accepts_immutable():
    cfg = Config()
    cfg.set("maxmemory", "2gb", runtime=True)
    assert cfg.dram_size == 2 * GiB
    cfg.set("dram-size", "1gb", runtime=True)
    assert cfg.dram_size == GiB
    cfg.set("proto-max-bulk-len", "1mb", runtime=True)
    assert cfg.proto_max_bulk_len == MiB
    cfg.set("port", "7001")  # runtime=False: startup may set anything
    assert cfg.port == 7001


def test_immutable_set_is_refused_by_name_as_given():
    cfg = Config()
    with pytest.raises(ValueError, match="'Port'"):
        cfg.set("Port", "1", runtime=True)


def test_mutability_flags():
    mutable = {p.name for p in PARAMS if p.mutable}
    assert {"dram-size", "maxmemory-policy", "requirepass", "hot-max-fraction", "proto-max-bulk-len"} <= mutable
    assert not {"port", "bind", "essd-path", "eviction-policy", "large-value-threshold"} & mutable


# ----------------------------------------------------------------------------------------------------------------
# Environment and precedence
# ----------------------------------------------------------------------------------------------------------------


def test_env_values_documented_names():
    env = {"DRAM_SIZE": "512mb", "ESSD_PATH": "/data/ssd", "KVSTRATA_PORT": "7000", "PORT": "1", "HOME": "/root",
           "KVSTRATA_HOT_MAX_FRACTION": "0.3"}
    assert env_values(env) == {"dram-size": "512mb", "essd-path": "/data/ssd", "port": "7000",
                               "hot-max-fraction": "0.3"}


def test_env_values_ignores_unrelated():
    assert env_values({"PATH": "/bin", "KVSTRATA_NOPE": "1", "port": "1"}) == {}


def write_toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "kvstrata.toml"
    path.write_text(text)
    return str(path)


def test_load_file_canonicalizes_names(tmp_path):
    path = write_toml(tmp_path, 'maxmemory = "1gb"\nhot_max_fraction = 0.2\nport = 7000\n')
    assert load_file(path) == {"dram-size": "1gb", "hot-max-fraction": 0.2, "port": 7000}


def test_build_config_defaults_only():
    cfg = build_config({}, {})
    assert cfg.port == 6379
    assert cfg.essd_path == ""


def test_file_overrides_defaults(tmp_path):
    path = write_toml(tmp_path, 'port = 7000\ndram-size = "256mb"\nprotected-mode = false\n'
                                'essd-path = "/from/file"\nhot-max-fraction = 0.1\n')
    cfg = build_config({}, {}, path)
    assert cfg.port == 7000
    assert cfg.dram_size == 256 * MiB
    assert cfg.protected_mode is False
    assert cfg.essd_path == "/from/file"
    assert cfg.hot_max_fraction == 0.1


def test_environment_overrides_file(tmp_path):
    path = write_toml(tmp_path, 'port = 7000\ndram-size = "256mb"\nessd-path = "/from/file"\n')
    env = {"KVSTRATA_PORT": "7001", "DRAM_SIZE": "16G", "ESSD_PATH": "/from/env"}
    cfg = build_config({}, env, path)
    assert cfg.port == 7001
    assert cfg.dram_size == 16 * GiB
    assert cfg.essd_path == "/from/env"


def test_flags_override_environment_and_file(tmp_path):
    path = write_toml(tmp_path, 'port = 7000\ndram-size = "256mb"\nessd-path = "/from/file"\n')
    env = {"KVSTRATA_PORT": "7001", "DRAM_SIZE": "16G", "ESSD_PATH": "/from/env"}
    flags = {"port": "7002", "dram-size": "1gb", "essd-path": "/from/flags"}
    cfg = build_config(flags, env, path)
    assert cfg.port == 7002
    assert cfg.dram_size == GiB
    assert cfg.essd_path == "/from/flags"


def test_each_layer_only_overrides_what_it_sets(tmp_path):
    path = write_toml(tmp_path, 'port = 7000\nhz = 50\n')
    cfg = build_config({"bind": "0.0.0.0"}, {"DRAM_SIZE": "128mb"}, path)
    assert (cfg.port, cfg.hz, cfg.dram_size, cfg.bind) == (7000, 50, 128 * MiB, "0.0.0.0")
    assert cfg.maxmemory_policy == "allkeys-lru"


def test_none_flags_do_not_override(tmp_path):
    path = write_toml(tmp_path, "port = 7000\n")
    cfg = build_config({"port": None, "dram-size": None}, {"DRAM_SIZE": "1gb"}, path)
    assert cfg.port == 7000
    assert cfg.dram_size == GiB


def test_maxmemory_alias_in_every_layer(tmp_path):
    path = write_toml(tmp_path, 'maxmemory = "100mb"\n')
    assert build_config({}, {}, path).dram_size == 100 * MiB
    assert build_config({"maxmemory": "200mb"}, {}, path).dram_size == 200 * MiB
    assert build_config({"maxmemory": "300mb"}, {"DRAM_SIZE": "1gb"}, path).dram_size == 300 * MiB
    assert build_config({}, {"DRAM_SIZE": "1gb"}, path).dram_size == GiB


def test_flag_spelling_with_underscores():
    assert build_config({"dram_size": "64mb", "hot_max_fraction": "0.4"}, {}).hot_max_fraction == 0.4


def test_build_config_reports_bad_value_with_source_and_name(tmp_path):
    with pytest.raises(ValueError, match=r"^flags: port: argument couldn't be parsed into an integer$"):
        build_config({"port": "x"}, {})
    with pytest.raises(ValueError, match=r"^environment: dram-size: argument must be a memory value$"):
        build_config({}, {"DRAM_SIZE": "lots"})
    path = write_toml(tmp_path, 'port = "seven"\n')
    with pytest.raises(ValueError, match=rf"^file {path}: port: "):
        build_config({}, {}, path)


def test_build_config_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="flags: nope: Unknown option"):
        build_config({"nope": "1"}, {})
    path = write_toml(tmp_path, "nope = 1\n")
    with pytest.raises(ValueError, match="nope"):
        build_config({}, {}, path)


def test_build_config_sets_immutables_at_startup():
    cfg = build_config({"port": "7100", "eviction-policy": "lru", "large-value-threshold": "128kb"}, {})
    assert cfg.port == 7100
    assert cfg.eviction_policy == "lru"
    assert cfg.large_value_threshold == 128 * KiB


def test_missing_file_raises_os_error(tmp_path):
    with pytest.raises(OSError):
        build_config({}, {}, str(tmp_path / "missing.toml"))


def test_configs_do_not_share_state():
    a = Config()
    b = Config()
    a.set("port", "1234")
    assert b.port == 6379
