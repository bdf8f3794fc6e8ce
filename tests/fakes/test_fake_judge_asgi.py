"""The fake judge as an ASGI app (``fake_judge_app``), driven through ``httpx.ASGITransport``.
Same routes and verdicts as the other adapters; broken connections surface as protocol errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from _fake_judge_support import BASE_URL, chat_body, chat_verdict, responses_body

from genrm_trio.fakes.judge import FakeJudge, pair_rule
from genrm_trio.fakes.judge_http import FakeJudgeApp, fake_judge_app


@pytest.fixture
def app() -> FakeJudgeApp:
    return fake_judge_app(seed=1, model="genrm", position_bias=1)


@pytest.fixture
async def client(app: FakeJudgeApp) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(base_url="http://judge", transport=transport) as client:
        yield client


def test_app_carries_a_judge_built_from_the_keywords(app: FakeJudgeApp) -> None:
    assert isinstance(app.judge, FakeJudge)
    assert (app.judge.seed, app.judge.model, app.judge.position_bias) == (1, "genrm", 1.0)


async def test_verdicts_and_routes(app: FakeJudgeApp, client: httpx.AsyncClient) -> None:
    reply = await client.post("/v1/chat/completions", json=chat_body("[[q=3]]", "[[q=3]]"))
    assert chat_verdict(reply.json()) == {"score_1": 4, "score_2": 3, "ranking": 2}
    reply = await client.post("/v1/responses", json=responses_body("a", "b"))
    assert reply.json()["status"] == "completed"
    wrong = await client.post("/v1/chat/completions", json=chat_body("a", "b", model="x"))
    assert wrong.status_code == 400
    assert (await client.get("/v1/models")).json()["data"][0]["id"] == "genrm"
    assert (await client.get("/_fake/stats")).json()["requests_total"] == 3
    assert (await client.get("/_fake/requests?limit=2")).json()[1]["action"] == "rejected"
    assert (await client.put("/_fake/rules", json=[{"action": "non_json"}])).status_code == 200
    assert (await client.post("/v1/chat/completions", json=chat_body("a", "b"))).text == (
        "<html>not json</html>"
    )
    assert (await client.post("/_fake/reset")).status_code == 200
    assert app.judge.stats()["requests_total"] == 0
    assert (await client.get("/healthz")).json() == {"status": "ok"}


async def test_truncated_body_and_close_raise_protocol_errors(
    app: FakeJudgeApp, client: httpx.AsyncClient
) -> None:
    app.judge.set_rules([{"action": "truncated_body", "times": 1}, {"action": "close"}])
    with pytest.raises(httpx.RemoteProtocolError, match="without sending complete message body"):
        await client.post("/v1/chat/completions", json=chat_body("a", "b"))
    with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
        await client.post("/v1/chat/completions", json=chat_body("a", "b"))
    assert app.judge.stats()["in_flight"] == 0


async def test_hang_and_latency_end_when_the_caller_cancels(
    app: FakeJudgeApp, client: httpx.AsyncClient, autojump_clock: trio.testing.MockClock
) -> None:
    app.judge.set_rules([{"action": "hang", "times": 1}, {"action": "verdict", "delay_s": 50}])
    for _ in range(2):
        with trio.move_on_after(10):
            await client.post("/v1/chat/completions", json=chat_body("a", "b"))
    assert app.judge.stats()["cancelled"] == 2
    assert app.judge.stats()["in_flight"] == 0
    start = trio.current_time()
    assert (await client.post("/v1/chat/completions", json=chat_body("a", "b"))).status_code == 200
    assert trio.current_time() - start == 50


async def test_lifespan_startup_and_shutdown(app: FakeJudgeApp) -> None:
    sent: list[MutableMapping[str, Any]] = []
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive() -> MutableMapping[str, Any]:
        await trio.lowlevel.checkpoint()
        return next(messages)

    async def send(message: MutableMapping[str, Any]) -> None:
        await trio.lowlevel.checkpoint()
        sent.append(message)

    await app({"type": "lifespan"}, receive, send)
    assert sent == [{"type": "lifespan.startup.complete"}, {"type": "lifespan.shutdown.complete"}]


# -- control routes (CL-18) -----------------------------------------------------------------


async def test_control_routes() -> None:
    judge = FakeJudge()
    transport = httpx.ASGITransport(app=FakeJudgeApp(judge))
    async with httpx.AsyncClient(base_url=BASE_URL, transport=transport) as client:
        await _control_routes(judge, client)


async def _control_routes(judge: FakeJudge, client: httpx.AsyncClient) -> None:
    rules = [pair_rule(0, 1, "http_status", status=500)]
    assert (await client.put("http://fake-judge/_fake/rules", json=rules)).json() == rules
    assert (await client.get("http://fake-judge/_fake/rules")).json() == rules
    chat = "/chat/completions"
    assert (await client.post(chat, json=chat_body("answer-0 x", "answer-1 y"))).status_code == 500
    await client.post(chat, json=chat_body("a", "b"))
    stats = (await client.get("http://fake-judge/_fake/stats")).json()
    assert stats == {
        "requests_total": 2,
        "by_api": {"chat_completions": 2, "responses": 0},
        "by_action": {"http_status": 1, "verdict": 1},
        "in_flight": 0,
        "max_in_flight": 1,
        "cancelled": 0,
    }
    recorded = (await client.get("http://fake-judge/_fake/requests?limit=1")).json()
    assert [(r["path"], r["action"]) for r in recorded] == [("/v1/chat/completions", "verdict")]
    assert recorded[0]["body"] == chat_body("a", "b")
    assert (await client.post("http://fake-judge/_fake/reset")).status_code == 200
    assert judge.stats()["requests_total"] == 0
    assert judge.rules == rules
    bad = await client.put("http://fake-judge/_fake/rules", json={"action": "close"})
    assert bad.status_code == 400
    models = (await client.get("/models")).json()
    assert models["data"][0]["id"] == "fake-judge"
    assert (await client.get("http://fake-judge/healthz")).json() == {"status": "ok"}
    assert (await client.get("http://fake-judge/elsewhere")).status_code == 404
    assert judge.stats()["requests_total"] == 0
