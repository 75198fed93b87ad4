"""The HTTP endpoint's pure parts: loopback detection, the refusal to expose it without a password, the
Authorization header check, and routing (no sockets)."""

import base64

import pytest

from kvstrata.observability.http import (
    HttpEndpoint,
    ObservabilityConfigError,
    authorized,
    check_bind,
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


def endpoint(require_auth, password="pw"):
    routes = {"/ok": lambda headers: (200, {"Content-Type": "text/plain"}, b"fine"),
              "/boom": lambda headers: 1 / 0}
    return HttpEndpoint(routes, ["127.0.0.1"], 0, require_auth=require_auth, password=lambda: password)


def test_respond_routes_methods_and_errors():
    ep = endpoint(False)
    assert ep.respond("GET", "/ok?x=1", {})[0::2] == (200, b"fine")
    assert ep.respond("HEAD", "/ok", {})[0] == 200
    status, headers, _ = ep.respond("POST", "/ok", {})
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert ep.respond("GET", "/missing", {})[0] == 404
    assert ep.respond("GET", "/boom", {})[0] == 500


def test_respond_checks_the_password_first():
    ep = endpoint(True)
    status, headers, _ = ep.respond("GET", "/ok", {})
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic realm=")
    assert ep.respond("GET", "/missing", {})[0] == 401  # no route discovery without the password
    assert ep.respond("GET", "/ok", {"authorization": "Bearer pw"})[0] == 200
    assert ep.respond("GET", "/ok", {"authorization": basic("u", "pw")})[0] == 200
    # Password removed at run time (CONFIG SET requirepass ""): everything is refused.
    assert endpoint(True, password=None).respond("GET", "/ok", {"authorization": "Bearer pw"})[0] == 401
