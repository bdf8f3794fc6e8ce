"""Acceptance: the judge protocol seen end to end, from the judge's recorded requests and the rows.

Scenarios AS-39…AS-66 and AS-68 of §10.5, through /verify on the fake judge.
"""

from __future__ import annotations

import itertools
import json
import logging
import socket
from collections import defaultdict
from typing import Any

import httpx
import pytest
import trio

from genrm_trio.config import config_from_mapping
from genrm_trio.http.app import create_app
from genrm_trio.testing import FakeJudge, pair_rule
from genrm_trio.testing.harness import SCENARIO_DEFAULTS, Reply, Server, member, running_server

SAMPLING = {"max_output_tokens": 16384, "temperature": 0.6, "top_p": 0.95}
CHAT_URL = "http://fake-judge/v1/chat/completions"
EXHAUSTED_1341 = (
    "Judge returned no completed answer after 2 attempts (2 of them exhausted "
    "max_output_tokens=1341 without emitting a verdict; raise the budget or constrain the "
    "judge's reasoning)"
)
METRICS = (
    "genrm_failed_comparison_rate_per_group",
    "genrm_masked_rollout_rate_per_group",
    "mean_individual_score",
    "std_individual_score",
    "tiebreak_usage_rate",
)


def fenced(score_1: Any, score_2: Any, ranking: Any) -> str:
    verdict = json.dumps({"score_1": score_1, "score_2": score_2, "ranking": ranking})
    return f"```json\n{verdict}\n```"


def every_call(action: str, **fields: Any) -> dict[str, Any]:
    return {"action": action, **fields}


def judged_texts(server: Server) -> list[tuple[str, str]]:
    """(response_1, response_2) of every recorded chat request, in arrival order."""
    pairs = []
    for request in server.judge.requests():
        messages = request["body"]["messages"]
        assert [m["role"] for m in messages[-2:]] == ["response_1", "response_2"]
        pairs.append((messages[-2]["content"], messages[-1]["content"]))
    return pairs


def reasons(rows: list[Reply]) -> list[str]:
    assert all(row.status == 200 and row.masked for row in rows), [r.raw for r in rows]
    return [row.body["failure_reason"] for row in rows]


def with_output(i: int, output: list[dict[str, Any]], g: str = "g") -> dict[str, Any]:
    body = member(i, g=g)
    body["response"]["output"] = output
    return body


# --- request construction (J-2…J-7) -----------------------------------------------------------


async def test_chat_payload_carries_history_answers_and_sampling() -> None:
    # AS-39
    async with running_server() as server:
        rows = await server.complete(qualities=[2, 4])
        assert [r.reward for r in rows] == [2.0, 4.0]
        requests = server.judge.requests()
    assert len(requests) == 2
    answers = {"answer-0 [[q=2]]", "answer-1 [[q=4]]"}
    seen = set()
    for request in requests:
        assert request["path"] == "/v1/chat/completions"
        body = request["body"]
        assert set(body) == {"model", "messages", "max_tokens", "temperature", "top_p"}
        assert body["model"] == "judge"
        assert (body["max_tokens"], body["temperature"], body["top_p"]) == (16384, 0.6, 0.95)
        messages = body["messages"]
        assert messages[0] == {"role": "user", "content": "2+2?"}
        assert [m["role"] for m in messages] == ["user", "response_1", "response_2"]
        assert {messages[1]["content"], messages[2]["content"]} == answers
        seen.add((messages[1]["content"], messages[2]["content"]))
    assert seen == {
        ("answer-0 [[q=2]]", "answer-1 [[q=4]]"),
        ("answer-1 [[q=4]]", "answer-0 [[q=2]]"),
    }

    sampling = {**SAMPLING, "chat_template_kwargs": {"enable_thinking": False}}
    async with running_server(genrm_responses_create_params=sampling) as server:
        await server.complete()
        for request in server.judge.requests():
            assert request["body"]["chat_template_kwargs"] == {"enable_thinking": False}
            assert "max_output_tokens" not in request["body"]
            assert request["body"]["max_tokens"] == 16384


async def test_principle_message_follows_use_principle_and_the_request() -> None:
    # AS-40
    def principle_messages(server: Server, start: int) -> list[list[dict[str, str]]]:
        found = []
        for request in server.judge.requests()[start:]:
            roles = [m["role"] for m in request["body"]["messages"]]
            assert roles.count("principle") <= 1
            found.append([m for m in request["body"]["messages"] if m["role"] == "principle"])
            if "principle" in roles:
                assert roles[-3:] == ["principle", "response_1", "response_2"]
        return found

    async with running_server(use_principle=True) as server:
        default = server.config.default_principle
        assert default.startswith("You are an impartial judge comparing two assistant responses")
        await server.verify_all([member(i, g="brief", principle="Be brief") for i in range(2)])
        assert principle_messages(server, 0) == [[{"role": "principle", "content": "Be brief"}]] * 2
        await server.verify_all([member(i, g="none") for i in range(2)])
        assert principle_messages(server, 2) == [[{"role": "principle", "content": default}]] * 2
        await server.verify_all([member(i, g="blank", principle="  ") for i in range(2)])
        assert principle_messages(server, 4) == [[{"role": "principle", "content": default}]] * 2
        assert server.calls() == 6
    async with running_server(use_principle=False) as server:
        await server.verify_all([member(i, principle="Be brief") for i in range(2)])
        assert principle_messages(server, 0) == [[], []]


async def test_responses_payload_puts_answers_in_metadata() -> None:
    # AS-41
    async with running_server(judge_api="responses", use_principle=True) as server:
        rows = await server.verify_all([member(i, 4 - 2 * i, principle="Be brief") for i in (0, 1)])
        assert [r.reward for r in rows] == [4.0, 2.0]
        requests = server.judge.requests()
    assert len(requests) == 2
    for request in requests:
        assert request["path"] == "/v1/responses"
        body = request["body"]
        assert set(body) == {
            "model",
            "input",
            "metadata",
            "max_output_tokens",
            "temperature",
            "top_p",
        }
        assert body["input"] == [{"role": "user", "content": "2+2?", "type": "message"}]
        assert body["max_output_tokens"] == 16384
        assert body["metadata"]["principle"] == "Be brief"
        assert set(body["metadata"]) == {"response_1", "response_2", "principle"}
    assert {
        (r["body"]["metadata"]["response_1"], r["body"]["metadata"]["response_2"]) for r in requests
    } == {
        ("answer-0 [[q=4]]", "answer-1 [[q=2]]"),
        ("answer-1 [[q=2]]", "answer-0 [[q=4]]"),
    }
    async with running_server(judge_api="responses") as server:
        await server.complete()
        for request in server.judge.requests():
            assert set(request["body"]["metadata"]) == {"response_1", "response_2"}


async def test_history_conversion_of_string_and_item_inputs() -> None:
    # AS-42
    parts_input = [{"role": "user", "content": [{"type": "input_text", "text": "Hello"}]}]
    mixed_input = [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hidden"}]},
        {"role": "developer", "content": "Answer with a number."},
        {"type": "message", "role": "user", "content": "2+2?"},
        {"role": "tool", "content": "4"},
        {"type": "function_call", "name": "calc", "arguments": "{}", "call_id": "c"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Four."}]},
    ]
    async with running_server() as server:
        for group, prompt in (("s", "Hello"), ("p", parts_input), ("m", mixed_input)):
            rows = await server.verify_all([member(i, g=group, prompt=prompt) for i in range(2)])
            assert [r.reward for r in rows] == [3.0, 3.0]
        histories = [r["body"]["messages"][:-2] for r in server.judge.requests()]
    hello = [{"role": "user", "content": "Hello"}]
    assert histories[:4] == [hello] * 4
    assert (
        histories[4:]
        == [
            [
                {"role": "system", "content": "Answer with a number."},
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "Four."},
            ]
        ]
        * 2
    )


async def test_answer_text_joins_output_text_and_empty_answers_become_none() -> None:
    # AS-43
    def message(*parts: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": "message", "role": "assistant", "content": list(parts)}]

    joined = message(
        {"type": "output_text", "text": "4"},
        {"type": "refusal", "refusal": "no"},
        {"type": "output_text", "text": "2"},
    )
    refusal_only = message({"type": "refusal", "refusal": "I cannot"})
    blank = message({"type": "output_text", "text": "  \n\t "})
    async with running_server() as server:
        rows = await server.verify_all([with_output(0, joined), with_output(1, refusal_only)])
        # q("42") = 1 + (2 mod 5) = 3; q("None") = 1 (CL-12).
        assert [r.reward for r in rows] == [3.0, 1.0]
        assert set(judged_texts(server)) == {("42", "None"), ("None", "42")}
        await server.verify_all([with_output(0, blank, g="w"), member(1, g="w")])
        assert set(judged_texts(server)[2:]) == {
            ("None", "answer-1 [[q=3]]"),
            ("answer-1 [[q=3]]", "None"),
        }


# --- reply interpretation (J-10…J-17, J-24) ----------------------------------------------------


async def test_a_verdict_inside_think_is_ignored() -> None:
    # AS-44
    text = '<think>{"score_1":1,"score_2":5,"ranking":6}</think>\n' + fenced(4, 2, 1)
    judge = FakeJudge(rules=[every_call("text", text=text)])
    async with running_server(judge=judge, comparison_strategy="all_pairs") as server:
        rows = await server.complete()
        assert [r.reward for r in rows] == [4.0, 2.0]
        assert server.calls() == 1


async def test_unfinished_reasoning_is_no_completed_answer() -> None:
    # AS-45
    text = '<think> {"score_1": 5, "score_2": 1, "ranking": 1}'
    judge = FakeJudge(rules=[every_call("text", text=text)])
    async with running_server(judge=judge, comparison_strategy="all_pairs") as server:
        rows = await server.complete()
        assert server.calls() == 4
    for reason in reasons(rows):
        assert (
            "pair=(0, 1) judge=0 attempt=4/4 deadline=2.0s: Judge returned no completed answer "
            "after 4 attempts; last reply: unfinished reasoning"
        ) in reason


async def test_budget_exhaustion_masks_and_is_logged_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # AS-46
    caplog.set_level(logging.INFO, logger="genrm_trio")
    judge = FakeJudge(rules=[every_call("budget_exhausted")])
    sampling = {**SAMPLING, "max_output_tokens": 1341}
    async with running_server(
        judge=judge, genrm_parse_retries=1, genrm_responses_create_params=sampling
    ) as server:
        rows = await server.complete()
        assert server.calls() == 4
    for reason in reasons(rows):
        assert EXHAUSTED_1341 in reason
        assert "every rollout was masked" in reason
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    detail = "reply finished with finish_reason=length and contains no verdict"
    for pair in ("(0, 1)", "(1, 0)"):
        for attempt in ("1/2", "2/2"):
            line = (
                f"GenRM output budget exhausted for pair {pair} (attempt {attempt}, "
                f"max_output_tokens=1341): {detail}"
            )
            assert warnings.count(line) == 1, line
    assert sum("output budget exhausted" in w for w in warnings) == 4


async def test_a_verdict_that_ends_at_the_length_limit_is_accepted() -> None:
    # AS-47
    judge = FakeJudge(rules=[every_call("text", text=fenced(4, 2, 1), finish="length")])
    async with running_server(judge=judge, comparison_strategy="all_pairs") as server:
        rows = await server.complete()
        assert [r.reward for r in rows] == [4.0, 2.0]
        assert server.calls() == 1


async def test_responses_budget_exhaustion(caplog: pytest.LogCaptureFixture) -> None:
    # AS-48
    caplog.set_level(logging.INFO, logger="genrm_trio")
    judge = FakeJudge(rules=[every_call("budget_exhausted")])
    sampling = {**SAMPLING, "max_output_tokens": 1341}
    async with running_server(
        judge=judge,
        judge_api="responses",
        genrm_parse_retries=1,
        genrm_responses_create_params=sampling,
    ) as server:
        rows = await server.complete()
        assert server.calls() == 4
    for reason in reasons(rows):
        assert EXHAUSTED_1341 in reason
        assert "every rollout was masked" in reason
    line = (
        "GenRM output budget exhausted for pair (0, 1) (attempt 1/2, max_output_tokens=1341): "
        "response is incomplete (reason=max_output_tokens) and contains no verdict"
    )
    assert [r.levelno for r in caplog.records if r.getMessage() == line] == [logging.WARNING]


async def test_responses_status_null_succeeds_and_unfinished_statuses_fail() -> None:
    # AS-49
    reply = {
        "id": "resp-1",
        "object": "response",
        "status": None,
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": fenced(4, 2, 1)}],
            }
        ],
    }
    judge = FakeJudge(rules=[every_call("raw", body=reply)])
    settings = {"judge_api": "responses", "comparison_strategy": "all_pairs"}
    async with running_server(settings, judge=judge) as server:
        rows = await server.complete()
        assert [r.reward for r in rows] == [4.0, 2.0]
        assert server.calls() == 1
    for status in ("failed", "cancelled", "in_progress"):
        judge = FakeJudge(rules=[every_call("finish", value=status)])
        async with running_server(settings, judge=judge) as server:
            rows = await server.complete()
            assert server.calls() == 4
        for reason in reasons(rows):
            assert (
                f"Judge returned no completed answer after 4 attempts; last reply: status={status}"
            ) in reason


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        (every_call("raw", body="null"), "not a JSON object"),
        (every_call("raw", body={}), "no choices"),
        (every_call("raw", body={"choices": []}), "no choices"),
        (every_call("null_content"), "content is not a string"),
        (every_call("empty"), "empty verdict text"),
    ],
    ids=["null", "empty-object", "no-choices", "null-content", "empty"],
)
async def test_unusable_replies_fail_every_comparison(rule: dict[str, Any], problem: str) -> None:
    # AS-50
    judge = FakeJudge(rules=[rule])
    async with running_server(judge=judge, num_rollouts_per_prompt=4) as server:
        rows = await server.complete()
        assert server.calls() == 16
    for reason in reasons(rows):
        assert "no completed answer after 4 attempts" in reason
        assert f"last reply: {problem}" in reason
        assert "every rollout was masked (4 of 4 comparisons failed)" in reason


async def test_an_unparseable_completed_reply_falls_back_to_default_scores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # AS-51
    caplog.set_level(logging.INFO, logger="genrm_trio")
    judge = FakeJudge(rules=[every_call("text", text="I prefer the first one.")])
    async with running_server(judge=judge, num_rollouts_per_prompt=4) as server:
        rows = await server.complete(qualities=[1, 2, 4, 5])
        assert server.calls() == 16
    assert [r.reward for r in rows] == [3.0] * 4
    assert not any(r.masked for r in rows)
    assert rows[0].body["genrm_failed_comparison_rate_per_group"] == 0.0
    assert rows[0].body["tiebreak_usage_rate"] == 1.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for pair in ("(0, 1)", "(1, 2)", "(2, 3)", "(3, 0)"):
        line = (
            f"GenRM judge reply unparseable for pair {pair} judge 0 after 4 attempts; "
            "using default scores"
        )
        assert warnings.count(line) == 1, line


@pytest.mark.parametrize(
    "malformed_first", [True, False], ids=["malformed-empty", "empty-malformed"]
)
async def test_one_usable_reply_among_failures_gives_default_scores(malformed_first: bool) -> None:
    # AS-52
    malformed = every_call("text", text="score_1 is four, score_2 is two", times=1)
    empty = every_call("empty", times=1)
    rules = [malformed, empty] if malformed_first else [empty, malformed]
    judge = FakeJudge(rules=rules)
    async with running_server(
        judge=judge, comparison_strategy="all_pairs", genrm_parse_retries=1
    ) as server:
        rows = await server.complete(qualities=[5, 1])
        assert server.calls() == 2
    assert [r.reward for r in rows] == [3.0, 3.0]
    actions = [r["action"] for r in judge.requests()]
    assert actions == (["text", "empty"] if malformed_first else ["empty", "text"])


async def test_a_malformed_reply_is_retried_until_a_verdict() -> None:
    # AS-53
    judge = FakeJudge(rules=[every_call("text", text="{score_1: 5}", times=1)])
    async with running_server(judge=judge, comparison_strategy="all_pairs") as server:
        rows = await server.complete(qualities=[4, 2])
        assert [r.reward for r in rows] == [4.0, 2.0]
        assert server.calls() == 2


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e309"])
@pytest.mark.parametrize("key", ["score_1", "score_2", "ranking"])
async def test_non_finite_verdict_values_are_invalid(literal: str, key: str) -> None:
    # AS-54
    values = {"score_1": "4", "score_2": "2", "ranking": "1"}
    values[key] = literal
    text = "{" + ", ".join(f'"{k}": {v}' for k, v in values.items()) + "}"
    async with running_server(
        judge=FakeJudge(rules=[every_call("text", text=text)]), num_rollouts_per_prompt=4
    ) as server:
        rows = await server.complete(qualities=[1, 2, 4, 5])
        assert server.calls() == 16
        assert [r.reward for r in rows] == [3.0] * 4
    async with running_server(
        judge=FakeJudge(rules=[every_call("text", text=text, times=1)]), num_rollouts_per_prompt=4
    ) as server:
        rows = await server.complete(qualities=[1, 2, 4, 5])
        assert server.calls() == 5
        assert [r.reward for r in rows] == [1.0, 2.0, 4.0, 5.0]


# --- retry classification (J-20…J-25) ---------------------------------------------------------


@pytest.mark.parametrize("status", [408, 429, 500, 503, 599])
async def test_a_transient_status_once_is_retried(status: int) -> None:
    # AS-55
    judge = FakeJudge(rules=[every_call("http_status", status=status, times=1)])
    async with running_server(judge=judge, num_rollouts_per_prompt=4) as server:
        rows = await server.complete(qualities=[1, 2, 4, 5])
        assert server.calls() == 5
    assert [r.reward for r in rows] == [1.0, 2.0, 4.0, 5.0]
    assert not any(r.masked for r in rows)


async def test_a_valid_reply_served_as_text_plain_is_read() -> None:
    # AS-55 (W-2)
    reply = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": fenced(4, 2, 1)},
                "finish_reason": "stop",
            }
        ],
    }
    judge = FakeJudge(rules=[every_call("raw", body=reply, content_type="text/plain")])
    async with running_server(judge=judge, comparison_strategy="all_pairs") as server:
        rows = await server.complete()
        assert [r.reward for r in rows] == [4.0, 2.0]
        assert server.calls() == 1


async def test_persistent_500_uses_every_attempt_and_4xx_only_one() -> None:
    # AS-56
    settings = {"comparison_strategy": "all_pairs", "genrm_parse_retries": 2}
    judge = FakeJudge(rules=[every_call("http_status", status=500)])
    async with running_server(settings, judge=judge) as server:
        rows = await server.complete()
        assert server.calls() == 3
    for reason in reasons(rows):
        assert (
            'attempt=3/3 deadline=2.0s: HTTPStatusError: HTTP 500; response={"error":"injected"}'
            in reason
        )
    for status in (400, 401, 403, 404):
        judge = FakeJudge(rules=[every_call("http_status", status=status)])
        async with running_server(settings, judge=judge) as server:
            rows = await server.complete()
            assert server.calls() == 1
        for reason in reasons(rows):
            assert f"attempt=1/3 deadline=2.0s: HTTPStatusError: HTTP {status};" in reason


async def test_a_transient_last_attempt_beats_an_earlier_unparseable_reply() -> None:
    # AS-57
    judge = FakeJudge(
        rules=[
            every_call("text", text="no verdict here", times=1),
            every_call("http_status", status=503),
        ]
    )
    async with running_server(
        judge=judge, comparison_strategy="all_pairs", genrm_parse_retries=1
    ) as server:
        rows = await server.complete()
        assert server.calls() == 2
    for reason in reasons(rows):
        assert "attempt=2/2 deadline=2.0s: HTTPStatusError: HTTP 503;" in reason


async def test_a_cut_off_body_is_transient() -> None:
    # AS-58
    judge = FakeJudge(rules=[every_call("truncated_body", times=1)])
    async with running_server(judge=judge, comparison_strategy="all_pairs") as server:
        rows = await server.complete(qualities=[4, 2])
        assert [r.reward for r in rows] == [4.0, 2.0]
        assert server.calls() == 2
    for action in ("truncated_body", "close"):
        judge = FakeJudge(rules=[every_call(action)])
        async with running_server(judge=judge, comparison_strategy="all_pairs") as server:
            rows = await server.complete()
            assert server.calls() == 4
        for reason in reasons(rows):
            assert "pair=(0, 1) judge=0 attempt=4/4 deadline=2.0s: RemoteProtocolError: " in reason


async def test_a_non_json_reply_fails_at_once() -> None:
    # AS-59
    judge = FakeJudge(rules=[every_call("non_json")])
    async with running_server(judge=judge, comparison_strategy="all_pairs") as server:
        rows = await server.complete()
        assert server.calls() == 1
    for reason in reasons(rows):
        assert (
            f"GenRM judge {CHAT_URL} pair=(0, 1) judge=0 attempt=1/4 deadline=2.0s: "
            "JSONDecodeError: judge reply is not valid JSON: <html>not json</html>"
        ) in reason


async def test_a_judge_on_a_closed_port_masks_both_rows_quickly() -> None:
    # AS-60 (real clock, real sockets)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = config_from_mapping(
        {
            **SCENARIO_DEFAULTS,
            "judge_base_url": f"http://127.0.0.1:{port}/v1",
            "judge_request_timeout_s": 0.2,
            "genrm_parse_retry_sleep_s": 0.05,
        }
    )
    app = create_app(config)
    async with app.test_app():
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://genrm.test") as client:
            replies: list[httpx.Response] = []

            async def post(i: int) -> None:
                replies.append(await client.post("/verify", json=member(i)))

            started = trio.current_time()
            with trio.fail_after(5):
                async with trio.open_nursery() as nursery:
                    for i in range(2):
                        nursery.start_soon(post, i)
            elapsed = trio.current_time() - started
    assert elapsed < 2.0
    assert len(replies) == 2
    for response in replies:
        body = response.json()
        assert response.status_code == 200
        assert body["mask_sample"] is True
        assert "ConnectError: cannot connect to 127.0.0.1:" in body["failure_reason"]
        assert "deadline=0.2s" in body["failure_reason"]
        assert f"GenRM judge http://127.0.0.1:{port}/v1/chat/completions" in body["failure_reason"]


# --- deadlines, backoff and concurrency (J-27…J-33) -------------------------------------------


async def test_a_hung_call_fails_its_comparison_at_the_request_deadline(
    autojump_clock: Any,
) -> None:
    # AS-61
    judge = FakeJudge(rules=[pair_rule(0, 1, "hang")])
    async with running_server(
        judge=judge,
        num_rollouts_per_prompt=3,
        comparison_strategy="all_pairs",
        judge_request_timeout_s=0.2,
    ) as server:
        started = trio.current_time()
        rows = await server.complete(qualities=[1, 2, 4])
        elapsed = trio.current_time() - started
        assert server.calls() == 3
        assert judge.stats()["in_flight"] == 0
        assert judge.stats()["cancelled"] == 1
    assert elapsed == pytest.approx(0.2, abs=1e-6)
    assert [r.masked for r in rows] == [True, True, False]
    cause = (
        f"GenRM judge {CHAT_URL} pair=(0, 1) judge=0 attempt=1/4 deadline=0.2s: "
        "TimeoutError: no complete reply within 0.2s"
    )
    for slot in (0, 1):
        assert rows[slot].body["failure_reason"] == (
            f"GenRM rollout_index={slot} lost a comparison to a judge failure "
            f"(1 of 3 comparisons failed): {cause}"
        )
    assert rows[2].reward == 4.0
    assert rows[2].body["genrm_failed_comparison_rate_per_group"] == pytest.approx(1 / 3)
    assert rows[2].body["genrm_masked_rollout_rate_per_group"] == pytest.approx(2 / 3)


async def test_retry_sleeps_grow_exponentially_with_full_jitter(autojump_clock: Any) -> None:
    # AS-62
    judge = FakeJudge(rules=[every_call("http_status", status=503)])
    async with running_server(
        judge=judge,
        num_rollouts_per_prompt=6,
        comparison_strategy="all_pairs",
        genrm_parse_retry_sleep_s=0.1,
        judge_retry_max_sleep_s=0.15,
    ) as server:
        await server.complete()
        assert server.calls() == 60
        arrivals: dict[tuple[str, str], list[float]] = defaultdict(list)
        for request in judge.requests():
            messages = request["body"]["messages"]
            arrivals[(messages[-2]["content"], messages[-1]["content"])].append(
                request["arrival_time"]
            )
    assert len(arrivals) == 15
    later_gaps = []
    for times in arrivals.values():
        assert len(times) == 4
        gaps = [b - a for a, b in itertools.pairwise(times)]
        # Under the mock clock a gap is exactly the drawn sleep, so no slack is needed.
        for gap, bound in zip(gaps, (0.1, 0.15, 0.15), strict=True):
            assert 0 < gap <= bound + 1e-9, (gaps, bound)
        later_gaps.extend(gaps[1:])
    # The bound grew past the base: some later sleeps are longer than the first bound.
    assert max(later_gaps) > 0.1


async def test_retry_after_delays_the_next_attempt(autojump_clock: Any) -> None:
    # AS-63
    judge = FakeJudge(rules=[every_call("http_status", status=429, retry_after=1, times=1)])
    async with running_server(judge=judge, comparison_strategy="all_pairs") as server:
        rows = await server.complete(qualities=[4, 2])
        assert [r.reward for r in rows] == [4.0, 2.0]
        first, second = (r["arrival_time"] for r in judge.requests())
    assert second - first >= 1.0


async def test_retry_after_beyond_the_evaluation_deadline_masks_the_pair(
    autojump_clock: Any,
) -> None:
    # AS-64
    judge = FakeJudge(rules=[pair_rule(1, 2, "http_status", status=429, retry_after=60)])
    async with running_server(
        judge=judge, num_rollouts_per_prompt=4, cohort_evaluation_timeout_s=2.0
    ) as server:
        started = trio.current_time()
        rows = await server.complete(qualities=[1, 2, 3, 4])
        elapsed = trio.current_time() - started
        assert server.calls() == 4
    assert elapsed < 1.0
    assert [r.masked for r in rows] == [False, True, True, False]
    assert (rows[0].reward, rows[3].reward) == (1.0, 4.0)
    cause = (
        f"GenRM judge {CHAT_URL} pair=(1, 2) judge=0 attempt=1/4 deadline=2.0s: "
        'HTTPStatusError: HTTP 429; response={"error":"injected"} '
        "(no time left to retry before the deadline)"
    )
    assert rows[1].body["failure_reason"] == (
        f"GenRM rollout_index=1 lost a comparison to a judge failure (1 of 4 comparisons failed): "
        f"{cause}"
    )
    assert rows[2].body["failure_reason"].endswith(cause)
    assert rows[0].body["genrm_failed_comparison_rate_per_group"] == 0.25
    assert rows[0].body["genrm_masked_rollout_rate_per_group"] == 0.5


async def test_judge_concurrency_is_capped_across_groups(autojump_clock: Any) -> None:
    # AS-65
    judge = FakeJudge(latency="fixed:0.2")
    async with running_server(
        judge=judge, num_rollouts_per_prompt=4, judge_max_concurrency=3
    ) as server:
        bodies = [member(i, i + 1, g=g) for g in ("a", "b") for i in range(4)]
        rows = await server.verify_all(bodies)
        assert server.calls() == 8
        assert judge.stats()["max_in_flight"] == 3
    assert [r.reward for r in rows] == [1.0, 2.0, 3.0, 4.0] * 2


async def test_waiting_for_a_slot_does_not_use_the_request_deadline(autojump_clock: Any) -> None:
    # AS-66
    judge = FakeJudge(latency="fixed:0.3")
    async with running_server(
        judge=judge,
        num_rollouts_per_prompt=4,
        judge_max_concurrency=1,
        judge_request_timeout_s=0.5,
    ) as server:
        started = trio.current_time()
        rows = await server.complete(qualities=[1, 2, 3, 4])
        elapsed = trio.current_time() - started
        assert server.calls() == 4
        assert judge.stats()["max_in_flight"] == 1
    assert [r.reward for r in rows] == [1.0, 2.0, 3.0, 4.0]
    assert elapsed == pytest.approx(1.2, abs=1e-6)


# --- error texts (J-40, J-41) -----------------------------------------------------------------


async def test_user_info_is_stripped_from_judge_error_texts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # AS-68
    caplog.set_level(logging.DEBUG, logger="genrm_trio")
    judge = FakeJudge(rules=[every_call("http_status", status=500)])
    async with running_server(
        judge=judge, judge_base_url="http://user:pw@127.0.0.1:9123/v1"
    ) as server:
        rows = await server.complete()
        assert server.calls() == 8
        health = await server.get("/healthz")
        recorded = judge.requests()
    text = (
        "GenRM judge http://127.0.0.1:9123/v1/chat/completions pair=(0, 1) judge=0 attempt=4/4 "
        'deadline=2.0s: HTTPStatusError: HTTP 500; response={"error":"injected"}'
    )
    for reason in reasons(rows):
        assert reason == (
            "GenRM cohort 'group_id::g::group_attempt::0' failed: every rollout was masked "
            f"(2 of 2 comparisons failed); first failure: {text}"
        )
    for output in (*(r.raw for r in rows), health.raw, caplog.text.encode()):
        assert b"user:pw" not in output
        assert b"pw@" not in output
    for request in recorded:
        assert "authorization" not in request["headers"]
