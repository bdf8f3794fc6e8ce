"""The round-robin balancer: connections spread in turn, bytes relayed both ways, dead backends
skipped, and the same behaviour when it runs as its own process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from genrm_trio.testing._balancer import RoundRobinBalancer, parse_backend
from genrm_trio.testing.redis_server import free_loopback_port


async def named_backend(name: bytes, task_status: trio.TaskStatus[int]) -> None:
    """Answers each connection with `name:` and then everything it received, after EOF."""

    async def handle(stream: trio.SocketStream) -> None:
        received = b""
        while data := await stream.receive_some():
            received += data
        await stream.send_all(name + b":" + received)
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


async def exchange(port: int, payload: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(payload)
        await stream.send_eof()
        reply = b""
        while data := await stream.receive_some():
            reply += data
        return reply


@asynccontextmanager
async def running(backends: list[tuple[str, int]]) -> AsyncIterator[tuple[RoundRobinBalancer, int]]:
    balancer = RoundRobinBalancer(backends)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(balancer.serve)
        yield balancer, port
        nursery.cancel_scope.cancel()


async def test_connections_go_to_the_backends_in_turn_and_bytes_flow_both_ways() -> None:
    async with trio.open_nursery() as nursery:
        a = await nursery.start(named_backend, b"A")
        b = await nursery.start(named_backend, b"B")
        async with running([("127.0.0.1", a), ("127.0.0.1", b)]) as (balancer, port):
            payload = bytes(range(256)) * 1000
            replies = [await exchange(port, payload) for _ in range(6)]
        assert [r[:2] for r in replies] == [b"A:", b"B:"] * 3
        assert all(r[2:] == payload for r in replies)
        assert balancer.connections == {("127.0.0.1", a): 3, ("127.0.0.1", b): 3}
        nursery.cancel_scope.cancel()


async def test_turns_count_each_request_after_a_reply_once() -> None:
    """A client that sends, reads the reply, and sends again makes two turns per connection,
    however its bytes are split; bytes sent before any reply (pipelining) are one turn."""

    async def ping_pong(stream: trio.SocketStream) -> None:
        while data := await stream.receive_some():
            if data.endswith(b"."):
                await stream.send_all(b"ok")

    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, ping_pong, listeners)
        backend = ("127.0.0.1", listeners[0].socket.getsockname()[1])
        async with running([backend]) as (balancer, port):
            for _ in range(3):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    for request in ([b"a", b"b."], [b"c."]):
                        for piece in request:
                            await stream.send_all(piece)
                            await trio.sleep(0.01)
                        assert await stream.receive_some() == b"ok"
            await trio.sleep(0.05)
            assert balancer.turns == 6
        nursery.cancel_scope.cancel()


async def test_a_backend_that_refuses_is_skipped_and_none_left_closes_the_client() -> None:
    dead = free_loopback_port()
    async with trio.open_nursery() as nursery:
        live = await nursery.start(named_backend, b"L")
        backends = [("127.0.0.1", dead), ("127.0.0.1", live)]
        async with running(backends) as (balancer, port):
            replies = [await exchange(port, b"x") for _ in range(4)]
        assert replies == [b"L:x"] * 4
        assert balancer.connections == {("127.0.0.1", live): 4}
        nursery.cancel_scope.cancel()
    async with running([("127.0.0.1", dead)]) as (balancer, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            assert await stream.receive_some() == b"", "closed at once, nothing relayed"
        assert balancer.refused == 1


def test_a_backend_must_be_host_and_port() -> None:
    assert parse_backend("127.0.0.1:8001") == ("127.0.0.1", 8001)
    result = subprocess.run(
        [sys.executable, "-m", "genrm_trio.testing._balancer", "--backend", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "backend must be host:port, got 'nope'" in result.stderr
    with pytest.raises(ValueError, match="at least one backend"):
        RoundRobinBalancer([])


async def test_the_balancer_runs_as_its_own_process() -> None:
    async with trio.open_nursery() as nursery:
        a = await nursery.start(named_backend, b"A")
        b = await nursery.start(named_backend, b"B")
        process = await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "genrm_trio.testing._balancer",
                "--port",
                "0",
                "--backend",
                f"127.0.0.1:{a}",
                "--backend",
                f"127.0.0.1:{b}",
            ],
            stdout=subprocess.PIPE,
        )
        try:
            assert process.stdout is not None
            line = b""
            with trio.fail_after(30):
                while not line.endswith(b"\n"):
                    line += await process.stdout.receive_some(1)
            prefix = b"balancer listening on http://127.0.0.1:"
            assert line.startswith(prefix), line
            port = int(line.removeprefix(prefix))
            assert [await exchange(port, b"q") for _ in range(3)] == [b"A:q", b"B:q", b"A:q"]
        finally:
            process.kill()
            await process.wait()
        nursery.cancel_scope.cancel()
