"""What `serve` relies on inside hypercorn and h11, checked by behaviour: http/_hypercorn_seam.py
driven with hypercorn's own protocol and h11 over a real socket pair, serving a tiny ASGI app,
by a read loop written here and by serve's own (http/_read_loop.py). A hypercorn or h11 that
changes what the seam relies on fails here, by the rule of the seam it breaks.
"""

from __future__ import annotations

import ast
import math
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypercorn.config import Config as HypercornConfig

import genrm_trio
from genrm_trio.config import Config
from genrm_trio.http._hypercorn_seam import Connection, ReadRequests, Worker, running
from genrm_trio.http._read_loop import FIRST_READ_BYTES, GATHERED_BODY_BYTES, RequestReader
from genrm_trio.http.read_gates import ReadGate, ReadGates
from genrm_trio.serve import hypercorn_settings

# --- a tiny application and a client ------------------------------------------------------------


@dataclass
class Seen:
    """One request as the application saw it."""

    path: str
    extensions: dict[str, Any]
    chunks: list[bytes] = field(default_factory=list)
    ended: bool = False  # the last http.request message came
    disconnected: bool = False


class App:
    """Answers each request, once it has its whole body, with the body's length; keeps what it
    saw. ``on_head`` runs first thing for each request; with ``answer_at_once`` the body is
    not read; a request for /forever never gets an answer."""

    def __init__(
        self, on_head: Callable[[Seen], None] | None = None, *, answer_at_once: bool = False
    ) -> None:
        self.on_head = on_head
        self.answer_at_once = answer_at_once
        self.seen: list[Seen] = []
        self.lifespan: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                event = message["type"].rsplit(".", 1)[1]
                self.lifespan.append(event)
                await send({"type": f"lifespan.{event}.complete"})
                if event == "shutdown":
                    return
        seen = Seen(scope["path"], dict(scope["extensions"]))
        self.seen.append(seen)
        if self.on_head is not None:
            self.on_head(seen)
        if scope["path"] == "/forever":
            await trio.sleep_forever()
        while not self.answer_at_once and not seen.ended:
            message = await receive()
            if message["type"] == "http.disconnect":
                seen.disconnected = True
                return
            if message["body"]:
                seen.chunks.append(message["body"])
            seen.ended = not message.get("more_body", False)
        body = b"%d" % sum(len(chunk) for chunk in seen.chunks)
        headers = [(b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def head(length: int | None, path: str = "/", *, extra: bytes = b"") -> bytes:
    framing = b"transfer-encoding: chunked" if length is None else b"content-length: %d" % length
    return b"POST %s HTTP/1.1\r\nhost: t\r\n%s%s\r\n\r\n" % (path.encode(), extra, framing)


GET = b"GET /get HTTP/1.1\r\nhost: t\r\n\r\n"
# How long the client waits for a reply, or for the connection's end: a broken seam fails a test
# instead of hanging it.
PATIENCE_S = 60.0


class Client:
    """The client's end of a connection: raw bytes out, replies parsed as they come."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def reply(self) -> tuple[int, dict[bytes, bytes], bytes]:
        """The next reply: its status, its header fields (names lowercased) and its body."""
        with trio.fail_after(PATIENCE_S):
            return await self._reply()

    async def _reply(self) -> tuple[int, dict[bytes, bytes], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            await self._more()
        head_, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status_line, *lines = head_.split(b"\r\n")
        fields = {}
        for line in lines:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip()
        length = int(fields[b"content-length"])
        while len(self.buffer) < length:
            await self._more()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), fields, body

    async def closed(self) -> bool:
        """Whether the server closes the connection, with nothing more sent, within the
        client's patience."""
        with trio.move_on_after(PATIENCE_S):
            return await self.stream.receive_some(65536) == b""
        return False

    async def _more(self) -> None:
        data = await self.stream.receive_some(1 << 20)
        assert data, "the server closed the connection"
        self.buffer += data


def serve_settings() -> HypercornConfig:
    return hypercorn_settings(Config(judge_base_url="http://judge.invalid/v1", judge_model="m"))


def socket_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    ends = socket.socketpair()
    server, client = (trio.SocketStream(trio.socket.from_stdlib_socket(end)) for end in ends)
    return server, client


Reading = Callable[[trio.SocketStream], ReadRequests]


def plain(stream: trio.SocketStream) -> ReadRequests:
    """The simplest read loop the seam's rules allow: every read fed as it came."""

    async def read(connection: Connection) -> None:
        while True:
            data = await stream.receive_some(65536)
            await connection.feed(data)
            if not data:
                return

    return read


def reader(gate: ReadGate | None = None, turns: trio.Semaphore | None = None) -> Reading:
    """serve's own read loop, as serve_app makes it."""
    return lambda stream: (
        RequestReader(stream, gate or ReadGate(), turns or trio.Semaphore(4), math.inf).run
    )


async def serve_one(
    worker: Worker,
    nursery: trio.Nursery,
    reading: Reading,
    extensions: dict[str, Any] | None = None,
    *,
    sent: bytes = b"",
) -> Client:
    """A connection served by ``worker``, read by ``reading``; ``sent``: bytes the client sent
    before the server started reading."""
    server, client = socket_pair()
    if sent:
        await client.send_all(sent)

    async def handle() -> None:
        try:
            await worker.serve_connection(server, reading(server), extensions)
        finally:
            await trio.aclose_forcefully(server)

    nursery.start_soon(handle)
    return Client(client)


@asynccontextmanager
async def serving(
    app: App, settings: HypercornConfig | None = None
) -> AsyncIterator[tuple[Worker, trio.Nursery]]:
    async with running(app, settings or serve_settings()) as worker:
        async with trio.open_nursery() as nursery:
            yield worker, nursery
            await trio.testing.wait_all_tasks_blocked()  # what the test set going ends
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def one_connection(
    app: App,
    reading: Reading,
    extensions: dict[str, Any] | None = None,
    *,
    sent: bytes = b"",
    settings: HypercornConfig | None = None,
) -> AsyncIterator[Client]:
    async with serving(app, settings) as (worker, nursery):
        yield await serve_one(worker, nursery, reading, extensions, sent=sent)


# --- the worker ---------------------------------------------------------------------------------


async def test_the_worker_starts_the_application_before_serving_and_stops_it_after() -> None:
    app = App()
    settings = serve_settings()
    settings.bind = ["127.0.0.1:0"]
    async with running(app, settings) as worker:
        assert app.lifespan == ["startup"]
        [(listener, url)] = worker.listen()
        with listener:
            assert url == f"http://127.0.0.1:{listener.getsockname()[1]}"
            # Listening already: a client's connect is queued before anything accepts.
            client = socket.create_connection(listener.getsockname())
            client.close()
    assert app.lifespan == ["startup", "shutdown"]


async def test_at_shutdown_idle_connections_close_at_once_and_busy_ones_get_the_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = serve_settings()
    settings.graceful_timeout = 7.0
    app = App()
    stop = trio.Event()
    clients: list[Client] = []
    async with running(app, settings) as worker:

        async def accept(handlers: trio.Nursery) -> None:
            for _ in range(2):
                clients.append(await serve_one(worker, handlers, plain))
            await trio.sleep_forever()

        with trio.fail_after(PATIENCE_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker.serve, accept, stop.wait)
                await trio.testing.wait_all_tasks_blocked()
                idle, busy = clients
                await busy.send(b"GET /forever HTTP/1.1\r\nhost: t\r\n\r\n")
                await trio.testing.wait_all_tasks_blocked()
                started = trio.current_time()
                stop.set()
                assert await idle.closed()
                assert trio.current_time() == started
        # The busy connection's handler was cancelled at the end of the grace.
        assert trio.current_time() == started + 7.0
        assert await busy.closed()


# --- the rules of a Connection, with a read loop written here ----------------------------------


async def test_each_request_carries_the_extensions_and_pipelined_ones_are_served() -> None:
    app = App()
    announced = {"example.extension": {"value": 1}}
    async with one_connection(app, plain, announced) as client:
        await client.send(head(3, "/a") + b"abc" + GET + head(0, "/b"))
        replies = [await client.reply() for _ in range(3)]
    assert [(status, body) for status, _, body in replies] == [
        (200, b"3"),
        (200, b"0"),
        (200, b"0"),
    ]
    assert [seen.path for seen in app.seen] == ["/a", "/get", "/b"]
    assert all(seen.extensions["example.extension"] == {"value": 1} for seen in app.seen)


def answers(connection: Connection) -> tuple[bool, bool, bool, bool, int | None]:
    return (
        connection.no_request,
        connection.expects_head,
        connection.between_requests,
        connection.failed,
        connection.unread_body(),
    )


async def test_the_questions_follow_h11_through_requests_and_a_broken_one() -> None:
    app = App()
    seen: list[tuple[bool, bool, bool, bool, int | None]] = []
    replied = trio.Event()
    finished = trio.Event()

    def scripted(stream: trio.SocketStream) -> ReadRequests:
        async def read(connection: Connection) -> None:
            seen.append(answers(connection))
            await connection.feed(b"POST /a HTTP/1.1\r\nhost: t\r\n")
            seen.append(answers(connection))
            await connection.feed(b"content-length: 10\r\n\r\n")
            seen.append(answers(connection))
            await connection.feed(b"0123")
            seen.append(answers(connection))
            await connection.feed(b"456789")
            seen.append(answers(connection))
            await replied.wait()
            await trio.testing.wait_all_tasks_blocked()  # the application's task is done
            seen.append(answers(connection))
            await connection.feed(b"NOT HTTP\r\n\r\n")
            seen.append(answers(connection))
            finished.set()

        return read

    async with one_connection(app, scripted) as client:
        assert (await client.reply())[2] == b"10"
        replied.set()
        status, fields, _ = await client.reply()
        await finished.wait()
    assert status == 400 and fields[b"connection"] == b"close"
    assert seen == [
        (True, True, True, False, None),  # nothing yet
        (True, False, True, False, None),  # part of a head, held by h11
        (False, False, False, False, 10),  # the head, and none of the body
        (False, False, False, False, 6),
        (False, False, True, False, None),  # the whole request
        (True, True, True, False, None),  # answered: the next one may come
        (False, False, False, True, None),  # a head that breaks HTTP/1.1
    ]


async def test_a_chunked_body_or_one_whose_start_h11_holds_is_not_unread() -> None:
    app = App()
    found: list[int | None] = []
    replied = trio.Event()

    def scripted(stream: trio.SocketStream) -> ReadRequests:
        async def read(connection: Connection) -> None:
            await connection.feed(head(None))
            found.append(connection.unread_body())
            assert connection.pass_body() is None
            await connection.feed(b"3\r\nabc\r\n0\r\n\r\n")
            await replied.wait()
            await connection.feed(head(10) + b"01")
            found.append(connection.unread_body())
            await connection.feed(b"23456789")

        return read

    async with one_connection(app, scripted) as client:
        assert (await client.reply())[2] == b"3"
        replied.set()
        assert (await client.reply())[2] == b"10"
    # h11 took the 2 bytes that came with the head as soon as it had the head: 8 are unread.
    assert found == [None, 8]


BODY = bytes(range(256)) * 1000  # 256,000 bytes


async def test_a_body_passed_past_h11_reaches_the_application_as_given_then_the_next() -> None:
    app = App()
    pieces = [BODY[:100_000], BODY[100_000:250_000], BODY[250_000:]]
    left: list[int] = []

    def passing(stream: trio.SocketStream) -> ReadRequests:
        async def read(connection: Connection) -> None:
            await connection.feed(head(len(BODY), "/passed"))
            body = connection.pass_body()
            assert body is not None
            for piece in pieces:
                left.append(body.remaining)
                await body.give(piece)
            assert body.remaining == 0 and not body.answered
            await body.end()
            assert connection.between_requests
            await plain(stream)(connection)

        return read

    async with one_connection(app, passing) as client:
        status, fields, body = await client.reply()
        assert (status, body) == (200, b"%d" % len(BODY))
        assert b"connection" not in fields  # kept alive
        await client.send(head(3, "/next") + b"abc")
        assert (await client.reply())[2] == b"3"
    assert left == [256_000, 156_000, 6_000]
    first, second = app.seen
    assert first.chunks == pieces and first.ended  # each piece as one message, as it was given
    assert second.chunks == [b"abc"]


async def test_a_body_cannot_be_given_more_than_it_has_left() -> None:
    app = App()
    refused: list[str] = []

    def passing(stream: trio.SocketStream) -> ReadRequests:
        async def read(connection: Connection) -> None:
            await connection.feed(head(4))
            body = connection.pass_body()
            assert body is not None
            with pytest.raises(ValueError) as error:
                await body.give(b"12345")
            refused.append(str(error.value))
            await body.give(b"1234")
            await body.end()
            await plain(stream)(connection)

        return read

    async with one_connection(app, passing) as client:
        assert (await client.reply())[2] == b"4"
    assert refused == ["5 bytes given with 4 left of the body"]


async def test_a_client_that_stops_halfway_through_a_passed_body_gets_h11s_400() -> None:
    app = App()

    def passing(stream: trio.SocketStream) -> ReadRequests:
        async def read(connection: Connection) -> None:
            await connection.feed(head(len(BODY)))
            body = connection.pass_body()
            assert body is not None
            await body.give(BODY[:1000])
            await connection.feed(b"")

        return read

    async with one_connection(app, passing) as client:
        status, fields, _ = await client.reply()
        assert (status, fields[b"connection"]) == (400, b"close")
        assert await client.closed()
    [seen] = app.seen
    assert seen.chunks == [BODY[:1000]] and seen.disconnected


async def test_a_body_answered_before_it_is_read_is_answered_and_the_connection_closed() -> None:
    app = App(answer_at_once=True)
    answered: list[bool] = []

    def passing(stream: trio.SocketStream) -> ReadRequests:
        async def read(connection: Connection) -> None:
            await connection.feed(head(len(BODY)))
            body = connection.pass_body()
            assert body is not None
            await connection.let_application_run()
            await trio.testing.wait_all_tasks_blocked()
            answered.append(body.answered)
            await plain(stream)(connection)

        return read

    async with one_connection(app, passing) as client:
        status, _, body = await client.reply()
        assert (status, body) == (200, b"0")
        assert await client.closed()
    assert answered == [True]


async def test_the_application_has_run_up_to_its_first_wait_when_let_run() -> None:
    app = App()
    ran: list[bool] = []

    def looking(stream: trio.SocketStream) -> ReadRequests:
        async def read(connection: Connection) -> None:
            await connection.feed(head(1))
            await connection.let_application_run()
            ran.append(len(app.seen) == 1)
            await plain(stream)(connection)

        return read

    # Trio runs tasks made runnable together in either order; many connections make a lucky
    # pass of a single one unlikely to hide a wrong wait.
    async with serving(app) as (worker, nursery):
        for _ in range(24):
            app.seen.clear()
            client = await serve_one(worker, nursery, looking)
            await client.send(b"x")
            assert (await client.reply())[2] == b"1"
    assert ran == [True] * 24


async def test_the_keep_alive_timeout_is_held_while_a_request_waits_and_restarted_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = serve_settings()
    settings.keep_alive_timeout = 5.0
    held = trio.Event()
    release = trio.Event()

    def waiting(stream: trio.SocketStream) -> ReadRequests:
        async def read(connection: Connection) -> None:
            await connection.hold_keep_alive()
            held.set()
            await release.wait()
            await connection.restart_keep_alive()
            await plain(stream)(connection)

        return read

    async with one_connection(App(), waiting, settings=settings) as client:
        await held.wait()
        with trio.move_on_after(60) as waited:
            await client.stream.receive_some(1)
        assert waited.cancelled_caught  # nothing came, and the connection is still open
        release.set()
        started = trio.current_time()
        assert await client.closed()
        assert trio.current_time() == started + 5.0


# --- serve's settings, as hypercorn reads them -------------------------------------------------


async def test_serve_settings_are_the_ones_hypercorn_applies() -> None:
    settings = serve_settings()
    assert settings.read_timeout is None  # a request waiting for its group is never cut off
    assert settings.h11_max_incomplete_size == 16 * 1024
    settings.keep_alive_max_requests = 2
    async with one_connection(App(), reader(), settings=settings) as client:
        # A head within h11's limit is served, one beyond it answered 431.
        await client.send(head(0, extra=b"x-pad: %s\r\n" % (b"p" * 12_000)))
        assert (await client.reply())[0] == 200
        await client.send(GET)
        status, fields, _ = await client.reply()
        assert status == 200 and fields[b"connection"] == b"close"  # the second of at most 2
        assert await client.closed()
    async with one_connection(App(), reader(), settings=serve_settings()) as client:
        # A head still incomplete after 16 KiB.
        await client.send(b"POST / HTTP/1.1\r\nhost: t\r\nx-pad: %s" % (b"p" * 20_000))
        assert (await client.reply())[0] == 431


# --- serve's read loop over the seam -------------------------------------------------------------


async def test_a_small_body_sent_with_its_head_reaches_the_application_in_one_piece() -> None:
    body = BODY[:100_000]
    assert len(body) <= GATHERED_BODY_BYTES
    app = App()
    # All of it in the kernel before the server reads: the turn gathers the body in one buffer
    # of its length, where plain reads of 32 KiB would hand it over in four pieces.
    async with one_connection(app, reader(), sent=head(len(body)) + body) as client:
        assert (await client.reply())[2] == b"100000"
    assert app.seen[0].chunks == [body]


@pytest.mark.parametrize(
    ("request_head", "needs_a_turn"),
    [
        (head(1000), True),
        (head(1000, extra=b"Content-Type: application/json\r\nX-Other: 1\r\n"), True),
        (head(GATHERED_BODY_BYTES + 1), False),
        (head(None), False),
        (GET, False),
    ],
    ids=["small", "small-after-other-fields", "large", "chunked", "no-body"],
)
async def test_the_length_a_head_declares_decides_whether_it_waits_for_a_turn(
    request_head: bytes, needs_a_turn: bool
) -> None:
    app = App()
    turns = trio.Semaphore(1)
    await turns.acquire()  # every turn taken
    async with one_connection(app, reader(turns=turns), sent=request_head) as client:
        await trio.testing.wait_all_tasks_blocked()
        assert len(app.seen) == (0 if needs_a_turn else 1)
        turns.release()
        await trio.testing.wait_all_tasks_blocked()
        assert len(app.seen) == 1
        await client.stream.aclose()


def shut_on_head(gate: ReadGate) -> Callable[[Seen], None]:
    """What the application does with a body that must wait: it shuts its connection's gate,
    which it finds in the request's scope."""

    def on_head(seen: Seen) -> None:
        found = ReadGates().of({"extensions": seen.extensions})  # type: ignore[typeddict-item]
        assert found is gate
        found.shut()

    return on_head


async def test_a_long_body_whose_gate_is_shut_stays_unread_until_it_opens() -> None:
    gate = ReadGate()
    app = App(shut_on_head(gate))
    body = BODY * 4  # 1,024,000 bytes: more than the kernel holds for a socket pair
    async with one_connection(app, reader(gate), ReadGates().extensions(gate)) as client:
        sent = trio.Event()

        async def send() -> None:
            await client.send(head(len(body)) + body)
            sent.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            await trio.testing.wait_all_tasks_blocked()
            [seen] = app.seen
            assert seen.chunks == [] and not gate.is_open
            assert not sent.is_set()  # the kernel's buffers are full: the client waits
            gate.open()
        assert (await client.reply())[2] == b"1024000"
    assert b"".join(seen.chunks) == body


async def test_a_small_body_whose_gate_is_shut_is_read_no_further_than_with_its_head() -> None:
    gate = ReadGate()
    app = App(shut_on_head(gate))
    body = BODY[:100_000]
    request = head(len(body)) + body
    async with one_connection(
        app, reader(gate), ReadGates().extensions(gate), sent=request
    ) as client:
        await trio.testing.wait_all_tasks_blocked()
        [seen] = app.seen
        # The first read took the head and the start of the body; the rest stays in the kernel.
        assert 0 < sum(len(chunk) for chunk in seen.chunks) < FIRST_READ_BYTES
        gate.open()
        assert (await client.reply())[2] == b"100000"
    assert b"".join(seen.chunks) == body


async def test_a_long_body_goes_past_h11_in_reads_of_what_the_kernel_holds() -> None:
    body = BODY[:150_000]
    assert len(body) > GATHERED_BODY_BYTES
    app = App()
    # All of it in the kernel before the server reads: the head is read alone and the body in
    # one read of what the kernel holds, handed over as it came; through h11, reads of 32, 64
    # and 128 KiB would hand it over in pieces.
    async with one_connection(app, reader(), sent=head(len(body)) + body) as client:
        assert (await client.reply())[2] == b"150000"
    assert app.seen[0].chunks == [body]


async def test_serves_read_loop_keeps_the_connection_after_long_bodies_for_the_next() -> None:
    app = App()
    async with one_connection(app, reader()) as client:
        for path in ("/first", "/second"):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.send, head(len(BODY), path) + BODY)
                status, fields, body = await client.reply()
            assert (status, body) == (200, b"256000") and b"connection" not in fields
        await client.send(GET + GET)
        assert [(await client.reply())[0] for _ in range(2)] == [200, 200]
    assert [b"".join(seen.chunks) == BODY for seen in app.seen[:2]] == [True, True]


async def test_a_client_that_stops_halfway_through_a_long_body_gets_a_400_from_serve() -> None:
    app = App()
    request = head(len(BODY)) + BODY[:50_000]
    async with one_connection(app, reader(), sent=request) as client:
        await client.stream.send_eof()
        status, fields, _ = await client.reply()
        assert (status, fields[b"connection"]) == (400, b"close")
    [seen] = app.seen
    assert seen.disconnected and b"".join(seen.chunks) == BODY[:50_000]


# --- nothing else reaches past the libraries' public faces ---------------------------------------

# What the package may import of each: hypercorn's settings, its ASGI types and its `serve`.
PUBLIC = {"hypercorn.config", "hypercorn.typing", "hypercorn.trio", "h11"}
SEAM = Path(genrm_trio.__file__).parent / "http" / "_hypercorn_seam.py"


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_only_the_seam_imports_hypercorn_or_h11_beyond_their_public_faces() -> None:
    reaching: dict[str, set[str]] = {}
    for path in Path(genrm_trio.__file__).parent.rglob("*.py"):
        beyond = {
            name
            for name in imported(path)
            if name.split(".")[0] in ("hypercorn", "h11") and name not in PUBLIC
        }
        if beyond:
            reaching[str(path.relative_to(SEAM.parents[2]))] = beyond
    assert list(reaching) == ["genrm_trio/http/_hypercorn_seam.py"]
