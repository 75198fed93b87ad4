"""The benchmarks' RESP client: ``kvstrata.client.fast.FastClient`` (large values go out as separate buffers,
no packing copy, and come back into a caller's buffer), so the client costs the same against every server."""

from __future__ import annotations

from kvstrata.client.fast import FastClient, RespError

RawClient = FastClient

__all__ = ["RawClient", "RespError"]
