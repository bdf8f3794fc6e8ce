"""The connection cap of `serve`'s accept loop: who is admitted, who gets the 503, and the log
lines that mark the start and the end of each episode."""

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

from genrm_trio.http.serving import ConnectionGate, _accept_loop, over_limit_reply


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


async def test_the_accept_loop_waits_out_descriptor_exhaustion_and_then_serves(
    lines: Lines, autojump_clock: trio.testing.MockClock
) -> None:
    listener = RunsOutOnce()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    gate = ConnectionGate(capacity=4, open_file_limit=256, rejecting_slots=2)
    served: list[bytes] = []
    done = trio.Event()

    async def handle(stream: trio.SocketStream) -> None:
        served.append(await stream.receive_some(100))
        gate.closed(admitted=True)
        await stream.aclose()
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_accept_loop, listener, gate, handle, nursery)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        await client.send_all(b"hello")
        await done.wait()
        await client.aclose()
        nursery.cancel_scope.cancel()

    assert served == [b"hello"]
    assert listener.fileno() == -1  # closed when the loop ends
    messages = lines.messages()
    assert messages[0].startswith("ERROR out of file descriptors: accept failed with EMFILE")
    assert messages[1].startswith("WARNING accepting connections again after ")
