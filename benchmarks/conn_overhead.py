#!/usr/bin/env python3
"""Per-command overhead of the connection hot path, in process: parsed bytes -> Connection -> fake transport.

    python benchmarks/conn_overhead.py [--rounds 7] [--n 50000]

Prints microseconds per command for SET and GET (100-byte values) at pipeline depth 1 and 16, the minimum over
rounds (the machine is shared: the minimum is the least noisy estimate). No sockets, so it isolates parsing,
dispatch, the handler, encoding and the flush; run it before and after a change to the hot path.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from kvstrata.config import build_config
from kvstrata.server.app import Server
from kvstrata.server.connection import Connection


class _Transport:
    def write(self, data: Any) -> None:
        pass

    def writelines(self, data: Any) -> None:
        pass

    def get_extra_info(self, key: str) -> Any:
        return ("127.0.0.1", 1) if key in ("peername", "sockname") else None

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--policy", default="lru")
    args = ap.parse_args()
    srv = Server(build_config({"eviction-policy": args.policy, "http-port": 0}, {}))
    conn = Connection(srv)
    conn.connection_made(_Transport())  # type: ignore[arg-type]

    def run(frames: list[bytes]) -> float:
        t = time.perf_counter()
        for f in frames:
            buf = conn.get_buffer(-1)
            n = len(f)
            buf[:n] = f
            conn.buffer_updated(n)
        return time.perf_counter() - t

    rng = random.Random(1)
    n = args.n
    sets = [b"*3\r\n$3\r\nSET\r\n$16\r\nkey:%012d\r\n$100\r\n%s\r\n" % (rng.randrange(100000), b"x" * 100)
            for _ in range(n)]
    gets = [b"*2\r\n$3\r\nGET\r\n$16\r\nkey:%012d\r\n" % rng.randrange(100000) for _ in range(n)]
    p16s = [b"".join(sets[i : i + 16]) for i in range(0, n, 16)]
    p16g = [b"".join(gets[i : i + 16]) for i in range(0, n, 16)]
    res: dict[str, list[float]] = {"SET P1": [], "GET P1": [], "SET P16": [], "GET P16": []}
    for _ in range(args.rounds):
        res["SET P1"].append(run(sets) / n * 1e6)
        res["GET P1"].append(run(gets) / n * 1e6)
        res["SET P16"].append(run(p16s) / n * 1e6)
        res["GET P16"].append(run(p16g) / n * 1e6)
    print(" ".join(f"{k}={min(v):.2f}us" for k, v in res.items()))


if __name__ == "__main__":
    main()
