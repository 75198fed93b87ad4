"""One client connection: receive, parse, dispatch from the command table, reply; suspend only for I/O.

Commands run synchronously on the event loop against the engine. A command is suspended (and the rest of this
client's pipeline waits behind it, so replies stay in order) only when it needs a lower tier's data loaded off
the loop, must wait for the SSD writer (backpressure, write-through acknowledgement, STRONG reads), or a prior
suspension is still running.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections import deque
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from kvstrata.commands.context import ClientState, Context
from kvstrata.commands.registry import CommandSpec, resolve
from kvstrata.commands.tairkv import WaitForCommit
from kvstrata.errors import CommandError, NoAuthError, ProtocolError
from kvstrata.protocol.encoder import ErrorReply, encode
from kvstrata.protocol.parser import RequestParser
from kvstrata.server.cmdstats import CommandStats

if TYPE_CHECKING:
    from kvstrata.server.app import Server

log = logging.getLogger("kvstrata.conn")

_LOOPBACK = ("127.", "::1", "::ffff:127.")
_JOIN_LIMIT = 64 * 1024


def _fmt_addr(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = addr[0]
        return f"[{host}]:{addr[1]}" if ":" in host and not host.startswith("::ffff:") else f"{host}:{addr[1]}"
    return str(addr or "")


class Connection(asyncio.BufferedProtocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.store = server.store
        self.config = server.config
        self.dispatch = server.dispatch
        self.counts = server.command_counts
        self.tiered = server.tiered
        now = server.store.clock.now_ms()
        self.client = ClientState(id=server.next_client_id(), created_ms=now, last_ms=now)
        self.client.authenticated = self.config.get("requirepass") is None
        self.ctx = Context(self.store, self.config, self.client, server)
        self.parser = RequestParser(
            max_bulk=lambda: int(self.config.get("proto-max-bulk-len")),
            max_query=lambda: int(self.config.get("client-query-buffer-limit")),
            large_threshold=int(self.config.get("large-value-threshold")),
            authenticated=lambda: self.client.authenticated,
        )
        self.transport: asyncio.Transport | None = None
        self.out: list[Any] = []
        self.backlog: deque[list[bytes]] = deque()
        self.busy = False
        self.closed = False
        self.paused_writing = False
        self._pending_error: ProtocolError | None = None

    # ---- asyncio callbacks ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        self.client.addr = _fmt_addr(peer)
        self.client.laddr = _fmt_addr(transport.get_extra_info("sockname"))
        self.client.fd = sock.fileno() if sock is not None else -1
        srv = self.server
        srv.stats.connections += 1
        if len(srv.clients) >= int(self.config.get("maxclients")):
            srv.stats.rejected += 1
            transport.write(b"-ERR max number of clients reached\r\n")
            self._close()
            return
        host = peer[0] if isinstance(peer, tuple) else ""
        if (self.config.get("protected-mode") and self.config.get("requirepass") is None
                and host and not host.startswith(_LOOPBACK)):
            srv.stats.rejected += 1
            transport.write(
                b"-DENIED kvstrata is running in protected mode because no password is set. In this mode "
                b"connections are only accepted from the loopback interface. Set a password with "
                b"--requirepass, or disable protected mode with --protected-mode no.\r\n")
            self._close()
            return
        high = int(self.config.get("client-output-buffer-limit"))
        transport.set_write_buffer_limits(high=min(high, 64 * 1024 * 1024))
        srv.clients[self.client.id] = self

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.clients.pop(self.client.id, None)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.parser.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        srv = self.server
        srv.stats.net_in += nbytes
        self.client.last_ms = srv.now_ms
        try:
            self.parser.buffer_updated(nbytes)
        except ProtocolError as exc:
            self._pending_error = exc
        if not self.busy:
            self._run()

    def eof_received(self) -> bool | None:
        return None

    def pause_writing(self) -> None:
        self.paused_writing = True
        if self.transport is not None:
            self.transport.pause_reading()
            limit = int(self.config.get("client-output-buffer-limit"))
            if self.transport.get_write_buffer_size() > limit:
                log.warning("client %s exceeded the output buffer limit; closing", self.client.addr)
                self._close(abort=True)

    def resume_writing(self) -> None:
        self.paused_writing = False
        if self.transport is not None and not self.busy and not self.closed:
            self.transport.resume_reading()

    # ---- processing ----
    def _run(self) -> None:
        cmds = self.parser.commands()
        backlog = self.backlog
        execute = self.execute
        if backlog:
            backlog.extend(cmds)
            while backlog:
                waiter = execute(backlog.popleft())
                if waiter is not None:
                    self._suspend(waiter)
                    break
                if self.client.closing:
                    backlog.clear()
                    break
        else:
            for i, args in enumerate(cmds):
                waiter = execute(args)
                if waiter is not None:
                    backlog.extend(cmds[i + 1 :])
                    self._suspend(waiter)
                    break
                if self.client.closing:
                    break
        self._flush()
        if self._pending_error is not None and not self.busy:
            self._protocol_error(self._pending_error)

    def _flush(self) -> None:
        out = self.out
        if not out or self.transport is None or self.closed:
            out.clear()
            return
        if len(out) == 1:
            data = out[0]
            self.server.stats.net_out += len(data)
            self.transport.write(data)
        else:
            n = sum(map(len, out))
            self.server.stats.net_out += n
            # Joining small replies costs less than handing the transport many buffers; large values are
            # never copied (writelines sends them as they are).
            if n < _JOIN_LIMIT:
                self.transport.write(b"".join(out))
            else:
                self.transport.writelines(out)
        self.out = []
        if self.client.closing:
            self._close()

    def _protocol_error(self, exc: ProtocolError) -> None:
        self._pending_error = None
        self.server.stats.protocol_errors += 1
        log.info("protocol error from %s: %s", self.client.addr, exc.message)
        if self.transport is not None and not self.closed:
            self.transport.write(b"-" + exc.message.encode() + b"\r\n")
        self._close()

    def _close(self, abort: bool = False) -> None:
        self.closed = True
        self.server.clients.pop(self.client.id, None)
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()

    def kill(self) -> None:
        """CLIENT KILL: close after what is already written."""
        self._close()

    def execute(self, args: list[Any]) -> Any:
        """Run one command; returns None when its reply is in ``out``, or a coroutine to await first."""
        spec = self.dispatch.get(args[0])
        if spec is None:
            spec = self.dispatch.get(args[0].lower()) if args[0].__class__ is bytes else None
            if spec is None:
                self.server.stats.unknown += 1
                self._error(_unknown(args))
                return None
        n = len(args)
        arity = spec.arity
        if arity != n and (arity >= 0 or n < -arity):
            self._error(f"ERR wrong number of arguments for '{spec.name}' command")
            return None
        client = self.client
        if not client.authenticated and not spec.noauth:
            self._error(NoAuthError().message)
            return None
        counts = self.counts[spec]
        counts.calls += 1
        client.last_cmd = spec
        if self.tiered:
            return self._tiered(spec, args, counts)
        t0 = perf_counter_ns()
        try:
            reply = spec.handler(self.ctx, args)
        except CommandError as exc:
            counts.failed += 1
            self._error(exc.message)
            return None
        except Exception as exc:  # a bug in one handler must not take the connection down
            counts.failed += 1
            log.error("command %s failed: %s", spec.name, traceback.format_exc())
            self._error(f"ERR internal error: {type(exc).__name__}")
            return None
        finally:
            usec = (perf_counter_ns() - t0) // 1000
            counts.usec += usec
            counts.hist[usec.bit_length()] += 1
            if usec >= self.server.slow_usec >= 0:
                self.server.slowlog.add(usec, args, client.addr, client.name)
            if spec.noauth:  # AUTH, HELLO, RESET may change what the parser must check
                self.parser.refresh()
        encode(reply, client.proto, self.out)
        return None

    def _error(self, message: str) -> None:
        self.server.stats.errors += 1
        encode(ErrorReply(message), self.client.proto, self.out)

    # ---- the tiered path: may need I/O before or after the handler ----
    def _tiered(self, spec: CommandSpec, args: list[Any], counts: CommandStats) -> Any:
        store = self.store
        ssd = store.ssd
        assert ssd is not None
        sub = resolve(args) if spec.subcommands else spec
        keys = sub.keys(args) if sub is not None else []
        needs_io = bool(keys and store.missing(keys))
        if spec.write and ssd.queued_bytes > int(self.config.get("ssd-write-queue")):
            needs_io = True
        if spec.name == "dbsize" and not ssd.settled:
            needs_io = True
        if needs_io:
            return self._slow(spec, args, keys, counts)
        return self._invoke_sync(spec, args, counts)

    def _invoke_sync(self, spec: CommandSpec, args: list[Any], counts: CommandStats) -> Any:
        store = self.store
        ssd = store.ssd
        assert ssd is not None
        store.ack_seq = 0
        t0 = perf_counter_ns()
        try:
            reply = spec.handler(self.ctx, args)
        except WaitForCommit as w:
            store.end_command()
            return self._slow(spec, args, [], counts, wait_seq=w.seq)
        except CommandError as exc:
            counts.failed += 1
            self._error(exc.message)
            return None
        except Exception as exc:
            counts.failed += 1
            log.error("command %s failed: %s", spec.name, traceback.format_exc())
            self._error(f"ERR internal error: {type(exc).__name__}")
            return None
        finally:
            store.end_command()
            usec = (perf_counter_ns() - t0) // 1000
            counts.usec += usec
            counts.hist[usec.bit_length()] += 1
            if usec >= self.server.slow_usec >= 0:
                self.server.slowlog.add(usec, args, self.client.addr, self.client.name)
            if spec.noauth:
                self.parser.refresh()
        seq = store.ack_seq
        if seq and seq > ssd.committed_seq:
            return self._ack_after(seq, reply)
        encode(reply, self.client.proto, self.out)
        return None

    async def _ack_after(self, seq: int, reply: Any) -> None:
        await self.server.wait_commit(seq)
        failed = self.store.ssd.failed.get(seq) if self.store.ssd is not None else None
        if failed is not None:
            self._error(f"ERR SSD write failed: {failed}")
        else:
            encode(reply, self.client.proto, self.out)

    async def _slow(self, spec: CommandSpec, args: list[Any], keys: list[bytes], counts: CommandStats,
                    wait_seq: int = 0) -> None:
        store = self.store
        ssd = store.ssd
        assert ssd is not None
        srv = self.server
        if wait_seq:
            await srv.wait_commit(wait_seq)
        if spec.write and ssd.queued_bytes > int(self.config.get("ssd-write-queue")):
            await srv.wait_commit(ssd.enqueued_seq)
        if spec.name == "dbsize" and not ssd.settled:
            await srv.wait_commit(ssd.enqueued_seq)
        for _ in range(3):
            if await srv.load(keys):
                break
        waiter = self._invoke_sync(spec, args, counts)
        if waiter is not None:
            await waiter

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
        except Exception as exc:
            log.error("suspended command failed: %s", traceback.format_exc())
            self._error(f"ERR internal error: {type(exc).__name__}")
        self.busy = False
        if self.closed:
            return
        self._run()
        if not self.busy and not self.closed and self.transport is not None and not self.paused_writing:
            self.transport.resume_reading()


def _unknown(args: list[Any]) -> str:
    """Redis's text: the arguments are quoted one by one until 128 characters are shown."""
    name = bytes(args[0])[:128].decode("latin-1")
    shown = ""
    for a in args[1:]:
        if len(shown) >= 128:
            break
        shown += "'" + bytes(a)[: 128 - len(shown)].decode("latin-1") + "' "
    return f"ERR unknown command '{name}', with args beginning with: {shown}"
