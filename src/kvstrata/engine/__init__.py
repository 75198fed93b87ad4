"""The storage engine: entries, tiers, eviction policies, TTL and versions. Synchronous and asyncio-free."""
