"""Server-wide counters (connections, commands, bytes), incremented on the hot path as plain ints."""

from __future__ import annotations

from dataclasses import dataclass

from kvstrata.engine.stats import Counters


@dataclass
class ServerStats(Counters):
    connections: int = 0
    unknown: int = 0
    net_in: int = 0
    net_out: int = 0
    rejected: int = 0
    errors: int = 0
    protocol_errors: int = 0
    output_limit_closed: int = 0
    query_limit_closed: int = 0
    cross_protocol_closed: int = 0
