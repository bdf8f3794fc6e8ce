"""The accept loop of `serve`: hypercorn's HTTP/1.1 protocol behind our own listener.

A trainer opens a fresh connection per rollout and posts a whole step at once, and each of those
connections then waits for its group. hypercorn's own loop (trio's `serve_listeners`) accepts
one connection per trip through the scheduler and, when descriptors run out, logs a traceback
every 100 ms while the judge's connections fail for want of descriptors. This loop instead:

- accepts in batches, so the kernel's listen queue drains as fast as clients fill it;
- keeps client connections under a cap sized from the open-file limit, so the descriptors a group
  needs to be judged and answered always remain; a connection over the cap is answered at once
  with a 503 naming the limit (not left hanging), and the episode is logged once, with its end;
- treats running out of descriptors anyway (EMFILE and kin) as a logged pause, not a crash.

Each connection's reads pass a ``ReadGate`` (http/read_gates.py), announced to the application
in the scope of every request on the connection: while a request waits for room in the memory
budget its gate is shut, and its body stays in the kernel and the client (TCP's own backpressure)
instead of piling up in hypercorn's queue. Reads start
small, so that a connection holds little while it waits, and grow while a body streams in.

A whole step posted at once puts thousands of requests in the kernel before the server reads
any, and Trio runs every connection's next step in turn: each read buffer, each copy h11 and
hypercorn make and each piece of a body waiting for the rest was then alive for thousands of
connections at once, and the heap kept the high-water mark as holes between the bodies that
stayed (a quarter of a GiB for 8,192 bodies of 35 KB). So a request whose head declares a body
of at most ``GATHERED_BODY_BYTES`` is read in a turn: at most ``RECEIVING_REQUESTS`` connections
at once read such a request's head and its whole body, into one buffer of its length, handed to
h11 in one piece (the application then takes it as one chunk, without joining pieces). A
connection gives its turn up as soon as it would wait, for the client's bytes or for its gate;
the rest of its reads go as before.

A larger body of declared length (a long rollout: 2 MB for 64k tokens) is passed from the
socket to the application past h11. h11 would copy each read into its buffer and slice it out
twice, and hypercorn copy it once more, each a fresh mapping at these sizes; the body instead
goes in reads of what the kernel holds, up to ``BODY_READ_BYTES``, each handed to hypercorn's
stream as it came, with h11's count of the body's bytes kept, so that h11 still ends the body
and the connection goes on as it would. Its head still goes through h11, and so does everything
about the body other than its bytes: the application's decision to read it now or later (its
gate), a client that stops halfway (a 400), a refusal by its declared length.

The loop drives hypercorn's HTTP/1.1 protocol objects directly, so ``pyproject.toml`` pins
hypercorn to one minor release, and what this loop leaves out of hypercorn's own (TLS, HTTP/2
and QUIC, ``max_requests``, ...) is listed in docs/running.md.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import math
import os
import re
import socket
import sys
import termios
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import h11
import trio
from h11._readers import ContentLengthReader
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, RawData
from hypercorn.protocol.events import Body
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import HTTPStream
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import (
    AppWrapper,
    ASGIReceiveCallable,
    ASGISendCallable,
    ConnectionState,
    Framework,
    LifespanState,
    Scope,
)
from hypercorn.utils import ShutdownError, raise_shutdown, repr_socket_addr, wrap_app

from genrm_trio.http.read_gates import ReadGate, ReadGates
from genrm_trio.wire.rendering import error_body

log = logging.getLogger("genrm_trio")

# One wake-up of the accept loop takes at most this many connections before letting the
# handlers it started run. With thousands of connection tasks runnable, one pass of the
# scheduler takes long enough for a fast client to refill the queue, so each wake-up may empty
# the default backlog whole (accepting one costs tens of microseconds). With 256, one of two
# bursts of 8,192 in bench_burst.py saw 8 listen-queue overflows; with 4,096, none in two.
ACCEPT_BATCH = 4096
# A worker of `serve --workers` shares its listening socket with the others, and every one of
# them is woken for each new connection: taking a whole burst in one wake-up would leave the
# others idle while it parses every body. In small batches, whichever worker comes back to its
# accept loop first (the least busy one) takes the next connections.
WORKER_ACCEPT_BATCH = 16
# accept(2) errors meaning the process or the system is out of descriptors or memory: waiting is
# the only remedy, and the connection stays in the listen queue meanwhile.
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
OUT_OF_RESOURCES_PAUSE_S = 0.1
# accept(2) errors about the one connection being accepted (it went away, or a firewall said no);
# the loop carries on with the next.
CONNECTION_GONE = frozenset(
    {errno.ECONNABORTED, errno.ECONNRESET, errno.EPROTO, errno.EPERM, errno.ETIMEDOUT}
)
# A connection answered 503 is drained for at most this long, so that the request body the
# client is still sending does not turn the reply into a connection reset.
REJECT_DRAIN_S = 2.0


# The first read of a connection, and every read after the socket ran dry: a request's head and
# a small body in one read, while a connection that waits holds at most this much unread.
FIRST_READ_BYTES = 32 * 1024
# Reads double while each one fills its buffer, up to this: a 2 MB body of no declared length (or
# whose head came in pieces) then takes about a dozen reads instead of 64 (each read is one trip
# through h11, hypercorn's queue and the scheduler).
LARGEST_READ_BYTES = 256 * 1024
# The largest read of a body passed past h11 (each asks for what the kernel holds; on loopback a
# 2 MB body comes in about five), so that no read asks for a buffer of whatever length a client
# declares.
BODY_READ_BYTES = 1024 * 1024
# hypercorn's HTTP/1.1 protocol has one stream, with this id (hypercorn.protocol.h11.STREAM_ID).
_STREAM_ID = 1
# Connections reading a request in their turn at once (see the module's docstring): enough to keep
# the event loop busy, few enough that their buffers are a few MiB that the next ones reuse.
RECEIVING_REQUESTS = 64
# A body with a declared length up to this is read whole in its request's turn: glibc's mmap
# threshold (process_tuning.LARGE_ALLOCATION_BYTES). Larger buffers are mappings of their own,
# given back to the system whole, and leave no holes in the heap.
GATHERED_BODY_BYTES = 128 * 1024
# How much of a request's head is looked at, before it is read, for its Content-Length.
HEAD_PEEK_BYTES = 2048
# A Content-Length field in a request's head (field names are case-insensitive).
_CONTENT_LENGTH = re.compile(rb"\ncontent-length:[ \t]*(\d{1,12})[ \t]*\r?\n", re.IGNORECASE)
# The end of a request's head as h11 finds it (h11._receivebuffer.blank_line_regex).
_HEAD_END = re.compile(b"\n\r?\n")


class Announcing:
    """hypercorn's application wrapper for one connection: the ASGI scope of each request on it
    carries ``extensions``."""

    __slots__ = ("_app", "_extensions")

    def __init__(self, app: AppWrapper, extensions: dict[str, dict[str, Any]]) -> None:
        self._app = app
        self._extensions = extensions

    async def __call__(
        self,
        scope: Scope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        sync_spawn: Callable[..., Any],
        call_soon: Callable[..., Any],
    ) -> None:
        if scope["type"] == "http":
            # hypercorn makes a fresh dict of extensions for each request.
            scope["extensions"].update(self._extensions)
        await self._app(scope, receive, send, sync_spawn, call_soon)


class GatedTCPServer(TCPServer):
    """hypercorn's connection handler, reading through a ``ReadGate`` with adaptive read sizes,
    each request's head and small body in a turn of ``turns`` when it is given one."""

    def __init__(self, *args: Any, gate: ReadGate, turns: trio.Semaphore | None = None) -> None:
        super().__init__(*args)
        self.read_gate = gate
        # Turns read the socket directly: a plain TCP stream (`serve` serves no TLS).
        self.turns = turns if isinstance(self.stream, trio.SocketStream) else None

    async def _read_data(self) -> None:
        size = FIRST_READ_BYTES
        limit = self.config.read_timeout or math.inf
        while True:
            await self.read_gate.wait_open()
            try:
                if self.turns is not None and self._between_requests():
                    with trio.fail_after(limit):
                        await trio.lowlevel.wait_readable(self.stream.socket)
                    head = await self._peek_head() if self._expects_head() else None
                    if head is not None and head[1] <= GATHERED_BODY_BYTES:
                        # A request is coming: waiting for its turn is not idling, and must
                        # not end in the keep-alive timeout.
                        await self.idle_task.stop()
                        if await self._read_request_in_turn(self.turns):
                            break  # the client closed the connection
                        if self._no_request():
                            await self.idle_task.restart(self._task_group, self._idle_timeout)
                        size = FIRST_READ_BYTES
                        continue
                    if head is not None:
                        if await self._read_large_request(head[0], limit):
                            break
                        size = FIRST_READ_BYTES
                        continue
                with trio.fail_after(limit):
                    data = await self.stream.receive_some(size)
            except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                break
            # A request waiting for its group should not keep its last chunk alive.
            got = len(data)
            await self.protocol.handle(RawData(bytes(data)))  # no copy: trio gives bytes
            del data
            if got == 0:
                break
            size = min(size * 2, LARGEST_READ_BYTES) if got == size else FIRST_READ_BYTES
        await self.protocol.handle(Closed())

    async def _read_request_in_turn(self, turns: trio.Semaphore) -> bool:
        """Read the start of the next request in a turn: its head and, when its length is
        declared and small, its whole body. True if the client closed the connection."""
        socket_ = self.stream.socket
        if socket_.fileno() < 0:
            raise trio.ClosedResourceError
        await turns.acquire()
        turn = True
        try:
            data = _read_now(socket_, FIRST_READ_BYTES)
            if data is None:
                return False  # nothing to read after all: wait again
            if not data:
                await self.protocol.handle(RawData(b""))
                return True
            # A read that did not fill its buffer took all the kernel had: mostly a whole small
            # request, handed over in one piece as it came. A head declaring a body too large to
            # gather goes with the start of its body in one piece too, as it always did.
            end = _HEAD_END.search(data) if len(data) == FIRST_READ_BYTES else None
            if end is not None and not _may_gather(data, end.end()):
                end = None
            if end is None:
                turns.release()
                turn = False
                await self.protocol.handle(RawData(data))
                return False
            head, rest = data[: end.end()], data[end.end() :]
            del data
            await self.protocol.handle(RawData(head))
            del head
            body = self._body_to_gather(len(rest))
            if body:
                # The application decides at once whether the body may be read now (it shuts
                # the gate if not); its task, started with the head, runs before this goes on.
                await trio.lowlevel.checkpoint()
                await trio.lowlevel.checkpoint()
            if not body or not self.read_gate.is_open:
                # Anything else (a pipelined request, a body too large) is read as before,
                # without the turn: h11 may wait inside hypercorn until a reply is out.
                turns.release()
                turn = False
                if rest and not self._h11_failed():
                    await self.protocol.handle(RawData(rest))
                return False
            gathered = bytearray(body)
            gathered[: len(rest)] = rest
            filled = len(rest)
            del rest
            with memoryview(gathered) as view:
                while filled < body:
                    got = _read_into_now(socket_, view[filled:])
                    if not got:
                        break  # closed, or the client is slower: the rest is read as before
                    filled += got
            if filled < body:
                del gathered[filled:]
            if gathered:
                # h11 copies it into its own buffer: any bytes-like object will do.
                await self.protocol.handle(RawData(cast(bytes, gathered)))
            return False
        finally:
            if turn:
                turns.release()

    async def _read_large_request(self, head_end: int, limit: float) -> bool:
        """Read a request whose head declares a body larger than GATHERED_BODY_BYTES: the head
        through h11, then the body from the socket to the application in reads as large as the
        kernel has (up to BODY_READ_BYTES), past h11. True if the client closed the connection."""
        socket_ = self.stream.socket
        head = _read_now(socket_, head_end)
        if head is None:
            return False  # nothing to read after all: wait again
        await self.protocol.handle(RawData(head))
        if not head:
            return True
        del head
        passing = self._body_to_pass()
        if passing is None:
            return False  # not a body of declared length: read as before
        protocol, reader, stream = passing
        # The application decides whether the body may be read now before any of it is (see
        # _read_request_in_turn); a body it refused without reading is read as before.
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()
        while reader._remaining:
            await self.read_gate.wait_open()
            if stream.closed:
                return False  # answered already: h11 reads (and drops) the rest as usual
            # A read asks for what the kernel holds: a buffer over the mmap threshold that
            # got less would stay a mapping of its own (glibc shrinks it in place), one per
            # read of a client sending slowly.
            size = max(_bytes_held(socket_), FIRST_READ_BYTES)
            data = _read_now(socket_, min(reader._remaining, size, BODY_READ_BYTES))
            if data is None:
                with trio.fail_after(limit):
                    await trio.lowlevel.wait_readable(socket_)
                continue
            if not data:
                # h11 learns of the early end as it does on the usual path (and answers 400).
                await self.protocol.handle(RawData(data))
                return True
            reader._remaining -= len(data)
            await stream.handle(Body(stream_id=_STREAM_ID, data=data))
            del data
        # With nothing left to read, h11 ends the body and hypercorn tells the application.
        await protocol._handle_events()
        return False

    def _body_to_pass(self) -> tuple[H11Protocol, ContentLengthReader, HTTPStream] | None:
        """hypercorn's protocol, h11's reader and hypercorn's stream for the request whose head
        h11 just took, when its body is to be passed to the application past h11: its length is
        declared, larger than GATHERED_BODY_BYTES, and h11 holds none of it; None otherwise."""
        reader = self._unread_body()
        protocol = getattr(self.protocol, "protocol", None)
        if (
            reader is None
            or reader._remaining <= GATHERED_BODY_BYTES
            or not isinstance(protocol, H11Protocol)
            or not isinstance(protocol.stream, HTTPStream)
        ):
            return None
        return protocol, reader, protocol.stream

    async def _peek_head(self) -> tuple[int, int] | None:
        """Where the head of the request the client is sending ends and the body length it
        declares, from the head's first bytes (only a hint: h11's reading of the head decides);
        None when they do not show both. A body up to GATHERED_BODY_BYTES is read in a turn.
        Larger bodies are read as they come, without a turn: in turns, the first reads of a step
        of 2 MB bodies spread out, more of each body came in small reads, and the heap grew with
        them (docs/performance.md)."""
        try:
            start = await self.stream.socket.recv(HEAD_PEEK_BYTES, socket.MSG_PEEK)
        except OSError as exc:
            raise _stream_error(exc) from None
        end = _HEAD_END.search(start)
        declared = None if end is None else _CONTENT_LENGTH.search(start, 0, end.end())
        if end is None or declared is None:
            return None
        return end.end(), int(declared[1])

    def _no_request(self) -> bool:
        """h11 has not seen the head of a request yet."""
        connection = self._h11()
        return connection is not None and connection.their_state is h11.IDLE

    def _between_requests(self) -> bool:
        """h11 has no request's head or body to read: none came yet or the last one is whole."""
        connection = self._h11()
        return connection is not None and connection.their_state in (h11.IDLE, h11.DONE)

    def _h11(self) -> h11.Connection | None:
        protocol = getattr(self.protocol, "protocol", None)
        if not isinstance(protocol, H11Protocol):
            return None  # HTTP/2
        connection = protocol.connection
        return connection if isinstance(connection, h11.Connection) else None  # not a WebSocket

    def _expects_head(self) -> bool:
        """h11 waits for a new request and holds none of its bytes."""
        connection = self._h11()
        return (
            connection is not None
            and connection.their_state is h11.IDLE
            and not connection._receive_buffer
        )

    def _h11_failed(self) -> bool:
        connection = self._h11()
        return connection is not None and connection.their_state is h11.ERROR

    def _body_to_gather(self, started: int) -> int:
        """The length of the body whose head h11 just took, when it is to be read whole: its
        length is declared, at most GATHERED_BODY_BYTES, and more than the ``started`` bytes
        read with the head; 0 otherwise."""
        reader = self._unread_body()
        length: int = 0 if reader is None else reader._remaining
        return length if started < length <= GATHERED_BODY_BYTES else 0

    def _unread_body(self) -> ContentLengthReader | None:
        """h11's reader of the body whose head it just took, when the body's length is declared
        and h11 holds none of it yet (its ``_remaining`` is then all of it)."""
        connection = self._h11()
        if connection is None or connection.their_state is not h11.SEND_BODY:
            return None
        reader = connection._reader
        if not isinstance(reader, ContentLengthReader) or connection._receive_buffer:
            return None
        return reader


def _may_gather(data: bytes, head_end: int) -> bool:
    """Whether the head at the start of ``data`` declares a body small enough to gather. Only a
    hint, from the first Content-Length field: h11's own reading of the head decides."""
    declared = _CONTENT_LENGTH.search(data, 0, head_end)
    return declared is not None and int(declared[1]) <= GATHERED_BODY_BYTES


def _read_now(socket_: trio.socket.SocketType, size: int) -> bytes | None:
    """Up to ``size`` bytes the kernel holds for ``socket_``; None if it holds none."""
    try:
        return os.read(socket_.fileno(), size)
    except BlockingIOError:
        return None
    except OSError as exc:
        raise _stream_error(exc) from None


def _bytes_held(socket_: trio.socket.SocketType) -> int:
    """How many bytes the kernel holds unread for ``socket_`` (0 if it cannot say)."""
    try:
        held = fcntl.ioctl(socket_.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int.from_bytes(held, sys.byteorder, signed=True)


def _read_into_now(socket_: trio.socket.SocketType, view: memoryview) -> int | None:
    """Bytes the kernel holds for ``socket_`` into ``view``: their count, None if it holds none."""
    try:
        return os.readv(socket_.fileno(), [view])
    except BlockingIOError:
        return None
    except OSError as exc:
        raise _stream_error(exc) from None


def _stream_error(exc: OSError) -> trio.ClosedResourceError | trio.BrokenResourceError:
    # As trio.SocketStream translates them.
    if exc.errno == errno.EBADF:
        return trio.ClosedResourceError()
    return trio.BrokenResourceError(exc)


def over_limit_reply(connections: int, open_file_limit: int) -> bytes:
    """The whole HTTP reply given to a connection over the client-connection cap."""
    body = error_body(
        f"server at its connection limit: {connections} client connections are open "
        f"(open-file limit {open_file_limit}); retry later, or raise the open-file limit "
        "of genrm-trio serve"
    )
    head = (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nretry-after: 1\r\nconnection: close\r\n\r\n" % len(body)
    )
    return head + body


class ConnectionGate:
    """Counts client connections against their cap and logs when the cap or the descriptors
    run out, once per episode. Plain bookkeeping: no method awaits."""

    def __init__(self, capacity: int, open_file_limit: int, rejecting_slots: int) -> None:
        self.capacity = capacity
        self.open_file_limit = open_file_limit
        self.rejecting_slots = rejecting_slots
        self.open = 0
        self.rejecting = 0
        self.rejected_total = 0
        self._rejected_in_episode = 0
        self._starved_since: float | None = None
        self.room = trio.Event()
        self.reply = over_limit_reply(capacity, open_file_limit)

    @property
    def can_accept(self) -> bool:
        return self.open < self.capacity or self.rejecting < self.rejecting_slots

    def admit(self) -> bool:
        """Count a newly accepted connection in; False if it must be answered 503."""
        if self.open < self.capacity:
            self.open += 1
            if self._rejected_in_episode:
                log.warning(
                    "accepting client connections again after answering %d with 503 at the "
                    "connection limit",
                    self._rejected_in_episode,
                )
                self._rejected_in_episode = 0
            return True
        if not self._rejected_in_episode:
            log.warning(
                "connection limit reached: %d client connections are open under the open-file "
                "limit %d; answering new connections 503 until some close. Raise the open-file "
                "limit (ulimit -n) for bursts this large",
                self.open,
                self.open_file_limit,
            )
        self._rejected_in_episode += 1
        self.rejected_total += 1
        self.rejecting += 1
        return False

    def closed(self, *, admitted: bool) -> None:
        if admitted:
            self.open -= 1
        else:
            self.rejecting -= 1
        self.room.set()
        self.room = trio.Event()

    def out_of_descriptors(self, exc: OSError) -> None:
        if self._starved_since is None:
            self._starved_since = time.monotonic()
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            log.error(
                "out of file descriptors: accept failed with %s (%s) while %d client "
                "connections are open (open-file limit %d); new connections wait in the listen "
                "queue until descriptors are freed",
                name,
                os.strerror(exc.errno or 0),
                self.open,
                self.open_file_limit,
            )

    def accepted(self) -> None:
        if self._starved_since is not None:
            log.warning(
                "accepting connections again after %.1f s out of file descriptors",
                time.monotonic() - self._starved_since,
            )
            self._starved_since = None


async def _reject(stream: trio.SocketStream, gate: ConnectionGate) -> None:
    try:
        with trio.move_on_after(REJECT_DRAIN_S):
            await stream.send_all(gate.reply)
            await stream.send_eof()
            while await stream.receive_some(65536):
                pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        gate.closed(admitted=False)
        await trio.aclose_forcefully(stream)


async def _accept_loop(
    sock: socket.socket,
    gate: ConnectionGate,
    handle: Callable[[trio.SocketStream], Awaitable[None]],
    handlers: trio.Nursery,
    batch: int = ACCEPT_BATCH,
) -> None:
    sock.setblocking(False)
    try:
        while True:
            while not gate.can_accept:
                await gate.room.wait()
            await trio.lowlevel.wait_readable(sock)
            for _ in range(batch):
                if not gate.can_accept:
                    break
                try:
                    conn, _ = sock.accept()
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno in CONNECTION_GONE:
                        continue
                    if exc.errno in OUT_OF_RESOURCES:
                        gate.out_of_descriptors(exc)
                        await trio.sleep(OUT_OF_RESOURCES_PAUSE_S)
                        break
                    raise
                gate.accepted()
                stream = trio.SocketStream(trio.socket.from_stdlib_socket(conn))
                if gate.admit():
                    handlers.start_soon(handle, stream)
                else:
                    handlers.start_soon(_reject, stream, gate)
    finally:
        trio.lowlevel.notify_closing(sock)
        sock.close()


async def serve_app(
    app: Framework,
    settings: HypercornConfig,
    gate: ConnectionGate,
    *,
    shutdown_trigger: Callable[[], Awaitable[Any]],
    read_gates: ReadGates | None = None,
    accept_batch: int = ACCEPT_BATCH,
    turns: trio.Semaphore | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `settings.bind` until `shutdown_trigger` returns, as hypercorn's trio
    worker does (ASGI lifespan, graceful timeout), but accepting through `gate`; requests are
    read in `turns` (by default RECEIVING_REQUESTS at once). Each connection's ReadGate is
    announced to `app` through `read_gates`, the object `create_app` was given."""
    settings.set_statsd_logger_class(StatsdLogger)
    asgi = wrap_app(app, settings.wsgi_max_body_size, "asgi")
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(asgi, settings, lifespan_state)
    context = WorkerContext(None)

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        # What the app put in the lifespan state at startup, shared by every connection.
        state = ConnectionState(lifespan_state.copy())

        async with trio.open_nursery() as handlers:
            sockets = settings.create_sockets().insecure_sockets
            for sock in sockets:
                sock.listen(settings.backlog)
            binds = [f"http://{repr_socket_addr(s.family, s.getsockname())}" for s in sockets]

            reading = trio.Semaphore(RECEIVING_REQUESTS) if turns is None else turns

            async def handle(stream: trio.SocketStream) -> None:
                reads = ReadGate()
                announcing = (
                    asgi if read_gates is None else Announcing(asgi, read_gates.extensions(reads))
                )
                try:
                    await GatedTCPServer(
                        announcing,
                        settings,
                        context,
                        state,
                        stream,
                        gate=reads,
                        turns=reading,
                    )
                finally:
                    gate.closed(admitted=True)
                    await trio.aclose_forcefully(stream)

            task_status.started(binds)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(raise_shutdown, context.terminate.wait)
                    for sock in sockets:
                        nursery.start_soon(_accept_loop, sock, gate, handle, handlers, accept_batch)
            except BaseExceptionGroup as error:
                _, others = error.split((ShutdownError, KeyboardInterrupt))
                if others is not None:
                    raise others from None
            finally:
                await context.terminated.set()
                handlers.cancel_scope.deadline = trio.current_time() + settings.graceful_timeout

        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
