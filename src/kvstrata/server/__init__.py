"""The network server: asyncio connections, background tasks, prefetching and lifecycle."""
