"""The accept side of `serve`: its listener's batches, the connection cap (who is admitted, who
gets the 503) and the log lines that mark the start and the end of each episode."""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing

from genrm_trio.config import Config
from genrm_trio.http.serving import (
    Accepted,
    ConnectionGate,
    GatedListener,
    over_limit_reply,
    serve_app,
)
from genrm_trio.serve import hypercorn_settings


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        return [f"{record.levelname} {record.getMessage()}" for record in self.records]


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("genrm_trio")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_connections_over_the_cap_are_refused_with_one_line_per_episode(lines: Lines) -> None:
    gate = ConnectionGate(capacity=2, open_file_limit=256, rejecting_slots=2)
    assert gate.admit() and gate.admit()
    assert lines.messages() == []

    assert not gate.admit()
    assert not gate.admit()
    assert not gate.can_accept  # both answering slots are busy: the rest wait in the queue
    assert gate.rejected_total == 2
    assert len(lines.messages()) == 1
    assert lines.messages()[0].startswith(
        "WARNING connection limit reached: 2 client connections are open under the open-file "
        "limit 256"
    )

    gate.closed(admitted=False)
    gate.closed(admitted=False)
    gate.closed(admitted=True)
    assert gate.admit()
    assert lines.messages()[1] == (
        "WARNING accepting client connections again after answering 2 with 503 at the "
        "connection limit"
    )
    assert gate.open == 2


def test_the_refusal_is_a_complete_503_that_names_the_limit() -> None:
    reply = over_limit_reply(144, 256)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ")
    assert b"\r\nconnection: close" in head
    assert b"\r\nretry-after: 1" in head
    assert f"content-length: {len(body)}".encode() in head
    assert b"144 client connections are open (open-file limit 256)" in body


def test_running_out_of_descriptors_is_logged_once_and_its_end_too(lines: Lines) -> None:
    gate = ConnectionGate(capacity=100, open_file_limit=256, rejecting_slots=2)
    exhausted = OSError(errno.EMFILE, "Too many open files")
    gate.out_of_descriptors(exhausted)
    gate.out_of_descriptors(exhausted)
    gate.accepted()
    gate.accepted()
    messages = lines.messages()
    assert len(messages) == 2
    assert messages[0].startswith(
        "ERROR out of file descriptors: accept failed with EMFILE (Too many open files)"
    )
    assert messages[1].startswith("WARNING accepting connections again after ")


class RunsOutOnce(socket.socket):
    """A listening socket whose first accept fails as if the process had no descriptor left."""

    failed = False

    def accept(self) -> tuple[socket.socket, Any]:
        if not self.failed:
            self.failed = True
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return super().accept()


async def test_the_listener_waits_out_descriptor_exhaustion_and_then_serves(
    lines: Lines, autojump_clock: trio.testing.MockClock
) -> None:
    listener = RunsOutOnce()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    gate = ConnectionGate(capacity=4, open_file_limit=256, rejecting_slots=2)
    served: list[bytes] = []
    done = trio.Event()

    async def handle(accepted: Accepted) -> None:
        assert accepted.admitted
        served.append(await accepted.stream.receive_some(100))
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, [GatedListener(listener, gate, 16)])
        client = await trio.open_tcp_stream("127.0.0.1", port)
        await client.send_all(b"hello")
        await done.wait()
        await client.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert gate.open == 0  # the connection, closed, gave its place back
        nursery.cancel_scope.cancel()

    assert served == [b"hello"]
    assert listener.fileno() == -1  # closed when serving ends
    messages = lines.messages()
    assert messages[0].startswith("ERROR out of file descriptors: accept failed with EMFILE")
    assert messages[1].startswith("WARNING accepting connections again after ")


async def test_the_listener_returns_the_connections_queued_in_one_batch_without_waiting() -> None:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        gate = ConnectionGate(capacity=100, open_file_limit=256, rejecting_slots=2)
        listener = GatedListener(sock, gate, batch=3)
        clients = [socket.create_connection(sock.getsockname()) for _ in range(5)]
        accepted = [await listener.accept()]
        # The rest of the batch comes without a checkpoint: serve_listeners starts each one's
        # handler and comes straight back for the next.
        with trio.testing.assert_no_checkpoints():
            accepted += [await listener.accept(), await listener.accept()]
        with trio.testing.assert_checkpoints():
            accepted.append(await listener.accept())  # a new batch begins with a wait
        assert gate.open == 4 and all(connection.admitted for connection in accepted)
        for connection in accepted:
            await connection.aclose()
        assert gate.open == 0
        for client in clients:
            client.close()


async def test_a_connection_over_the_cap_is_answered_at_once_with_the_503_naming_the_limit(
    lines: Lines,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        gate = ConnectionGate(capacity=1, open_file_limit=256, rejecting_slots=2)
        listener = GatedListener(sock, gate, batch=16)
        first = socket.create_connection(sock.getsockname())
        second = socket.create_connection(sock.getsockname())
        held, refused = await listener.accept(), await listener.accept()
        assert (held.admitted, refused.admitted) == (True, False)
        assert (gate.open, gate.rejecting, gate.rejected_total) == (1, 1, 1)
        await refused.aclose()
        await held.aclose()
        assert (gate.open, gate.rejecting) == (0, 0)
        first.close()
        second.close()
    assert lines.messages()[0].startswith("WARNING connection limit reached: 1 client")


async def tiny_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def test_serve_answers_a_connection_over_the_cap_with_the_503_and_closes_it() -> None:
    settings = hypercorn_settings(Config(judge_base_url="http://judge.invalid/v1", judge_model="m"))
    settings.bind = ["127.0.0.1:0"]
    gate = ConnectionGate(capacity=1, open_file_limit=256, rejecting_slots=2)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        [url] = await nursery.start(
            lambda task_status: serve_app(
                tiny_app, settings, gate, shutdown_trigger=stop.wait, task_status=task_status
            )
        )
        port = int(url.rsplit(":", 1)[1])
        held = await trio.open_tcp_stream("127.0.0.1", port)
        await held.send_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
        assert (await held.receive_some(65536)).startswith(b"HTTP/1.1 204 ")
        refused = await trio.open_tcp_stream("127.0.0.1", port)
        reply = b""
        while data := await refused.receive_some(65536):
            reply += data
        assert reply == over_limit_reply(1, 256)
        await refused.aclose()
        await held.aclose()
        stop.set()
    assert gate.rejected_total == 1
