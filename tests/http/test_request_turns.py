"""How `serve` reads requests. In turns: at most a few connections at once read a request's head
and its (small) body, so that a whole step posted at once does not leave every connection's read
buffers in the heap. A larger body of declared length goes from the socket to the application in
large reads, past h11's buffer. A connection waiting for its turn, a client sending slowly or
leaving halfway, changes nothing else a client sees. Driven over real loopback sockets through
`serve`'s own loops."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio

from genrm_trio.config import config_from_mapping
from genrm_trio.http._read_loop import GATHERED_BODY_BYTES
from genrm_trio.http.app import GenRMApp, create_app
from genrm_trio.http.read_gates import ReadGates
from genrm_trio.http.serving import ConnectionGate, serve_app
from genrm_trio.serve import hypercorn_settings
from genrm_trio.testing import FakeJudge
from genrm_trio.testing.harness import SCENARIO_DEFAULTS, member, running_server

GROUP = 4


def head(length: int, *, extra: bytes = b"") -> bytes:
    return (
        b"POST /verify HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n%s\r\n" % (length, extra)
    )


async def read_reply(stream: trio.SocketStream) -> tuple[bytes, bytes]:
    """(status line, body) of the next reply on ``stream``; a 100 Continue is skipped."""
    data = b""
    while True:
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            assert chunk, "closed before the reply"
            data += chunk
        head_, _, data = data.partition(b"\r\n\r\n")
        if not head_.startswith(b"HTTP/1.1 100"):
            break
    length = int(
        next(h for h in head_.split(b"\r\n") if h.lower().startswith(b"content-length"))[15:]
    )
    while len(data) < length:
        chunk = await stream.receive_some(1 << 20)
        assert chunk, "closed inside the reply"
        data += chunk
    return head_.split(b"\r\n", 1)[0], data


@asynccontextmanager
async def serving(
    turns: trio.Semaphore, *, keep_alive_s: float | None = None, **overrides: Any
) -> AsyncIterator[tuple[GenRMApp, int]]:
    config = config_from_mapping(
        {**SCENARIO_DEFAULTS, "num_rollouts_per_prompt": GROUP, "port": 0, **overrides}
    )
    read_gates = ReadGates()
    app = create_app(config, judge_transport=FakeJudge().transport(), read_gates=read_gates)
    settings = hypercorn_settings(config)
    settings.bind = ["127.0.0.1:0"]
    if keep_alive_s is not None:
        settings.keep_alive_timeout = keep_alive_s
    gate = ConnectionGate(capacity=512, open_file_limit=1024, rejecting_slots=4)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_app(
                app,
                settings,
                gate,
                shutdown_trigger=stop.wait,
                read_gates=read_gates,
                turns=turns,
                task_status=task_status,
            )
        )
        try:
            yield app, int(binds[0].rsplit(":", 1)[1])
        finally:
            stop.set()


def bodies(groups: int, tokens: int = 2_000) -> list[bytes]:
    out = []
    for g in range(groups):
        for i in range(GROUP):
            body = member(i, q=1 + i, g=f"g{g}")
            body["response"]["generation_token_ids"] = list(range(i, tokens + i))
            out.append(msgspec.json.encode(body))
    return out


async def expected_rows(posted: list[bytes]) -> list[bytes]:
    async with running_server(num_rollouts_per_prompt=GROUP) as server:
        rows: list[bytes] = [b""] * len(posted)

        async def one(index: int) -> None:
            rows[index] = (await server.verify(posted[index])).raw

        async with trio.open_nursery() as nursery:
            for index in range(len(posted)):
                nursery.start_soon(one, index)
    return rows


async def post_each(port: int, posted: list[bytes]) -> list[bytes]:
    """Each body on a fresh connection, all at once; the rows in the order posted."""
    rows: list[bytes] = [b""] * len(posted)

    async def post(index: int) -> None:
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(head(len(posted[index])) + posted[index])
            status, rows[index] = await read_reply(stream)
            assert status.startswith(b"HTTP/1.1 200")

    async with trio.open_nursery() as nursery:
        for index in range(len(posted)):
            nursery.start_soon(post, index)
    return rows


async def test_more_requests_at_once_than_turns_are_all_read_and_answered_right() -> None:
    posted = bodies(4)
    expected = await expected_rows(posted)
    async with serving(trio.Semaphore(2)) as (_, port):
        rows = await post_each(port, posted)
    assert rows == expected


async def send_in_some_way(stream: trio.SocketStream, body: bytes, way: int) -> None:
    """A whole request, sent in one of four ways a client may send it."""
    if way == 0:
        # The head alone, then the body in pieces with pauses between them.
        await stream.send_all(head(len(body)))
        half = len(body) // 2
        for piece in (body[:1000], body[1000:half], body[half:]):
            await trio.sleep(0.05)
            await stream.send_all(piece)
    elif way == 1:
        # The head with the start of the body, then the rest later.
        await stream.send_all(head(len(body)) + body[:40_000])
        await trio.sleep(0.05)
        await stream.send_all(body[40_000:])
    elif way == 2:
        # The client asks before it sends its body.
        await stream.send_all(head(len(body), extra=b"expect: 100-continue\r\n"))
        line = await stream.receive_some(65536)
        assert line.startswith(b"HTTP/1.1 100"), line
        await stream.send_all(body)
    else:
        await stream.send_all(head(len(body)) + body)


async def test_a_body_sent_slowly_in_pieces_gets_the_row_it_gets_sent_at_once() -> None:
    posted = bodies(1, tokens=20_000)  # 100 KB: read whole when it arrives at once
    expected = await expected_rows(posted)
    async with serving(trio.Semaphore(1)) as (_, port):
        rows: list[bytes] = [b""] * len(posted)

        async def post(index: int) -> None:
            async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                await send_in_some_way(stream, posted[index], index)
                status, rows[index] = await read_reply(stream)
                assert status.startswith(b"HTTP/1.1 200")

        async with trio.open_nursery() as nursery:
            for index in range(len(posted)):
                nursery.start_soon(post, index)
    assert rows == expected


async def test_a_request_waiting_for_its_turn_is_not_closed_by_the_keep_alive_timeout() -> None:
    posted = bodies(1)
    expected = await expected_rows(posted)
    turns = trio.Semaphore(1)
    async with serving(turns, keep_alive_s=0.2) as (_, port):
        rows: list[bytes] = [b""] * len(posted)
        await turns.acquire()  # no connection may read a request yet
        sent = 0

        async def post(index: int) -> None:
            nonlocal sent
            async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                await stream.send_all(head(len(posted[index])) + posted[index])
                sent += 1
                status, rows[index] = await read_reply(stream)
                assert status.startswith(b"HTTP/1.1 200")

        async with trio.open_nursery() as nursery:
            for index in range(len(posted)):
                nursery.start_soon(post, index)
            while sent < len(posted):  # noqa: ASYNC110
                await trio.sleep(0.01)
            await trio.sleep(0.5)  # longer than the keep-alive timeout
            turns.release()
    assert rows == expected


async def test_a_pipelined_request_after_a_whole_one_is_answered_in_order() -> None:
    posted = bodies(1)
    expected = await expected_rows(posted)
    async with serving(trio.Semaphore(1)) as (_, port):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            health = b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n"
            await stream.send_all(health + health)
            for _ in range(2):
                status, _body = await read_reply(stream)
                assert status.startswith(b"HTTP/1.1 200")
        rows = await post_each(port, posted)
    assert rows == expected


# Bodies of about 500 KB: larger than a turn gathers, so each is passed to the application past h11.
LARGE_TOKENS = 80_000


async def test_large_bodies_sent_in_any_way_on_kept_alive_connections_get_the_right_rows() -> None:
    posted = bodies(2, tokens=LARGE_TOKENS)
    assert min(len(body) for body in posted) > GATHERED_BODY_BYTES
    expected = await expected_rows(posted)
    async with serving(trio.Semaphore(2)) as (_, port):
        rows: list[bytes] = [b""] * len(posted)

        async def client(slot: int) -> None:
            # One connection per slot, posting its member of the first group, then of the second.
            async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                for group in range(2):
                    index = group * GROUP + slot
                    await send_in_some_way(stream, posted[index], (slot + group) % GROUP)
                    status, rows[index] = await read_reply(stream)
                    assert status.startswith(b"HTTP/1.1 200")

        async with trio.open_nursery() as nursery:
            for slot in range(GROUP):
                nursery.start_soon(client, slot)
    assert rows == expected


async def test_a_client_that_stops_halfway_through_a_large_body_gets_a_400_and_no_slot() -> None:
    posted = bodies(1, tokens=LARGE_TOKENS)
    expected = await expected_rows(posted)
    async with serving(trio.Semaphore(2)) as (app, port):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(head(len(posted[0])) + posted[0][: len(posted[0]) // 2])
            await stream.send_eof()
            status, _body = await read_reply(stream)
            assert status.startswith(b"HTTP/1.1 400")
        # The half body took nothing: the whole group, the same member included, is answered.
        rows = await post_each(port, posted)
        assert app.spool_budget.receiving == 0
    assert rows == expected


async def test_a_large_body_over_the_size_limit_is_refused_by_its_declared_length() -> None:
    posted = bodies(1, tokens=LARGE_TOKENS)
    limit = len(posted[0]) - 1
    async with serving(trio.Semaphore(2), max_body_bytes=limit) as (app, port):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(head(len(posted[0])))
            status, body = await read_reply(stream)  # answered before the body is sent
            assert status.startswith(b"HTTP/1.1 413")
            assert str(limit).encode() in body
        assert app.spool_budget.receiving == 0
