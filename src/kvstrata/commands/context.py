"""What a handler sees: the connection's client state and the shared server state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvstrata.config import Config
from kvstrata.engine.store import Store


@dataclass
class ClientState:
    id: int
    addr: str = ""
    laddr: str = ""
    name: bytes = b""
    lib_name: bytes = b""
    lib_ver: bytes = b""
    proto: int = 2
    authenticated: bool = True
    # The ACL user (kvstrata.acl.User) the connection runs as; None (no server) means unrestricted.
    user: Any = None
    created_ms: int = 0
    last_ms: int = 0
    last_cmd: Any = "NULL"
    closing: bool = False
    fd: int = -1


@dataclass
class Context:
    """One per connection. ``server`` is the running server (clients, stats, shutdown) or None in tests."""

    store: Store
    config: Config
    client: ClientState
    server: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
