"""What `serve` relies on inside hypercorn, checked so that an upgrade that removes it fails here,
by name, rather than as a slow or silently untuned server.

`serve` runs hypercorn's HTTP/1.1 protocol behind its own accept loop and its own read loop
(http/serving.py: a subclass of hypercorn's connection handler that replaces ``_read_data``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import h11
import hypercorn.protocol.h11
import hypercorn.protocol.http_stream
import hypercorn.trio.tcp_server
import pytest
from h11._readers import ContentLengthReader
from hypercorn.protocol import ProtocolWrapper
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.utils import wrap_app

from genrm_trio.config import Config
from genrm_trio.serve import hypercorn_settings


def parameters(callable_: Callable[..., object]) -> list[str]:
    return [name for name in inspect.signature(callable_).parameters if name != "self"]


def test_the_connection_handler_reads_through_the_method_serve_replaces() -> None:
    run = inspect.getsource(TCPServer.run)
    assert "await self._read_data()" in run
    # The replacement reads the same attributes the original does.
    assert "self.stream = stream" in inspect.getsource(TCPServer.__init__)
    assert "self.protocol = ProtocolWrapper(" in run
    read = inspect.getsource(TCPServer._read_data)
    assert "await self.protocol.handle(RawData(" in read
    assert "await self.protocol.handle(Closed())" in read


def test_the_accept_loop_builds_hypercorn_objects_with_the_arguments_it_passes() -> None:
    assert parameters(TCPServer.__init__) == ["app", "config", "context", "state", "stream"]
    assert parameters(Lifespan.__init__) == ["app", "config", "state"]
    assert parameters(WorkerContext.__init__) == ["max_requests"]
    assert parameters(wrap_app)[:3] == ["app", "wsgi_max_body_size", "mode"]


@pytest.mark.parametrize(
    ("setting", "reader"),
    [
        ("keep_alive_timeout", hypercorn.trio.tcp_server.TCPServer),
        ("h11_max_incomplete_size", hypercorn.protocol.h11.H11Protocol),
        ("keep_alive_max_requests", hypercorn.protocol.h11.H11Protocol),
    ],
)
def test_each_setting_serve_chooses_is_still_read_by_hypercorn(setting: str, reader: type) -> None:
    assert f"config.{setting}" in inspect.getsource(reader)


def test_an_unset_read_timeout_means_no_deadline_on_a_waiting_request() -> None:
    config = Config(judge_base_url="http://judge.invalid/v1", judge_model="m")
    assert hypercorn_settings(config).read_timeout is None


def test_the_read_loop_finds_what_h11_still_expects_of_a_request_where_it_looks() -> None:
    # GatedTCPServer reads a request's head and small body in a turn: it asks hypercorn's
    # protocol for its h11 connection, and h11 for its state, reader and buffer.
    assert "= h11.Connection(" in inspect.getsource(hypercorn.protocol.h11.H11Protocol.__init__)
    assert "self.protocol = H11Protocol(" in inspect.getsource(ProtocolWrapper.__init__)
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\nab")
    assert connection.their_state is h11.IDLE and len(connection._receive_buffer) > 0
    assert isinstance(connection.next_event(), h11.Request)
    assert connection.their_state is h11.SEND_BODY
    reader = connection._reader
    assert isinstance(reader, ContentLengthReader)
    assert (reader._length, reader._remaining) == (5, 5)
    connection.next_event()
    assert reader._remaining == 3 and not connection._receive_buffer
    # While a request waits for its turn, the read loop stops the keep-alive timer as
    # hypercorn does when a request starts, and starts it again as hypercorn does.
    run = inspect.getsource(TCPServer.run)
    assert "await self.idle_task.restart(self._task_group, self._idle_timeout)" in run
    assert "self.idle_task = TrioSingleTask()" in inspect.getsource(TCPServer.__init__)


def test_a_large_body_passed_past_h11_reaches_the_application_as_hypercorn_would_pass_it() -> None:
    # The read loop hands a large body's reads to hypercorn's stream as Body events, counts them
    # off h11's reader, and then lets hypercorn's protocol take h11's end of the body.
    assert "def _handle_events(self)" in inspect.getsource(hypercorn.protocol.h11.H11Protocol)
    events = inspect.getsource(hypercorn.protocol.h11.H11Protocol._handle_events)
    assert "self.connection.next_event()" in events
    assert "await self.stream.handle(EndBody(stream_id=STREAM_ID))" in events
    handle = inspect.getsource(hypercorn.protocol.http_stream.HTTPStream.handle)
    assert '"body": bytes(event.data), "more_body": True' in handle
    assert "if self.closed:" in handle
    assert hypercorn.protocol.h11.STREAM_ID == 1
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\n")
    connection.next_event()
    reader = connection._reader
    assert isinstance(reader, ContentLengthReader)
    reader._remaining -= 5  # what the read loop passed on itself
    assert isinstance(connection.next_event(), h11.EndOfMessage)
    assert connection.their_state is h11.DONE
