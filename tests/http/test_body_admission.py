"""/verify bodies are admitted by their length before they are read: within the memory budget
they are read and wait in memory, beyond it they wait unread (in the kernel and the client) for a
spool slot, then are read, written to their file and let go. Driven over real loopback sockets
through `serve`'s own accept and read loops."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import trio
import trio.lowlevel

from genrm_trio.config import config_from_mapping
from genrm_trio.http._receiving import SPOOL_SLOTS
from genrm_trio.http.app import GenRMApp, create_app
from genrm_trio.http.read_gates import ReadGates
from genrm_trio.http.serving import ConnectionGate, serve_app
from genrm_trio.serve import hypercorn_settings
from genrm_trio.testing import FakeJudge
from genrm_trio.testing.harness import SCENARIO_DEFAULTS, member, running_server

GROUP = 4


def big_member(i: int, g: str, tokens: int = 60_000) -> dict[str, Any]:
    """A member whose body is several hundred KB, as a long rollout's is."""
    body = member(i, q=1 + i, g=g)
    body["response"]["generation_token_ids"] = list(range(i, tokens + i))
    body["response"]["generation_log_probs"] = [-0.5 - k / 9 for k in range(tokens // 4)]
    return body


def request_bytes(body: bytes, *, chunked: bool = False) -> bytes:
    if chunked:
        pieces = [body[i : i + 100_000] for i in range(0, len(body), 100_000)]
        framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
        return (
            b"POST /verify HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + framed
        )
    return (
        b"POST /verify HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    ) + body


async def read_reply(stream: trio.SocketStream) -> bytes:
    """The body of the one reply on ``stream``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        assert chunk, "closed before the reply"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    length = int(
        next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))[15:]
    )
    while len(rest) < length:
        chunk = await stream.receive_some(1 << 20)
        assert chunk, "closed inside the reply"
        rest += chunk
    return rest


@asynccontextmanager
async def serving(**overrides: Any) -> AsyncIterator[tuple[GenRMApp, int]]:
    """A server on a loopback port, through serve's accept loop and connection handler."""
    config = config_from_mapping(
        {**SCENARIO_DEFAULTS, "num_rollouts_per_prompt": GROUP, "port": 0, **overrides}
    )
    read_gates = ReadGates()
    app = create_app(config, judge_transport=FakeJudge().transport(), read_gates=read_gates)
    settings = hypercorn_settings(config)
    settings.bind = ["127.0.0.1:0"]
    gate = ConnectionGate(capacity=512, open_file_limit=1024, rejecting_slots=4)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_app(
                app,
                settings,
                gate,
                shutdown_trigger=stop.wait,
                read_gates=read_gates,
                task_status=task_status,
            )
        )
        port = int(binds[0].rsplit(":", 1)[1])
        try:
            yield app, port
        finally:
            stop.set()


async def expected_rows(bodies: list[bytes]) -> list[bytes]:
    """The rows a server without a budget gives for ``bodies`` (posted group by group)."""
    async with running_server(
        num_rollouts_per_prompt=GROUP, waiting_body_memory_bytes=None
    ) as server:
        rows: list[bytes] = [b""] * len(bodies)

        async def one(index: int) -> None:
            rows[index] = (await server.verify(bodies[index])).raw

        async with trio.open_nursery() as nursery:
            for index in range(len(bodies)):
                nursery.start_soon(one, index)
    return rows


async def all_requests_done(app: GenRMApp) -> None:
    """Wait until every request has finished on the server (a reply is out before its request
    gives back its budget and removes its file)."""
    with trio.fail_after(10):
        while app.spool.files or app.spool_budget.in_memory:  # noqa: ASYNC110
            await trio.sleep(0.01)


def step(groups: int) -> list[bytes]:
    return [
        msgspec.json.encode(big_member(i, f"g{g}")) for g in range(groups) for i in range(GROUP)
    ]


async def test_a_whole_step_at_once_stays_within_the_budget_and_every_row_is_right(
    tmp_path: Path,
) -> None:
    bodies = step(6)
    size = max(len(b) for b in bodies)
    budget = 5 * size
    expected = await expected_rows(bodies)
    async with serving(waiting_body_memory_bytes=budget, spool_dir=str(tmp_path)) as (app, port):
        held: list[tuple[int, int]] = []
        done = trio.Event()

        async def watch() -> None:
            while not done.is_set():
                held.append((app.spool_budget.in_memory, app.spool_budget.receiving))
                await trio.lowlevel.checkpoint()

        rows: list[bytes] = [b""] * len(bodies)

        async def post(index: int) -> None:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(request_bytes(bodies[index]))
                rows[index] = await read_reply(stream)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            async with trio.open_nursery() as posts:
                for index in range(len(bodies)):
                    posts.start_soon(post, index)
            done.set()
        assert rows == expected
        # What the budget gave out never passed it; bodies beyond it were read at most
        # SPOOL_SLOTS at a time.
        assert max(used for used, _ in held) <= budget
        assert max(receiving for _, receiving in held) <= budget + SPOOL_SLOTS * size
        assert max(used for used, _ in held) > 3 * size  # the budget was used, not bypassed
        await all_requests_done(app)
        assert (app.spool_budget.receiving, app.spool_budget.waiting) == (0, 0)
        assert app.spool.files == 0


def fill_socket(sock: socket.socket, data: memoryview) -> int:
    """Send from ``data`` until the kernel takes no more; the bytes sent."""
    sent = 0
    while sent < len(data):
        try:
            sent += sock.send(data[sent : sent + 1 << 20])
        except BlockingIOError:
            break
    return sent


async def kernel_buffers() -> int:
    """What the kernel holds of a loopback connection whose peer reads nothing, filled the way
    the test fills its request's."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
        with client, peer:
            client.setblocking(False)
            data = memoryview(bytes(64 << 20))
            sent = fill_socket(client, data)
            await trio.sleep(0.5)
            return sent + fill_socket(client, data[sent:])


async def test_a_body_beyond_the_budget_is_not_read_until_a_spool_slot_frees(
    tmp_path: Path,
) -> None:
    huge = msgspec.json.encode(big_member(0, "solo", tokens=1_000_000))
    others = [msgspec.json.encode(member(i, q=1 + i, g="solo")) for i in range(1, GROUP)]
    async with serving(
        waiting_body_memory_bytes=0, spool_dir=str(tmp_path), cohort_collection_timeout_s=600
    ) as (app, port):
        slots = app.body_receiver.slots
        for _ in range(SPOOL_SLOTS):
            await slots.acquire()  # every spool slot busy
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        request = memoryview(request_bytes(huge))
        sent = fill_socket(sock, request)
        await trio.sleep(0.5)  # the server gets every chance to read
        sent += fill_socket(sock, request[sent:])
        # Nothing of the body reached the application, and besides the kernel's buffers the
        # server took no more than its first reads of the connection: the client cannot send.
        assert app.spool_budget.receiving == 0
        assert sent <= await kernel_buffers() + 128 * 1024
        assert app.spool.files == 0
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        rows: dict[int, bytes] = {}

        async def post(index: int, payload: bytes) -> None:
            other = await trio.open_tcp_stream("127.0.0.1", port)
            async with other:
                await other.send_all(request_bytes(payload))
                rows[index] = await read_reply(other)

        async with trio.open_nursery() as nursery:
            for _ in range(SPOOL_SLOTS):
                slots.release()
            nursery.start_soon(stream.send_all, request[sent:])
            for index, payload in enumerate(others, start=1):
                nursery.start_soon(post, index, payload)
            rows[0] = await read_reply(stream)
        await stream.aclose()
        decoded = [msgspec.json.decode(rows[i]) for i in range(GROUP)]
        assert [row["_ng_rollout_index"] for row in decoded] == [0, 1, 2, 3]
        assert [row["mask_sample"] for row in decoded] == [False] * GROUP
        assert [row["reward"] for row in decoded] == [1.0, 2.0, 3.0, 4.0]
        assert rows[0].startswith(huge[:-1])  # the echo, byte for byte
        await all_requests_done(app)
        assert (app.spool_budget.receiving, slots.value) == (0, SPOOL_SLOTS)


async def test_a_chunked_body_that_outgrows_the_budget_is_spooled_with_the_same_row(
    tmp_path: Path,
) -> None:
    bodies = step(1)
    expected = await expected_rows(bodies)
    # Room for one body and a half: the second chunked body runs out of room part way.
    budget = len(bodies[0]) * 3 // 2
    async with serving(waiting_body_memory_bytes=budget, spool_dir=str(tmp_path)) as (app, port):
        rows: list[bytes] = [b""] * len(bodies)
        spooled: list[int] = []

        async def post(index: int) -> None:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(request_bytes(bodies[index], chunked=True))
                rows[index] = await read_reply(stream)

        async with trio.open_nursery() as nursery:
            for index in range(len(bodies)):
                nursery.start_soon(post, index)
                with trio.fail_after(10):
                    # One at a time, so that each has its place: in memory or in a file.
                    while app.engine.statistics().waiters <= index and index < GROUP - 1:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                spooled.append(app.spool.files)
        assert rows == expected
        assert spooled[:3] == [0, 1, 2]  # the first fits; the others are in files
        await all_requests_done(app)
        assert (app.spool_budget.receiving, app.spool_budget.waiting, app.spool.files) == (0, 0, 0)


async def test_a_client_that_leaves_while_waiting_for_room_gives_its_place_back(
    tmp_path: Path,
) -> None:
    body = msgspec.json.encode(big_member(0, "gone"))
    async with serving(waiting_body_memory_bytes=0, spool_dir=str(tmp_path)) as (app, port):
        slots = app.body_receiver.slots
        for _ in range(SPOOL_SLOTS):
            await slots.acquire()
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(request_bytes(body)[:100_000])
        await stream.aclose()
        for _ in range(SPOOL_SLOTS):
            slots.release()
        # The next body beyond the budget is served as if the first had never come.
        rows = []
        for i in range(GROUP):
            other = await trio.open_tcp_stream("127.0.0.1", port)
            await other.send_all(request_bytes(msgspec.json.encode(big_member(i, "next"))))
            rows.append(other)
        decoded = [msgspec.json.decode(await read_reply(other)) for other in rows]
        for other in rows:
            await other.aclose()
        assert [row["reward"] for row in decoded] == [1.0, 2.0, 3.0, 4.0]
        await all_requests_done(app)
        assert (app.spool_budget.receiving, slots.value, app.spool.files) == (0, SPOOL_SLOTS, 0)
        assert app.engine.statistics().active_groups == 0
