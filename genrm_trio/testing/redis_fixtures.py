"""pytest fixtures that give a test a real Redis server with a clean keyspace.

Enable with ``pytest_plugins = ["genrm_trio.testing.redis_fixtures"]``.

- ``redis_server``: a fresh `RedisServer` for this test alone, with its data folder under the
  test's tmp_path; killed when the test ends.
- ``shared_redis_server``: one server per test module, emptied (FLUSHALL) before each test and
  started again if an earlier test stopped or killed it. Cheaper when a module has many tests.

Both use append-only persistence with ``appendfsync always``, so a test may kill the server with
SIGKILL, start it again on the same port and find every acknowledged write.

- ``store_clock``: Trio's clock for a test whose leases and deadlines must expire by its steps,
  not by how loaded the machine is: it stands still while any task runs or any store command
  waits for its reply, and jumps to the next deadline once every task has been blocked for
  ``AUTOJUMP_S`` of real time with no command outstanding. A loaded machine (a slow fsync under
  ``appendfsync always``) makes a reply late, never a deadline early. Give the stores
  ``clock=harness_time`` (testing/_shared_store.py) so that their times follow it too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio.testing

from genrm_trio.store import resp
from genrm_trio.testing.redis_server import RedisServer

AUTOJUMP_S = 0.05


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(data_dir=tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def _module_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(data_dir=tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def shared_redis_server(_module_redis_server: RedisServer) -> RedisServer:
    if not _module_redis_server.running():
        _module_redis_server.start()
    _module_redis_server.flush()
    return _module_redis_server


class _HeldWhileStoreReplies:
    """Holds a mock clock's autojump off while any store command waits for its reply.

    Only commands count: a subscription waiting for a notification waits for something that
    may never come, and the clock must be free to jump past it."""

    def __init__(self, clock: trio.testing.MockClock) -> None:
        self._clock = clock
        self._outstanding = 0

    def wrap(self, pipeline: Any) -> Any:
        async def held(connection: resp.Connection, commands: Sequence[Sequence[Any]]) -> Any:
            self._outstanding += 1
            self._clock.autojump_threshold = math.inf
            try:
                return await pipeline(connection, commands)
            finally:
                self._outstanding -= 1
                if not self._outstanding:
                    self._clock.autojump_threshold = AUTOJUMP_S

        return held


def store_aware_clock(monkeypatch: pytest.MonkeyPatch) -> trio.testing.MockClock:
    """A mock clock that jumps only when no store command is outstanding (see the module's
    docstring), for this test alone."""
    clock = trio.testing.MockClock(autojump_threshold=AUTOJUMP_S)
    hold = _HeldWhileStoreReplies(clock)
    monkeypatch.setattr(resp.Connection, "pipeline", hold.wrap(resp.Connection.pipeline))
    return clock


@pytest.fixture
def store_clock(monkeypatch: pytest.MonkeyPatch) -> trio.testing.MockClock:
    return store_aware_clock(monkeypatch)
