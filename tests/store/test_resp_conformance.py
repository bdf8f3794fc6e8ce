"""What the store's Redis client (store/resp.py) promises, checked on the wire.

Most cases run against a scripted Redis on real loopback TCP that answers each command with
exactly the bytes a test chose, piece by piece: every reply shape, replies split at every
boundary, large replies in many pieces, a server that closes, resets or hangs mid-reply, bytes
that are not RESP and replies over the size cap. The rest run against a real redis-server
(the fixtures of genrm_trio/testing/redis_fixtures.py): a restart between two commands, a
WATCH conflict, an error inside EXEC, more than 1,024 open descriptors, a unix socket.

Each case asserts what a user of the client would notice: the values returned, the exception
and its text, whether the next command reuses the connection or opens another.
"""

from __future__ import annotations

import os
import resource
import select
import shutil
import socket
import struct
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import hiredis
import pytest
import trio
import trio.testing

from genrm_trio.store.resp import (
    MAX_REPLY_BYTES,
    PASSWORD_ENV,
    Client,
    ServerError,
    StoreAddress,
    StoreUnavailable,
)
from genrm_trio.testing.redis_server import RedisServer

SAFETY_S = 10.0  # bounds waits on the scripted server's side; never reached when all is well
CLOSE = "close"  # end the connection in order (FIN)
RESET = "reset"  # end the connection with a reset (RST)
HANG = "hang"  # send nothing more; wait for the client to close

Step = bytes | str


@pytest.fixture(autouse=True)
def _no_password_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # An AUTH would be the scripted server's first command and shift every answer.
    monkeypatch.delenv(PASSWORD_ENV, raising=False)


# --------------------------------------------------------------------------------------------
# The scripted server


@dataclass
class ScriptedRedis:
    """A Redis stand-in on loopback TCP. The n-th command it reads, over all connections, is
    answered with ``answers[n]`` (``default`` past the end): each bytes step is sent on its
    own and the next step waits until every task is blocked, so the client has read it as one
    piece; CLOSE, RESET and HANG end the answer (HANG reads and drops whatever comes until
    the client closes). An empty answer sends nothing, so a later answer can carry the
    replies of a whole pipeline split anywhere."""

    answers: list[list[Step]]
    default: list[Step] = field(default_factory=lambda: [b"+OK\r\n"])
    commands: list[list[bytes]] = field(default_factory=list)
    connections: int = 0  # accepted so far
    ended_by_client: int = 0  # connections the client closed
    ended_by_server: int = 0  # connections a CLOSE or RESET step closed

    async def serve(self, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        reader = hiredis.Reader()
        async with stream:
            while True:
                command = reader.gets()
                if command is False:
                    data = await self._receive(stream)
                    if not data:
                        return
                    reader.feed(data)
                    continue
                self.commands.append(command)
                index = len(self.commands) - 1
                answer = self.answers[index] if index < len(self.answers) else self.default
                for step in answer:
                    if step == CLOSE:
                        # Counted in the task step that closes the socket: whoever sees the
                        # count sees the end of stream too.
                        self.ended_by_server += 1
                        return
                    if step == RESET:
                        # Linger 0: closing sends a reset instead of an orderly end of stream.
                        stream.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                        self.ended_by_server += 1
                        return
                    if step == HANG:
                        while await self._receive(stream):
                            pass
                        return
                    assert isinstance(step, bytes)
                    await stream.send_all(step)
                    await trio.testing.wait_all_tasks_blocked()

    async def _receive(self, stream: trio.SocketStream) -> bytes:
        """Bytes from the client; b"" once it closed (counted)."""
        try:
            data = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            self.ended_by_client += 1
        return bytes(data)


async def scripted(
    nursery: trio.Nursery, answers: list[list[Step]], **client_options: Any
) -> tuple[ScriptedRedis, Client]:
    server = ScriptedRedis(answers)
    port = await nursery.start(server.serve)
    return server, Client(StoreAddress.parse(f"redis://127.0.0.1:{port}/0"), **client_options)


def pieces(data: bytes, size: int) -> list[Step]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


# --------------------------------------------------------------------------------------------
# Reply shapes

# name -> (reply bytes, the value the client returns)
SHAPES: dict[str, tuple[bytes, Any]] = {
    "simple string": (b"+OK\r\n", b"OK"),
    "empty simple string": (b"+\r\n", b""),
    "integer": (b":42\r\n", 42),
    "negative integer": (b":-7\r\n", -7),
    "64-bit integer": (b":9223372036854775807\r\n", 2**63 - 1),
    "bulk string": (b"$5\r\nhello\r\n", b"hello"),
    "empty bulk string": (b"$0\r\n\r\n", b""),
    "bulk string holding CRLF": (b"$6\r\na\r\nb\r\n\r\n", b"a\r\nb\r\n"),
    "binary bulk string": (b"$4\r\n\xff\x00\xfe\r\r\n", b"\xff\x00\xfe\r"),
    "nil bulk string": (b"$-1\r\n", None),
    "nil array": (b"*-1\r\n", None),
    "empty array": (b"*0\r\n", []),
    "flat array": (b"*3\r\n$1\r\na\r\n:2\r\n$-1\r\n", [b"a", 2, None]),
    "nested arrays": (
        b"*3\r\n*2\r\n:1\r\n*1\r\n$1\r\nx\r\n*0\r\n*-1\r\n",
        [[1, [b"x"]], [], None],
    ),
}


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_every_resp2_shape_is_read_as_its_python_value(
    shape: str, nursery: trio.Nursery
) -> None:
    reply, expected = SHAPES[shape]
    server, client = await scripted(nursery, [[reply], [b"+PONG\r\n"]])
    value = await client.call("GET", "k")
    assert value == expected
    assert type(value) is type(expected)
    if isinstance(expected, list):
        assert [type(item) for item in value] == [type(item) for item in expected]
    assert await client.call("PING") == b"PONG"
    assert server.connections == 1, "a whole reply leaves the connection reusable"
    assert server.commands == [[b"GET", b"k"], [b"PING"]]
    await client.aclose()


async def test_an_error_reply_is_a_server_error_value_and_the_connection_stays(
    nursery: trio.Nursery,
) -> None:
    error = b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
    server, client = await scripted(nursery, [[error], [error], [b":1\r\n"]])
    (reply,) = await client.pipeline([["GET", "l"]])
    assert type(reply) is ServerError
    assert str(reply) == "WRONGTYPE Operation against a key holding the wrong kind of value"
    with pytest.raises(ServerError, match=r"^WRONGTYPE"):
        await client.call("GET", "l")
    assert await client.call("EXISTS", "l") == 1
    assert server.connections == 1
    await client.aclose()


async def test_error_replies_inside_an_exec_array_are_server_error_values(
    nursery: trio.Nursery,
) -> None:
    replies = [
        b"+OK\r\n",
        b"+QUEUED\r\n",
        b"+QUEUED\r\n",
        b"*2\r\n+OK\r\n-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
    ]
    server, client = await scripted(nursery, [[], [], [], [b"".join(replies)]])
    async with client.connection() as connection:
        outcome = await connection.pipeline(
            [["MULTI"], ["SET", "s", "v"], ["LPUSH", "s", "x"], ["EXEC"]]
        )
    assert outcome[:3] == [b"OK", b"QUEUED", b"QUEUED"]
    first, second = outcome[3]
    assert first == b"OK"
    assert isinstance(second, ServerError)
    assert str(second).startswith("WRONGTYPE")
    assert server.commands[3] == [b"EXEC"]
    await client.aclose()


# --------------------------------------------------------------------------------------------
# Framing: replies in pieces

COMPOSITE = (
    b"*5\r\n$5\r\nhello\r\n:-12\r\n*2\r\n$-1\r\n*0\r\n-ERR bad\r\n$4\r\na\r\nb\r\n",
    [b"hello", -12, [None, []], "ERR bad", b"a\r\nb"],
)


def _comparable(value: Any) -> Any:
    if isinstance(value, ServerError):
        return str(value)
    if isinstance(value, list):
        return [_comparable(item) for item in value]
    return value


async def test_a_reply_split_at_every_boundary_reads_the_same(nursery: trio.Nursery) -> None:
    reply, expected = COMPOSITE
    answers: list[list[Step]] = [[reply[:cut], reply[cut:]] for cut in range(1, len(reply))]
    server, client = await scripted(nursery, answers)
    for _ in answers:
        (value,) = await client.pipeline([["GET", "k"]])
        assert _comparable(value) == expected
    assert server.connections == 1
    await client.aclose()


async def test_a_pipeline_sent_byte_by_byte_across_reply_boundaries(
    nursery: trio.Nursery,
) -> None:
    replies = [b"+OK\r\n", COMPOSITE[0], bulk(b"x" * 40), b"$-1\r\n", b":7\r\n"]
    # Nothing until the last command arrives, then every byte on its own.
    answers: list[list[Step]] = [[] for _ in replies[1:]]
    answers.append(pieces(b"".join(replies), 1))
    server, client = await scripted(nursery, answers)
    values = await client.pipeline([["GET", f"k{index}"] for index in range(len(replies))])
    assert _comparable(values) == [b"OK", COMPOSITE[1], b"x" * 40, None, 7]
    assert await client.call("PING") == b"OK"
    assert server.connections == 1
    await client.aclose()


async def test_an_8_mb_bulk_reply_in_many_pieces_is_read_whole(nursery: trio.Nursery) -> None:
    payload = bytes(range(256)) * (8 * 1024 * 1024 // 256)
    # A prime piece size puts the cuts everywhere: inside the header, the data and the CRLF.
    server, client = await scripted(nursery, [pieces(bulk(payload), 65521), [b":1\r\n"]])
    value = await client.call("GET", "big")
    assert len(value) == len(payload)
    assert value == payload
    assert await client.call("EXISTS", "big") == 1
    assert server.connections == 1
    await client.aclose()


async def _profiled_calls_to_read(nursery: trio.Nursery, elements: int) -> int:
    """Python calls (C functions included) made in this thread while one array reply of
    ``elements`` bulk strings arrives in 4 KiB pieces."""
    reply = b"*%d\r\n" % elements + bulk(b"hello") * elements
    _, client = await scripted(nursery, [pieces(reply, 4096)])
    calls = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        calls += 1

    sys.setprofile(profile)
    try:
        value = await client.call("LRANGE", "l", 0, -1)
    finally:
        sys.setprofile(None)
    assert value == [b"hello"] * elements
    await client.aclose()
    return calls


async def test_reading_a_reply_is_linear_in_its_size(nursery: trio.Nursery) -> None:
    # Counted work, not time: four times the elements (and the pieces) must cost about four
    # times the calls. A parser that starts again from the first element on every piece
    # costs sixteen times as much.
    small = await _profiled_calls_to_read(nursery, 5_000)
    large = await _profiled_calls_to_read(nursery, 20_000)
    assert large < 6 * small, (small, large)


# --------------------------------------------------------------------------------------------
# The server going away


PARTIAL_REPLIES = [
    b"+OK",
    b"+OK\r",
    b"$5\r\nhel",
    b"$5\r\nhello\r",
    b"*2\r\n:1\r\n",
    b"*2\r\n*1\r\n$1\r\n",
    b":12",
]


@pytest.mark.parametrize("partial", PARTIAL_REPLIES)
async def test_a_server_closing_mid_reply_is_store_unavailable_and_the_connection_is_dropped(
    partial: bytes, nursery: trio.Nursery
) -> None:
    server, client = await scripted(nursery, [[partial, CLOSE], [b"+PONG\r\n"]])
    with pytest.raises(StoreUnavailable) as caught:
        await client.call("GET", "k")
    assert str(caught.value) == "the server closed the connection mid-reply"
    assert await client.call("PING") == b"PONG"
    assert server.connections == 2, "the half-read connection is never reused"
    await client.aclose()


async def test_a_server_closing_before_replying_is_store_unavailable(
    nursery: trio.Nursery,
) -> None:
    server, client = await scripted(nursery, [[CLOSE], [b"+PONG\r\n"]])
    with pytest.raises(StoreUnavailable) as caught:
        await client.call("GET", "k")
    assert str(caught.value) == "the server closed the connection"
    assert await client.call("PING") == b"PONG"
    assert server.connections == 2
    await client.aclose()


async def test_a_reset_mid_reply_is_store_unavailable_naming_the_reset(
    nursery: trio.Nursery,
) -> None:
    server, client = await scripted(nursery, [[b"$5\r\nhe", RESET], [b"+PONG\r\n"]])
    with pytest.raises(StoreUnavailable) as caught:
        await client.call("GET", "k")
    assert "Connection reset by peer" in str(caught.value)
    assert await client.call("PING") == b"PONG"
    assert server.connections == 2
    await client.aclose()


async def test_a_pooled_connection_the_server_closed_is_replaced_before_a_command_is_sent(
    nursery: trio.Nursery,
) -> None:
    server, client = await scripted(nursery, [[b"+OK\r\n", CLOSE], [b"$1\r\nv\r\n"]])
    assert await client.call("SET", "k", "v") == b"OK"
    with trio.fail_after(SAFETY_S):
        while server.ended_by_server < 1:
            await trio.testing.wait_all_tasks_blocked()
    async with client.connection() as connection:
        assert not connection.reused
        assert await connection.call("GET", "k") == b"v"
    assert server.connections == 2
    assert server.commands == [[b"SET", b"k", b"v"], [b"GET", b"k"]]
    await client.aclose()


async def test_bytes_left_over_after_a_reply_keep_the_connection_out_of_the_pool(
    nursery: trio.Nursery,
) -> None:
    # A reply with more after it (a stream out of step) would hand the next caller a reply
    # to a command it never sent.
    server, client = await scripted(nursery, [[b"+OK\r\n+STALE\r\n"], [b"$5\r\nfresh\r\n"]])
    assert await client.call("SET", "k", "v") == b"OK"
    assert await client.call("GET", "k") == b"fresh"
    assert server.connections == 2
    await client.aclose()


# --------------------------------------------------------------------------------------------
# Bytes that are not RESP

# reply bytes -> words the StoreUnavailable text contains
MALFORMED: dict[bytes, str] = {
    b"?what\r\n": 'not valid RESP (Protocol error, got "?" as reply type byte)',
    b"\r\n": 'not valid RESP (Protocol error, got "\\r" as reply type byte)',
    b"$abc\r\n": "not valid RESP (Bad bulk string length)",
    b"$-5\r\n": "not valid RESP (Bulk string length out of range)",
    b"*x\r\n": "not valid RESP (Bad multi-bulk length)",
    b"*-2\r\n": "not valid RESP (Multi-bulk length out of range)",
    b"*1000000000000\r\n": "not valid RESP (Multi-bulk length out of range)",
    b":12x\r\n": "not valid RESP (Bad integer value)",
    b":99999999999999999999\r\n": "not valid RESP (Bad integer value)",
    b"*2\r\n:1\r\n!oops\r\n": 'not valid RESP (Protocol error, got "!" as reply type byte)',
    b"%1\r\n+a\r\n+b\r\n": "a RESP3 value (dict) on a RESP2 connection",
    b"#t\r\n": "a RESP3 value (bool) on a RESP2 connection",
    b",1.5\r\n": "a RESP3 value (float) on a RESP2 connection",
    b"*1\r\n>2\r\n+message\r\n+x\r\n": "a RESP3 value (PushNotification) on a RESP2 connection",
}


@pytest.mark.parametrize("reply", list(MALFORMED))
async def test_bytes_that_are_not_resp2_are_store_unavailable_naming_the_fault(
    reply: bytes, nursery: trio.Nursery
) -> None:
    server, client = await scripted(nursery, [[reply], [b"+PONG\r\n"]])
    with pytest.raises(StoreUnavailable) as caught:
        await client.call("GET", "k")
    assert MALFORMED[reply] in str(caught.value)
    assert await client.call("PING") == b"PONG"
    assert server.connections == 2, "a connection whose framing failed is never reused"
    await client.aclose()


async def test_a_malformed_reply_after_good_ones_fails_the_pipeline(
    nursery: trio.Nursery,
) -> None:
    server, client = await scripted(nursery, [[], [], [b"+OK\r\n:1\r\n$x\r\n"]])
    async with client.connection() as connection:
        with pytest.raises(StoreUnavailable, match="Bad bulk string length"):
            await connection.pipeline([["SET", "k", "v"], ["EXISTS", "k"], ["GET", "k"]])
        assert connection.broken
        with pytest.raises(StoreUnavailable, match="already failed"):
            await connection.pipeline([["PING"]])
    with trio.fail_after(SAFETY_S):
        while server.ended_by_client < 1:
            await trio.testing.wait_all_tasks_blocked()
    assert client.statistics().idle == 0, "a failed connection is closed, not pooled"
    await client.aclose()


# --------------------------------------------------------------------------------------------
# The reply size cap

CAP = 4096


async def test_a_reply_over_the_cap_is_store_unavailable(nursery: trio.Nursery) -> None:
    reply = bulk(b"x" * 100_000)
    server, client = await scripted(
        nursery, [pieces(reply, 1000), [b"+PONG\r\n"]], max_reply_bytes=CAP
    )
    with pytest.raises(StoreUnavailable) as caught:
        await client.call("GET", "big")
    assert str(caught.value) == (
        f"a reply grew past {CAP} bytes before it was complete (the cap on one reply)"
    )
    assert await client.call("PING") == b"PONG"
    assert server.connections == 2
    await client.aclose()


async def test_an_array_of_small_items_over_the_cap_is_store_unavailable(
    nursery: trio.Nursery,
) -> None:
    reply = b"*100000\r\n" + b":1\r\n" * 100_000
    _, client = await scripted(nursery, [pieces(reply, 1000)], max_reply_bytes=CAP)
    with pytest.raises(StoreUnavailable, match=f"grew past {CAP} bytes"):
        await client.call("LRANGE", "l", 0, -1)
    await client.aclose()


async def test_replies_under_the_cap_pass_however_many_a_pipeline_holds(
    nursery: trio.Nursery,
) -> None:
    one = bulk(b"y" * (CAP - 100))
    count = 10  # ten times the cap in all, each reply under it
    answers: list[list[Step]] = [[] for _ in range(count - 1)]
    answers.append(pieces(one * count, 1500))
    server, client = await scripted(nursery, answers, max_reply_bytes=CAP)
    values = await client.pipeline([["GET", f"k{index}"] for index in range(count)])
    assert values == [b"y" * (CAP - 100)] * count
    assert server.connections == 1
    await client.aclose()


def test_the_default_cap_is_redis_own_largest_bulk_string() -> None:
    assert MAX_REPLY_BYTES == 512 * 1024 * 1024


# --------------------------------------------------------------------------------------------
# The pool: what comes back, what is closed


async def test_a_connection_given_back_in_order_is_reused(nursery: trio.Nursery) -> None:
    server, client = await scripted(nursery, [])
    async with client.connection() as first:
        assert not first.reused
        await first.call("SET", "k", "v")
    async with client.connection() as second:
        assert second.reused
        assert second is first
    assert server.connections == 1
    await client.aclose()


@pytest.mark.parametrize("raised", [ServerError("ERR from the caller"), RuntimeError("bug")])
async def test_an_exception_inside_connection_closes_it(
    raised: Exception, nursery: trio.Nursery
) -> None:
    server, client = await scripted(nursery, [])
    with pytest.raises(type(raised)):
        async with client.connection() as first:
            await first.call("WATCH", "k")
            raise raised
    assert first.broken
    async with client.connection() as second:
        assert not second.reused
        assert second is not first
    with trio.fail_after(SAFETY_S):
        while server.ended_by_client < 1:
            await trio.testing.wait_all_tasks_blocked()
    assert server.connections == 2
    assert client.statistics().idle == 1
    await client.aclose()


async def test_a_cancellation_inside_connection_closes_it(nursery: trio.Nursery) -> None:
    server, client = await scripted(nursery, [])
    with trio.CancelScope() as scope:
        async with client.connection() as first:
            await first.call("WATCH", "k")
            scope.cancel()
            await trio.sleep_forever()
    assert first.broken
    async with client.connection() as second:
        assert second is not first
    assert server.connections == 2
    await client.aclose()


async def test_a_cancellation_mid_reply_leaves_the_connection_broken_and_closed(
    nursery: trio.Nursery,
) -> None:
    server, client = await scripted(nursery, [[b"$10\r\nhalf", HANG], [b"+PONG\r\n"]])
    with trio.CancelScope() as scope:

        async def cancel_once_half_is_read() -> None:
            with trio.fail_after(SAFETY_S):
                while not server.commands:
                    await trio.testing.wait_all_tasks_blocked()
            # Every task blocked: the client has read the half and waits for the rest.
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()

        nursery.start_soon(cancel_once_half_is_read)
        async with client.connection() as connection:
            await connection.call("GET", "k")
    assert scope.cancelled_caught
    assert connection.broken
    with trio.fail_after(SAFETY_S):
        while server.ended_by_client < 1:
            await trio.testing.wait_all_tasks_blocked()
    assert await client.call("PING") == b"PONG"
    assert server.connections == 2
    assert client.in_use == 0
    await client.aclose()


# --------------------------------------------------------------------------------------------
# max_connections


async def test_a_third_user_waits_while_two_connections_are_lent_out(
    nursery: trio.Nursery,
) -> None:
    server, client = await scripted(nursery, [], max_connections=2)
    release = [trio.Event(), trio.Event()]
    entered: list[str] = []
    reused: dict[str, bool] = {}

    async def user(name: str, done: trio.Event | None) -> None:
        async with client.connection() as connection:
            entered.append(name)
            reused[name] = connection.reused
            await connection.call("PING")
            if done is not None:
                await done.wait()

    with trio.fail_after(SAFETY_S):
        async with trio.open_nursery() as users:
            users.start_soon(user, "first", release[0])
            users.start_soon(user, "second", release[1])
            while len(entered) < 2:
                await trio.testing.wait_all_tasks_blocked()
            users.start_soon(user, "third", None)
            while client.statistics().waiting < 1:
                await trio.testing.wait_all_tasks_blocked()
            assert sorted(entered) == ["first", "second"]
            assert client.statistics().lent_out == 2
            assert client.in_use == 3
            # Outside the cap: the pub/sub subscription's own connection.
            subscription = await client.connect()
            await subscription.aclose()
            release[0].set()
            while len(entered) < 3:
                await trio.testing.wait_all_tasks_blocked()
            assert reused["third"], "the third user got the connection the first gave back"
            release[1].set()
    assert server.connections == 3  # two lent out and the subscription's
    assert client.in_use == 0
    assert client.statistics().lent_out == 0
    await client.aclose()


async def test_the_wait_for_a_connection_ends_with_the_callers_cancel_scope(
    nursery: trio.Nursery,
) -> None:
    server, client = await scripted(nursery, [], max_connections=1)
    async with client.connection():
        with trio.CancelScope() as scope:
            nursery.start_soon(_cancel_when_waiting, client, scope)
            async with client.connection():
                pytest.fail("entered past the cap")
        assert scope.cancelled_caught
        assert client.statistics().waiting == 0
        assert client.in_use == 1
    assert server.connections == 1
    assert client.in_use == 0
    await client.aclose()


async def _cancel_when_waiting(client: Client, scope: trio.CancelScope) -> None:
    with trio.fail_after(SAFETY_S):
        while client.statistics().waiting < 1:
            await trio.testing.wait_all_tasks_blocked()
    scope.cancel()


async def test_a_burst_of_callers_opens_no_more_than_max_connections(
    nursery: trio.Nursery,
) -> None:
    server, client = await scripted(nursery, [], max_connections=4)
    async with trio.open_nursery() as burst:
        for index in range(100):
            burst.start_soon(client.call, "SET", f"k{index}", "v")
    assert len(server.commands) == 100
    assert server.connections <= 4
    await client.aclose()


def test_max_connections_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        Client(StoreAddress.parse("redis://127.0.0.1:1/0"), max_connections=0)


# --------------------------------------------------------------------------------------------
# Addresses


@pytest.mark.parametrize(
    ("url", "path", "db", "public"),
    [
        ("unix:///run/redis/redis.sock", "/run/redis/redis.sock", 0, None),
        ("unix:///run/redis.sock?db=3", "/run/redis.sock", 3, "unix:///run/redis.sock?db=3"),
        ("unix://:s3cret@/tmp/r.sock?db=1", "/tmp/r.sock", 1, "unix:///tmp/r.sock?db=1"),
        ("unix:///tmp/with%20space.sock", "/tmp/with space.sock", 0, None),
    ],
)
def test_a_unix_socket_address_is_parsed_and_shown_without_credentials(
    url: str, path: str, db: int, public: str | None
) -> None:
    address = StoreAddress.parse(url)
    assert address.path == path
    assert address.db == db
    assert not address.tls
    assert address.public() == (public or f"unix://{path}?db={db}")
    assert "s3cret" not in address.public()


def test_a_unix_socket_password_comes_from_the_url_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert StoreAddress.parse("unix://:p%40ss@/tmp/r.sock").password == "p@ss"
    assert StoreAddress.parse("unix://me:pw@/tmp/r.sock").username == "me"
    assert StoreAddress.parse("unix:///tmp/r.sock").password is None
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    assert StoreAddress.parse("unix:///tmp/r.sock").password == "from-env"


@pytest.mark.parametrize(
    ("url", "text"),
    [
        ("unix://", "names no socket path"),
        ("unix:///", "names no socket path"),
        ("unix://localhost/tmp/r.sock", "names a host in a unix:// URL"),
        ("unix:///tmp/r.sock?db=x", "has a database that is not a number"),
        ("unix:///tmp/r.sock?db=-1", "has a negative database number"),
        ("unix:///tmp/r.sock?timeout=3", "has an unknown query parameter 'timeout'"),
        ("redis+unix:///tmp/r.sock", "must be 'memory' or a redis://, rediss:// or unix:// URL"),
        ("http://host:6379/0", "must be 'memory' or a redis://, rediss:// or unix:// URL"),
    ],
)
def test_a_bad_unix_socket_address_is_a_value_error_saying_why(url: str, text: str) -> None:
    with pytest.raises(ValueError, match="^" + text.replace("?", r"\?")):
        StoreAddress.parse(url)


def test_tcp_addresses_keep_their_host_and_port() -> None:
    address = StoreAddress.parse("rediss://user:pw@redis.example:6380/2")
    assert (address.host, address.port, address.db, address.tls) == ("redis.example", 6380, 2, True)
    assert address.path is None
    assert address.public() == "rediss://redis.example:6380/2"
    assert StoreAddress.parse("redis://h").port == 6379


async def test_an_absent_unix_socket_is_store_unavailable(tmp_path: Path) -> None:
    client = Client(StoreAddress.parse(f"unix://{tmp_path}/none.sock"))
    with pytest.raises(StoreUnavailable, match="FileNotFoundError"):
        await client.call("PING")
    assert client.in_use == 0


# --------------------------------------------------------------------------------------------
# A real Redis


async def test_a_restart_between_two_commands_drops_the_pooled_connection(
    redis_server: RedisServer,
) -> None:
    client = Client(StoreAddress.parse(redis_server.url))
    try:
        assert await client.call("SET", "k", "kept") == b"OK"
        assert client.statistics().idle == 1
        redis_server.restart()
        async with client.connection() as connection:
            # Found closed in the pool before a command went out on it.
            assert not connection.reused
            assert await connection.call("GET", "k") == b"kept"
        assert await client.call("GET", "k") == b"kept"
        assert client.statistics().idle == 1
    finally:
        await client.aclose()


async def test_a_watch_conflict_reads_exec_as_nil(shared_redis_server: RedisServer) -> None:
    client = Client(StoreAddress.parse(shared_redis_server.url))
    try:
        await client.call("SET", "k", "0")
        async with client.connection() as connection:
            assert await connection.pipeline([["WATCH", "k"], ["GET", "k"]]) == [b"OK", b"0"]
            # Another writer between the read and the commit.
            assert shared_redis_server.command("SET", "k", "other") == b"OK"
            outcome = await connection.pipeline([["MULTI"], ["SET", "k", "1"], ["EXEC"]])
        assert outcome == [b"OK", b"QUEUED", None]
        assert await client.call("GET", "k") == b"other"
        # Without the conflict the same transaction commits.
        async with client.connection() as connection:
            await connection.pipeline([["WATCH", "k"], ["GET", "k"]])
            outcome = await connection.pipeline([["MULTI"], ["SET", "k", "1"], ["EXEC"]])
        assert outcome == [b"OK", b"QUEUED", [b"OK"]]
    finally:
        await client.aclose()


async def test_an_error_inside_exec_on_a_real_redis_is_a_server_error_value(
    shared_redis_server: RedisServer,
) -> None:
    client = Client(StoreAddress.parse(shared_redis_server.url))
    try:
        async with client.connection() as connection:
            outcome = await connection.pipeline(
                [["MULTI"], ["SET", "s", "v"], ["LPUSH", "s", "x"], ["INCR", "n"], ["EXEC"]]
            )
        assert outcome[:4] == [b"OK", b"QUEUED", b"QUEUED", b"QUEUED"]
        ok, error, counted = outcome[4]
        assert ok == b"OK"
        assert isinstance(error, ServerError)
        assert str(error).startswith("WRONGTYPE")
        assert counted == 1
        with pytest.raises(ServerError, match="unknown command"):
            await client.call("NO-SUCH-COMMAND")
        assert client.statistics().idle == 1, "error replies leave the connection healthy"
    finally:
        await client.aclose()


async def test_a_large_value_round_trips_through_a_real_redis(
    shared_redis_server: RedisServer,
) -> None:
    client = Client(StoreAddress.parse(shared_redis_server.url))
    value = os.urandom(8 * 1024 * 1024)
    try:
        assert await client.call("SET", "big", value) == b"OK"
        assert await client.call("GET", "big") == value
        assert await client.call("STRLEN", "big") == len(value)
    finally:
        await client.aclose()


async def test_pub_sub_messages_arrive_through_receive(shared_redis_server: RedisServer) -> None:
    client = Client(StoreAddress.parse(shared_redis_server.url))
    subscription = await client.connect()
    try:
        assert await subscription.pipeline([["SUBSCRIBE", "news"]]) == [[b"subscribe", b"news", 1]]
        assert await client.call("PUBLISH", "news", "hello") == 1
        with trio.fail_after(SAFETY_S):
            assert await subscription.receive() == [b"message", b"news", b"hello"]
    finally:
        await subscription.aclose()
        await client.aclose()


@pytest.fixture
def descriptors_past_1024() -> Iterator[None]:
    """More than 1,100 descriptors open, so every new one is numbered past select()'s 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2048
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below {wanted}")
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    pipes = []
    try:
        while True:
            probe = os.open(os.devnull, os.O_RDONLY)
            os.close(probe)
            if probe >= 1100:
                break
            pipes.append(os.pipe())
        yield
    finally:
        for read_end, write_end in pipes:
            os.close(read_end)
            os.close(write_end)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_the_pool_works_with_descriptors_past_1024(
    descriptors_past_1024: None, redis_server: RedisServer
) -> None:
    probe = socket.socket()
    try:
        # What the old select()-based check could not handle.
        assert probe.fileno() >= 1024
        with pytest.raises(ValueError):
            select.select([probe.fileno()], [], [], 0)
    finally:
        probe.close()
    client = Client(StoreAddress.parse(redis_server.url))
    try:
        assert await client.call("SET", "k", "v") == b"OK"
        async with client.connection() as connection:
            assert connection.reused
            assert not connection.closed_while_idle()
            assert await connection.call("GET", "k") == b"v"
        redis_server.restart()
        async with client.connection() as connection:
            assert not connection.reused, "the pooled connection was found closed"
            assert await connection.call("GET", "k") == b"v"
    finally:
        await client.aclose()


@pytest.fixture
def short_socket_dir() -> Iterator[Path]:
    # A unix socket path has room for about 100 bytes; pytest's tmp_path can be longer.
    folder = Path(tempfile.mkdtemp(prefix="genrm-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def test_a_real_round_trip_over_a_unix_socket(short_socket_dir: Path, tmp_path: Path) -> None:
    socket_path = short_socket_dir / "redis.sock"
    with RedisServer(data_dir=tmp_path / "redis", unix_socket=socket_path) as server:
        assert server.unix_url == f"unix://{socket_path}?db=0"
        assert os.stat(socket_path).st_mode & 0o777 == 0o700
        client = Client(StoreAddress.parse(f"unix://{socket_path}?db=2"))
        try:
            assert await client.call("SET", "k", "over-unix") == b"OK"
            info = await client.call("CLIENT", "INFO")
            assert f"laddr={socket_path}".encode() in info
            assert b" db=2 " in info
            with server.connect() as direct:
                assert direct.command("GET", "k") is None  # database 0
                direct.command("SELECT", 2)
                assert direct.command("GET", "k") == b"over-unix"
            server.restart()
            assert await client.call("GET", "k") == b"over-unix"
        finally:
            await client.aclose()
