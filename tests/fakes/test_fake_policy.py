"""The fake policy: seeded answers the fake judge can read, both APIs, errors, served over HTTP."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
import trio

from genrm_trio.core.texts import extract_scoring_text
from genrm_trio.fakes.judge import quality
from genrm_trio.fakes.policy import FakePolicy, parse_range, serve_fake_policy


def _post(policy: FakePolicy, body: Any, path: str = "/v1/responses") -> tuple[int, Any]:
    reply = policy.handle("POST", path, json.dumps(body).encode())
    return reply.status, json.loads(reply.body)


def _answer(policy: FakePolicy, prompt: str) -> str:
    status, body = _post(policy, {"input": prompt})
    assert status == 200, body
    return extract_scoring_text(body)[1]


def test_answers_are_numbered_per_prompt_and_carry_a_quality_the_judge_reads() -> None:
    policy = FakePolicy(seed=3, quality="1:5", words="2:6")
    first = [_answer(policy, "task A") for _ in range(6)]
    other = _answer(policy, "task B")
    assert [a.split(" ")[0] for a in first] == [f"answer-{k}" for k in range(6)]
    assert other.startswith("answer-0 ")
    for k, text in enumerate(first):
        expected_text, expected_quality = policy.answer(
            json.dumps([{"content": "task A", "role": "user"}]), k
        )
        assert text == expected_text
        assert quality(text) == expected_quality
        assert 1 <= expected_quality <= 5
        assert 2 <= len(text.split(" ")) - 2 <= 6
    # The same seed gives the same answers in a fresh process; another seed does not.
    again = FakePolicy(seed=3, quality="1:5", words="2:6")
    assert [_answer(again, "task A") for _ in range(6)] == first
    changed = FakePolicy(seed=4, quality="1:5", words="2:6")
    assert [_answer(changed, "task A") for _ in range(6)] != first


def test_a_qualities_directive_in_the_prompt_fixes_each_answers_quality() -> None:
    policy = FakePolicy(seed=0)
    texts = [_answer(policy, "rate me [[qualities=5,1,3]]") for _ in range(4)]
    assert [quality(t) for t in texts] == [5.0, 1.0, 3.0, 5.0]


def test_chat_completions_and_responses_answer_alike() -> None:
    responses = FakePolicy(seed=1)
    chat = FakePolicy(seed=1)
    status, body = _post(
        chat,
        {"messages": [{"role": "user", "content": "hi"}], "model": "m"},
        "/v1/chat/completions",
    )
    assert status == 200
    assert body["object"] == "chat.completion"
    assert body["model"] == "m"
    assert body["choices"][0]["message"]["content"] == _answer(responses, "hi")
    assert chat.stats()["by_api"] == {"responses": 0, "chat_completions": 1}


# The fields the OpenAI SDK's `Response` model declares without a default, and the two usage
# details it requires: NeMo Gym's `openai_model` server validates every reply against that
# model (`NeMoGymResponse`) and fails the agent's /run when one is missing.
RESPONSE_REQUIRED = {
    "id",
    "created_at",
    "model",
    "object",
    "output",
    "parallel_tool_calls",
    "tool_choice",
    "tools",
}


def test_a_responses_reply_has_every_field_the_openai_response_model_requires() -> None:
    status, body = _post(FakePolicy(seed=1), {"input": "hi", "model": "m"})
    assert status == 200
    assert RESPONSE_REQUIRED <= set(body)
    assert (body["parallel_tool_calls"], body["tool_choice"], body["tools"]) == (True, "auto", [])
    usage = body["usage"]
    assert usage["input_tokens_details"] == {"cached_tokens": 0}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


@pytest.mark.parametrize(
    ("path", "body", "status", "text"),
    [
        ("/v1/responses", b"{", 400, "not valid JSON"),
        ("/v1/responses", b"[]", 400, "not a JSON object"),
        ("/v1/responses", b'{"input": 3}', 400, "input must be a string or an array"),
        ("/v1/chat/completions", b'{"messages": []}', 400, "messages must be a non-empty"),
        ("/v1/responses", b'{"input": "x", "model": "other"}', 404, "not served here"),
        ("/v1/nothing", b"{}", 404, "no route"),
    ],
)
def test_bad_requests_get_a_clear_error(path: str, body: bytes, status: int, text: str) -> None:
    policy = FakePolicy(model="served")
    reply = policy.handle("POST", path, body)
    assert reply.status == status
    assert text in json.loads(reply.body)["error"]["message"]
    assert policy.stats()["requests_total"] == 0


def test_error_rate_and_latency_are_seeded() -> None:
    def run() -> list[tuple[int, float]]:
        policy = FakePolicy(seed=7, error_rate=0.3, latency="lognormal:0.1:1.0")
        replies = [policy.handle("POST", "/v1/responses", b'{"input": "p"}') for _ in range(40)]
        return [(r.status, r.delay_s) for r in replies]

    first = run()
    assert first == run()
    errors = sum(status == 500 for status, _ in first)
    assert 0 < errors < 40
    delays = sorted(delay for _, delay in first)
    # Long-tailed: the slowest answer takes several times the median.
    assert delays[-1] > 3 * delays[len(delays) // 2]


def test_ranges_are_checked() -> None:
    assert parse_range("3", "quality") == (3, 3)
    assert parse_range("1:5", "quality") == (1, 5)
    for bad in ("5:1", "a:b", "1:2:3", "-1:2"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            parse_range(bad, "quality")


async def test_served_over_http() -> None:
    policy = FakePolicy(seed=2)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_fake_policy, policy, "127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=url, trust_env=False) as client:
            reply = await client.post("/v1/responses", json={"input": "served"})
            stats = await client.get("/_fake/stats")
        nursery.cancel_scope.cancel()
    assert reply.status_code == 200
    assert extract_scoring_text(reply.json())[1].startswith("answer-0 ")
    assert stats.json()["requests_total"] == 1
