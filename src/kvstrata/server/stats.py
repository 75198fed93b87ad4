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
    evicted_clients: int = 0  # closed by maxmemory-clients
    peak_memory: int = 0  # the most used_memory seen (each background cycle and INFO), as Redis's
    query_limit_closed: int = 0
    cross_protocol_closed: int = 0


ERROR_CODES_MAX = 128  # Redis's ERROR_STATS_NUMBER: distinct error codes counted; later new ones are not


def count_error(codes: dict[str, int], message: str) -> None:
    """Count an error reply under its code, the first word of its text (``ERR``, ``WRONGTYPE``, ``NOPERM``...), as
    Redis's INFO errorstats does."""
    code = message.split(" ", 1)[0]
    if code in codes:
        codes[code] += 1
    elif len(codes) < ERROR_CODES_MAX:
        codes[code] = 1
