"""Where the SDK's transport connects: a redis-py connection pool's settings as FastClient's keywords.

redis-py parses the SDK's URL (``redis://``, ``rediss://``, ``unix://``; credentials, ``/db``, query options such
as ``?ssl_ca_certs=...``) into a pool; ``transport_args`` turns that pool's connection class and keywords into
the keywords of ``FastClient`` and ``AsyncFastClient.connect``, so both clients connect the same way: TCP or a
Unix socket, AUTH, ``SELECT db``, and TLS with an ``ssl.SSLContext`` built from redis-py's ``ssl_*`` options
(with redis-py's defaults: certificates required, host names checked).
"""

from __future__ import annotations

import ssl
from typing import Any

_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
# redis-py's SSL options this transport applies; any other ssl_* option given is refused rather than ignored.
_SSL_OPTIONS = {"ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_data", "ssl_ca_path",
                "ssl_check_hostname", "ssl_password", "ssl_min_version", "ssl_ciphers"}


def transport_args(pool: Any) -> dict[str, Any]:
    """``FastClient`` keywords for the connections ``pool`` (a sync or asyncio redis-py ``ConnectionPool``)
    describes."""
    kw = pool.connection_kwargs
    kind = pool.connection_class.__name__
    if kind not in ("Connection", "SSLConnection", "UnixDomainSocketConnection"):
        raise ValueError(f"the SDK's transport cannot connect with redis-py's {kind}")
    return {
        "host": kw.get("host", "localhost"),
        "port": int(kw.get("port", 6379)),
        "unix_path": kw.get("path") if kind == "UnixDomainSocketConnection" else None,
        "timeout": kw.get("socket_timeout"),
        "password": kw.get("password"),
        "username": kw.get("username"),
        "db": int(kw.get("db") or 0),
        "ssl_context": ssl_context(kw) if kind == "SSLConnection" else None,
    }


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off")
    return bool(value)


def ssl_context(kw: dict[str, Any]) -> ssl.SSLContext:
    """The TLS context redis-py's ``SSLConnection`` would use for these keywords."""
    unknown = sorted(k for k, v in kw.items() if k.startswith("ssl_") and k not in _SSL_OPTIONS and v is not None
                     and v is not False)
    if unknown:
        raise ValueError(f"TLS option(s) {', '.join(unknown)} are not supported by the SDK's transport")
    reqs = kw.get("ssl_cert_reqs", "required")
    if isinstance(reqs, str):
        if reqs.lower() not in _CERT_REQS:
            raise ValueError(f"ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}, not {reqs!r}")
        reqs = _CERT_REQS[reqs.lower()]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = _flag(kw.get("ssl_check_hostname", True)) and reqs != ssl.CERT_NONE
    ctx.verify_mode = reqs
    if reqs != ssl.CERT_NONE:
        if kw.get("ssl_ca_certs") or kw.get("ssl_ca_path") or kw.get("ssl_ca_data"):
            ctx.load_verify_locations(cafile=kw.get("ssl_ca_certs"), capath=kw.get("ssl_ca_path"),
                                      cadata=kw.get("ssl_ca_data"))
        else:
            ctx.load_default_certs()
    if kw.get("ssl_certfile"):
        ctx.load_cert_chain(kw["ssl_certfile"], kw.get("ssl_keyfile"), kw.get("ssl_password"))
    if kw.get("ssl_min_version") is not None:
        ctx.minimum_version = kw["ssl_min_version"]
    if kw.get("ssl_ciphers"):
        ctx.set_ciphers(kw["ssl_ciphers"])
    return ctx
