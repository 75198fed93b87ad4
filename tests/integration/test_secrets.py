"""No secret is echoed: SLOWLOG, /stats.json, CONFIG GET pool, INFO and the log never show a password."""

from __future__ import annotations

import base64
import http.client
import json

import pytest

from kvstrata.bench.procs import free_port

pytestmark = pytest.mark.kvstrata_only

PASSWORD = "s3cretPass"
NEW_PASSWORD = "n3wPass"
POOL_PASSWORD = "p00lSecret"


def _get(port: int, path: str, password: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": "Bearer " + password})
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200, body
        return body
    finally:
        conn.close()


def test_passwords_never_reach_slowlog_http_or_log(make_server, tmp_path):
    http_port = free_port()
    pool_port = free_port()  # nothing listens there: the pool is degraded, which the log reports
    srv = make_server({"requirepass": PASSWORD, "slowlog-log-slower-than": 0, "http-port": http_port,
                       "essd-path": tmp_path / "ssd", "pool": f"redis://user:{POOL_PASSWORD}@127.0.0.1:{pool_port}",
                       "pool-connect-timeout": 50, "pool-timeout": 50,
                       "pool-start-degraded": "yes",  # an unreachable pool refuses startup without it
                       "pool-ack": "local"})  # writes answered while the pool is away (pool: -TRYAGAIN)
    r = srv.client(password=PASSWORD)
    r3 = srv.client(protocol=3, username="default", password=PASSWORD)  # HELLO 3 AUTH default <password>
    try:
        assert r3.ping()
        r.execute_command("AUTH", PASSWORD)
        r.execute_command("AUTH", "default", PASSWORD)
        r.config_set("requirepass", NEW_PASSWORD)
        r.config_set("requirepass", PASSWORD)
        r.set("tenantA:doc", "tenantA-value-7f3a")
        pool_url = r.config_get("pool")["pool"]
        assert POOL_PASSWORD not in pool_url and pool_url.endswith(f"@127.0.0.1:{pool_port}")
        entries = r.execute_command("SLOWLOG", "GET", "-1")
        logged = [list(e[3]) for e in entries]
        assert [b"AUTH", b"(redacted)"] in logged
        assert [b"AUTH", b"(redacted)", b"(redacted)"] in logged
        assert [b"CONFIG", b"SET", b"requirepass", b"(redacted)"] in logged
        assert any(a[:1] == [b"HELLO"] and a.count(b"(redacted)") == 2 for a in logged)
        assert [b"SET", b"tenantA:doc", b"tenantA-value-7f3a"] in logged  # RESP clients see their own commands
        info = str(r.info("everything")).encode()
        everything = b"".join(bytes(a) for e in entries for a in e[3]) + info
        for secret in (PASSWORD, NEW_PASSWORD, POOL_PASSWORD):
            assert secret.encode() not in everything
        stats = _get(http_port, "/stats.json", PASSWORD)
        metrics = _get(http_port, "/metrics", PASSWORD)
        latest = json.loads(stats)["slowlog"]["latest"]
        assert latest and all(e["args"][0].isalpha() for e in latest)
        for text in (stats, metrics):
            for secret in (PASSWORD, NEW_PASSWORD, POOL_PASSWORD, "tenantA:doc", "tenantA-value-7f3a"):
                assert secret.encode() not in text, secret
    finally:
        r.close()
        r3.close()
    log = srv.log_text().split("\n", 1)[1]  # the first line is the harness's command line
    assert f"@127.0.0.1:{pool_port}" in log  # the pool is named in the log ...
    assert POOL_PASSWORD not in log and PASSWORD not in log  # ... its password is not
    assert base64.b64encode(PASSWORD.encode()).decode() not in log
