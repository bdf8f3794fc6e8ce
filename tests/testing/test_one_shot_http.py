"""The one-shot HTTP poster used by process-level tests: a whole reply is decoded, anything less
is a connection error rather than a half-read body."""

from __future__ import annotations

import pytest
import trio

from genrm_trio.testing._one_shot_http import post_json


async def serve_once(reply: bytes, task_status: trio.TaskStatus[int]) -> None:
    """Answers one request with `reply`, then closes."""

    async def handle(stream: trio.SocketStream) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            request += await stream.receive_some()
        head, _, body = request.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += await stream.receive_some()
        assert head.startswith(b"POST /verify HTTP/1.1\r\n")
        await stream.send_all(reply.replace(b"@BODY@", body))
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


async def test_a_whole_reply_gives_its_status_and_json() -> None:
    body = b'{"echo": @BODY@}'
    reply = b"HTTP/1.1 409 Conflict\r\ncontent-length: %d\r\n\r\n" % (len(body) - 6 + 8) + body
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_once, reply)
        assert await post_json(port, b'{"a": 1}') == (409, {"echo": {"a": 1}})
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "reply",
    [b"", b"HTTP/1.1 200 OK\r\ncontent-le", b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\n{}"],
)
async def test_a_connection_closed_before_a_whole_reply_is_a_connection_error(
    reply: bytes,
) -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_once, reply)
        with pytest.raises(ConnectionError, match="before a whole reply"):
            await post_json(port, b"{}")
        nursery.cancel_scope.cancel()
