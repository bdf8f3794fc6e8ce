"""What `serve` relies on inside hypercorn, checked so that an upgrade that removes it fails here,
by name, rather than as a slow or silently untuned server.

`serve` runs hypercorn's HTTP/1.1 protocol behind its own accept loop (http/serving.py) and sets
hypercorn's socket read size, a module constant (process_tuning.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import hypercorn.protocol.h11
import hypercorn.trio.tcp_server
import pytest
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.utils import wrap_app

from genrm_trio.cli import hypercorn_settings
from genrm_trio.config import Config
from genrm_trio.process_tuning import SOCKET_READ_BYTES, set_socket_read_size


def parameters(callable_: Callable[..., object]) -> list[str]:
    return [name for name in inspect.signature(callable_).parameters if name != "self"]


def test_the_socket_read_size_is_a_module_constant_that_tcp_server_reads() -> None:
    assert "receive_some(MAX_RECV)" in inspect.getsource(hypercorn.trio.tcp_server.TCPServer)
    before = hypercorn.trio.tcp_server.MAX_RECV
    try:
        set_socket_read_size()
        assert hypercorn.trio.tcp_server.MAX_RECV == SOCKET_READ_BYTES
    finally:
        hypercorn.trio.tcp_server.MAX_RECV = before


def test_the_accept_loop_builds_hypercorn_objects_with_the_arguments_it_passes() -> None:
    assert parameters(TCPServer.__init__) == ["app", "config", "context", "state", "stream"]
    assert parameters(Lifespan.__init__) == ["app", "config", "state"]
    assert parameters(WorkerContext.__init__) == ["max_requests"]
    assert parameters(wrap_app)[:3] == ["app", "wsgi_max_body_size", "mode"]


@pytest.mark.parametrize(
    ("setting", "reader"),
    [
        # The read deadline is applied to every read: serve turns it off (None -> inf).
        ("read_timeout", hypercorn.trio.tcp_server.TCPServer),
        ("keep_alive_timeout", hypercorn.trio.tcp_server.TCPServer),
        ("h11_max_incomplete_size", hypercorn.protocol.h11.H11Protocol),
        ("keep_alive_max_requests", hypercorn.protocol.h11.H11Protocol),
    ],
)
def test_each_setting_serve_chooses_is_still_read_by_hypercorn(setting: str, reader: type) -> None:
    assert f"config.{setting}" in inspect.getsource(reader)


def test_an_unset_read_timeout_means_no_deadline_on_a_waiting_request() -> None:
    source = inspect.getsource(hypercorn.trio.tcp_server.TCPServer)
    assert "self.config.read_timeout or inf" in source
    before = hypercorn.trio.tcp_server.MAX_RECV
    try:
        config = Config(judge_base_url="http://judge.invalid/v1", judge_model="m")
        assert hypercorn_settings(config).read_timeout is None
    finally:
        hypercorn.trio.tcp_server.MAX_RECV = before
