"""The fake judge as a real HTTP/1.1 server on loopback TCP (h11 on Trio).
Socket-level actions break real connections; keep-alive and concurrent connections work."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import partial

import h11
import httpx
import pytest
import trio
from _fake_judge_support import chat_body, chat_verdict, responses_body

from genrm_trio.fakes.judge import FakeJudge
from genrm_trio.fakes.judge_http import serve_fake_judge, wait_for_stats

# Only guards against a hung test; no assertion depends on it.
SAFETY_S = 10


@pytest.fixture
def judge() -> FakeJudge:
    return FakeJudge()


@pytest.fixture
async def port(judge: FakeJudge, nursery: trio.Nursery) -> int:
    bound: int = await nursery.start(serve_fake_judge, judge, "127.0.0.1", 0)
    return bound


@pytest.fixture
async def client(port: int) -> AsyncIterator[httpx.AsyncClient]:
    base_url = f"http://127.0.0.1:{port}/v1"
    async with httpx.AsyncClient(base_url=base_url, timeout=SAFETY_S) as client:
        yield client


async def wait_until_settled(judge: FakeJudge) -> None:
    """Wait for the server to notice that a caller went away."""
    with trio.fail_after(SAFETY_S):
        await wait_for_stats(judge, lambda stats: stats["in_flight"] == 0)


async def post_then_leave(client: httpx.AsyncClient, judge: FakeJudge) -> None:
    """Send a judge call, and cancel it once the judge is working on it."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(client.post, "/chat/completions", json=chat_body("a", "b")))
        with trio.fail_after(SAFETY_S):
            await wait_for_stats(judge, lambda stats: stats["in_flight"] == 1)
        nursery.cancel_scope.cancel()


async def raw_exchange(port: int, request: bytes) -> bytes:
    """Send raw bytes and read until the server closes the connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        received = b""
        with trio.fail_after(SAFETY_S):
            while data := await stream.receive_some(65536):
                received += data
    return received


def post_bytes(body: dict[str, object], path: str = "/v1/chat/completions") -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: judge\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def test_verdicts_over_tcp(judge: FakeJudge, client: httpx.AsyncClient) -> None:
    reply = await client.post("/chat/completions", json=chat_body("[[q=5]]", "[[q=2]]"))
    assert reply.status_code == 200
    assert chat_verdict(reply.json()) == {"score_1": 5, "score_2": 2, "ranking": 1}
    reply = await client.post("/responses", json=responses_body("a", "b"))
    assert reply.json()["object"] == "response"
    assert judge.stats()["requests_total"] == 2
    assert judge.requests(1)[0]["headers"]["host"].startswith("127.0.0.1:")


async def test_keep_alive_serves_many_requests_on_one_connection(port: int) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    connection = h11.Connection(h11.CLIENT)
    statuses = []
    async with stream:
        for path in ("/v1/chat/completions", "/healthz", "/v1/chat/completions"):
            body = json.dumps(chat_body("a", "b")).encode() if "chat" in path else b""
            method = "POST" if body else "GET"
            headers = [("host", "judge"), ("content-length", str(len(body)))]
            await stream.send_all(
                connection.send(h11.Request(method=method, target=path, headers=headers))
            )
            await stream.send_all(connection.send(h11.Data(data=body)))
            await stream.send_all(connection.send(h11.EndOfMessage()))
            with trio.fail_after(SAFETY_S):
                while True:
                    event = connection.next_event()
                    if event is h11.NEED_DATA:
                        connection.receive_data(await stream.receive_some(65536))
                    elif isinstance(event, h11.Response):
                        statuses.append(event.status_code)
                    elif isinstance(event, h11.EndOfMessage):
                        break
            connection.start_next_cycle()
    assert statuses == [200, 200, 200]


async def test_concurrent_connections(judge: FakeJudge, client: httpx.AsyncClient) -> None:
    judge.set_rules([{"action": "verdict", "score_1": 1, "delay_s": 0.2}])
    statuses: list[int] = []

    async def one(n: int) -> None:
        reply = await client.post("/chat/completions", json=chat_body(f"a{n}", "b"))
        statuses.append(reply.status_code)

    async with trio.open_nursery() as nursery:
        for n in range(5):
            nursery.start_soon(one, n)
        with trio.fail_after(SAFETY_S):
            await wait_for_stats(judge, lambda stats: stats["in_flight"] == 5)
    assert statuses == [200] * 5
    assert judge.stats()["max_in_flight"] == 5
    await wait_until_settled(judge)


async def test_truncated_body_announces_more_than_it_sends(judge: FakeJudge, port: int) -> None:
    judge.set_rules([{"action": "truncated_body"}])
    received = await raw_exchange(port, post_bytes(chat_body("a", "b")))
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    announced = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    assert 0 < len(body) < announced


async def test_truncated_body_is_a_protocol_error_for_httpx(
    judge: FakeJudge, client: httpx.AsyncClient
) -> None:
    judge.set_rules([{"action": "truncated_body", "times": 1}])
    with pytest.raises(httpx.RemoteProtocolError, match="without sending complete message body"):
        await client.post("/chat/completions", json=chat_body("a", "b"))
    assert (await client.post("/chat/completions", json=chat_body("a", "b"))).status_code == 200
    assert judge.stats()["by_action"] == {"truncated_body": 1, "verdict": 1}
    assert judge.stats()["cancelled"] == 0


async def test_close_without_reply(judge: FakeJudge, port: int, client: httpx.AsyncClient) -> None:
    judge.set_rules([{"action": "close", "times": 2}])
    assert await raw_exchange(port, post_bytes(chat_body("a", "b"))) == b""
    with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
        await client.post("/chat/completions", json=chat_body("a", "b"))
    assert (await client.post("/chat/completions", json=chat_body("a", "b"))).status_code == 200
    await wait_until_settled(judge)


async def test_hang_until_the_client_goes_away(judge: FakeJudge, client: httpx.AsyncClient) -> None:
    judge.set_rules([{"action": "hang"}])
    await post_then_leave(client, judge)
    await wait_until_settled(judge)
    assert judge.stats()["cancelled"] == 1
    assert judge.stats()["in_flight"] == 0
    assert judge.stats()["by_action"] == {"hang": 1}


async def test_hang_with_client_timeout(judge: FakeJudge, port: int) -> None:
    judge.set_rules([{"action": "hang", "times": 1}])
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1", timeout=0.2) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/chat/completions", json=chat_body("a", "b"))
        await wait_until_settled(judge)
        assert judge.stats()["cancelled"] == 1
        assert (await client.post("/chat/completions", json=chat_body("a", "b"))).status_code == 200


async def test_client_leaving_during_latency_counts_as_cancelled(nursery: trio.Nursery) -> None:
    judge = FakeJudge(latency="fixed:30")
    port = await nursery.start(serve_fake_judge, judge, "127.0.0.1", 0)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(post_bytes(chat_body("a", "b")))
    with trio.fail_after(SAFETY_S):
        await wait_for_stats(judge, lambda stats: stats["in_flight"] == 1)
    await stream.aclose()
    await wait_until_settled(judge)
    assert judge.stats()["cancelled"] == 1
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1") as client:
        await post_then_leave(client, judge)
    await wait_until_settled(judge)
    assert judge.stats() | {"by_api": None} == {
        "requests_total": 2,
        "by_api": None,
        "by_action": {"verdict": 2},
        "in_flight": 0,
        "max_in_flight": 1,
        "cancelled": 2,
    }


async def test_control_routes_over_tcp(judge: FakeJudge, port: int) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        rules = [{"action": "http_status", "status": 503, "retry_after": 2}]
        assert (await client.put("/_fake/rules", json=rules)).json() == rules
        reply = await client.post("/v1/chat/completions", json=chat_body("a", "b"))
        assert (reply.status_code, reply.headers["retry-after"]) == (503, "2")
        assert (await client.get("/_fake/stats")).json()["by_action"] == {"http_status": 1}
        assert (await client.get("/v1/models")).json()["data"][0]["id"] == "fake-judge"
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.post("/_fake/reset")).status_code == 200
        assert judge.stats()["requests_total"] == 0
        assert (await client.get("/v1/chat/completions")).status_code == 405


async def test_malformed_http_gets_400_and_close(port: int) -> None:
    received = await raw_exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 400 ")
