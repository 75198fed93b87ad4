"""How a connection runs a command that may need I/O: declared waits first, then the handler, then its acks.

``CommandRuns`` is the half of ``Connection`` that runs commands on a tiered server (and any command whose handler
returns a typed wait): ``_tiered`` decides whether the command can run now (its keys in DRAM, the SSD writer not
behind); ``_slow`` performs the waits the command declares (writer backpressure, a settled SSD, its keys loaded,
with the prefetcher told what the read will want next); ``_invoke_sync`` runs the handler or a continuation with
the command's state, stats and slowlog; ``_continue`` performs a handler's typed wait (``Suspend``) off the loop;
``_ack_after`` holds a reply until the SSD writer acknowledged the write; ``settle_pool_acks`` the replies of a
pipeline's writes until the pool holds them. The I/O half (buffers, replies, flow control) is
``kvstrata.server.connection``.
"""

from __future__ import annotations

import logging
import traceback
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from kvstrata.commands.pool_acks import abandon_writes, after_command_writes
from kvstrata.commands.registry import CommandSpec
from kvstrata.commands.transactions import exec_, exec_waits
from kvstrata.commands.waits import PoolAck, Suspend
from kvstrata.errors import CommandError
from kvstrata.protocol.encoder import ErrorReply, encode
from kvstrata.server.cmdstats import CommandStats

if TYPE_CHECKING:
    from kvstrata.commands.context import ClientState, Context
    from kvstrata.engine.store import Store
    from kvstrata.protocol.parser import RequestParser
    from kvstrata.server.app import Server


log = logging.getLogger("kvstrata.conn")  # as Connection's: a command that failed on a connection


class PoolAckWait:
    """What a command whose reply waits only for the pool (``pool-ack``: a ``Suspend`` on ``PoolAck``) returns to
    the connection. Awaiting it performs the wait and runs the continuation, as any other wait; a connection
    running a pipeline instead keeps the reply's place and runs the next commands, then waits once for all the
    pool writes of the batch (``Connection._run``, ``settle_pool_acks``): a pipeline of writes costs one pool
    round trip, not one per command."""

    __slots__ = ("args", "counts", "runs", "spec", "sus")

    def __init__(self, runs: CommandRuns, spec: CommandSpec, args: list[Any], counts: CommandStats,
                 sus: Suspend) -> None:
        self.runs = runs
        self.spec = spec
        self.args = args
        self.counts = counts
        self.sus = sus

    def __await__(self) -> Any:
        return self.runs._continue(self.spec, self.args, self.counts, self.sus).__await__()


class HeldReply:
    """The place of a reply in a connection's output while its command waits for the pool (see PoolAckWait)."""

    __slots__ = ()

    def __len__(self) -> int:
        return 0


class CommandRuns:
    """The command-running half of ``Connection`` (a mixin: the attributes below are the connection's)."""

    server: Server
    store: Store
    ctx: Context
    client: ClientState
    out: Any
    parser: RequestParser
    _predict_later: bool
    _predicted: bool

    def _fail(self, spec: CommandSpec, counts: CommandStats, exc: Exception, first: bool = True) -> None:
        raise NotImplementedError  # Connection's

    def _error(self, message: str) -> None:
        raise NotImplementedError  # Connection's

    def _tracked(self, spec: CommandSpec, args: list[Any]) -> None:
        """After a tracking client's handler ran: it no longer runs (its own invalidations go out at once again),
        and the keys a read-only command read may now be cached there (Redis remembers them whatever the reply)."""
        tracking = self.server.tracking
        tracking.current = None
        if "readonly" in spec.flags and self.client.tracking:
            tracking.remember(self.client, spec, args)

    def _tiered(self, spec: CommandSpec, args: list[Any], counts: CommandStats) -> Any:
        store = self.store
        ssd = store.ssd
        if spec.handler is exec_:  # the queued commands' keys and waits, and the watched keys
            keys, settle, write = exec_waits(self.client)
        else:
            keys, settle, write = spec.load_keys(args), spec.settle, spec.write
        needs_io = bool(keys and store.missing(keys))
        if ssd is not None:
            if write and ssd.queued_bytes > self.server.ssd_write_queue:
                needs_io = True
            if settle and not ssd.settled:
                needs_io = True
        if needs_io:
            return self._slow(spec, args, keys, counts, settle, write)
        return self._invoke_sync(spec, args, counts)

    def _invoke_sync(self, spec: CommandSpec, args: list[Any], counts: CommandStats,
                     step: Any = None, result: Any = None) -> Any:
        """Run the handler (or, with ``step``, a suspended command's continuation) now, on the loop.

        Returns None when the reply is in ``out``, or a coroutine to await first: the handler returned a typed
        wait (``Suspend``), or its write must be acknowledged by the SSD writer before the reply goes out.
        """
        store = self.store
        ssd = store.ssd
        # A fresh state per run (also a command resumed after a load must not run as the stream of whichever
        # connection ran last meanwhile: the predictor follows each connection's reads).
        self.ctx.command = state = store.begin_command(self.client.id)
        tracking = self.client.tracking
        if tracking:
            self.server.tracking.current = self
        t0 = perf_counter_ns()
        try:
            reply = spec.handler(self.ctx, args) if step is None else step(result)
            if state.pool_writes:
                if reply.__class__ is Suspend:  # a handler that waits acknowledges its writes itself
                    abandon_writes(store, state.pool_writes)
                else:
                    reply = after_command_writes(self.ctx, reply, state.pool_writes, state.ack_seq)
        except Exception as exc:
            if state.pool_writes:
                abandon_writes(store, state.pool_writes)
            self._fail(spec, counts, exc, step is None)
            return None
        finally:
            if tracking:
                self._tracked(spec, args)
            if store.predictor is not None and store.predictor.pending:
                if self._predict_later and step is None:
                    # [prefetch hook, issue 19] A command run without a load (nothing in the overlay): after
                    # the replies (_run), so the client does not wait for the predictor.
                    self._predicted = True
                else:
                    # Before the overlay goes: predicted keys this command loaded come up from what it read.
                    self.server.prefetcher.submit_predicted()
            store.end_command()
            if step is None:  # a continuation is the same call
                counts.calls += 1
            usec = (perf_counter_ns() - t0) // 1000
            counts.usec += usec
            if self.server.latency_tracking:
                counts.hist[usec.bit_length()] += 1
            if usec >= self.server.slow_usec >= 0:
                self.server.slowlog.add(usec, args, self.client.addr, self.client.name)
            if spec.noauth:
                self.parser.refresh()
        if reply.__class__ is Suspend:
            if reply.wait.__class__ is PoolAck and not reply.reload:
                return PoolAckWait(self, spec, args, counts, reply)
            return self._continue(spec, args, counts, reply)
        seq = state.ack_seq
        if seq and ssd is not None and seq > ssd.committed_seq:
            return self._ack_after(seq, reply)
        encode(reply, self.client.proto, self.out)
        return None

    async def _continue(self, spec: CommandSpec, args: list[Any], counts: CommandStats, sus: Suspend) -> None:
        """Perform a handler's wait off the loop, then run its continuation (which may wait again)."""
        srv = self.server
        try:
            result = await srv.wait(sus.wait)
            if sus.reload:
                await self._load(spec.load_keys(args), spec.probes(args))
        except BaseException:
            sus.release()
            raise
        waiter = self._invoke_sync(spec, args, counts, sus.then, result)
        if waiter is not None:
            await waiter

    async def settle_pool_acks(self, held: list[tuple[HeldReply, PoolAckWait]]) -> None:
        """The replies a pipeline's commands held for the pool (``Connection._run``): one wait for the highest pool
        write among them (the writer commits in order), then each continuation in order, its reply written in its
        place; the output is flushed once every place is filled."""
        seq = max(w.sus.wait.seq for _, w in held)
        ssd_seq = max(w.sus.wait.ssd_seq for _, w in held)
        try:
            await self.server.wait(PoolAck(seq, ssd_seq))
        except Exception as exc:  # each held command answers this error (one reply each, in its place)
            for slot, w in held:
                w.sus.release()
                self._fill(slot, [ErrorReply(exc.message if isinstance(exc, CommandError) else
                                             f"ERR internal error: {type(exc).__name__}")])
            self._flush()
            return
        except BaseException:  # cancelled: the connection or the server is going away
            for _, w in held:
                w.sus.release()
            raise
        for slot, w in held:
            # Encoded into a list of its own, then put in its place: the replies after it are in ``out`` already.
            out, self.out = self.out, []
            try:
                waiter = self._invoke_sync(w.spec, w.args, w.counts, w.sus.then, None)
                if waiter is not None:
                    await waiter  # the continuation waits again (a write sent again above the pool's version)
            except CommandError as exc:  # decided while waiting again (as Connection._resume)
                self._error(exc.message)
            except Exception as exc:  # a fault: this command's reply says so, the others still go out
                log.error("held command failed: %s", traceback.format_exc())
                self._error(f"ERR internal error: {type(exc).__name__}")
            finally:
                mine, self.out = self.out, out
            self._fill(slot, mine, encoded=True)
        self._flush()

    def _fill(self, slot: HeldReply, parts: list[Any], encoded: bool = False) -> None:
        """Put a held reply in its place in ``out`` (``parts``: encoded chunks, or replies to encode)."""
        if not encoded:
            chunks: list[Any] = []
            for reply in parts:
                encode(reply, self.client.proto, chunks)
            parts = chunks
        out = self.out
        for i, part in enumerate(out):
            if part is slot:
                out[i:i + 1] = parts
                return

    def _flush(self) -> None:
        raise NotImplementedError  # Connection's

    async def _load(self, keys: list[bytes], meta: bool = False) -> None:
        """Load ``keys`` from the lower tiers for the command about to run (its reads then stay off the loop); with
        ``meta``, probe their record headers only.

        A load raced by a write is done again, a few times; after that the command runs anyway and reads what is
        still unknown synchronously (correct, only slower). A probe leaves queued prefetches alone: it reads no
        value, so taking a key back from the prefetcher would only lose its prefetch.
        """
        if not keys:
            return
        srv = self.server
        if not meta:
            missing = self.store.missing(keys)
            if missing and srv.prefetcher.in_flight(missing):
                await srv.prefetcher.claim(missing)
        for _ in range(3):
            if await srv.load(keys, meta=meta):
                break

    async def _ack_after(self, seq: int, reply: Any) -> None:
        await self.server.wait_commit(seq)
        failed = self.store.ssd.failed.get(seq) if self.store.ssd is not None else None
        if failed is not None:
            self._error(f"ERR SSD write failed: {failed}")
        else:
            encode(reply, self.client.proto, self.out)

    async def _slow(self, spec: CommandSpec, args: list[Any], keys: list[bytes], counts: CommandStats,
                    settle: bool, write: bool) -> None:
        """The waits a command declares, before it runs: writer backpressure, a settled SSD, its keys loaded."""
        ssd = self.store.ssd
        srv = self.server
        if ssd is not None:
            if write and ssd.queued_bytes > srv.ssd_write_queue:
                await srv.wait_commit(ssd.enqueued_seq)
            if settle and not ssd.settled:
                await srv.wait_commit(ssd.enqueued_seq)
        # [prefetch hook, issue 19] what follows a chunk read: queued, its first chunks loaded with this one
        along = srv.prefetcher.expect(spec, keys, self.client.id, srv.prefetcher.along)
        await self._load(keys + along if along else keys, spec.probes(args))
        waiter = self._invoke_sync(spec, args, counts)
        if waiter is not None:
            await waiter
