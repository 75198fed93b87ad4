"""TLS on the RESP port and the HTTP endpoint (Redis's option names), with a CA and certificates made here:
redis-py ``ssl=True``, ``redis-cli --tls``, client certificates required / optional, HTTPS."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import os
import ssl
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from redis.backoff import NoBackoff
from redis.retry import Retry
from tests.integration.polling import wait_for

from kvstrata.bench.procs import free_port

pytestmark = pytest.mark.kvstrata_only
HOST = "127.0.0.1"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, issuer_key, issuer: str, key, *, ca: bool = False, usage=None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        b = b.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _write(path, cert, key) -> None:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("kvstrata test CA", ca_key, "kvstrata test CA", ca_key, ca=True)
    _write(d / "ca", ca, ca_key)
    for name, usage in (("server", ExtendedKeyUsageOID.SERVER_AUTH), ("client", ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        _write(d / name, _cert(name, ca_key, "kvstrata test CA", key, usage=usage), key)
    other_key = ec.generate_private_key(ec.SECP256R1())  # a client certificate from a CA the server does not trust
    _write(d / "stranger", _cert("stranger", other_key, "stranger", other_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH),
           other_key)
    return d


def _tls_config(pki, **extra) -> dict:
    return {"tls-port": free_port(), "tls-cert-file": pki / "server.crt", "tls-key-file": pki / "server.key",
            "tls-ca-cert-file": pki / "ca.crt", **extra}


def _tls_client(srv, pki, cert: str | None = "client", timeout: float = 10, **kw) -> redis.Redis:
    certs = {"ssl_certfile": str(pki / f"{cert}.crt"), "ssl_keyfile": str(pki / f"{cert}.key")} if cert else {}
    return redis.Redis(host=HOST, port=srv.config["tls-port"], ssl=True, ssl_ca_certs=str(pki / "ca.crt"),
                       socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0),
                       **certs, **kw)


def test_redis_py_and_redis_cli_over_tls_with_client_certificates(make_server, pki):
    srv = make_server(_tls_config(pki, requirepass="pw"))
    r = _tls_client(srv, pki, password="pw")
    try:
        assert r.ping()
        big = bytes(range(256)) * 8192  # 2 MiB: the large-value receive path, through TLS
        assert r.set("tls:big", big) and r.get("tls:big") == big
        assert r.set("tls:k", "v") and r.get("tls:k") == b"v"
        line = r.execute_command("CLIENT", "INFO").decode()
        assert f"laddr={HOST}:{srv.config['tls-port']}" in line
    finally:
        r.close()
    assert srv.client(password="pw").get("tls:k") == b"v"  # the plain port serves the same data
    cli = subprocess.run(
        ["redis-cli", "--tls", "--cacert", str(pki / "ca.crt"), "--cert", str(pki / "client.crt"),
         "--key", str(pki / "client.key"), "-h", HOST, "-p", str(srv.config["tls-port"]), "--no-auth-warning",
         "-a", "pw", "GET", "tls:k"], capture_output=True, timeout=15, check=False)
    assert cli.stdout.decode().strip() == "v", cli.stderr
    for cert in (None, "stranger"):  # tls-auth-clients yes: no certificate, or an untrusted one, is refused
        bad = _tls_client(srv, pki, cert=cert, timeout=2, password="pw")
        with pytest.raises(redis.ConnectionError):
            bad.ping()
        bad.close()
    plain_cli = subprocess.run(["redis-cli", "-h", HOST, "-p", str(srv.config["tls-port"]), "PING"],
                               capture_output=True, timeout=15, check=False)
    assert b"PONG" not in plain_cli.stdout  # plain RESP on the TLS port gets nothing
    assert srv.alive()


def test_optional_and_no_client_certificates(make_server, pki):
    srv = make_server(_tls_config(pki, **{"tls-auth-clients": "optional"}))
    for cert in (None, "client"):
        r = _tls_client(srv, pki, cert=cert)
        assert r.ping()
        r.close()
    bad = _tls_client(srv, pki, cert="stranger", timeout=2)
    with pytest.raises(redis.ConnectionError):
        bad.ping()
    bad.close()
    srv2 = make_server(_tls_config(pki, **{"tls-auth-clients": "no", "tls-ca-cert-file": ""}))
    r = _tls_client(srv2, pki, cert=None)
    assert r.ping()
    r.close()
    cli = subprocess.run(["redis-cli", "--tls", "--cacert", str(pki / "ca.crt"), "-h", HOST,
                          "-p", str(srv2.config["tls-port"]), "PING"], capture_output=True, timeout=15, check=False)
    assert cli.stdout.decode().strip() == "PONG", cli.stderr


def test_https_endpoint(make_server, pki):
    http_port = free_port()
    make_server(_tls_config(pki, **{"http-port": http_port, "http-tls": "yes", "requirepass": "pw"}))
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    conn = http.client.HTTPSConnection(HOST, http_port, context=ctx, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": "Bearer pw"})
        resp = conn.getresponse()
        assert resp.status == 200 and b"kvstrata_" in resp.read()
    finally:
        conn.close()
    plain = http.client.HTTPConnection(HOST, http_port, timeout=10)
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        plain.request("GET", "/healthz")
        plain.getresponse().read()
    plain.close()


def test_bad_tls_configuration_stops_the_start(tmp_path, pki):
    base = [sys.executable, "-m", "kvstrata", "serve", "--port", str(free_port()), "--http-port", "0",
            "--tls-port", str(free_port())]
    cases = [
        ([], "tls-cert-file"),
        (["--tls-cert-file", str(pki / "server.crt"), "--tls-key-file", str(tmp_path / "missing.key"),
          "--tls-auth-clients", "no"], "missing.key"),
        (["--tls-cert-file", str(pki / "server.crt"), "--tls-key-file", str(pki / "server.key")],
         "tls-ca-cert-file"),
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    for extra, expected in cases:
        proc = subprocess.run(base + extra, capture_output=True, timeout=30, check=False, env=env,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode != 0 and expected in proc.stderr.decode(), proc.stderr


def test_port_zero_with_a_tls_port_serves_tls_only(pki, tmp_path):
    tls_port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvstrata", "serve", "--port", "0", "--http-port", "0", "--tls-port", str(tls_port),
         "--tls-cert-file", str(pki / "server.crt"), "--tls-key-file", str(pki / "server.key"),
         "--tls-auth-clients", "no"], stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
    try:
        r = redis.Redis(host=HOST, port=tls_port, ssl=True, ssl_ca_certs=str(pki / "ca.crt"), socket_timeout=5,
                        retry=Retry(NoBackoff(), 0))
        wait_for(lambda: _pings(r), timeout=20, what="the TLS port to answer")
        r.close()
        text = (tmp_path / "server.log").read_text()
        assert "ready to accept connections" in text and f"TLS on port {tls_port}" in text
        listening = {c.laddr.port for c in psutil.Process(proc.pid).net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN}
        assert listening == {tls_port}  # no plain RESP listener (and no HTTP endpoint: --http-port 0)
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def _pings(r) -> bool:
    try:
        return bool(r.ping())
    except redis.ConnectionError:
        return False
