"""Shared pytest configuration: every async test runs under Trio (trio_mode in pyproject).

The Redis fixtures (a real server per test or per module) are available to every test.

``group_store`` runs a test once per group store: the memory store, and a Redis store on one
real Redis server the session starts (a key prefix of its own for every server a test starts,
on the harness's clock). The runtime and HTTP suites take it for every test (their conftest);
a test whose behaviour exists on only some stores says which, and why, with
``@pytest.mark.stores(*names, why=...)``: it is then collected for those stores only.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio.testing

from genrm_trio.config import Config
from genrm_trio.store.redis_store import RedisGroupStore
from genrm_trio.store.resp import StoreAddress
from genrm_trio.testing.harness import servers_on
from genrm_trio.testing.redis_server import RedisServer

# The race harness's fixtures (genrm_server, ...) and the Redis fixtures, for every test.
pytest_plugins = ["genrm_trio.testing.redis_fixtures", "genrm_trio.testing.fixtures"]

STORES = ("memory", "redis")
_prefixes = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "stores(*names, why): the group stores a test runs on when not every one, and why",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "group_store" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("stores")
    names = STORES if marker is None else marker.args
    if marker is not None:
        assert marker.kwargs.get("why"), f"{metafunc.definition.nodeid}: say why (why=...)"
        assert set(names) <= set(STORES), names
    metafunc.parametrize("group_store", names, indirect=True)


@pytest.fixture(scope="session")
def _stores_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(data_dir=Path(tmp_path_factory.mktemp("stores-redis")))
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def group_store(request: pytest.FixtureRequest) -> Iterator[str]:
    """The group store every server this test starts keeps its groups in."""
    name: str = request.param
    if name == "memory":
        yield name
        return
    # Imported here, once pytest has taken in the plugins above: it loads the race harness.
    from genrm_trio.testing._shared_store import harness_time

    server: RedisServer = request.getfixturevalue("_stores_redis")
    if not server.running():
        server.start()
    address = StoreAddress.parse(server.url)

    def redis_store(config: Config) -> RedisGroupStore:
        return RedisGroupStore(
            config,
            address,
            f"t{next(_prefixes)}:",
            config.group_store_lease_s,
            clock=harness_time,
            poll_s=config.group_store_poll_s,
        )

    with servers_on(redis_store):
        yield name


@pytest.fixture
def autojump_clock(request: pytest.FixtureRequest) -> trio.testing.MockClock:
    """pytest-trio's clock, but on a Redis store it never jumps while a store command waits for
    its reply (a task waiting for Redis looks blocked too)."""
    from genrm_trio.testing.redis_fixtures import store_aware_clock

    redis = "group_store" in request.fixturenames and request.getfixturevalue("group_store")
    if redis == "redis":
        return store_aware_clock(request.getfixturevalue("monkeypatch"))
    return trio.testing.MockClock(autojump_threshold=0.0)


@pytest.fixture
def default_digit_cap() -> Iterator[None]:
    """Python's own 4,300-digit cap on decimal conversions, whatever ran before."""
    earlier = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(4300)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(earlier)
