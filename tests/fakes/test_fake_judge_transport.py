"""The fake judge through the in-memory judge transport (fakes/memory_transport.py), as the
judge client uses it: every CL-15 action, the CL-11 checks, latency and cancellation under a mock
clock. Control routes are not judge calls; they are tested over ASGI and TCP.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing
from _fake_judge_support import (
    BASE_URL,
    chat_body,
    chat_content,
    chat_verdict,
    fenced_verdict,
    responses_body,
    responses_text,
)

from genrm_trio.fakes.judge import FakeJudge, pair_rule
from genrm_trio.fakes.memory_transport import MemoryTransport
from genrm_trio.judge.transport import JudgeEndpoint, JudgeReply, RemoteProtocolError


@dataclass
class Answer:
    status_code: int
    headers: dict[str, str]
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode()


class JudgeCaller:
    """Posts request bodies to the fake judge through the in-memory transport."""

    def __init__(self, judge: FakeJudge) -> None:
        self.judge = judge

    async def send(
        self, path: str, *, json: Any, headers: dict[str, str] | None = None
    ) -> JudgeReply:
        endpoint = JudgeEndpoint(url=BASE_URL + path, headers=headers or {}, timeout_s=60.0)
        return await MemoryTransport(self.judge, endpoint).send(_json_bytes(json))

    async def post(self, path: str, *, json: Any, headers: dict[str, str] | None = None) -> Answer:
        reply = await self.send(path, json=json, headers=headers)
        chunks: list[bytes] = []
        try:
            await reply.read_at_most(1 << 24, chunks)
        finally:
            await reply.release()
        names = {name.decode(): value.decode() for name, value in reply.headers}
        return Answer(reply.status, names, b"".join(chunks))

    async def __aenter__(self) -> JudgeCaller:
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await trio.lowlevel.checkpoint()


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


@pytest.fixture
def judge() -> FakeJudge:
    return FakeJudge()


@pytest.fixture
async def client(judge: FakeJudge) -> AsyncIterator[JudgeCaller]:
    async with JudgeCaller(judge) as client:
        yield client


async def chat(client: JudgeCaller, a: str = "a", b: str = "b", **kw: Any) -> Answer:
    return await client.post("/chat/completions", json=chat_body(a, b, **kw))


async def responses(client: JudgeCaller, a: str = "a", b: str = "b") -> Answer:
    return await client.post("/responses", json=responses_body(a, b))


# -- verdicts and request checks ------------------------------------------------------------


async def test_plain_verdicts_over_both_apis(judge: FakeJudge, client: JudgeCaller) -> None:
    reply = await chat(client, "answer-0 [[q=5]]", "answer-1 [[q=2]]")
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "application/json"
    assert chat_verdict(reply.json()) == {"score_1": 5, "score_2": 2, "ranking": 1}
    reply = await responses(client, "[[q=3]]", "[[q=3]]")
    assert fenced_verdict(responses_text(reply.json())) == {
        "score_1": 3,
        "score_2": 3,
        "ranking": 3.5,
    }
    assert judge.stats()["by_api"] == {"chat_completions": 1, "responses": 1}
    assert judge.stats()["by_action"] == {"verdict": 2}


async def test_as_167_request_checks() -> None:
    judge = FakeJudge(model="genrm", api_key="k")
    auth = {"Authorization": "Bearer k"}
    async with JudgeCaller(judge) as client:
        body = chat_body("a", "b")
        body["messages"] = body["messages"][:-1]
        bad_role = await client.post("/chat/completions", json=body, headers=auth)
        wrong_model = await client.post(
            "/chat/completions", json=chat_body("a", "b", model="x"), headers=auth
        )
        no_key = await client.post("/chat/completions", json=chat_body("a", "b"))
        good = await client.post("/chat/completions", json=chat_body("a", "b"), headers=auth)
    assert bad_role.status_code == 400
    assert bad_role.json()["error"]["message"].startswith("fake judge: ")
    assert wrong_model.status_code == 400
    assert wrong_model.json() == {
        "error": {"message": "fake judge: model 'x' is not served here; expected 'genrm'"}
    }
    assert no_key.status_code == 401
    assert no_key.json() == {"error": {"message": "fake judge: missing or wrong API key"}}
    assert good.status_code == 200
    assert judge.requests(1)[0]["headers"]["authorization"] == "<redacted>"


# -- every action ---------------------------------------------------------------------------


async def test_verdict_action(judge: FakeJudge, client: JudgeCaller) -> None:
    judge.set_rules([{"action": "verdict", "score_1": 4, "score_2": 2, "ranking": 1}])
    assert chat_verdict((await chat(client)).json()) == {"score_1": 4, "score_2": 2, "ranking": 1}
    text = responses_text((await responses(client)).json())
    assert fenced_verdict(text) == {"score_1": 4, "score_2": 2, "ranking": 1}


async def test_verdict_action_can_carry_non_finite_values(
    judge: FakeJudge, client: JudgeCaller
) -> None:
    judge.set_rules([{"action": "verdict", "score_1": float("nan"), "ranking": 1}])
    content = chat_content((await chat(client)).json())
    assert content.endswith('```json\n{"score_1": NaN, "ranking": 1}\n```')


async def test_text_action_with_and_without_finish(judge: FakeJudge, client: JudgeCaller) -> None:
    fenced = '```json\n{"score_1": 4, "score_2": 2, "ranking": 1}\n```'
    judge.set_rules(
        [
            {"action": "text", "text": "I prefer the first one.", "times": 2},
            {"action": "text", "text": fenced, "finish": "length"},
        ]
    )
    plain = (await chat(client)).json()
    assert chat_content(plain) == "I prefer the first one."
    assert plain["choices"][0]["finish_reason"] == "stop"
    plain_responses = (await responses(client)).json()
    assert responses_text(plain_responses) == "I prefer the first one."
    assert plain_responses["status"] == "completed"
    finished = (await chat(client)).json()
    assert (chat_content(finished), finished["choices"][0]["finish_reason"]) == (fenced, "length")
    assert (await responses(client)).json()["status"] == "length"


async def test_empty_action(judge: FakeJudge, client: JudgeCaller) -> None:
    judge.set_rules([{"action": "empty"}])
    reply = (await chat(client)).json()
    assert chat_content(reply).rpartition("</think>")[2].strip() == ""
    assert reply["choices"][0]["finish_reason"] == "stop"
    reply = (await responses(client)).json()
    assert (reply["status"], responses_text(reply)) == ("completed", "")


async def test_null_content_action(judge: FakeJudge, client: JudgeCaller) -> None:
    judge.set_rules([{"action": "null_content"}])
    assert chat_content((await chat(client)).json()) is None
    message = (await responses(client)).json()["output"][1]
    assert message["content"] == [{"type": "output_text", "text": None, "annotations": []}]


@pytest.mark.parametrize("value", ["content_filter", "failed", "cancelled", "in_progress"])
async def test_finish_action(judge: FakeJudge, client: JudgeCaller, value: str) -> None:
    judge.set_rules([{"action": "finish", "value": value}])
    reply = (await chat(client)).json()
    assert reply["choices"][0]["finish_reason"] == value
    assert "```" not in chat_content(reply)
    reply = (await responses(client)).json()
    assert (reply["status"], responses_text(reply)) == (value, "")


async def test_budget_exhausted_action(judge: FakeJudge, client: JudgeCaller) -> None:
    judge.set_rules([{"action": "budget_exhausted"}])
    reply = (await chat(client)).json()
    content = chat_content(reply)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert content.startswith("<think>")
    assert "</think>" not in content
    reply = (await responses(client)).json()
    assert reply["status"] == "incomplete"
    assert reply["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [item["type"] for item in reply["output"]] == ["reasoning"]


async def test_http_status_action(judge: FakeJudge, client: JudgeCaller) -> None:
    judge.set_rules(
        [
            {"action": "http_status", "status": 500, "times": 1},
            {"action": "http_status", "status": 429, "retry_after": 1, "times": 1},
            {"action": "http_status", "status": 503, "body": {"error": "busy"}, "times": 1},
            {"action": "http_status", "status": 401, "body": "no", "times": 1},
        ]
    )
    first = await chat(client)
    assert (first.status_code, first.content) == (500, b'{"error":"injected"}')
    assert "retry-after" not in first.headers
    second = await chat(client)
    assert (second.status_code, second.headers["retry-after"]) == (429, "1")
    third = await chat(client)
    assert (third.status_code, third.content) == (503, b'{"error":"busy"}')
    fourth = await chat(client)
    assert (fourth.status_code, fourth.content) == (401, b"no")
    assert judge.stats()["by_action"] == {"http_status": 4}


async def test_non_json_action(judge: FakeJudge, client: JudgeCaller) -> None:
    judge.set_rules([{"action": "non_json"}])
    reply = await chat(client)
    assert (reply.status_code, reply.content) == (200, b"<html>not json</html>")


@pytest.mark.parametrize(
    ("body", "expected"),
    [("null", b"null"), ("{}", b"{}"), ('{"choices": []}', b'{"choices": []}'), ([], b"[]")],
)
async def test_raw_action_bodies(
    judge: FakeJudge, client: JudgeCaller, body: Any, expected: bytes
) -> None:
    judge.set_rules([{"action": "raw", "body": body}])
    reply = await chat(client)
    assert (reply.status_code, reply.content) == (200, expected)
    assert reply.headers["content-type"] == "application/json"


async def test_raw_action_status_and_content_type(judge: FakeJudge, client: JudgeCaller) -> None:
    valid = '{"choices": [{"message": {"content": "x"}}]}'
    judge.set_rules([{"action": "raw", "body": valid, "status": 202, "content_type": "text/plain"}])
    reply = await chat(client)
    assert (reply.status_code, reply.headers["content-type"]) == (202, "text/plain")
    assert reply.text == valid


async def test_truncated_body_action_breaks_the_read(judge: FakeJudge, client: JudgeCaller) -> None:
    judge.set_rules([{"action": "truncated_body", "times": 1}])
    with pytest.raises(RemoteProtocolError, match="closed the connection after"):
        await chat(client)
    assert (await chat(client)).status_code == 200
    judge.set_rules([{"action": "truncated_body"}])
    reply = await client.send("/chat/completions", json=chat_body("a", "b"))
    announced = int(reply.header(b"content-length") or 0)
    received: list[bytes] = []
    with pytest.raises(RemoteProtocolError):
        await reply.read_at_most(1 << 20, received)
    await reply.release()
    assert 0 < len(b"".join(received)) < announced
    assert judge.stats()["in_flight"] == 0
    assert judge.stats()["by_action"] == {"truncated_body": 2, "verdict": 1}


async def test_close_action(judge: FakeJudge, client: JudgeCaller) -> None:
    judge.set_rules([{"action": "close"}])
    with pytest.raises(RemoteProtocolError, match="before replying"):
        await chat(client)
    assert judge.stats()["in_flight"] == 0
    assert judge.stats()["cancelled"] == 0


async def test_hang_until_the_caller_cancels(
    judge: FakeJudge, client: JudgeCaller, autojump_clock: trio.testing.MockClock
) -> None:
    judge.set_rules([{"action": "hang"}])
    with trio.move_on_after(600) as scope:
        await chat(client)
    assert scope.cancelled_caught
    assert trio.current_time() == 600
    assert judge.stats()["cancelled"] == 1
    assert judge.stats()["in_flight"] == 0
    assert judge.stats()["by_action"] == {"hang": 1}


async def test_hang_ignores_latency(autojump_clock: trio.testing.MockClock) -> None:
    judge = FakeJudge(latency="fixed:5", rules=[{"action": "hang"}])
    async with JudgeCaller(judge) as hang_client:
        with trio.move_on_after(1):
            await chat(hang_client)
    assert judge.requests(1)[0]["delay_s"] == 0.0
    assert judge.stats()["cancelled"] == 1


# -- latency (CL-16) ------------------------------------------------------------------------


async def test_fixed_latency_is_exact_under_the_mock_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = FakeJudge(latency="fixed:0.2")
    async with JudgeCaller(judge) as client:
        start = trio.current_time()
        reply = await chat(client)
        assert trio.current_time() - start == pytest.approx(0.2, abs=1e-12)
    assert reply.status_code == 200
    assert judge.requests(1)[0]["arrival_time"] == start


async def test_latency_applies_before_error_actions_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = FakeJudge(latency="fixed:1", rules=[{"action": "close", "delay_s": 0.5}])
    async with JudgeCaller(judge) as client:
        with pytest.raises(RemoteProtocolError):
            await chat(client)
    assert trio.current_time() == pytest.approx(1.5)


async def test_uniform_latency_matches_the_recorded_delay(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = FakeJudge(latency="uniform:0.1:0.3", seed=5)
    async with JudgeCaller(judge) as client:
        for _ in range(5):
            start = trio.current_time()
            await chat(client)
            delay = judge.requests(1)[0]["delay_s"]
            assert 0.1 <= delay <= 0.3
            assert trio.current_time() - start == pytest.approx(delay)


async def test_cancel_during_latency_counts_as_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = FakeJudge(latency="fixed:10")
    async with JudgeCaller(judge) as client:
        with trio.move_on_after(1):
            await chat(client)
    assert judge.stats()["cancelled"] == 1
    assert judge.stats()["in_flight"] == 0


async def test_concurrent_calls_raise_max_in_flight(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = FakeJudge(latency="fixed:0.2")
    async with JudgeCaller(judge) as client:
        async with trio.open_nursery() as nursery:
            for n in range(3):
                nursery.start_soon(chat, client, f"a{n}", "b")
            await trio.testing.wait_all_tasks_blocked()
            assert judge.stats()["in_flight"] == 3
    assert judge.stats()["max_in_flight"] == 3
    assert judge.stats()["in_flight"] == 0
    assert trio.current_time() == pytest.approx(0.2)


# -- rules over the wire (AS-168) -----------------------------------------------------------


async def test_as_168_times_and_after(judge: FakeJudge, client: JudgeCaller) -> None:
    judge.set_rules([{"action": "http_status", "status": 503, "times": 1}])
    assert [(await chat(client)).status_code for _ in range(3)] == [503, 200, 200]
    judge.set_rules([{"action": "http_status", "status": 503, "after": 1}])
    assert [(await chat(client)).status_code for _ in range(2)] == [200, 503]


async def test_pair_rule_fails_one_pair(judge: FakeJudge, client: JudgeCaller) -> None:
    judge.set_rules([pair_rule(15, 0, "budget_exhausted")])
    hit = (await chat(client, "answer-15 [[q=3]]", "answer-0 [[q=3]]")).json()
    miss = (await chat(client, "answer-14 [[q=3]]", "answer-15 [[q=3]]")).json()
    assert hit["choices"][0]["finish_reason"] == "length"
    assert miss["choices"][0]["finish_reason"] == "stop"
