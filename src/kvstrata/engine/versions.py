"""Versions: a per-node counter that survives restarts, or hybrid logical clocks with a pool.

With an SSD tier the counter reserves blocks ahead in LMDB's meta, so versions keep increasing after a restart
without a disk write per version. With a pool, versions compare across nodes (docs/pool.md).
"""

from __future__ import annotations

VERSION_BLOCK = 100_000
# With a pool, versions are hybrid logical clocks: (wall ms << HLC_LOGICAL_BITS | logical) << NODE_BITS | node.
HLC_LOGICAL_BITS = 12
NODE_BITS = 8
HLC_VERSION_BLOCK = 1000 << (HLC_LOGICAL_BITS + NODE_BITS)  # one second of wall time


class VersionsMixin:
    """Store's versions (state: ``version``, ``node_id``, ``ssd``, ``pool``, ``clock``)."""

    def next_version(self) -> int:
        if self.pool is not None:
            return self._next_hlc()
        self.version += 1
        if self.ssd is not None and self.version > self.ssd.version_high_water:
            # Reserve a block ahead, so versions keep increasing after a restart without a write per version.
            self.ssd.save_version_high_water(self.version + VERSION_BLOCK)
        return self.version

    def _next_hlc(self) -> int:
        """A hybrid-logical-clock version, comparable across nodes: wall ms, a logical counter, the node id.

        It is higher than every version this node has issued or seen in the pool (``observe_version``), and
        higher than any version issued before a restart (the SSD tier keeps a high-water mark).
        """
        clock = self.version >> NODE_BITS
        physical = self.clock.now_ms() << HLC_LOGICAL_BITS
        clock = max(clock + 1, physical)
        self.version = (clock << NODE_BITS) | self.node_id
        if self.ssd is not None and self.version > self.ssd.version_high_water:
            self.ssd.save_version_high_water(self.version + HLC_VERSION_BLOCK)
        return self.version

    def observe_version(self, version: int) -> None:
        """Lamport's receive rule: later local writes get versions above one seen in the pool."""
        if version > self.version:
            self.version = (version >> NODE_BITS) << NODE_BITS | self.node_id
