"""The HTTP endpoint's pure parts: loopback detection, the refusal to expose it without a password, the
Authorization header check, and routing (no sockets)."""

import base64

import pytest

from kvstrata.observability.http import (
    HttpEndpoint,
    ObservabilityConfigError,
    authorized,
    check_bind,
    host_names,
    host_ok,
    is_loopback,
    needs_auth,
)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_hosts(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "example.com", "*", ""])
def test_other_hosts_are_not_loopback(host):
    assert not is_loopback(host)


def test_needs_auth():
    assert not needs_auth("127.0.0.1")
    assert not needs_auth("127.0.0.1 ::1")
    assert needs_auth("127.0.0.1 0.0.0.0")
    assert needs_auth("0.0.0.0")
    assert needs_auth("")  # every interface


def test_check_bind_refuses_an_exposed_endpoint_without_password():
    assert check_bind("127.0.0.1", None) is False
    assert check_bind("0.0.0.0", "pw") is True
    with pytest.raises(ObservabilityConfigError, match="requirepass"):
        check_bind("0.0.0.0", None)
    with pytest.raises(ObservabilityConfigError):
        check_bind("::", "")


def basic(user, password):
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_authorized():
    assert authorized("Bearer pw", "pw")
    assert authorized("bearer   pw ", "pw")
    assert authorized(basic("default", "pw"), "pw")
    assert authorized(basic("anyone", "p:w"), "p:w")  # only the first colon separates the user
    assert not authorized("Bearer nope", "pw")
    assert not authorized(basic("default", "nope"), "pw")
    assert not authorized("Basic !!!notbase64", "pw")
    assert not authorized("Basic " + base64.b64encode(b"no-colon").decode(), "no-colon")
    assert not authorized("Digest pw", "pw")
    assert not authorized(None, "pw")
    assert not authorized("Bearer pw", None)  # no password configured: nothing is accepted
    assert not authorized("Bearer ", "")


H = {"host": "127.0.0.1:9379"}


def endpoint(require_auth, password="pw"):
    routes = {"/ok": lambda headers: (200, {"Content-Type": "text/plain"}, b"fine"),
              "/boom": lambda headers: 1 / 0}
    return HttpEndpoint(routes, ["127.0.0.1"], 0, require_auth=require_auth, password=lambda: password)


def test_respond_routes_methods_and_errors():
    ep = endpoint(False)
    assert ep.respond("GET", "/ok?x=1", dict(H))[0::2] == (200, b"fine")
    assert ep.respond("HEAD", "/ok", dict(H))[0] == 200
    status, headers, _ = ep.respond("POST", "/ok", dict(H))
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert ep.respond("GET", "/missing", dict(H))[0] == 404
    assert ep.respond("GET", "/boom", dict(H))[0] == 500


def test_respond_checks_the_password_first():
    ep = endpoint(True)
    status, headers, _ = ep.respond("GET", "/ok", dict(H))
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic realm=")
    assert ep.respond("GET", "/missing", dict(H))[0] == 401  # no route discovery without the password
    assert ep.respond("GET", "/ok", {**H, "authorization": "Bearer pw"})[0] == 200
    assert ep.respond("GET", "/ok", {**H, "authorization": basic("u", "pw")})[0] == 200
    # Password removed at run time (CONFIG SET requirepass ""): everything is refused.
    assert endpoint(True, password=None).respond("GET", "/ok", {**H, "authorization": "Bearer pw"})[0] == 401


def test_healthz_is_open_and_auth_can_be_asked_per_request():
    routes = {"/healthz": lambda headers: (200, {}, b"ok\n"), "/ok": lambda headers: (200, {}, b"fine")}
    required = [True]
    ep = HttpEndpoint(routes, ["127.0.0.1"], 0, require_auth=lambda: required[0],
                      check=lambda user, pw: (user, pw) == ("ops", "pw"))
    assert ep.respond("GET", "/healthz", dict(H))[0] == 200
    assert ep.respond("GET", "/ok", dict(H))[0] == 401
    assert ep.respond("GET", "/ok", {**H, "authorization": basic("ops", "pw")})[0] == 200
    assert ep.respond("GET", "/ok", {**H, "authorization": basic("other", "pw")})[0] == 401
    required[0] = False
    assert ep.respond("GET", "/ok", dict(H))[0] == 200


@pytest.mark.parametrize("host", ["127.0.0.1:9379", "localhost:9379", "LOCALHOST", "[::1]:9379", "10.1.2.3",
                                  "localhost.", "metrics.internal:80"])
def test_host_header_accepted(host):
    assert host_ok(host, host_names(["127.0.0.1"], "metrics.internal"))


@pytest.mark.parametrize("host", ["attacker.example:9379", "attacker.example", "", "localhost:x", None,
                                  "127.0.0.1.nip.io"])
def test_host_header_refused(host):
    assert not host_ok(host, host_names(["127.0.0.1"]))


def test_dns_rebinding_gets_421_before_any_route():
    ep = endpoint(False)
    assert ep.respond("GET", "/ok", {"host": "rebind.attacker.example:9379"})[0] == 421
    assert ep.respond("GET", "/healthz", {"host": "rebind.attacker.example"})[0] == 421
    assert ep.respond("GET", "/ok", {})[0] == 421  # HTTP/1.1 without Host
    assert ep.respond("GET", "/ok", {}, "HTTP/1.0")[0] == 200  # HTTP/1.0 had no Host header
