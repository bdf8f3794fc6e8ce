"""The fake judge's decisions without any I/O: quality, verdicts, rules, faults, latency, stats.
Requests go straight into ``FakeJudge.handle``; no event loop is needed (§8.2)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from _fake_judge_support import chat_body, chat_content, chat_verdict, responses_body

from genrm_trio.fakes.judge import (
    FakeJudge,
    FakeReply,
    pair_rule,
    parse_fault_action,
    parse_latency,
    quality,
)


def call(
    judge: FakeJudge,
    body: dict[str, Any] | bytes,
    *,
    api: str = "chat_completions",
    headers: list[tuple[str, str]] | None = None,
    now: float = 0.0,
) -> FakeReply:
    path = "/v1/chat/completions" if api == "chat_completions" else "/v1/responses"
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = judge.handle("POST", path, headers or [], raw, now=now)
    judge.end_request(reply, cancelled=False)
    return reply


def reply_json(reply: FakeReply) -> Any:
    return json.loads(reply.body)


# -- CL-12, CL-13 (AS-166) ------------------------------------------------------------------


def test_quality_of_plain_none_and_directive_texts() -> None:
    assert quality("answer") == 2
    assert quality("None") == 1
    assert quality("x [[q=4]] [[q=5]]") == 5


def test_quality_of_length_wraps_modulo_five_after_trimming() -> None:
    assert quality("") == 1
    assert quality("  abcd  ") == 5
    assert quality("abcde") == 1
    assert quality("[[q=2.5]]") == 2.5
    assert quality(" None ") == 1 + 4 % 5


def test_verdicts_of_as_166() -> None:
    judge = FakeJudge()
    assert judge.verdict("[[q=5]]", "[[q=2]]") == (5, 2, 1)
    assert judge.verdict("[[q=3]]", "[[q=3]]") == (3, 3, 3.5)
    assert FakeJudge(position_bias=1).verdict("[[q=3]]", "[[q=3]]") == (4, 3, 2)


def test_verdict_values_are_ints_when_integral() -> None:
    s1, s2, ranking = FakeJudge().verdict("[[q=5]]", "[[q=2]]")
    assert (type(s1), type(s2), type(ranking)) == (int, int, int)
    assert FakeJudge(tie_ranking=3).verdict("a", "b") == (2, 2, 3)
    assert type(FakeJudge(tie_ranking=3).verdict("a", "b")[2]) is int


@pytest.mark.parametrize(
    ("q1", "q2", "ranking"),
    [
        (5, 3, 1),
        (4.5, 3, 2),
        (4, 3, 2),
        (3.5, 3, 3),
        (3, 3, 3.5),
        (3, 3.5, 4),
        (3, 4, 5),
        (3, 4.5, 5),
        (3, 5, 6),
    ],
)
def test_ranking_bands(q1: float, q2: float, ranking: float) -> None:
    assert FakeJudge().verdict(f"[[q={q1}]]", f"[[q={q2}]]")[2] == ranking


def test_scores_are_clamped_to_one_to_five_after_position_bias() -> None:
    assert FakeJudge(position_bias=2).verdict("[[q=4]]", "[[q=9]]") == (5, 5, 3.5)
    assert FakeJudge(position_bias=-3).verdict("[[q=2]]", "[[q=0]]") == (1, 1, 3.5)


def test_principle_and_history_do_not_change_the_verdict() -> None:
    judge = FakeJudge()
    plain = chat_verdict(reply_json(call(judge, chat_body("[[q=4]]", "[[q=2]]"))))
    with_principle = chat_verdict(
        reply_json(call(judge, chat_body("[[q=4]]", "[[q=2]]", principle="Be brief")))
    )
    assert plain == with_principle == {"score_1": 4, "score_2": 2, "ranking": 1}


# -- CL-14 reply shapes ---------------------------------------------------------------------


def test_chat_reply_shape() -> None:
    reply = call(FakeJudge(), chat_body("[[q=5]]", "[[q=2]]", model="judge-m"))
    body = reply_json(reply)
    assert (reply.status, reply.action, reply.kind) == (200, "verdict", "respond")
    assert ("content-type", "application/json") in reply.headers
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["object"] == "chat.completion"
    assert body["model"] == "judge-m"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "<think>comparing the two responses</think>\n```json\n"
                '{"score_1": 5, "score_2": 2, "ranking": 1}\n```',
            },
            "finish_reason": "stop",
        }
    ]
    assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}


def test_responses_reply_shape() -> None:
    reply = call(FakeJudge(), responses_body("[[q=3]]", "[[q=3]]"), api="responses")
    body = reply_json(reply)
    # Every field the Responses API requires, so that validating clients accept the reply.
    assert set(body) == {
        "id",
        "object",
        "created_at",
        "status",
        "model",
        "output",
        "parallel_tool_calls",
        "tool_choice",
        "tools",
        "usage",
    }
    assert (body["object"], body["status"], body["model"]) == ("response", "completed", "genrm")
    assert (body["parallel_tool_calls"], body["tool_choice"], body["tools"]) == (False, "auto", [])
    assert body["output"] == [
        {
            "id": "rs-fake-0",
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "comparing the two responses"}],
        },
        {
            "id": "msg-fake-0",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {
                    "type": "output_text",
                    "text": '```json\n{"score_1": 3, "score_2": 3, "ranking": 3.5}\n```',
                    "annotations": [],
                }
            ],
        },
    ]
    assert set(body["usage"]) == {
        "input_tokens",
        "input_tokens_details",
        "output_tokens",
        "output_tokens_details",
        "total_tokens",
    }


def test_reasoning_never_contains_braces() -> None:
    judge = FakeJudge(rules=[{"action": "budget_exhausted"}])
    chat = chat_content(reply_json(call(judge, chat_body("a", "b"))))
    responses = reply_json(call(judge, responses_body("a", "b"), api="responses"))
    assert "{" not in chat and "}" not in chat
    assert "{" not in responses["output"][0]["summary"][0]["text"]
    assert [item["type"] for item in responses["output"]] == ["reasoning"]


def test_model_defaults_to_configured_or_fake_judge_name() -> None:
    body = chat_body("a", "b")
    del body["model"]
    assert reply_json(call(FakeJudge(), body))["model"] == "fake-judge"
    assert reply_json(call(FakeJudge(model="m"), chat_body("a", "b", model="m")))["model"] == "m"


# -- CL-11 request checks -------------------------------------------------------------------


def problem(reply: FakeReply) -> str:
    message: str = reply_json(reply)["error"]["message"]
    assert message.startswith("fake judge: ")
    return message.removeprefix("fake judge: ")


def test_chat_whose_last_role_is_not_response_2_is_rejected() -> None:
    body = chat_body("a", "b")
    body["messages"].reverse()
    reply = call(FakeJudge(), body)
    assert (reply.status, reply.action) == (400, "rejected")
    assert problem(reply) == "the last two messages must have roles response_1 then response_2"


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        (None, "messages must be a non-empty array"),
        ([], "messages must be a non-empty array"),
        (
            [{"role": "response_1", "content": 1}, {"role": "response_2", "content": "b"}],
            "messages[0] must be an object with string role and content",
        ),
        (
            [
                {"role": "principle", "content": "p"},
                {"role": "user", "content": "u"},
                {"role": "response_1", "content": "a"},
                {"role": "response_2", "content": "b"},
            ],
            "messages[0] has unexpected role 'principle'",
        ),
        (
            [
                {"role": "critic", "content": "c"},
                {"role": "response_1", "content": "a"},
                {"role": "response_2", "content": "b"},
            ],
            "messages[0] has unexpected role 'critic'",
        ),
        (
            [
                {"role": "response_1", "content": "x"},
                {"role": "principle", "content": "p"},
                {"role": "response_1", "content": "a"},
                {"role": "response_2", "content": "b"},
            ],
            "messages[0] has unexpected role 'response_1'",
        ),
    ],
)
def test_chat_message_checks(messages: Any, expected: str) -> None:
    reply = call(FakeJudge(), {"model": "m", "messages": messages})
    assert reply.status == 400
    assert problem(reply) == expected


def test_principle_directly_before_response_1_is_accepted() -> None:
    assert call(FakeJudge(), chat_body("a", "b", principle="Be brief")).status == 200


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        (None, "metadata must be an object"),
        ({"response_1": "a"}, "metadata.response_2 must be a string"),
        ({"response_1": None, "response_2": "b"}, "metadata.response_1 must be a string"),
        (
            {"response_1": "a", "response_2": "b", "principle": 3},
            "metadata.principle must be a string",
        ),
    ],
)
def test_responses_metadata_checks(metadata: Any, expected: str) -> None:
    reply = call(FakeJudge(), {"model": "m", "metadata": metadata}, api="responses")
    assert reply.status == 400
    assert problem(reply) == expected


def test_body_must_be_a_json_object() -> None:
    assert problem(call(FakeJudge(), b"{not json")) == "body is not valid JSON"
    assert problem(call(FakeJudge(), b"[1]")) == "body is not a JSON object"
    assert problem(call(FakeJudge(), b"null")) == "body is not a JSON object"


def test_wrong_model_is_rejected_when_a_model_is_configured() -> None:
    reply = call(FakeJudge(model="genrm"), chat_body("a", "b", model="other"))
    assert reply.status == 400
    assert problem(reply) == "model 'other' is not served here; expected 'genrm'"
    assert call(FakeJudge(), chat_body("a", "b", model="other")).status == 200


def test_api_key_is_required_when_configured() -> None:
    judge = FakeJudge(api_key="sekrit")
    missing = call(judge, chat_body("a", "b"))
    wrong = call(judge, chat_body("a", "b"), headers=[("Authorization", "Bearer nope")])
    right = call(judge, chat_body("a", "b"), headers=[("Authorization", "Bearer sekrit")])
    assert (missing.status, wrong.status, right.status) == (401, 401, 200)
    assert problem(missing) == "missing or wrong API key"
    assert b"sekrit" not in missing.body


def test_rejected_calls_are_counted_and_recorded() -> None:
    judge = FakeJudge(model="m")
    call(judge, chat_body("a", "b", model="x"))
    assert judge.stats()["requests_total"] == 1
    assert judge.stats()["by_action"] == {"rejected": 1}
    assert judge.requests(1)[0]["action"] == "rejected"


# -- CL-15 rules ----------------------------------------------------------------------------


def test_rule_with_times_1_applies_to_the_first_matching_call_only() -> None:
    judge = FakeJudge(rules=[{"action": "http_status", "status": 503, "times": 1}])
    statuses = [call(judge, chat_body("a", "b")).status for _ in range(3)]
    assert statuses == [503, 200, 200]


def test_rule_with_after_1_skips_the_first_matching_call() -> None:
    judge = FakeJudge(rules=[{"action": "http_status", "status": 503, "after": 1}])
    statuses = [call(judge, chat_body("a", "b")).status for _ in range(3)]
    assert statuses == [200, 503, 503]


def test_times_and_after_together_select_a_window() -> None:
    judge = FakeJudge(rules=[{"action": "empty", "after": 1, "times": 2}])
    actions = [call(judge, chat_body("a", "b")).action for _ in range(5)]
    assert actions == ["verdict", "empty", "empty", "verdict", "verdict"]


def test_times_and_after_count_only_matching_calls() -> None:
    rule = pair_rule(0, 1, "http_status", status=500, times=1, after=1)
    judge = FakeJudge(rules=[rule])
    other = chat_body("answer-1 x", "answer-0 y")
    pair = chat_body("answer-0 x", "answer-1 y")
    statuses = [call(judge, body).status for body in (other, pair, other, other, pair, pair)]
    assert statuses == [200, 200, 200, 200, 500, 200]


def test_first_applicable_rule_wins_and_a_spent_rule_falls_through() -> None:
    judge = FakeJudge(
        rules=[
            {"action": "http_status", "status": 429, "times": 1},
            {"action": "http_status", "status": 500},
        ]
    )
    assert [call(judge, chat_body("a", "b")).status for _ in range(3)] == [429, 500, 500]


def test_pair_rule_matches_only_that_presentation_order() -> None:
    assert pair_rule(15, 0, "budget_exhausted") == {
        "match": {"response_1": "answer-15 ", "response_2": "answer-0 "},
        "action": "budget_exhausted",
    }
    judge = FakeJudge(rules=[pair_rule(1, 2, "http_status", status=500)])
    assert call(judge, chat_body("answer-1 [[q=3]]", "answer-2 [[q=3]]")).status == 500
    assert call(judge, chat_body("answer-2 [[q=3]]", "answer-1 [[q=3]]")).status == 200
    assert call(judge, chat_body("answer-11 [[q=3]]", "answer-2 [[q=3]]")).status == 200


def test_any_order_matches_both_presentations() -> None:
    rule = {"match": {"response_1": "A", "response_2": "B", "any_order": True}, "action": "empty"}
    judge = FakeJudge(rules=[rule])
    assert call(judge, chat_body("xA", "xB")).action == "empty"
    assert call(judge, chat_body("xB", "xA")).action == "empty"
    assert call(judge, chat_body("xA", "xA")).action == "verdict"


def test_principle_and_api_matches() -> None:
    judge = FakeJudge(
        rules=[
            {"match": {"principle": "brief"}, "action": "empty"},
            {"match": {"api": "responses"}, "action": "null_content"},
        ]
    )
    assert call(judge, chat_body("a", "b", principle="Be brief")).action == "empty"
    assert call(judge, chat_body("a", "b")).action == "verdict"
    assert call(judge, chat_body("a", "b", principle="Be long")).action == "verdict"
    assert call(judge, responses_body("a", "b"), api="responses").action == "null_content"
    body = responses_body("a", "b", principle="so brief")
    assert call(judge, body, api="responses").action == "empty"


def test_rule_probability_is_seeded() -> None:
    def actions(seed: int) -> list[str]:
        judge = FakeJudge(seed=seed, rules=[{"action": "empty", "probability": 0.5}])
        return [call(judge, chat_body("a", "b")).action for _ in range(60)]

    first = actions(7)
    assert first == actions(7)
    assert 0 < first.count("empty") < 60
    assert first != actions(8)


def test_rule_delay_adds_to_latency() -> None:
    judge = FakeJudge(latency="fixed:0.25", rules=[{"action": "verdict", "delay_s": 1.5}])
    assert call(judge, chat_body("a", "b")).delay_s == 1.75


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"action": "explode"}, "rule 0: unknown action 'explode'"),
        ({"action": "http_status"}, "rule 0: action 'http_status' needs status"),
        ({"action": "text"}, "rule 0: action 'text' needs text"),
        ({"action": "raw"}, "rule 0: action 'raw' needs body"),
        ({"action": "finish"}, "rule 0: action 'finish' needs value"),
        ({"action": "empty", "status": 500}, "rule 0: unknown key 'status' for action 'empty'"),
        ({"action": "empty", "times": -1}, "rule 0: times must be an integer >= 0"),
        ({"action": "empty", "after": True}, "rule 0: after must be an integer >= 0"),
        ({"action": "empty", "probability": 2}, "rule 0: probability must be a number in [0, 1]"),
        ({"action": "empty", "match": {"api": "grpc"}}, "rule 0: match.api must be one of"),
        ({"action": "empty", "match": {"response": "x"}}, "rule 0: unknown match key"),
        ({"action": "http_status", "status": 99}, "rule 0: status must be an integer HTTP status"),
    ],
)
def test_bad_rules_are_rejected_and_the_old_rules_stay(rule: dict[str, Any], message: str) -> None:
    judge = FakeJudge(rules=[{"action": "empty"}])
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        judge.set_rules([rule])
    assert judge.rules == [{"action": "empty"}]


def test_rules_property_returns_the_rules_as_given() -> None:
    rules = [pair_rule(0, 1, "http_status", status=503, retry_after=1), {"action": "empty"}]
    judge = FakeJudge()
    judge.set_rules(rules)
    assert judge.rules == rules


# -- CL-17 fault rates ----------------------------------------------------------------------


def test_fault_rate_one_and_zero() -> None:
    always = FakeJudge(fault_rates={"http_status:503": 1.0})
    never = FakeJudge(fault_rates={"http_status:503": 0.0})
    assert call(always, chat_body("a", "b")).status == 503
    assert call(never, chat_body("a", "b")).status == 200


def test_fault_rates_apply_after_rules() -> None:
    judge = FakeJudge(rules=[{"action": "empty", "times": 1}], fault_rates={"close": 1.0})
    assert [call(judge, chat_body("a", "b")).action for _ in range(2)] == ["empty", "close"]


def test_fault_rates_are_seeded_and_independent_per_request() -> None:
    def actions(seed: int) -> list[str]:
        judge = FakeJudge(seed=seed, fault_rates={"budget_exhausted": 0.3, "finish:length": 0.3})
        return [call(judge, chat_body("a", "b")).action for _ in range(100)]

    first = actions(1)
    assert first == actions(1)
    assert {"budget_exhausted", "finish", "verdict"} == set(first)


def test_fault_action_names() -> None:
    assert parse_fault_action("http_status:503") == ("http_status", {"status": 503})
    assert parse_fault_action("finish:length") == ("finish", {"value": "length"})
    assert parse_fault_action("truncated_body") == ("truncated_body", {})
    for bad in ("http_status", "http_status:abc", "finish", "raw", "text", "nope", "close:1"):
        with pytest.raises(ValueError):
            parse_fault_action(bad)
    with pytest.raises(ValueError):
        FakeJudge(fault_rates={"close": 1.5})


# -- CL-16 latency --------------------------------------------------------------------------


def test_latency_specs() -> None:
    rng = random.Random(0)
    assert parse_latency("none").draw(rng) == 0.0
    assert parse_latency("fixed:0.2").draw(rng) == 0.2
    assert 0.1 <= parse_latency("uniform:0.1:0.3").draw(rng) <= 0.3
    assert parse_latency("lognormal:0.5:0").draw(rng) == pytest.approx(0.5)
    for bad in ("fast", "fixed", "fixed:-1", "uniform:0.3:0.1", "lognormal:0:1", "fixed:nan"):
        with pytest.raises(ValueError):
            parse_latency(bad)


def test_latency_is_drawn_per_request_and_not_applied_to_hang() -> None:
    judge = FakeJudge(latency="uniform:0.1:0.3", rules=[{"action": "hang", "after": 3}])
    delays = [call(judge, chat_body("a", "b")).delay_s for _ in range(4)]
    assert all(0.1 <= d <= 0.3 for d in delays[:3])
    assert len(set(delays[:3])) == 3
    assert delays[3] == 0.0


# -- CL-18 stats, requests, reset -----------------------------------------------------------


def test_stats_count_calls_by_api_and_action() -> None:
    judge = FakeJudge(
        rules=[{"match": {"response_1": "bad"}, "action": "http_status", "status": 500}]
    )
    call(judge, chat_body("a", "b"))
    call(judge, chat_body("bad", "b"))
    call(judge, responses_body("a", "b"), api="responses")
    assert judge.stats() == {
        "requests_total": 3,
        "by_api": {"chat_completions": 2, "responses": 1},
        "by_action": {"verdict": 2, "http_status": 1},
        "in_flight": 0,
        "max_in_flight": 1,
        "cancelled": 0,
    }


def test_in_flight_and_cancelled_follow_end_request() -> None:
    judge = FakeJudge()
    replies = [
        judge.handle(
            "POST", "/v1/chat/completions", [], json.dumps(chat_body("a", "b")).encode(), now=0
        )
        for _ in range(3)
    ]
    assert (judge.stats()["in_flight"], judge.stats()["max_in_flight"]) == (3, 3)
    judge.end_request(replies[0], cancelled=True)
    judge.end_request(replies[1], cancelled=False)
    assert (judge.stats()["in_flight"], judge.stats()["cancelled"]) == (1, 1)
    judge.reset()
    assert judge.stats()["in_flight"] == 1
    assert judge.stats()["max_in_flight"] == 1
    judge.end_request(replies[2], cancelled=False)
    assert judge.stats()["in_flight"] == 0


def test_recorded_requests_redact_the_key_and_keep_body_time_and_action() -> None:
    judge = FakeJudge(api_key="sekrit")
    headers = [("Authorization", "Bearer sekrit"), ("User-Agent", "genrm-trio/0.1.0")]
    body = chat_body("a", "b")
    call(judge, body, headers=headers, now=12.5)
    [recorded] = judge.requests(10)
    assert recorded == {
        "index": 0,
        "path": "/v1/chat/completions",
        "api": "chat_completions",
        "headers": {"authorization": "<redacted>", "user-agent": "genrm-trio/0.1.0"},
        "body": body,
        "arrival_time": 12.5,
        "action": "verdict",
        "delay_s": 0.0,
    }


def test_requests_keeps_the_last_1000_and_limit_returns_the_newest() -> None:
    judge = FakeJudge()
    for n in range(1005):
        call(judge, chat_body("a", "b"), now=float(n))
    assert len(judge.requests(5000)) == 1000
    assert [r["arrival_time"] for r in judge.requests(2)] == [1003.0, 1004.0]
    assert judge.requests(0) == []


def test_reset_zeroes_counters_recordings_and_rule_usage_but_keeps_rules() -> None:
    judge = FakeJudge(rules=[{"action": "http_status", "status": 503, "times": 1}])
    assert call(judge, chat_body("a", "b")).status == 503
    assert call(judge, chat_body("a", "b")).status == 200
    judge.reset()
    assert judge.stats()["requests_total"] == 0
    assert judge.stats()["by_action"] == {}
    assert judge.requests(10) == []
    assert judge.rules == [{"action": "http_status", "status": 503, "times": 1}]
    assert call(judge, chat_body("a", "b")).status == 503


def test_control_routes_are_not_judge_calls() -> None:
    judge = FakeJudge(model="m")
    models = judge.handle("GET", "/v1/models", [], b"", now=0)
    assert models.tracked is False
    assert [m["id"] for m in reply_json(models)["data"]] == ["m"]
    put = judge.handle("PUT", "/_fake/rules", [], b'[{"action": "close"}]', now=0)
    assert (put.status, judge.rules) == (200, [{"action": "close"}])
    bad = judge.handle("PUT", "/_fake/rules", [], b'[{"action": "boom"}]', now=0)
    assert bad.status == 400
    assert reply_json(bad)["error"]["message"].startswith("fake judge: rule 0: unknown action")
    assert judge.rules == [{"action": "close"}]
    assert judge.handle("GET", "/nowhere", [], b"", now=0).status == 404
    assert judge.handle("GET", "/v1/chat/completions", [], b"", now=0).status == 405
    assert judge.stats()["requests_total"] == 0


# -- CL-19 determinism (AS-169) -------------------------------------------------------------


def test_same_seed_rules_and_requests_give_identical_replies_and_latencies() -> None:
    def run(seed: int) -> list[tuple[int, bytes, float, str]]:
        judge = FakeJudge(
            seed=seed,
            latency="lognormal:0.2:0.5",
            rules=[{"match": {"response_1": "answer-1 "}, "action": "empty", "probability": 0.5}],
            fault_rates={"http_status:503": 0.2, "budget_exhausted": 0.1},
        )
        out = []
        for n in range(40):
            body = chat_body(f"answer-{n % 3} [[q={n % 5}]]", f"answer-{n % 4} ")
            api = "chat_completions" if n % 2 else "responses"
            if api == "responses":
                body = responses_body(f"answer-{n % 3} ", f"answer-{n % 4} [[q=2]]")
            reply = call(judge, body, api=api)
            out.append((reply.status, reply.body, reply.delay_s, reply.action))
        return out

    first = run(3)
    assert first == run(3)
    assert first != run(4)
    assert len({delay for _, _, delay, _ in first}) == 40


# -- prefix-cache latency model --------------------------------------------------------------


def conversation(body: dict[str, Any], prompt: str) -> dict[str, Any]:
    """``body`` with the user's message replaced: another group's conversation."""
    if "messages" in body:
        body["messages"][0]["content"] = prompt
    else:
        body["input"][0]["content"] = prompt
    return body


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_a_conversation_served_recently_is_faster(api: str) -> None:
    judge = FakeJudge(latency="fixed:0.1", prefix_cache="2:0.5")
    build = chat_body if api == "chat_completions" else responses_body

    def delay(prompt: str, first: str = "a", principle: str | None = None) -> float:
        body = conversation(build(first, "b", principle=principle), prompt)
        return call(judge, body, api=api).delay_s

    assert delay("p1") == pytest.approx(0.6)  # prefill: never served
    assert delay("p1", first="other answer") == pytest.approx(0.1)  # same prefix, other pair
    assert delay("p2") == pytest.approx(0.6)
    assert delay("p1") == pytest.approx(0.1)  # p1 is now the most recently used
    assert delay("p3") == pytest.approx(0.6)  # capacity 2: p2, the least recent, goes
    assert delay("p2") == pytest.approx(0.6)
    assert delay("p1", principle="be brief") == pytest.approx(0.6)  # the principle is prefix
    assert judge.stats()["prefix_cache"] == {"hits": 2, "misses": 5}
    judge.reset()
    assert judge.stats()["prefix_cache"] == {"hits": 0, "misses": 0}
    assert delay("p2") == pytest.approx(0.6)  # a reset empties the cache


def test_without_the_model_latency_and_stats_are_unchanged() -> None:
    judge = FakeJudge(latency="fixed:0.1")
    assert [call(judge, chat_body("a", "b")).delay_s for _ in range(2)] == [0.1, 0.1]
    assert "prefix_cache" not in judge.stats()


@pytest.mark.parametrize("spec", ["0:1", "4", "4:-1", "x:1", "4:inf", "4:nan"])
def test_bad_prefix_cache_settings_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="expected none or CAPACITY:MISS_S"):
        FakeJudge(prefix_cache=spec)
