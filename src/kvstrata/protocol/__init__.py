"""RESP2/RESP3: request parsing and reply encoding, with no I/O (sans-IO)."""

from kvstrata.protocol.encoder import ErrorReply, Status, encode
from kvstrata.protocol.parser import RequestParser

__all__ = ["ErrorReply", "RequestParser", "Status", "encode"]
