"""Adapters that carry out the fake judge's replies over HTTP: an ASGI app and a real TCP server
on Trio built directly on h11 (so broken connections are exact). The judge client's in-memory
transport (fakes/memory_transport.py) is the third adapter, with no HTTP in between.

Each adapter passes a request to :meth:`FakeJudge.handle`, sleeps the reply's ``delay_s`` with
``trio.sleep`` (instant and exact under a mock clock) while watching for the caller going away,
then responds, truncates, closes or hangs. A caller that leaves before the reply is complete is
counted in ``cancelled``; ``in_flight`` always comes back down.

How the socket-level actions look through each adapter:

=================  ==========================================  ===============================
action             TCP server                                  ASGI app
=================  ==========================================  ===============================
``truncated_body`` headers with the full ``Content-Length``,   same start and partial body,
                   half the body, then the connection breaks   then the app raises
                                                               ``httpx.RemoteProtocolError``
``close``          the connection breaks without a reply       the app raises
                                                               ``httpx.RemoteProtocolError``
``hang``           no reply until the caller cancels or        no reply until
                   closes the connection                       ``http.disconnect`` or cancel
=================  ==========================================  ===============================

ASGI has no way to close a connection without a reply, so the app raises instead. Through
``httpx.ASGITransport`` (``raise_app_exceptions=True``, the default) an httpx client receives
that ``httpx.RemoteProtocolError`` exactly as from a broken connection. Under an ASGI server such
as hypercorn the exception is logged; after ``truncated_body`` the server closes the connection
mid-body (the client sees a short body), but after ``close`` it answers ``500`` with an empty body
and ``Connection: close`` — use :func:`serve_fake_judge` when a test needs a silent close.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from typing import Any, TypeVar

import h11
import httpx
import trio

from genrm_trio.fakes.judge import FakeJudge, FakeReply

T = TypeVar("T")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

CLOSED_WITHOUT_REPLY = "Server disconnected without sending a response."
_RECEIVE_SIZE = 65536


def _truncation_message(reply: FakeReply) -> str:
    return (
        "peer closed connection without sending complete message body: "
        f"received {reply.sent_bytes} bytes, expected {len(reply.body)}"
    )


def _response_headers(reply: FakeReply, content_length: int) -> list[tuple[str, str]]:
    return [*reply.headers, ("content-length", str(content_length))]


async def wait_for_stats(
    judge: FakeJudge, condition: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Wait until ``condition(judge.stats())`` holds and return those stats.

    For tests that must see the judge react to a caller, e.g. a cancelled call over TCP:
    ``await wait_for_stats(judge, lambda s: s["in_flight"] == 0)``. Bound it with a cancel scope.
    """
    return await observe_until(judge, judge.stats, condition)


async def observe_until(judge: FakeJudge, probe: Callable[[], T], done: Callable[[T], bool]) -> T:
    """The first ``probe()`` for which ``done`` holds, probing again whenever ``judge`` reports
    a change (a call starting or ending, a reset)."""
    while True:
        value = probe()
        if done(value):
            await trio.lowlevel.checkpoint()
            return value
        changed = trio.Event()
        remove = judge.add_observer(changed.set)
        try:
            await changed.wait()
        finally:
            remove()


# --------------------------------------------------------------------------------------------
# ASGI app


class FakeJudgeApp:
    """The fake judge as a plain ASGI 3 application (HTTP and lifespan scopes)."""

    def __init__(self, judge: FakeJudge) -> None:
        self.judge = judge

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await receive_body(receive)
        if body is None:
            return
        target = scope["path"]
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        headers = [
            (name.decode("latin-1").lower(), value.decode("latin-1"))
            for name, value in scope.get("headers", [])
        ]
        reply = self.judge.handle(scope["method"], target, headers, body, now=trio.current_time())
        if not reply.tracked:
            await _asgi_respond(send, reply)
            return
        cancelled = True
        try:
            if reply.kind == "hang":
                await _asgi_wait_for_disconnect(receive)
                return
            if await _asgi_sleep_unless_disconnected(receive, reply.delay_s):
                return
            cancelled = False
        finally:
            self.judge.end_request(reply, cancelled=cancelled)
        if reply.kind == "close":
            raise httpx.RemoteProtocolError(CLOSED_WITHOUT_REPLY)
        if reply.kind == "truncate":
            await send(
                {
                    "type": "http.response.start",
                    "status": reply.status,
                    "headers": _asgi_headers(_response_headers(reply, len(reply.body))),
                }
            )
            await send(
                {
                    "type": "http.response.body",
                    "body": reply.body[: reply.sent_bytes],
                    "more_body": True,
                }
            )
            raise httpx.RemoteProtocolError(_truncation_message(reply))
        await _asgi_respond(send, reply)


def _asgi_headers(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]


async def _asgi_respond(send: Send, reply: FakeReply) -> None:
    headers = _asgi_headers(_response_headers(reply, len(reply.body)))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})


async def _asgi_wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _asgi_sleep_unless_disconnected(receive: Receive, delay_s: float) -> bool:
    """Sleep ``delay_s``; True if the client disconnected first."""
    disconnected = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal disconnected
            await _asgi_wait_for_disconnect(receive)
            disconnected = True
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        await trio.sleep(delay_s)
        nursery.cancel_scope.cancel()
    return disconnected


async def receive_body(receive: Receive) -> bytes | None:
    """An ASGI request's whole body, or None when the client left first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def serve_lifespan(receive: Receive, send: Send) -> None:
    """Answer an ASGI lifespan scope: nothing to start or stop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def fake_judge_app(
    *,
    seed: int = 0,
    model: str | None = None,
    api_key: str | None = None,
    latency: str = "none",
    position_bias: float = 0.0,
    tie_ranking: float = 3.5,
    rules: list[dict[str, Any]] | None = None,
    fault_rates: dict[str, float] | None = None,
    prefix_cache: str | None = None,
) -> FakeJudgeApp:
    """A new fake judge as an ASGI app; the judge itself is the app's ``.judge``."""
    judge = FakeJudge(
        seed=seed,
        model=model,
        api_key=api_key,
        latency=latency,
        position_bias=position_bias,
        tie_ranking=tie_ranking,
        rules=rules,
        fault_rates=fault_rates,
        prefix_cache=prefix_cache,
    )
    return FakeJudgeApp(judge)


# --------------------------------------------------------------------------------------------
# TCP server (h11 on Trio)


async def serve_fake_judge(
    judge: FakeJudge,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``judge`` over HTTP/1.1 on ``host:port`` until cancelled.

    Reports the bound port through ``task_status`` (use ``port=0`` for a free one). Connections
    are kept alive between requests and served concurrently.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_port: int = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, partial(_serve_connection, judge), listeners)
        task_status.started(bound_port)


class _Connection:
    """One accepted connection: an h11 state machine over a Trio stream."""

    def __init__(self, judge: FakeJudge, stream: trio.SocketStream) -> None:
        self.judge = judge
        self.stream = stream
        self.h11 = h11.Connection(h11.SERVER)

    async def send(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data:
            await self.stream.send_all(data)

    async def receive_request(self) -> tuple[h11.Request, bytes] | None:
        """The next complete request, or None when the peer closed the connection."""
        request: h11.Request | None = None
        chunks: list[bytes] = []
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.stream.receive_some(_RECEIVE_SIZE))
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                return request, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def wait_for_peer_to_leave(self) -> None:
        """Return when the peer closes its side. Anything it sends meanwhile is buffered in h11
        (a pipelined request), so nothing is lost if the wait is cancelled."""
        while True:
            try:
                data = await self.stream.receive_some(_RECEIVE_SIZE)
            except trio.BrokenResourceError:
                return
            if not data:
                return
            self.h11.receive_data(data)

    async def sleep_unless_peer_leaves(self, delay_s: float) -> bool:
        """Sleep ``delay_s``; True if the peer left first."""
        left = False
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal left
                await self.wait_for_peer_to_leave()
                left = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            await trio.sleep(delay_s)
            nursery.cancel_scope.cancel()
        return left

    async def respond(self, reply: FakeReply) -> None:
        await self.send(_h11_response(reply, len(reply.body)))
        await self.send(h11.Data(data=reply.body))
        await self.send(h11.EndOfMessage())

    async def answer(self, request: h11.Request, body: bytes) -> bool:
        """Answer one request; True if the connection can serve another."""
        headers = [
            (name.decode("latin-1").lower(), value.decode("latin-1"))
            for name, value in request.headers
        ]
        reply = self.judge.handle(
            request.method.decode("ascii"),
            request.target.decode("latin-1"),
            headers,
            body,
            now=trio.current_time(),
        )
        if not reply.tracked:
            await self.respond(reply)
            return True
        ended = False
        try:
            if reply.kind == "hang":
                await self.wait_for_peer_to_leave()
                return False
            if await self.sleep_unless_peer_leaves(reply.delay_s):
                return False
            # The call ends when its reply is ready, before it is written (as in the other
            # adapters): a caller that has read the reply may send its next call before this
            # task runs again, and the judge would count both in flight at once.
            ended = True
            self.judge.end_request(reply, cancelled=False)
            if reply.kind == "close":
                return False
            if reply.kind == "truncate":
                await self.send(_h11_response(reply, len(reply.body)))
                await self.send(h11.Data(data=reply.body[: reply.sent_bytes]))
                return False
            await self.respond(reply)
            return True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        finally:
            if not ended:
                self.judge.end_request(reply, cancelled=True)

    async def serve(self) -> None:
        while True:
            try:
                received = await self.receive_request()
            except h11.RemoteProtocolError as error:
                if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await self.send(
                        h11.Response(
                            status_code=error.error_status_hint,
                            headers=[("content-length", "0"), ("connection", "close")],
                        )
                    )
                return
            if received is None or not await self.answer(*received):
                return
            if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
                return
            self.h11.start_next_cycle()


def _h11_response(reply: FakeReply, content_length: int) -> h11.Response:
    return h11.Response(
        status_code=reply.status,
        headers=_response_headers(reply, content_length),
        reason=reply.reason.encode("latin-1"),
    )


async def _serve_connection(judge: FakeJudge, stream: trio.SocketStream) -> None:
    connection = _Connection(judge, stream)
    try:
        await connection.serve()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        with trio.move_on_after(1, shield=True):
            await stream.aclose()


__all__ = [
    "CLOSED_WITHOUT_REPLY",
    "FakeJudgeApp",
    "fake_judge_app",
    "observe_until",
    "serve_fake_judge",
    "wait_for_stats",
]
