"""Waiting for a blocked client: until what it waits for happens, its deadline passes, or it hangs up.

A connection whose command waits (WAIT, a command held by CLIENT PAUSE) reads nothing meanwhile, so asyncio
learns of its hang-up only once the wait ends; the waiter asks (``Connection.hung_up``) every ``poll`` seconds
instead, and a client that left is dropped during the wait, as Redis frees it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

GONE_POLL_S = 0.25  # how soon a blocked client that disconnected is noticed


@contextlib.contextmanager
def blocked(server: Any, client: Any) -> Iterator[None]:
    """While a client waits (WAIT, a command held by CLIENT PAUSE): counted in INFO's blocked_clients and shown
    with flag ``b`` in CLIENT LIST."""
    if server is not None:
        server.blocked_clients += 1
    client.blocked = True
    try:
        yield
    finally:
        client.blocked = False
        if server is not None:
            server.blocked_clients -= 1


async def until_done_or_gone(fut: asyncio.Future[Any], gone: Callable[[], bool], deadline: float | None = None,
                             poll: float = GONE_POLL_S) -> bool:
    """True once ``fut`` is done; False when ``deadline`` (loop time; None: none) passes or ``gone()`` says the
    client left. ``fut`` itself is never cancelled here."""
    loop = asyncio.get_running_loop()
    while not fut.done():
        if gone():
            return False
        step = poll if deadline is None else min(poll, deadline - loop.time())
        if step <= 0:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(fut), step)
    return True
