"""CONFIG REWRITE with a TOML config file: the file keeps its parameters, gains what CONFIG SET changed (as given),
leaves out flags, keeps its permissions, and reads back the same on a restart; no value can add a parameter of
its own (a password with quotes, newlines and control characters stays one string); without a file it is
refused as in Redis."""

from __future__ import annotations

import stat
import tomllib

import pytest
import redis

pytestmark = pytest.mark.kvstrata_only

HOSTILE = 'p"w\nport = 1\n[table]\n\x00\x7f\\"""'


def test_rewrite_keeps_the_file_adds_config_set_and_reads_back(make_server, tmp_path) -> None:
    path = tmp_path / "kvstrata.toml"
    path.write_text('# mine\ndram-size = "8mb"\nunixsocketperm = "750"\nprefetch-along = 2\n')
    path.chmod(0o640)
    srv = make_server({"config": str(path), "maxmemory-policy": "noeviction"})  # a flag: not written
    r = srv.client()
    assert r.config_set("prefetch-along", 3) and r.config_set("ssd-writer-pause", 150)
    assert r.config_set("requirepass", HOSTILE)
    assert r.execute_command("CONFIG", "REWRITE") == b"OK"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    written = tomllib.loads(path.read_text())
    assert written == {"dram-size": "8mb", "unixsocketperm": "750", "prefetch-along": "3",
                       "ssd-writer-pause": "150", "requirepass": HOSTILE}
    srv.stop()
    again = make_server({"config": str(path)})
    with pytest.raises(redis.AuthenticationError):
        again.client().ping()
    r = again.client(password=HOSTILE)
    got = r.config_get("*")
    assert (got["prefetch-along"], got["ssd-writer-pause"], got["dram-size"]) == ("3", "150", str(8 << 20))
    assert got["unixsocketperm"] == "750" and got["maxmemory-policy"] == "allkeys-lru"
    assert got["port"] == str(again.port)


def test_rewrite_without_a_config_file_is_refused(make_server) -> None:
    r = make_server().client()
    with pytest.raises(redis.ResponseError, match="^The server is running without a config file$"):
        r.execute_command("CONFIG", "REWRITE")


def test_rewrite_of_the_client_limits_and_acl_parameters_reads_back(make_server, tmp_path) -> None:
    """client-output-buffer-limit set one class at a time is written whole (each CONFIG SET named one class), and
    the other new parameters as given; a restart reads them back the same."""
    path = tmp_path / "kvstrata.toml"
    path.write_text('client-output-buffer-limit = "normal 10mb 0 0"\n')
    srv = make_server({"config": str(path)})
    r = srv.client()
    assert r.config_set("client-output-buffer-limit", "pubsub 1mb 512kb 5")
    for name, value in (("maxmemory-clients", "5%"), ("latency-tracking-info-percentiles", "50 99.99"),
                        ("tcp-keepalive", "60"), ("acllog-max-len", "16"), ("acl-pubsub-default", "allchannels")):
        assert r.config_set(name, value)
    before = r.config_get("*")
    assert before["client-output-buffer-limit"] == ("normal 10485760 0 0 slave 268435456 67108864 60 "
                                                    "pubsub 1048576 524288 5")
    assert r.execute_command("CONFIG", "REWRITE") == b"OK"
    srv.stop()
    again = make_server({"config": str(path)})
    after = again.client().config_get("*")
    for name in ("client-output-buffer-limit", "maxmemory-clients", "latency-tracking-info-percentiles",
                 "tcp-keepalive", "acllog-max-len", "acl-pubsub-default"):
        assert after[name] == before[name], name
