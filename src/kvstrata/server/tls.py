"""TLS for the RESP port and the HTTP endpoint, configured with Redis's option names.

``tls-cert-file``/``tls-key-file`` (and ``tls-key-file-pass``) are the server's identity; ``tls-auth-clients``
``yes`` (Redis's default) requires a client certificate signed by ``tls-ca-cert-file``, ``optional`` verifies
one when given, ``no`` asks for none. TLS 1.2 is the oldest version accepted.
"""

from __future__ import annotations

import ssl
from typing import Any


class TlsConfigError(ValueError):
    """The TLS options are incomplete or their files cannot be used (raised before anything listens)."""


def tls_wanted(config: Any) -> bool:
    return int(config.get("tls-port")) > 0 or bool(config.get("http-tls"))


def server_context(config: Any) -> ssl.SSLContext:
    cert, key = str(config.get("tls-cert-file")), str(config.get("tls-key-file"))
    if not cert or not key:
        raise TlsConfigError("TLS (tls-port or http-tls) needs --tls-cert-file and --tls-key-file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key, password=str(config.get("tls-key-file-pass")) or None)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load tls-cert-file {cert} / tls-key-file {key}: {exc}") from None
    mode = config.get("tls-auth-clients")
    if mode == "no":
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    ca = str(config.get("tls-ca-cert-file"))
    if not ca:
        raise TlsConfigError("tls-auth-clients yes/optional needs --tls-ca-cert-file (or --tls-auth-clients no)")
    try:
        ctx.load_verify_locations(ca)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load tls-ca-cert-file {ca}: {exc}") from None
    ctx.verify_mode = ssl.CERT_REQUIRED if mode == "yes" else ssl.CERT_OPTIONAL
    return ctx
