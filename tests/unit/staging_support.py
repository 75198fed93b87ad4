"""What the staging unit tests share: a budget that only counts (the DRAM tier's charge/uncharge interface)."""

from __future__ import annotations

MB = 1 << 20


class Budget:
    def __init__(self) -> None:
        self.used = 0

    def charge(self, n: int) -> None:
        self.used += n

    def uncharge(self, n: int) -> None:
        self.used -= n
