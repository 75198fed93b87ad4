"""What one command's run through the engine carries and leaves behind: the client stream it comes from (the
predictor follows each stream's reads) and the completions its reply must wait for (the SSD writer's sequence
number under write-through or a checkpoint, the pool writes under ``pool-ack``).

The server starts each command with ``Store.begin_command(stream)``, hands the returned object to the handler
(``Context.command``) and reads it after the handler ran; a fresh object per command, so no command's state is
left for the next one to trip over. The engine writes the same object (``Store.command``).
"""

from __future__ import annotations


class CommandState:
    __slots__ = ("ack_seq", "pool_ack", "pool_writes", "stream")

    def __init__(self, stream: int = 0) -> None:
        self.stream = stream
        # The SSD writer sequence number the reply must wait for (0: none).
        self.ack_seq = 0
        # The pool write the reply should wait for (0: none); set by put() and delete().
        self.pool_ack = 0
        # Every pool write of this run as (key, version, seq; 0: skipped) that no handler acknowledged itself
        # (pool_acks.after_pool_write takes its own): the server acknowledges them all before the reply
        # (pool_acks.after_command_writes). None until the first.
        self.pool_writes: list[tuple[bytes, int, int]] | None = None

    def took(self, key: bytes) -> None:
        """The handler acknowledges its last write, of ``key``, itself."""
        writes = self.pool_writes
        if writes and writes[-1][0] == key:
            writes.pop()


class CommandStateMixin:
    """Store's per-command state (``command``): started by the server for each command."""

    command: CommandState

    def begin_command(self, stream: int) -> CommandState:
        """Start one command from client ``stream``: its fresh state, which the caller reads after it ran."""
        self.command = state = CommandState(stream)
        return state
