"""One set of behaviours every judge transport shows, run against each implementation (the idea of
trio.testing.check_two_way_stream): the network transport (judge/http11.py) against the fake
judge's real TCP server on loopback, the in-memory transport (fakes/memory_transport.py) and
the controlled judge's transport built on it, both under an autojump mock clock.

The fake judge's synchronous core decides every reply; a transport must carry out exactly what
it decided: the same status and body bytes for a reply, the same failure and text for a broken
connection, the same statistics on the judge's side for a caller that gives up. Framing cases
that only exist on a wire (chunked, gzip, 1xx, close-delimited, malformed) run against the
network transport with a scripted TCP server at the end of this file.
"""

from __future__ import annotations

import errno
import gzip
import json
import math
import os
import socket
import ssl
import struct
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing

from genrm_trio.fakes.judge import ACTIONS, FakeJudge, FakeReply, parse_latency
from genrm_trio.fakes.memory_transport import BodyReply, MemoryTransport
from genrm_trio.judge._requests import judge_headers
from genrm_trio.judge.http11 import Http11Transport
from genrm_trio.judge.transport import (
    CLOSED_BEFORE_REPLY,
    CLOSED_IN_CHUNKED_BODY,
    ConnectError,
    ConnectTimedOut,
    JudgeEndpoint,
    JudgeReply,
    JudgeTransport,
    ReadError,
    RemoteProtocolError,
    ReplyDecodingFailed,
    RequestInvalid,
    closed_in_body,
    describe,
)
from genrm_trio.testing import serve_fake_judge, wait_for_stats
from genrm_trio.testing.controlled_judge import ControlledJudge

PATH = "/v1/chat/completions"
BODY = json.dumps(
    {
        "model": "fake-judge",
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "response_1", "content": "answer-0 [[q=4]]"},
            {"role": "response_2", "content": "answer-1 [[q=2]]"},
        ],
    }
).encode()
# Fields for the actions that need some (the others need none).
ACTION_FIELDS: dict[str, dict[str, Any]] = {
    "verdict": {"score_1": 4, "score_2": 2, "ranking": 1},
    "text": {"text": "I prefer the first one."},
    "finish": {"value": "content_filter"},
    "http_status": {"status": 503, "retry_after": 2},
    "raw": {"body": "not { json", "status": 202, "content_type": "text/plain"},
}
SAFETY_S = 10.0  # bounds waits on the judge's side over TCP; never reached when all is well


# --------------------------------------------------------------------------------------------
# The implementations


@dataclass
class Setup:
    """A fake judge and a way to build transports to it."""

    kind: str
    judge: FakeJudge
    url: str
    make: Callable[[JudgeEndpoint], JudgeTransport]
    sockets: list[trio.SocketStream] | None = None  # every TCP connection really opened

    def connections(self, transport: JudgeTransport) -> int:
        """Connections the transport opened: its own count, which over a network must match
        the sockets really opened."""
        count = transport.statistics().connections_opened
        if self.sockets is not None:
            assert count == len(self.sockets)
        return count

    def sockets_open(self) -> int:
        return sum(1 for stream in self.sockets or () if stream.socket.fileno() != -1)

    def transport(self, *, timeout_s: float = 5.0, api_key: str | None = None) -> JudgeTransport:
        return self.make(JudgeEndpoint(self.url, judge_headers(api_key), timeout_s))

    async def judge_settles(self, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The judge's stats once ``done`` holds; over TCP the judge learns of a caller going
        away only when the closed socket reaches it."""
        with trio.fail_after(SAFETY_S):
            return await wait_for_stats(self.judge, done)


KINDS = ["network", "memory", "controlled"]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clock(kind: str) -> trio.abc.Clock | None:
    """pytest-trio runs a test under any Clock among its arguments: the in-memory transports
    get the autojump clock, the network one real time."""
    return None if kind == "network" else trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture
async def setup(
    kind: str, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Setup]:
    if kind == "network":
        judge = FakeJudge()
        port = await nursery.start(serve_fake_judge, judge, "127.0.0.1", 0)
        sockets: list[trio.SocketStream] = []
        real_open = trio.open_tcp_stream

        async def open_and_count(*args: Any, **kwargs: Any) -> trio.SocketStream:
            stream = await real_open(*args, **kwargs)
            sockets.append(stream)
            return stream

        monkeypatch.setattr(trio, "open_tcp_stream", open_and_count)
        yield Setup(kind, judge, f"http://127.0.0.1:{port}{PATH}", Http11Transport, sockets)
    elif kind == "memory":
        judge = FakeJudge()
        yield Setup(kind, judge, f"http://fake-judge{PATH}", judge.transport())
    else:
        controlled = ControlledJudge()
        yield Setup(kind, controlled, f"http://fake-judge{PATH}", controlled.transport())


async def read_all(reply: JudgeReply, limit: int = 1 << 24) -> bytes:
    chunks: list[bytes] = []
    assert await reply.read_at_most(limit, chunks)
    return b"".join(chunks)


async def exchange(transport: JudgeTransport, body: bytes = BODY) -> tuple[JudgeReply, bytes]:
    """One request read in full and released."""
    reply = await transport.send(body)
    try:
        return reply, await read_all(reply)
    finally:
        await reply.release()


def decided(judge: FakeJudge, body: bytes = BODY) -> FakeReply:
    """What a twin of ``judge`` (same rules, fresh state) decides for ``body``."""
    twin = FakeJudge(rules=judge.rules)
    return twin.handle("POST", PATH, [], body, now=0.0)


# --------------------------------------------------------------------------------------------
# Replies and every fake-judge action


async def test_a_verdict_reply_is_the_judges_decision(
    setup: Setup, clock: trio.abc.Clock | None
) -> None:
    transport = setup.transport()
    reply, body = await exchange(transport)
    expected = decided(setup.judge)
    assert (reply.status, body) == (expected.status, expected.body)
    assert reply.header(b"content-type") == b"application/json"
    assert reply.header(b"content-length") == str(len(body)).encode()
    assert json.loads(body)["choices"][0]["message"]["content"].endswith(
        '```json\n{"score_1": 4, "score_2": 2, "ranking": 1}\n```'
    )
    recorded = setup.judge.requests(1)[0]
    assert recorded["body"] == json.loads(BODY)
    assert set(recorded["headers"]) == {
        "host",
        "content-length",
        "content-type",
        "accept",
        "user-agent",
    }
    await transport.aclose()


@pytest.mark.parametrize(
    "action", [a for a in ACTIONS if a not in ("truncated_body", "close", "hang")]
)
async def test_every_replying_action_arrives_as_decided(
    setup: Setup, clock: trio.abc.Clock | None, action: str
) -> None:
    setup.judge.set_rules([{"action": action, **ACTION_FIELDS.get(action, {})}])
    expected = decided(setup.judge)
    transport = setup.transport()
    reply, body = await exchange(transport)
    assert (reply.status, body) == (expected.status, expected.body)
    for name, value in expected.headers:
        assert reply.header(name.encode()) == value.encode()
    assert setup.judge.stats()["by_action"] == {action: 1}
    # Read in full, so the connection is kept: the next call reuses it.
    await exchange(transport)
    assert setup.connections(transport) == 1
    await transport.aclose()


async def test_truncated_body_breaks_the_read_after_half_the_body(
    setup: Setup, clock: trio.abc.Clock | None
) -> None:
    setup.judge.set_rules([{"action": "truncated_body", "times": 1}])
    expected = decided(setup.judge)
    transport = setup.transport()
    reply = await transport.send(BODY)
    assert reply.status == 200
    assert reply.header(b"content-length") == str(len(expected.body)).encode()
    chunks: list[bytes] = []
    with pytest.raises(RemoteProtocolError) as caught:
        await reply.read_at_most(1 << 20, chunks)
    await reply.release()
    assert str(caught.value) == closed_in_body(expected.sent_bytes, len(expected.body))
    assert b"".join(chunks) == expected.body[: expected.sent_bytes]
    # The broken connection is never reused.
    await exchange(transport)
    assert setup.connections(transport) == 2
    stats = await setup.judge_settles(lambda s: s["in_flight"] == 0)
    assert stats["cancelled"] == 0
    await transport.aclose()


async def test_close_fails_the_send_as_closed_before_replying(
    setup: Setup, clock: trio.abc.Clock | None
) -> None:
    setup.judge.set_rules([{"action": "close", "times": 1}])
    transport = setup.transport()
    with pytest.raises(RemoteProtocolError) as caught:
        await transport.send(BODY)
    assert str(caught.value) == CLOSED_BEFORE_REPLY
    await exchange(transport)
    assert setup.connections(transport) == 2
    stats = await setup.judge_settles(lambda s: s["in_flight"] == 0)
    assert stats["cancelled"] == 0
    assert stats["by_action"] == {"close": 1, "verdict": 1}
    await transport.aclose()


async def test_hang_lasts_until_the_caller_gives_up(
    setup: Setup, clock: trio.abc.Clock | None
) -> None:
    setup.judge.set_rules([{"action": "hang", "times": 1}])
    transport = setup.transport()
    started = trio.current_time()
    with trio.move_on_after(0.3) as scope:
        await transport.send(BODY)
    assert scope.cancelled_caught
    assert trio.current_time() - started == pytest.approx(0.3, abs=0.2 if clock is None else 0)
    stats = await setup.judge_settles(lambda s: s["cancelled"] == 1)
    assert stats["in_flight"] == 0
    await exchange(transport)  # a fresh connection answers
    assert setup.connections(transport) == 2
    await transport.aclose()


async def test_an_error_status_read_in_full_keeps_the_connection(
    setup: Setup, clock: trio.abc.Clock | None
) -> None:
    setup.judge.set_rules([{"action": "http_status", "status": 500, "times": 2}])
    transport = setup.transport()
    for _ in range(2):
        reply, body = await exchange(transport)
        assert (reply.status, body) == (500, b'{"error":"injected"}')
    reply, _ = await exchange(transport)
    assert reply.status == 200
    assert setup.connections(transport) == 1
    await transport.aclose()


async def test_a_wrong_api_key_is_the_judges_401(
    setup: Setup, clock: trio.abc.Clock | None
) -> None:
    setup.judge.api_key = "sk-right"
    transport = setup.transport(api_key="sk-wrong")
    reply, body = await exchange(transport)
    assert reply.status == 401
    assert b"missing or wrong API key" in body
    right = setup.transport(api_key="sk-right")
    assert (await exchange(right))[0].status == 200
    assert setup.judge.requests(1)[0]["headers"]["authorization"] == "<redacted>"
    await transport.aclose()
    await right.aclose()


# --------------------------------------------------------------------------------------------
# Deadlines and cancellation (the caller's cancel scopes)


async def test_latency_inside_the_deadline_is_waited_out(
    setup: Setup, clock: trio.abc.Clock | None
) -> None:
    setup.judge.latency = parse_latency("fixed:0.2")
    transport = setup.transport()
    started = trio.current_time()
    with trio.fail_after(1.0):
        reply, _ = await exchange(transport)
    assert reply.status == 200
    elapsed = trio.current_time() - started
    if clock is None:
        assert 0.2 <= elapsed < 1.0
    else:
        assert elapsed == pytest.approx(0.2, abs=1e-9)
    await transport.aclose()


async def test_a_deadline_during_latency_cancels_the_call(
    setup: Setup, clock: trio.abc.Clock | None
) -> None:
    setup.judge.latency = parse_latency("fixed:5.0")
    transport = setup.transport()
    with trio.move_on_after(0.2) as scope:
        await transport.send(BODY)
    assert scope.cancelled_caught
    stats = await setup.judge_settles(lambda s: s["in_flight"] == 0)
    assert stats["cancelled"] == 1
    assert transport.statistics().idle_connections == 0
    await transport.aclose()


async def test_a_deadline_while_reading_the_body_drops_the_connection(
    setup: Setup, clock: trio.abc.Clock | None
) -> None:
    transport = setup.transport()
    reply = await transport.send(BODY)
    with trio.CancelScope() as scope:
        scope.cancel()
        await reply.read_at_most(1 << 20, [])
    assert scope.cancelled_caught
    await reply.release()
    assert transport.statistics().idle_connections == 0
    await exchange(transport)
    assert setup.connections(transport) == 2
    await transport.aclose()


async def test_a_reply_released_unread_is_not_reused(
    setup: Setup, clock: trio.abc.Clock | None
) -> None:
    transport = setup.transport()
    reply = await transport.send(BODY)
    await reply.release()
    await exchange(transport)
    assert setup.connections(transport) == 2
    await transport.aclose()


# --------------------------------------------------------------------------------------------
# Pool reuse


async def test_sequential_calls_reuse_one_connection(
    setup: Setup, clock: trio.abc.Clock | None
) -> None:
    transport = setup.transport()
    for _ in range(5):
        reply, _ = await exchange(transport)
        assert reply.status == 200
    assert setup.connections(transport) == 1
    assert transport.statistics().idle_connections == 1
    await transport.aclose()
    assert transport.statistics().idle_connections == 0
    assert setup.sockets_open() == 0
    with pytest.raises(RuntimeError):
        await transport.send(BODY)


async def test_concurrent_calls_open_one_connection_each_then_reuse_them(
    setup: Setup, clock: trio.abc.Clock | None
) -> None:
    setup.judge.latency = parse_latency("fixed:0.05")
    transport = setup.transport()
    for _ in range(2):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(exchange, transport)
    assert setup.judge.stats()["max_in_flight"] == 4
    assert setup.judge.stats()["requests_total"] == 8
    assert setup.connections(transport) == 4
    assert transport.statistics().idle_connections == 4
    await transport.aclose()


# --------------------------------------------------------------------------------------------
# Content-Encoding, decoded once for every transport (judge/transport.py)

PLAIN = b'{"choices": []}' * 50


def _deflate(data: bytes, wbits: int) -> bytes:
    compressor = zlib.compressobj(wbits=wbits)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("encoding", "encoded"),
    [
        ("gzip", gzip.compress(PLAIN)),
        ("x-gzip", gzip.compress(PLAIN)),
        ("deflate", _deflate(PLAIN, zlib.MAX_WBITS)),
        ("deflate", _deflate(PLAIN, -zlib.MAX_WBITS)),
        ("identity", PLAIN),
        ("gzip, identity", gzip.compress(PLAIN)),
        ("deflate, gzip", gzip.compress(_deflate(PLAIN, zlib.MAX_WBITS))),
    ],
)
async def test_content_encodings_are_decoded(encoding: str, encoded: bytes) -> None:
    parts = [encoded[i : i + 7] for i in range(0, len(encoded), 7)]
    reply = BodyReply(200, [("content-encoding", encoding)], parts)
    assert await read_all(reply) == PLAIN


@pytest.mark.parametrize(
    ("encoding", "encoded", "text"),
    [
        ("br", b"\x0b\x02\x80", "unsupported Content-Encoding 'br'"),
        ("gzip", b"not gzip at all", "gzip body does not decode"),
        ("gzip", gzip.compress(PLAIN)[:-12], "gzip body ends inside its compressed stream"),
    ],
)
async def test_undecodable_bodies_fail_as_decoding_errors(
    encoding: str, encoded: bytes, text: str
) -> None:
    reply = BodyReply(200, [("content-encoding", encoding)], [encoded])
    with pytest.raises(ReplyDecodingFailed, match=text):
        await reply.read_at_most(1 << 20, [])


async def test_a_compressed_body_is_bounded_after_decoding() -> None:
    bomb = gzip.compress(b" " * (10 << 20))
    reply = BodyReply(200, [("content-encoding", "gzip")], [bomb])
    chunks: list[bytes] = []
    assert not await reply.read_at_most(1 << 20, chunks)
    assert sum(map(len, chunks)) == (1 << 20) + 1


# --------------------------------------------------------------------------------------------
# The network transport only: connecting, and framing against a scripted TCP judge


async def test_a_closed_port_is_connect_failed_in_the_os_words() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    transport = Http11Transport(JudgeEndpoint(f"http://127.0.0.1:{port}{PATH}", {}, 1.0))
    with pytest.raises(ConnectError) as caught:
        await transport.send(BODY)
    assert str(caught.value) == f"cannot connect to 127.0.0.1:{port}: Connection refused"


async def test_a_judge_that_never_accepts_is_connect_timed_out() -> None:
    # A listening socket with a full backlog: the handshake never completes.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        transport = Http11Transport(JudgeEndpoint(f"http://127.0.0.1:{port}{PATH}", {}, 0.2))
        try:
            for _ in range(8):
                filler = socket.socket()
                filler.setblocking(False)
                fillers.append(filler)
                try:
                    filler.connect(("127.0.0.1", port))
                except BlockingIOError:
                    pass
            with pytest.raises(ConnectTimedOut) as caught:
                await transport.send(BODY)
        finally:
            for filler in fillers:
                filler.close()
    assert str(caught.value) == f"no connection to 127.0.0.1:{port} within 0.2s"


async def test_a_header_value_with_a_line_break_is_never_sent() -> None:
    endpoint = JudgeEndpoint("http://127.0.0.1:9/v1/chat", {"Authorization": "Bearer a\r\nb"}, 1)
    with pytest.raises(RequestInvalid, match="Authorization"):
        await Http11Transport(endpoint).send(BODY)


Script = Callable[[bytes], bytes]


@dataclass
class ScriptedJudge:
    """A TCP judge answering the n-th request with replies[n](request bytes), closing the
    connection after a reply when ``close`` says so; keeps every request's head."""

    replies: list[Script]
    close_after: bool = False
    heads: list[bytes] | None = None

    async def serve(self, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        self.heads = []
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        assert self.heads is not None
        buffer = b""
        async with stream:
            while len(self.heads) < len(self.replies):
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(buffer) < length:
                    buffer += await stream.receive_some(65536)
                buffer = buffer[length:]
                self.heads.append(head)
                await stream.send_all(self.replies[len(self.heads) - 1](head))
                if self.close_after:
                    return


def chunked(body: bytes, size: int = 7) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def head(*lines: bytes, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 " + status + b"\r\n" + b"".join(line + b"\r\n" for line in lines) + b"\r\n"


REPLY = b'{"ok": true}' * 20
LENGTH = b"content-length: %d" % len(REPLY)
# framing -> (reply bytes, close after it, expected body, reusable)
FRAMINGS: dict[str, tuple[bytes, bool, bytes, bool]] = {
    "content-length": (head(LENGTH) + REPLY, False, REPLY, True),
    "chunked": (head(b"transfer-encoding: chunked") + chunked(REPLY), False, REPLY, True),
    "chunked with extensions and trailers": (
        head(b"Transfer-Encoding: chunked")
        + b"5;name=value\r\n"
        + REPLY[:5]
        + b"\r\n%x\r\n" % (len(REPLY) - 5)
        + REPLY[5:]
        + b"\r\n0\r\nx-trailer: 1\r\n\r\n",
        False,
        REPLY,
        True,
    ),
    "gzip": (
        head(b"content-encoding: gzip", b"content-length: %d" % len(gzip.compress(REPLY)))
        + gzip.compress(REPLY),
        False,
        REPLY,
        True,
    ),
    "gzip chunked": (
        head(b"content-encoding: gzip", b"transfer-encoding: chunked")
        + chunked(gzip.compress(REPLY)),
        False,
        REPLY,
        True,
    ),
    "1xx before the reply": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"
        + head(LENGTH)
        + REPLY,
        False,
        REPLY,
        True,
    ),
    "close-delimited": (head(b"connection: close") + REPLY, True, REPLY, False),
    "HTTP/1.0": (b"HTTP/1.0 200 OK\r\n" + LENGTH + b"\r\n\r\n" + REPLY, False, REPLY, False),
    "connection: close with length": (
        head(LENGTH, b"Connection: keep-alive, close") + REPLY,
        True,
        REPLY,
        False,
    ),
    "204 without a body": (head(status=b"204 No Content"), False, b"", True),
    "status line without a reason": (
        b"HTTP/1.1 200\r\n" + LENGTH + b"\r\n\r\n" + REPLY,
        False,
        REPLY,
        True,
    ),
    "repeated equal content-length": (
        head(LENGTH + b", %d" % len(REPLY)) + REPLY,
        False,
        REPLY,
        True,
    ),
}


@pytest.mark.parametrize("framing", list(FRAMINGS))
async def test_reply_framings_are_read_whole(framing: str, nursery: trio.Nursery) -> None:
    reply_bytes, close, expected, reusable = FRAMINGS[framing]
    judge = ScriptedJudge([lambda _: reply_bytes] * 2, close_after=close)
    port = await nursery.start(judge.serve)
    transport = Http11Transport(JudgeEndpoint(f"http://127.0.0.1:{port}{PATH}", {}, 5.0))
    for _ in range(2):
        _, body = await exchange(transport)
        assert body == expected
    assert transport.statistics().connections_opened == (1 if reusable else 2)
    await transport.aclose()


CUT = head(b"transfer-encoding: chunked") + chunked(REPLY)[:40]
# failure -> (reply bytes, error type, exact text or None, raised by send rather than the read)
BROKEN: dict[str, tuple[bytes, type[Exception], str | None, bool]] = {
    "content-length cut short": (
        head(LENGTH) + REPLY[:50],
        RemoteProtocolError,
        closed_in_body(50, len(REPLY)),
        False,
    ),
    "chunked cut short": (CUT, RemoteProtocolError, CLOSED_IN_CHUNKED_BODY, False),
    "closed before replying": (b"", RemoteProtocolError, CLOSED_BEFORE_REPLY, True),
    "head cut short": (
        b"HTTP/1.1 200 OK\r\ncontent-le",
        RemoteProtocolError,
        CLOSED_BEFORE_REPLY,
        True,
    ),
    "not HTTP": (b"SSH-2.0-OpenSSH\r\n\r\n", RemoteProtocolError, None, True),
    "bad header line": (
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        RemoteProtocolError,
        None,
        True,
    ),
    "101": (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", RemoteProtocolError, None, True),
    "unknown transfer-encoding": (
        head(b"transfer-encoding: gzip"),
        RemoteProtocolError,
        None,
        True,
    ),
    "conflicting content-length": (head(b"content-length: 5, 6"), RemoteProtocolError, None, True),
    "bad chunk size": (
        head(b"transfer-encoding: chunked") + b"zz\r\n",
        RemoteProtocolError,
        None,
        False,
    ),
    "chunk without CRLF": (
        head(b"transfer-encoding: chunked") + b"2\r\nabXY",
        RemoteProtocolError,
        None,
        False,
    ),
    "unknown content-encoding": (
        head(b"content-encoding: br", LENGTH) + REPLY,
        ReplyDecodingFailed,
        "unsupported Content-Encoding 'br'",
        False,
    ),
    "endless head": (b"HTTP/1.1 200 OK\r\nx: " + b"y" * 70_000, RemoteProtocolError, None, True),
    "endless chunk size line": (
        head(b"transfer-encoding: chunked") + b"1" * 70_000,
        RemoteProtocolError,
        None,
        False,
    ),
    "endless trailers": (
        head(b"transfer-encoding: chunked") + b"0\r\nx-trailer: " + b"y" * 70_000,
        RemoteProtocolError,
        None,
        False,
    ),
}


@pytest.mark.parametrize("failure", list(BROKEN))
async def test_broken_replies_fail_with_the_projects_errors(
    failure: str, nursery: trio.Nursery
) -> None:
    reply_bytes, error, text, at_send = BROKEN[failure]
    valid = head(LENGTH) + REPLY
    judge = ScriptedJudge([lambda _: reply_bytes, lambda _: valid], close_after=True)
    port = await nursery.start(judge.serve)
    transport = Http11Transport(JudgeEndpoint(f"http://127.0.0.1:{port}{PATH}", {}, 5.0))
    with pytest.raises(error) as caught:
        if at_send:
            await transport.send(BODY)
        else:
            await exchange(transport)
    assert isinstance(caught.value, RemoteProtocolError | ReplyDecodingFailed | ReadError)
    if text is not None:
        assert str(caught.value) == text
    else:
        assert str(caught.value).startswith("malformed reply: ")
    _, body = await exchange(transport)
    assert body == REPLY
    await transport.aclose()


async def test_a_connection_reset_mid_reply_is_read_failed(nursery: trio.Nursery) -> None:
    async def reset_after_half_a_head(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-le")
        # Linger 0: closing sends a reset instead of an orderly end of stream.
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    nursery.start_soon(trio.serve_listeners, reset_after_half_a_head, listeners)
    transport = Http11Transport(JudgeEndpoint(f"http://127.0.0.1:{port}{PATH}", {}, 5.0))
    with pytest.raises(ReadError) as caught:
        await transport.send(BODY)
    assert str(caught.value) == "connection to the judge broken: " + os.strerror(errno.ECONNRESET)
    await transport.aclose()


async def test_tls_to_a_plain_http_port_is_connect_failed_naming_the_tls_error(
    nursery: trio.Nursery,
) -> None:
    port = await nursery.start(serve_fake_judge, FakeJudge(), "127.0.0.1", 0)
    transport = Http11Transport(JudgeEndpoint(f"https://127.0.0.1:{port}{PATH}", {}, 5.0))
    with pytest.raises(ConnectError) as caught:
        await transport.send(BODY)
    assert str(caught.value).startswith(f"cannot connect to 127.0.0.1:{port}: SSLError: [SSL")
    await transport.aclose()


async def test_the_request_head_is_exactly_the_endpoints(nursery: trio.Nursery) -> None:
    # J-8: only our headers, and nothing a judge sets (a cookie) comes back on the next request.
    cookie = head(LENGTH, b"set-cookie: session=1; Path=/") + REPLY
    judge = ScriptedJudge([lambda _: cookie] * 2)
    port = await nursery.start(judge.serve)
    headers = judge_headers("sk-k")
    transport = Http11Transport(JudgeEndpoint(f"http://127.0.0.1:{port}/v1/chat?x=1", headers, 5))
    await exchange(transport)
    await exchange(transport)
    await transport.aclose()
    assert judge.heads is not None
    for sent in judge.heads:
        lines = sent.split(b"\r\n")
        assert lines[0] == b"POST /v1/chat?x=1 HTTP/1.1"
        assert sorted(line.split(b":")[0].lower() for line in lines[1:]) == sorted(
            [
                b"host",
                b"content-type",
                b"accept",
                b"user-agent",
                b"authorization",
                b"content-length",
            ]
        )
        assert f"Host: 127.0.0.1:{port}".encode() in lines
        assert b"Authorization: Bearer sk-k" in lines
        assert b"Content-Length: %d" % len(BODY) in lines


async def test_connect_to_reaches_another_address_under_the_judges_name(
    nursery: trio.Nursery,
) -> None:
    judge = FakeJudge()
    port = await nursery.start(serve_fake_judge, judge, "127.0.0.1", 0)
    endpoint = JudgeEndpoint(f"http://fake-judge{PATH}", {}, 5.0)
    transport = Http11Transport(endpoint, connect_to=("127.0.0.1", port))
    reply, _ = await exchange(transport)
    assert reply.status == 200
    assert judge.requests(1)[0]["headers"]["host"] == "fake-judge"
    await transport.aclose()


async def test_idle_connections_past_their_expiry_are_not_reused(nursery: trio.Nursery) -> None:
    judge = FakeJudge()
    port = await nursery.start(serve_fake_judge, judge, "127.0.0.1", 0)
    endpoint = JudgeEndpoint(f"http://127.0.0.1:{port}{PATH}", {}, 5.0)
    transport = Http11Transport(endpoint, keepalive_expiry_s=0.05)
    await exchange(transport)
    await trio.sleep(0.1)
    await exchange(transport)
    assert transport.statistics().connections_opened == 2
    transport = Http11Transport(endpoint, keepalive_expiry_s=math.inf)
    for _ in range(3):
        await exchange(transport)
    assert transport.statistics().connections_opened == 1
    await transport.aclose()


async def test_memory_transport_records_what_the_network_would_send() -> None:
    judge = FakeJudge()
    transport = MemoryTransport(judge, JudgeEndpoint(f"http://judge:8000{PATH}?q=1", {}, 1.0))
    await exchange(transport)
    recorded = judge.requests(1)[0]
    assert (recorded["path"], recorded["headers"]) == (
        PATH,
        {"host": "judge:8000", "content-length": str(len(BODY))},
    )


# --------------------------------------------------------------------------------------------
# How backend failures are worded (judge/transport.py's describe)


def _caused(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


REFUSED = os.strerror(errno.ECONNREFUSED)


@pytest.mark.parametrize(
    ("failure", "words"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "Error connecting to 127.0.0.1:9"), REFUSED),
        (
            _caused(
                OSError("all attempts to connect to 127.0.0.1:9 failed"),
                ExceptionGroup("attempts", [ConnectionRefusedError(errno.ECONNREFUSED, "x")]),
            ),
            REFUSED,
        ),
        (
            _caused(trio.BrokenResourceError(), ConnectionResetError(errno.ECONNRESET, "x")),
            os.strerror(errno.ECONNRESET),
        ),
        (
            socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
            "Name or service not known",
        ),
        (
            _caused(trio.BrokenResourceError(), ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] v")),
            "SSLError: [SSL: WRONG_VERSION_NUMBER] v",
        ),
        (trio.BrokenResourceError("stream closed"), "stream closed"),
        (trio.BrokenResourceError(), "BrokenResourceError"),
    ],
)
def test_backend_failures_are_described_in_a_few_words(failure: BaseException, words: str) -> None:
    assert describe(failure) == words
