"""hypercorn and h11 as `serve` drives them: every internal of theirs it relies on, in one place.

`serve` keeps hypercorn's HTTP/1.1 protocol, its ASGI lifespan and its graceful stop, but accepts
connections and reads their sockets itself (http/serving.py, http/_read_loop.py). Neither library
offers that publicly, so this module reaches past both public APIs, and no other module of the
package does: hypercorn's non-public modules (the pieces of its Trio worker, its HTTP/1.1
protocol and stream, ``hypercorn.utils``) and h11's private state (a connection's receive buffer
and body reader, and that reader's count of the body's bytes still to come). pyproject.toml pins
both libraries to the minor release this was checked against, and tests/test_library_reliance.py
drives this module with hypercorn's own protocol over a socket pair, so that an upgrade that
changes what it relies on fails there.

What it offers
--------------
``running(app, settings)`` is hypercorn's Trio worker (``hypercorn.trio.run.worker_serve``)
without its accept side: the application's lifespan runs around the block, and the ``Worker`` it
gives

- ``listen()`` binds and listens on ``settings.bind`` (plain TCP only: `serve` serves no TLS),
  and gives each socket with its URL;
- ``serve(accept, shutdown_trigger)`` runs ``accept(handlers)``, which starts each connection's
  handler in the nursery ``handlers``, until ``shutdown_trigger`` returns; then, as hypercorn
  does, the connections still open get ``settings.graceful_timeout`` to finish;
- ``serve_connection(stream, read, extensions)`` is hypercorn's handler of one connection, with
  ``read(connection)`` as the only reader of its socket and ``extensions`` in the ASGI scope of
  each request that comes on it.

The rules ``read`` keeps with the ``Connection`` it is given
----------------------------------------------------------
1. Every byte ``read`` takes from the socket goes to ``feed``, once and in order, except the bytes
   of a passed body (rule 4). ``feed(b"")`` says the client closed its side.
2. When ``read`` returns, or raises what a closed or broken stream raises or ``trio.TooSlowError``,
   hypercorn is told the connection is closed, and it ends the request in progress.
3. The questions (``no_request``, ``expects_head``, ``between_requests``, ``failed``,
   ``unread_body``) describe h11 as the last ``feed`` left it. On a connection that is no longer
   HTTP/1.1 (upgraded to a WebSocket or to HTTP/2) each of them says no.
4. ``pass_body()``, right after the ``feed`` that ended a request's head, gives that request's
   body when its length is declared and h11 holds none of it. Its bytes then go to
   ``PassedBody.give``, never to ``feed``, no more than ``remaining`` of them, and ``end()`` is
   called once ``remaining`` is 0: h11 counts the bytes as read and ends the body itself, so the
   connection goes on to its next request as if h11 had read them. If the client stops early,
   ``feed(b"")`` instead, and h11 answers 400. Once the body is ``answered`` (the application
   replied without reading all of it), none of the rest is given: hypercorn closes the
   connection, as it does whenever a reply goes out before its request is whole.
5. ``let_application_run()``, after a ``feed`` that ended a request's head, returns once the
   application's task for that request has run up to its first wait: the application has then
   decided whether the body may be read now.
6. ``hold_keep_alive()`` stops hypercorn's keep-alive timeout while a request the client has sent
   waits to be read (waiting for the server is not idling); ``restart_keep_alive()`` starts it
   again, when h11 has ``no_request``.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import h11
import trio
from h11._readers import ContentLengthReader
from hypercorn.config import Config
from hypercorn.events import Closed, RawData
from hypercorn.protocol.events import Body
from hypercorn.protocol.h11 import STREAM_ID, H11Protocol
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

__all__ = ["Connection", "PassedBody", "ReadRequests", "Worker", "running"]

# What reads a connection's socket for hypercorn's protocol (rules 1-6).
ReadRequests = Callable[["Connection"], Awaitable[None]]
# A read loop that raises one of these has met the end of its connection (rule 2): hypercorn's own
# read loop stops on the same.
_CONNECTION_ENDED = (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError)


@asynccontextmanager
async def running(app: Framework, settings: Config) -> AsyncIterator[Worker]:
    """The ASGI ``app`` started (its lifespan's startup) for the block, and stopped after it."""
    settings.set_statsd_logger_class(StatsdLogger)
    asgi = wrap_app(app, settings.wsgi_max_body_size, "asgi")
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(asgi, settings, lifespan_state)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        # What the app put in the lifespan state at startup, shared by every connection.
        state = ConnectionState(lifespan_state.copy())
        yield Worker(asgi, settings, state, WorkerContext(None))
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


class Worker:
    """One run of hypercorn's Trio worker whose accept side is the caller's."""

    __slots__ = ("_app", "_context", "_settings", "_state")

    def __init__(
        self, app: AppWrapper, settings: Config, state: ConnectionState, context: WorkerContext
    ) -> None:
        self._app = app
        self._settings = settings
        self._state = state
        self._context = context

    def listen(self) -> list[tuple[socket.socket, str]]:
        """The sockets of ``settings.bind``, listening, each with the URL it serves."""
        listening = []
        for sock in self._settings.create_sockets().insecure_sockets:
            sock.listen(self._settings.backlog)
            listening.append((sock, f"http://{repr_socket_addr(sock.family, sock.getsockname())}"))
        return listening

    async def serve(
        self,
        accept: Callable[[trio.Nursery], Awaitable[object]],
        shutdown_trigger: Callable[[], Awaitable[object]],
    ) -> None:
        """Run ``accept(handlers)`` until ``shutdown_trigger`` returns, then give the handlers
        started in ``handlers`` ``settings.graceful_timeout`` to finish."""
        async with trio.open_nursery() as handlers:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(raise_shutdown, self._context.terminate.wait)
                    nursery.start_soon(accept, handlers)
            except BaseExceptionGroup as error:
                _, others = error.split((ShutdownError, KeyboardInterrupt))
                if others is not None:
                    raise others from None
            finally:
                # Connections idle between requests close at once; busy ones are not kept alive.
                await self._context.terminated.set()
                handlers.cancel_scope.deadline = (
                    trio.current_time() + self._settings.graceful_timeout
                )

    def serve_connection(
        self,
        stream: trio.SocketStream,
        read: ReadRequests,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> Awaitable[None]:
        """Serve one connection with hypercorn's protocol, ``read`` reading it, when awaited;
        done when the connection is. ``extensions``: in each of its requests' scope (the same
        dict for each, not a copy)."""
        # Not a coroutine function: thousands of connections wait at once, each holding what its
        # awaits hold, so this frame would be one more per connection.
        app = self._app if not extensions else _Announcing(self._app, extensions)
        return _ConnectionHandler(app, self._settings, self._context, self._state, stream, read)


class _ConnectionHandler(TCPServer):
    """hypercorn's handler of one connection (``TCPServer``), whose ``run`` sets up the protocol
    and then awaits ``_read_data``, its read loop: here ``read`` reads instead."""

    def __init__(
        self,
        app: AppWrapper,
        settings: Config,
        context: WorkerContext,
        state: ConnectionState,
        stream: trio.SocketStream,
        read: ReadRequests,
    ) -> None:
        # hypercorn types the stream as its TLS stream; a plain one is what its own worker passes
        # for a plain socket too.
        super().__init__(app, settings, context, state, stream)  # type: ignore[arg-type]
        self._read = read

    async def _read_data(self) -> None:
        try:
            await self._read(Connection(self))
        except _CONNECTION_ENDED:
            pass
        await self.protocol.handle(Closed())


class _Announcing:
    """hypercorn's application wrapper for one connection: the ASGI scope of each HTTP request on
    it carries ``extensions``."""

    __slots__ = ("_app", "_extensions")

    def __init__(self, app: AppWrapper, extensions: dict[str, dict[str, Any]]) -> None:
        self._app = app
        self._extensions = extensions

    def __call__(
        self,
        scope: Scope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        sync_spawn: Callable[..., Any],
        call_soon: Callable[..., Any],
    ) -> Coroutine[Any, Any, None]:
        # Not a coroutine function, as serve_connection, so that a waiting request holds no
        # frame of this one.
        if scope["type"] == "http":
            # hypercorn makes a fresh dict of extensions for each request, empty on HTTP/1.1: the
            # connection's own takes its place, so that a waiting request holds no copy of it.
            extensions = scope["extensions"]
            scope["extensions"] = (
                {**extensions, **self._extensions} if extensions else self._extensions
            )
        return self._app(scope, receive, send, sync_spawn, call_soon)


class Connection:
    """One connection's HTTP/1.1 protocol as its read loop drives it, under the rules above."""

    __slots__ = ("_handler",)

    def __init__(self, handler: _ConnectionHandler) -> None:
        self._handler = handler

    async def feed(self, data: bytes | bytearray) -> None:
        """Hand bytes read from the socket to hypercorn's protocol (h11 copies them into its own
        buffer, so any bytes-like object will do); ``b""``: the client closed its side."""
        await self._handler.protocol.handle(RawData(data))  # type: ignore[arg-type]

    @property
    def no_request(self) -> bool:
        """h11 has not seen the head of a request yet."""
        connection = self._h11()
        return connection is not None and connection.their_state is h11.IDLE

    @property
    def expects_head(self) -> bool:
        """h11 waits for a request's head and holds none of its bytes."""
        connection = self._h11()
        return (
            connection is not None
            and connection.their_state is h11.IDLE
            and not connection._receive_buffer
        )

    @property
    def between_requests(self) -> bool:
        """h11 has no request's head or body to read: none came yet or the last one is whole."""
        connection = self._h11()
        return connection is not None and connection.their_state in (h11.IDLE, h11.DONE)

    @property
    def failed(self) -> bool:
        """h11 found the client breaking HTTP/1.1 (and hypercorn answered it)."""
        connection = self._h11()
        return connection is not None and connection.their_state is h11.ERROR

    def unread_body(self) -> int | None:
        """The length of the body whose head h11 just took, when its length is declared and h11
        holds none of it yet; None otherwise."""
        reader = self._unread_body_reader()
        return None if reader is None else reader._remaining

    def pass_body(self) -> PassedBody | None:
        """The body whose head h11 just took, to be passed to the application past h11 (rule 4),
        when its length is declared and h11 holds none of it yet; None otherwise."""
        reader = self._unread_body_reader()
        protocol = self._handler.protocol.protocol
        if (
            reader is None
            or not isinstance(protocol, H11Protocol)
            or not isinstance(protocol.stream, HTTPStream)
        ):
            return None
        return PassedBody(protocol, reader, protocol.stream)

    async def let_application_run(self) -> None:
        """Return once the application's task for the request whose head was just fed has run
        up to its first wait (rule 5)."""
        # hypercorn starts that task (start_soon) as it takes the head. Trio runs the tasks that
        # became runnable together in either order, so after one checkpoint that task may not
        # have run yet; after a second it has.
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()

    async def hold_keep_alive(self) -> None:
        """Stop hypercorn's keep-alive timeout (rule 6)."""
        await self._handler.idle_task.stop()

    async def restart_keep_alive(self) -> None:
        """Start hypercorn's keep-alive timeout again, as hypercorn does after a request."""
        handler = self._handler
        await handler.idle_task.restart(handler._task_group, handler._idle_timeout)

    def _h11(self) -> h11.Connection | None:
        protocol = self._handler.protocol.protocol
        if not isinstance(protocol, H11Protocol):
            return None  # HTTP/2
        connection = protocol.connection
        return connection if isinstance(connection, h11.Connection) else None  # a WebSocket

    def _unread_body_reader(self) -> ContentLengthReader | None:
        # h11's reader of a body of declared length counts the bytes still to come in
        # ``_remaining``: all of the body, while h11's buffer holds none of it.
        connection = self._h11()
        if connection is None or connection.their_state is not h11.SEND_BODY:
            return None
        reader = connection._reader
        if not isinstance(reader, ContentLengthReader) or connection._receive_buffer:
            return None
        return reader


class PassedBody:
    """A request's body of declared length, passed from the socket to the application past h11
    (rule 4)."""

    __slots__ = ("_protocol", "_reader", "_stream")

    def __init__(
        self, protocol: H11Protocol, reader: ContentLengthReader, stream: HTTPStream
    ) -> None:
        self._protocol = protocol
        self._reader = reader
        self._stream = stream

    @property
    def remaining(self) -> int:
        """The bytes of the body still to come."""
        return self._reader._remaining

    @property
    def answered(self) -> bool:
        """The application has replied, and takes no more of the body."""
        return self._stream.closed

    async def give(self, data: bytes) -> None:
        """The body's next bytes to the application, as one ``http.request`` message; h11
        counts them as read."""
        if len(data) > self._reader._remaining:
            raise ValueError(f"{len(data)} bytes given with {self.remaining} left of the body")
        self._reader._remaining -= len(data)
        await self._stream.handle(Body(stream_id=STREAM_ID, data=data))

    async def end(self) -> None:
        """With none of the body left to come, h11 ends it and hypercorn tells the
        application; the connection goes on to its next request."""
        await self._protocol._handle_events()
