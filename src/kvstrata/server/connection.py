"""One client connection: receive, parse, dispatch from the command table, reply; suspend only for I/O.

Commands run synchronously on the event loop against the engine. A command is suspended (and the rest of this
client's pipeline waits behind it, so replies stay in order) only when it needs a lower tier's data loaded off
the loop, must wait for the SSD writer (backpressure, write-through acknowledgement, STRONG reads), or a prior
suspension is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
import traceback
from collections import deque
from time import monotonic, perf_counter_ns
from typing import TYPE_CHECKING, Any

from kvstrata.commands.context import REPLY_OFF, REPLY_SKIP, REPLY_SKIP_NEXT, ClientState, Context
from kvstrata.commands.registry import CommandSpec, subcommand_syntax_error, unknown_subcommand
from kvstrata.commands.transactions import QUEUED, RUN_IN_MULTI, end_transaction, exec_, refused_in_multi
from kvstrata.commands.waits import Suspend
from kvstrata.engine.bufpool import BufferPool, tune_malloc
from kvstrata.errors import CommandError, NoAuthError, OutOfMemoryError, ProtocolError, wrong_arity
from kvstrata.protocol.alloc import untouched
from kvstrata.protocol.encoder import ErrorReply, encode
from kvstrata.protocol.parser import LargeArgv, RequestParser
from kvstrata.server.cmdstats import CommandStats
from kvstrata.server.command_runs import CommandRuns, HeldReply, PoolAckWait
from kvstrata.server.hangup import blocked
from kvstrata.server.monitor import shown

if TYPE_CHECKING:
    from kvstrata.server.app import Server

log = logging.getLogger("kvstrata.conn")

_LOOPBACK = ("127.", "::1", "::ffff:127.")
# First words of an HTTP request that Redis treats as an attack on the RESP port (see _cross_protocol).
_CROSS_PROTOCOL = frozenset({b"post", b"host:"})
# What a RESP2 client may run while subscribed (Redis's rule: its replies would be mistaken for messages).
SUBSCRIBED_MODE = frozenset({"subscribe", "unsubscribe", "psubscribe", "punsubscribe", "ssubscribe", "sunsubscribe",
                             "ping", "quit", "reset"})
_cross_protocol_logged = [-60_000]  # when it was last logged (server ms): at most once a minute, as Redis
_JOIN_LIMIT = 64 * 1024
# What an idle connection costs besides its buffers (the objects of a connection, its parser and transport;
# measured with 2,000 idle clients, see tests/integration/test_memory.py), counted in CLIENT LIST's tot-mem.
CONNECTION_OVERHEAD = 8 * 1024
# A read of this many bytes of commands ends the connection's turn: it reads again on the next loop iteration.
FAIR_SHARE = 64 * 1024
# Bytes handed to the transport per writelines call while streaming a large reply.
_STREAM_BATCH = 16 * 1024 * 1024
# Where the transport pushes back (stops reading the client, checks the output limit) at most: lower when the
# client's output limit is lower.
_HIGH_WATER = 64 * 1024 * 1024


def server_pool(server: Server) -> BufferPool | None:
    """The server's pool of receive buffers, created on first use; None unless DRAM is the only tier.

    With an SSD tier or the cluster pool tier a stored value can be shared with a writer thread (demotion,
    write-through, publishing), which holds no leases, so large values are then received into plain bytearrays.
    """
    pool = getattr(server, "bufpool", None)
    store = server.store
    if pool is None and not getattr(store, "lower", None):
        dram = store.dram
        pool = BufferPool(min(1024**3, max(dram.budget // 4, 0)), room=lambda: dram.budget - dram.used)
        dram.bufpool = pool
        dram.bufpool_min = pool.min_size
        server.bufpool = pool  # type: ignore[attr-defined]
        tune_malloc()
    return pool


def _fmt_addr(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = addr[0]
        return f"[{host}]:{addr[1]}" if ":" in host and not host.startswith("::ffff:") else f"{host}:{addr[1]}"
    return str(addr or "")


def keep_alive(sock: Any, seconds: int) -> None:
    """TCP keepalive as Redis's anetKeepAlive: the first probe after ``seconds`` of silence, then every third of
    that, and the peer is dropped after three unanswered (so a vanished client is found in about twice
    ``seconds``). A socket that refuses is left as it is: keepalive is a hint."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, seconds)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, seconds // 3))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


class Connection(CommandRuns, asyncio.BufferedProtocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.store = server.store
        self.config = server.config
        self.dispatch = server.dispatch
        self.pause = server.pause  # CLIENT PAUSE (server/pause.py): checked per command, hence kept here
        self.counts = server.command_counts
        self.tiered = server.tiered
        # The monitors by client id (never replaced): its truth is all the hot path reads while nobody monitors.
        self._monitoring = server.monitors.conns
        now = server.store.clock.now_ms()
        self.client = ClientState(id=server.next_client_id(), created_ms=now, last_ms=now)
        server.acl.attach(self.client)  # the default user; authenticated when it needs no password
        self.ctx = Context(self.store, self.config, self.client, server)
        self.pool = server_pool(server)
        self.parser = RequestParser(
            max_bulk=lambda: int(self.config.get("proto-max-bulk-len")),
            max_query=lambda: int(self.config.get("client-query-buffer-limit")),
            large_threshold=int(self.config.get("large-value-threshold")),
            authenticated=lambda: self.client.authenticated,
            allocate=self._allocate if self.pool is not None else untouched,
        )
        self.client.memory = self.memory
        self.transport: asyncio.Transport | None = None
        self.out: list[Any] = []
        self._holding = False  # replies held for the pool are being settled: nothing is flushed before them
        # The arguments of the command running (or last run): CLIENT LIST counts them while it runs, as Redis
        self._argv: list[Any] = []
        self.backlog: deque[list[bytes]] = deque()
        self.busy = False
        self.closed = False
        self.paused_writing = False
        self._pending_error: ProtocolError | None = None
        # [prefetch hook, issue 19] Inside _run, a command's predictions are taken after the replies went out
        # (_predict_later), and the taking is owed (_predicted) until then or until the next command starts:
        # nothing runs in between, so they are the predictions of taking them at the command's end.
        self._predict_later = False
        self._predicted = False
        # Pool buffers the parser received values into (one lease each, given back once their command ran),
        # and buffers sent by replies still in the transport (one lease each, given back once it is empty).
        self._recv_leases: list[bytearray] = []
        self._reply_leases: list[bytearray] = []
        # Parts of large replies not yet handed to the transport (streamed as it drains), and their size.
        self._stream: deque[Any] | None = None
        self._stream_bytes = 0
        # This client's memory as maxmemory-clients last counted it (server/client_eviction.py).
        self.mem_counted = 0
        # When the pending replies passed the soft output limit of this client's class (0.0: they are under it).
        self._soft_since = 0.0
        # MONITOR lines and pub/sub messages for this client, written together once the loop's turn ends (one
        # write per client per turn: a pipeline of PUBLISHes to N subscribers costs N writes, not N per message).
        self._pushes: list[bytes] | None = None
        self._pushes_bytes = 0
        # CLIENT TRACKING: invalidations this client's own commands caused, sent after the reply (server/tracking.py)
        self.tracking_pending: list[bytes] | None = None

    # ---- asyncio callbacks ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        if isinstance(peer, tuple):
            self.client.addr = _fmt_addr(peer)
            self.client.laddr = _fmt_addr(transport.get_extra_info("sockname"))
        else:  # the Unix socket: its path as both ends, as Redis shows it
            self.client.unix = True
            self.client.addr = self.client.laddr = f"{transport.get_extra_info('sockname')}:0"
        self.client.fd = sock.fileno() if sock is not None else -1
        srv = self.server
        srv.stats.connections += 1
        if len(srv.clients) >= int(self.config.get("maxclients")):
            srv.stats.rejected += 1
            transport.write(b"-ERR max number of clients reached\r\n")
            self._close()
            return
        host = peer[0] if isinstance(peer, tuple) else ""
        if (self.config.get("protected-mode") and srv.acl.open_default()
                and host and not host.startswith(_LOOPBACK)):
            srv.stats.rejected += 1
            transport.write(
                b"-DENIED kvstrata is running in protected mode because no password is set. In this mode "
                b"connections are only accepted from the loopback interface. Set a password with "
                b"--requirepass, or disable protected mode with --protected-mode no.\r\n")
            self._close()
            return
        keepalive = int(self.config.get("tcp-keepalive"))
        if keepalive and isinstance(peer, tuple) and sock is not None:  # TCP, not the Unix socket
            keep_alive(sock, keepalive)
        high = self.config.get("client-output-buffer-limit").lowest("normal")
        transport.set_write_buffer_limits(high=min(high or _HIGH_WATER, _HIGH_WATER))
        srv.clients[self.client.id] = self

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.clients.pop(self.client.id, None)
        self.server.client_eviction.forget(self)
        if self.client.monitor:
            self.server.monitors.discard(self.client.id)
        if self.client.subscribed:
            self.server.pubsub.forget(self)
        if self.client.tracking:
            self.server.tracking.disable(self)
        peer, self.client.pull_peer = self.client.pull_peer, None
        if peer is not None:
            peer.close()  # the connection's reference; a pull still copying holds its own
        if self.store.predictor is not None:
            self.store.predictor.forget_stream(self.client.id)
        end_transaction(self.ctx)  # its watched keys are no longer watched by it
        self._stream = None
        self._stream_bytes = 0
        self.out = []
        self.backlog.clear()
        partial = self.parser.partial_value()
        self.parser.release()  # a half-received value goes now, not when the garbage collector finds a cycle
        pool = self.pool
        if pool is not None:
            if partial is not None and any(b is partial for b in self._recv_leases):
                # A value the client never finished does not join the free list: a client that declares large
                # values and leaves must not fill the pool with sizes nobody stored.
                pool.forfeit(partial)
                self._recv_leases = [b for b in self._recv_leases if b is not partial]
            # Anything uvloop still exports is caught by the pool's resize probe (quarantine), never reused.
            pool.holders.discard(self)
            for buf in self._reply_leases:
                pool.release(buf)
            for buf in self._recv_leases:
                pool.release(buf)
            self._reply_leases = []
            self._recv_leases = []

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.parser.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        srv = self.server
        srv.stats.net_in += nbytes
        self.client.last_ms = srv.now_ms
        parser = self.parser
        # Bytes read into a large value's own buffer are not commands: no reason to yield the loop for them (that
        # cost every large SET a pause, an extra loop turn and a resume, two epoll changes).
        commands_read = parser._target is None
        try:
            parser.buffer_updated(nbytes)
        except ProtocolError as exc:
            self._pending_error = exc
        if not parser._fast and parser.query_bytes > self.query_limit():
            self._query_limit_reached()
            return
        if self._count_memory():
            return
        # Nothing to run while a large value is still arriving, or has arrived without the CRLF that ends its
        # command (the next read brings it): skip the batch work.
        if not self.busy and (parser._ready or self._pending_error is not None
                              or (parser._target is None and not parser._need_crlf)):
            self._run()
        if (nbytes >= FAIR_SHARE and commands_read and parser._target is None and not self.closed
                and self.transport is not None):
            # A full receive buffer of commands: more are probably waiting, and the event loop would read them
            # at once (libuv reads a socket up to 32 times per wake-up), starving every other client behind a
            # pipeline of millions. Read again on the next turn of the loop instead.
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # fed directly (unit tests): there is no loop to take turns on
                return
            self.transport.pause_reading()
            loop.call_soon(self._fair_resume)

    def _fair_resume(self) -> None:
        if (not self.closed and not self.busy and not self.paused_writing and self._stream is None
                and self.transport is not None):
            self.transport.resume_reading()

    def query_limit(self) -> int:
        return int(self.config.get("client-query-buffer-limit"))

    def _query_limit_reached(self) -> None:
        """Like Redis: a client whose pending request outgrows client-query-buffer-limit is closed, no reply."""
        log.warning("closing client %s that reached the max query buffer length (%d bytes, limit %d)",
                    self.client.addr, self.parser.query_bytes, self.query_limit())
        self.server.stats.query_limit_closed += 1
        self.parser.release()
        self._close(abort=True)

    def memory(self, running: bool = False) -> tuple[int, int, int, int, int, int]:
        """(qbuf, qbuf-free, argv-mem, oll, omem, tot-mem) for CLIENT LIST and INFO: what this client holds
        (tot-mem also counts MULTI's queued commands, CLIENT LIST's multi-mem, and what its watched keys,
        subscriptions and BCAST prefixes hold, as Redis's).

        ``running``: the caller is this client's own command (CLIENT LIST, CLIENT INFO); a command in progress
        counts in qbuf (as the request bytes Redis still holds) and argv-mem, as in Redis."""
        qbuf, free, argv = self.parser.memory()
        if running or self.busy:
            args = self._argv
            argv += sum(map(len, args))
            qbuf += wire_size(args)
        t = self.transport
        omem = self._stream_bytes + sum(map(len, self.out))
        if t is not None and not self.closed:
            omem += t.get_write_buffer_size()
        oll = len(self._stream) if self._stream else 0
        client = self.client
        total = CONNECTION_OVERHEAD + qbuf + argv + omem + client.multi_bytes + client.held_bytes
        return qbuf, free, argv, oll, omem, total

    def eof_received(self) -> bool | None:
        return None

    def pause_writing(self) -> None:
        self.paused_writing = True
        if self.transport is not None:
            self.transport.pause_reading()
            self._check_output_limit()

    def push_write(self, data: bytes) -> None:
        """A MONITOR line (server/monitor.py) or a pub/sub message (server/pubsub.py): queued, and written with the
        others of this loop turn (before this client's own next replies, so the order is the one they were made
        in), behind any reply still streaming, bounded as replies are."""
        if self.closed or self.transport is None:
            return
        pending = self._pushes
        if pending is None:
            self._pushes = pending = []
            self._pushes_bytes = 0
            asyncio.get_running_loop().call_soon(self._flush_pushes)
        pending.append(data)
        self._pushes_bytes += len(data)
        if self._pushes_bytes >= _JOIN_LIMIT:  # bounded here too: the output limit is checked as it is written
            self._flush_pushes()

    def deliver(self, data: bytes, running: Any) -> None:
        """A message for this client (a MONITOR line, a pub/sub message, an invalidation): into the replies of the
        command running now when ``running`` is this connection (so after those it has pending), else queued
        (``push_write``)."""
        if self is running:
            self.out.append(data)
        else:
            self.push_write(data)

    def _flush_pushes(self) -> None:
        pending = self._pushes
        self._pushes = None
        if not pending or self.closed or self.transport is None:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        if self._check_output_limit(len(data)):
            return
        if self._stream is not None:
            self._stream.append(data)
            self._stream_bytes += len(data)
        else:
            self.transport.write(data)
        self._count_memory()

    def _check_output_limit(self, adding: int = 0) -> bool:
        """Close a client whose unsent replies pass its class's client-output-buffer-limit (kvstrata.output_limits);
        True when it was closed."""
        assert self.transport is not None
        limits = self.config.get("client-output-buffer-limit")
        limit = limits.pubsub if self.client.subscribed else limits.normal
        used = self.transport.get_write_buffer_size() + self._stream_bytes + adding
        close, self._soft_since = limit.passed(used, self._soft_since, monotonic())
        if close:
            log.warning("client %s passed the output buffer limit; closing", self.client.addr)
            self.server.stats.output_limit_closed += 1
            self._close(abort=True)
            return True
        return False

    def resume_writing(self) -> None:
        self.paused_writing = False
        if self.closed or self.transport is None:
            return
        self._count_memory()  # what was sent leaves the total
        if self._stream:
            self._pump()
            if self._stream or self.closed:
                return
        if self._reply_leases:
            self.settle()
        if not self.busy:
            self.transport.resume_reading()

    # ---- buffer leases ----
    def _allocate(self, n: int) -> bytearray:
        assert self.pool is not None
        buf = self.pool.acquire(n)
        if self.pool.tracked(buf):
            self._recv_leases.append(buf)
        return buf

    def _release_recv(self) -> None:
        """Give back the parser's leases on values whose commands have run (the store took its own)."""
        parser = self.parser
        if self.busy or self.backlog:
            return
        pool = self.pool
        assert pool is not None
        keep = [b for b in self._recv_leases if parser.holds(b)]
        for buf in self._recv_leases:
            if not any(buf is k for k in keep):
                pool.release(buf)
        self._recv_leases = keep

    def settle(self) -> None:
        """Give back reply leases once the transport holds nothing more to write."""
        t = self.transport
        if self._stream or (t is not None and not self.closed and t.get_write_buffer_size()):
            return
        pool = self.pool
        if pool is not None:
            for buf in self._reply_leases:
                pool.release(buf)
            pool.holders.discard(self)
        self._reply_leases = []

    # ---- processing ----
    def _run(self) -> None:
        parser = self.parser
        while True:
            self._run_batch()
            # A pipelined AUTH or HELLO ran: the bytes after it are parsed now, under the limits it decided.
            if not parser.held or self.busy or self.closed or self.client.closing:
                return
            try:
                parser.resume()
            except ProtocolError as exc:
                self._pending_error = exc
            if not parser._ready and self._pending_error is None:
                return

    def _run_batch(self) -> None:
        cmds = self.parser.commands()
        backlog = self.backlog
        execute = self.execute
        client = self.client
        self._predict_later = True  # [prefetch hook, issue 19]
        # Replies held for the pool (PoolAckWait): the commands after them run meanwhile, and one wait settles all.
        # None until the first (most batches hold none: no list on the small-request path).
        held: list[tuple[HeldReply, PoolAckWait]] | None = None
        if backlog:
            backlog.extend(cmds)
            while backlog:
                mark = len(self.out)
                waiter = execute(backlog.popleft())
                if waiter is not None:
                    if waiter.__class__ is PoolAckWait and not (client.reply or client.closing):
                        held = self._hold(waiter, held)
                        continue
                    self._suspend(self._after_held(held, waiter) if held else waiter)
                    held = None
                    break
                if client.reply:
                    self._reply_done(mark)
                if client.tracking:
                    self.server.tracking.after_command(self)
                if client.closing:
                    backlog.clear()
                    break
        else:
            for i, args in enumerate(cmds):
                mark = len(self.out)
                waiter = execute(args)
                if waiter is not None:
                    if waiter.__class__ is PoolAckWait and not (client.reply or client.closing):
                        held = self._hold(waiter, held)
                        continue
                    backlog.extend(cmds[i + 1 :])
                    self._suspend(self._after_held(held, waiter) if held else waiter)
                    held = None
                    break
                if client.reply:
                    self._reply_done(mark)
                if client.tracking:
                    self.server.tracking.after_command(self)
                if client.closing:
                    break
        self._predict_later = False
        if held:
            self._suspend(self._after_held(held, None))
        if not self._holding:  # held replies: settle_pool_acks flushes once their places are filled
            self._flush()
        if self._predicted:  # [prefetch hook, issue 19] off the reply's path
            self._predicted = False
            self.server.prefetcher.submit_predicted()
        if self._recv_leases:
            self._release_recv()
        if self._pending_error is not None and not self.busy:
            self._protocol_error(self._pending_error)

    def _hold(self, waiter: PoolAckWait, held: list[tuple[HeldReply, PoolAckWait]] | None
              ) -> list[tuple[HeldReply, PoolAckWait]]:
        """Keep the place of ``waiter``'s reply (it waits only for the pool) and let the batch go on with the next
        command; only while the client takes every reply and is not closing (CLIENT REPLY and QUIT need the replies
        in their order now: the caller checks)."""
        slot = HeldReply()
        self.out.append(slot)
        if held is None:
            held = []
        held.append((slot, waiter))
        return held

    def _after_held(self, held: list[tuple[HeldReply, PoolAckWait]], waiter: Any) -> Any:
        """The held replies settled (flushed in order), then ``waiter``, the command that stopped the batch. Nothing
        is flushed from now until they are (``_holding``)."""
        self._holding = True

        async def run() -> None:
            try:
                await self.settle_pool_acks(held)
            finally:
                self._holding = False
            if waiter is not None:
                await waiter

        return run()

    def _reply_done(self, mark: int) -> None:
        """CLIENT REPLY, as Redis's resetClient: the command that just ended keeps no reply while replies are
        off or skipped (``out[mark:]`` is its reply); a SKIP applies to the one command after CLIENT REPLY SKIP."""
        client = self.client
        if client.reply & (REPLY_OFF | REPLY_SKIP):
            del self.out[mark:]
        client.reply &= ~REPLY_SKIP
        if client.reply & REPLY_SKIP_NEXT:
            client.reply = (client.reply | REPLY_SKIP) & ~REPLY_SKIP_NEXT

    def _flush(self) -> None:
        if self._pushes:  # messages queued for this client before these replies go first
            self._flush_pushes()
        out = self.out
        if not out or self.transport is None or self.closed:
            out.clear()
            if self.client.closing and not self.closed:  # QUIT or a self-kill whose reply CLIENT REPLY dropped
                self._close()
            return
        if len(out) == 1 and self._stream is None:
            data = out[0]
            n = len(data)
            self.server.stats.net_out += n
            if n < _JOIN_LIMIT:
                self.transport.write(data)
            else:
                self._send_large(out, n)
        else:
            n = sum(map(len, out))
            self.server.stats.net_out += n
            # Joining small replies costs less than handing the transport many buffers; large values are
            # never copied (they go out as they are, streamed as the transport drains).
            if n < _JOIN_LIMIT and self._stream is None:
                self.transport.write(b"".join(out))
            else:
                self._send_large(out, n)
        self.out = []
        if self.client.closing:
            self._close()
        self._count_memory()

    def _send_large(self, out: list[Any], n: int) -> None:
        """Queue reply parts behind any stream in progress and hand the transport what it can take now.

        Each pool buffer among the parts gets a reply lease, given back once the transport is empty.
        """
        if self._check_output_limit(n):
            return
        pool = self.pool
        if pool is not None:
            if self._reply_leases:
                self.settle()
            leases = self._reply_leases
            for part in out:
                if len(part) >= _JOIN_LIMIT and pool.retain(part):
                    leases.append(part)
            if leases:
                pool.holders.add(self)
        if self._stream is None:
            self._stream = deque(out)
        else:
            self._stream.extend(out)
        self._stream_bytes += n
        self._pump()

    def _pump(self) -> None:
        """Write queued reply parts in batches until the transport asks to pause (resume_writing resumes)."""
        stream = self._stream
        t = self.transport
        assert stream is not None and t is not None
        while stream and not self.paused_writing and not self.closed:
            batch = []
            size = 0
            while stream and size < _STREAM_BATCH:
                part = stream.popleft()
                batch.append(part)
                size += len(part)
            self._stream_bytes -= size
            if len(batch) == 1:
                t.write(batch[0])
            else:
                t.writelines(batch)
        if not stream:
            self._stream = None
            self._stream_bytes = 0
            if self._reply_leases and not self.closed and not t.get_write_buffer_size():
                self.settle()
        elif not self.closed:
            # Replies are waiting: read no more requests from this client until they are out.
            t.pause_reading()

    def _protocol_error(self, exc: ProtocolError) -> None:
        self._pending_error = None
        self.server.stats.protocol_errors += 1
        log.info("protocol error from %s: %s", self.client.addr, exc.message)
        if self.transport is not None and not self.closed:
            out: list[Any] = []
            encode(ErrorReply(exc.message), self.client.proto, out)
            self.transport.write(b"".join(out))
        self._close()

    def _count_memory(self) -> bool:
        """maxmemory-clients (server/client_eviction.py): this client's memory changed; True when counting it
        closed the client. Nothing while the limit is off."""
        eviction = self.server.client_eviction
        return bool(eviction.limit) and not self.closed and eviction.account(self)

    def evict(self) -> None:
        """maxmemory-clients closes this client (server/client_eviction.py): at once, nothing more is sent."""
        self._close(abort=True)

    def _close(self, abort: bool = False) -> None:
        self.closed = True
        self.server.clients.pop(self.client.id, None)
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()

    def _cross_protocol(self) -> None:
        """'POST' or 'Host:' as a command: an HTTP request (a browser tricked into cross-protocol scripting) is
        talking to this port. Like Redis: close at once, without the replies of this batch and without running
        anything after it (the request body may hold commands); logged at most once a minute."""
        srv = self.server
        srv.stats.cross_protocol_closed += 1
        now = srv.now_ms
        if now - _cross_protocol_logged[0] >= 60_000:
            _cross_protocol_logged[0] = now
            log.warning("Possible SECURITY ATTACK detected. It looks like somebody is sending POST or Host: "
                        "commands to kvstrata (from %s). This is likely due to an attacker attempting to use "
                        "Cross Protocol Scripting to compromise your kvstrata instance. Connection aborted.",
                        self.client.addr)
        self.out.clear()
        self.backlog.clear()
        self.client.closing = True
        self._close()

    def hung_up(self) -> bool:
        """Whether the client closed its end (or the connection broke) while its reading is paused: a suspended
        connection reads nothing, so asyncio would learn of it only once the suspension ends."""
        if self.closed:
            return True
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None:
            return False
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLRDHUP)
        return bool(poller.poll(0))

    def kill(self) -> None:
        """CLIENT KILL: close after what is already written."""
        self._close()

    def execute(self, args: list[Any]) -> Any:
        """Run one command; returns None when its reply is in ``out``, or a coroutine to await first."""
        if self._predicted:  # [prefetch hook, issue 19] the previous command's, before this one runs
            self._predicted = False
            self.server.prefetcher.submit_predicted()
        self._argv = args
        large = args.__class__ is LargeArgv
        if large:
            args[0] = bytes(args[0])
        spec = self.dispatch.get(args[0])
        if spec is None:
            spec = self.dispatch.get(args[0].lower()) if args[0].__class__ is bytes else None
            if spec is None:
                if args[0].lower() in _CROSS_PROTOCOL:
                    self._cross_protocol()
                    return None
                self.server.stats.unknown += 1
                self._refuse(_unknown(args))
                return None
        n = len(args)
        arity = spec.arity
        if arity != n and (arity >= 0 or n < -arity):
            self._reject(spec, wrong_arity(spec.name).message)
            return None
        if spec.subcommands and n > 1:
            # A container: from here on the subcommand is the command (arity, ACL, stats, CLIENT LIST's cmd=).
            name = args[1] if args[1].__class__ is bytes else bytes(args[1])
            sub = spec.subcommands.get(name) or spec.subcommands.get(name.lower())
            if sub is None:  # as Redis: an error, but no command ran (no stats row)
                self._refuse(unknown_subcommand(args[0], name).message)
                return None
            if not sub.arity_ok(n):
                self._reject(sub, wrong_arity(sub.full_name).message)
                return None
            spec = sub
        if large:
            spec.own_arguments(args)
        client = self.client
        if not client.authenticated and not spec.noauth:
            self._reject(spec, NoAuthError().message)
            return None
        if client.user is not None and not client.user.unrestricted:  # ACL: commands and key patterns
            denied = self.server.acl.deny(client, spec, args)
            if denied is not None:
                self._reject(spec, denied)
                return None
        counts = self.counts[spec]
        client.last_cmd = spec
        if spec.most and n > spec.most:  # more arguments than the subcommand's handler takes: it fails
            counts.calls += 1
            counts.failed += 1
            self._refuse(subcommand_syntax_error(args).message)
            return None
        if spec.denyoom and self.store.dram.used > self.store.dram.budget:
            refused = self.store.refuse_denyoom()
            if refused is not None:  # as Redis: refused before it runs, a rejected call
                self._reject(spec, refused)
                return None
        watching = self._monitoring
        if watching and client.monitor and (spec.write or "readonly" in spec.flags or spec.key_specs
                                            or (spec.parent or spec).group == "tairkv"):
            self._reject(spec, "ERR Replica can't interact with the keyspace")  # Redis's text for monitors
            return None
        if client.proto == 2 and client.subscribed and spec.full_name not in SUBSCRIBED_MODE:
            self._reject(spec, f"ERR Can't execute '{spec.full_name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / "
                               "PING / QUIT / RESET are allowed in this context")
            return None
        if self.pause.kind and self.pause.holds(spec, client.multi, spec.handler is exec_):
            return self._after_pause(args)  # as Redis: before MULTI queues it, after every refusal
        if client.multi is not None:
            if spec.name not in RUN_IN_MULTI:
                self._queue(spec, args)
                return None
            if spec.handler is exec_ and any(q.denyoom for q, _ in client.multi) \
                    and self.store.dram.used > self.store.dram.budget:
                refused = self.store.refuse_denyoom()
                if refused is not None:
                    self._reject(spec, refused)
                    return None
        if watching and shown(spec) and spec.handler is not exec_:  # EXEC feeds its own lines
            if client.monitor:
                return self._monitor_own(spec, args, counts)
            self.server.monitors.feed(client, args)
        if self.tiered:
            return self._tiered(spec, args, counts)
        tracking = client.tracking
        if tracking:
            self.server.tracking.current = self
        t0 = perf_counter_ns()
        try:
            reply = spec.handler(self.ctx, args)
        except Exception as exc:  # a bug in one handler must not take the connection down
            self._fail(spec, counts, exc)
            return None
        finally:
            if tracking:
                self._tracked(spec, args)
            # Counted after it ran, as Redis: INFO does not count itself, CONFIG RESETSTAT counts itself.
            counts.calls += 1
            usec = (perf_counter_ns() - t0) // 1000
            counts.usec += usec
            if self.server.latency_tracking:
                counts.hist[usec.bit_length()] += 1
            if usec >= self.server.slow_usec >= 0:
                self.server.slowlog.add(usec, args, client.addr, client.name)
            if spec.noauth:  # AUTH, HELLO, RESET may change what the parser must check
                self.parser.refresh()
        if reply.__class__ is Suspend:  # a typed wait (a large two-phase commit's copy, off the loop)
            return self._continue(spec, args, counts, reply)
        encode(reply, client.proto, self.out)
        return None

    async def _after_pause(self, args: list[Any]) -> None:
        """CLIENT PAUSE: the command runs (every check made again) once the pause ends, unless the client left."""
        with blocked(self.server, self.client):  # as Redis counts a postponed client
            await self.pause.wait(self.hung_up)
        if self.closed or self.hung_up():  # as Redis frees a client that left: its command never runs
            self._close(abort=True)
            return
        waiter = self.execute(args)
        if waiter is not None:
            await waiter

    def _monitor_own(self, spec: CommandSpec, args: list[Any], counts: CommandStats) -> Any:
        """A monitor's own command (none touches keys): the other monitors see it now, this one after its reply, as
        Redis feeds a command once it ran (so not its RESET, which ends monitor mode)."""
        monitors = self.server.monitors
        monitors.feed(self.client, args, skip=self)
        waiter = self._tiered(spec, args, counts) if self.tiered else self._invoke_sync(spec, args, counts)
        if waiter is None and self.client.monitor:
            self.out.append(monitors.line_for(self.client, args))
        return waiter

    def _error(self, message: str) -> None:
        self.server.error_replied(message)
        encode(ErrorReply(message), self.client.proto, self.out)

    def _reject(self, spec: CommandSpec, message: str) -> None:
        """Refused before it ran (arity, NOAUTH, ACL): Redis's ``rejected_calls`` of that (sub)command."""
        self.counts[spec].rejected += 1
        if spec.handler is exec_:  # as Redis, in MULTI or not: the transaction goes with it
            end_transaction(self.ctx)
            reason = message[4:] if message.startswith("ERR ") else message
            message = f"EXECABORT Transaction discarded because of: {reason}"
        self._refuse(message)

    def _refuse(self, message: str) -> None:
        """A command refused before it ran; inside MULTI that also dooms the transaction (EXEC answers
        -EXECABORT), as Redis's flagTransaction."""
        if self.client.multi is not None:
            self.client.multi_dirty = True
        self._error(message)

    def _queue(self, spec: CommandSpec, args: list[Any]) -> None:
        """MULTI: keep the command for EXEC (its arguments as bytes of their own: a value received into a pooled
        buffer would be reused once this batch has run) and answer +QUEUED."""
        refused = refused_in_multi(spec)
        if refused is not None:
            self._refuse(refused)
            return
        client = self.client
        assert client.multi is not None
        # Python's objects counted too (a bytes object per argument, a list and a tuple per command): a million
        # queued PINGs held 213 MB of RSS, not 4 MB.
        client.multi_bytes += sum(len(a) for a in args) + 56 * len(args) + 160
        if client.multi_bytes > self.query_limit():
            # The queue is client memory no budget covers: bounded as a pending request is.
            client.multi.clear()
            client.multi_bytes = 0
            self._refuse("ERR the transaction's queued commands exceed client-query-buffer-limit; it is discarded")
            return
        client.multi.append((spec, [a if a.__class__ is bytes else bytes(a) for a in args]))
        encode(QUEUED, client.proto, self.out)

    def _fail(self, spec: CommandSpec, counts: CommandStats, exc: Exception, first: bool = True) -> None:
        """A handler raised: its error reply (a CommandError's text, or an internal error, logged).

        An OOM refusal of a write is a rejected call, as Redis counts it (it refuses before running the command);
        the call the caller counts after this (``first``: not a continuation) is taken back here.
        """
        if first and exc.__class__ is OutOfMemoryError:
            counts.rejected += 1
            counts.calls -= 1
            self._error(exc.message)
            return
        counts.failed += 1
        if isinstance(exc, CommandError):
            self._error(exc.message)
            return
        log.error("command %s failed: %s", spec.name, traceback.format_exc())
        self._error(f"ERR internal error: {type(exc).__name__}")

    def _suspend(self, waiter: Any) -> None:
        self.busy = True
        if self.transport is not None:
            self.transport.pause_reading()
        task = asyncio.ensure_future(self._resume(waiter))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def _resume(self, waiter: Any) -> None:
        try:
            await waiter
        except CommandError as exc:
            # A refusal decided while suspended (the pool could not be asked: -TRYAGAIN), not a server fault.
            self._error(exc.message)
        except Exception as exc:
            log.error("suspended command failed: %s", traceback.format_exc())
            self._error(f"ERR internal error: {type(exc).__name__}")
        self.busy = False
        if self.client.reply:
            self._reply_done(0)  # _run flushed everything before the suspended command
        if self.client.tracking:
            self.server.tracking.after_command(self)
        if self.closed:
            return
        self._run()
        if (not self.busy and not self.closed and self.transport is not None and not self.paused_writing
                and self._stream is None):
            self.transport.resume_reading()


def wire_size(args: list[Any]) -> int:
    """Bytes of ``args`` sent as a RESP multibulk request (``*2\r\n$6\r\nclient\r\n$4\r\nlist\r\n``: 26)."""
    size = len(b"*%d\r\n" % len(args))
    for a in args:
        n = len(a)
        size += len(b"$%d\r\n" % n) + n + 2
    return size


def _unknown(args: list[Any]) -> str:
    """Redis's text: the arguments are quoted one by one until 128 characters are shown (each as a C string:
    it ends at a NUL byte)."""
    name = bytes(args[0]).split(b"\0", 1)[0][:128].decode("latin-1")
    shown = ""
    for a in args[1:]:
        if len(shown) >= 128:
            break
        shown += "'" + bytes(a).split(b"\0", 1)[0][: 128 - len(shown)].decode("latin-1") + "' "
    return f"ERR unknown command '{name}', with args beginning with: {shown}"
