"""Parsing /compare bodies and encoding /compare replies (§2.7, W-40…W-42, AS-21, AS-31, AS-32)."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
import pytest

from genrm_trio.config import Config
from genrm_trio.wire.bodies import BadRequest
from genrm_trio.wire.parsing import parse_compare_body
from genrm_trio.wire.rendering import render_compare_reply
from genrm_trio.wire.schema import CompareReply

CONFIG = Config(judge_base_url="http://judge/v1", judge_model="m", max_compare_responses=3)
BASELINE = Config(
    judge_base_url="http://judge/v1", judge_model="m", comparison_strategy="fixed_baseline"
)


def answer(text: str) -> dict[str, Any]:
    return {
        "output": [
            {"type": "message", "content": [{"type": "output_text", "text": text}]},
        ]
    }


def body(**changes: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "conversation_history": [{"role": "user", "content": "2+2?"}],
        "response_objs": [answer("4"), answer("5")],
    }
    value.update(changes)
    return {k: v for k, v in value.items() if v is not ...}


def rejected(value: dict[str, Any] | bytes, config: Config = CONFIG) -> BadRequest:
    data = value if isinstance(value, bytes) else json.dumps(value).encode()
    with pytest.raises(BadRequest) as caught:
        parse_compare_body(data, config)
    return caught.value


def test_a_compare_body_is_read() -> None:
    history = [
        {"role": "developer", "content": "be terse", "name": "x"},
        {"role": "user", "content": "2+2?"},
    ]
    request = parse_compare_body(
        json.dumps(body(conversation_history=history, principle="P", extra=[1])).encode(), CONFIG
    )
    assert request.history == [
        {"role": "developer", "content": "be terse"},
        {"role": "user", "content": "2+2?"},
    ]
    assert request.responses == [answer("4"), answer("5")]
    assert (request.principle, request.baseline) == ("P", None)


def test_empty_lists_and_null_principle_are_accepted() -> None:
    request = parse_compare_body(
        json.dumps(body(conversation_history=[], response_objs=[], principle=None)).encode(), CONFIG
    )
    assert (request.history, request.responses, request.principle) == ([], [], None)


def test_other_keys_are_ignored_even_with_non_standard_literals() -> None:
    text = json.dumps(body()).encode()[:-1] + b', "scores": [NaN, Infinity]}'
    assert len(parse_compare_body(text, CONFIG).responses) == 2


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        (
            body(response_objs={"a": answer("4")}),
            "response_objs: expected an array of objects, got an object",
        ),
        (
            body(response_objs=...),
            "response_objs: required field missing (expected an array of objects)",
        ),
        (body(response_objs=[answer("4"), 7]), "response_objs[1]: expected an object, got 7"),
        (
            body(response_objs=[answer("4"), {"id": "r"}]),
            "response_objs[1].output: required field missing (expected an array of objects)",
        ),
        (
            body(response_objs=[{"output": "4"}]),
            'response_objs[0].output: expected an array of objects, got "4"',
        ),
        (
            body(response_objs=[{"output": [None]}]),
            "response_objs[0].output[0]: expected an object, got null",
        ),
        (
            body(conversation_history=[{"role": "user", "content": 5}]),
            "conversation_history[0].content: expected a string, got 5",
        ),
        (
            body(conversation_history=[{"role": "user", "content": "a"}, {"content": "b"}]),
            "conversation_history[1].role: required field missing (expected a string)",
        ),
        (
            body(conversation_history=["hi"]),
            'conversation_history[0]: expected an object with string role and content, got "hi"',
        ),
        (
            body(conversation_history="hi"),
            "conversation_history: expected an array of objects with string role and content, "
            'got "hi"',
        ),
        (
            body(conversation_history=...),
            "conversation_history: required field missing "
            "(expected an array of objects with string role and content)",
        ),
        (body(principle=1.5), "principle: expected a string or null, got 1.5"),
    ],
    ids=lambda value: "" if isinstance(value, dict) else value.split(":")[0],
)
def test_schema_violations_are_422_naming_the_path(value: dict[str, Any], detail: str) -> None:
    error = rejected(value)
    assert (error.status, error.detail) == (422, detail)


def test_at_most_max_compare_responses_answers() -> None:
    three = json.dumps(body(response_objs=[answer(str(i)) for i in range(3)])).encode()
    assert len(parse_compare_body(three, CONFIG).responses) == 3
    error = rejected(body(response_objs=[answer(str(i)) for i in range(4)]))
    assert (error.status, error.detail) == (422, "response_objs: expected at most 3 entries, got 4")


def test_fixed_baseline_requires_a_non_empty_baseline_response() -> None:
    text = (
        "baseline_response: expected a non-empty string when comparison_strategy is fixed_baseline"
    )
    for missing in (..., "", None, 3):
        assert rejected(body(baseline_response=missing), BASELINE).detail == text
    ok = json.dumps(body(baseline_response="B")).encode()
    assert parse_compare_body(ok, BASELINE).baseline == "B"
    assert (
        parse_compare_body(json.dumps(body(baseline_response=3)).encode(), CONFIG).baseline is None
    )


def test_bad_json_duplicates_and_size_are_rejected_like_verify() -> None:
    assert rejected(b"[]").detail.startswith("invalid JSON body: expected a JSON object")
    assert rejected(b'{"response_objs": [], "response_objs": []}').detail == (
        "duplicate key 'response_objs'"
    )
    small = Config(judge_base_url="http://judge/v1", judge_model="m", max_body_bytes=1024)
    error = rejected(body(response_objs=[answer("x" * 2000)]), small)
    assert (error.status, error.detail) == (413, "request body exceeds 1024 bytes")


# --- replies -------------------------------------------------------------------------------------


def test_replies_without_comparisons_carry_nulls() -> None:
    assert render_compare_reply([], None, None) == (
        b'{"rewards":[],"comparison_results":null,"metrics":null}'
    )
    assert render_compare_reply([3.0], None, None) == (
        b'{"rewards":[3.0],"comparison_results":null,"metrics":null}'
    )


def test_a_judged_reply_lists_every_comparison_and_the_metrics() -> None:
    results = [
        {
            "response_i": 0,
            "response_j": 1,
            "judge_idx": 0,
            "score_1": 4,
            "score_2": 2,
            "ranking": 1,
        },
        {
            "response_i": 1,
            "response_j": 0,
            "judge_idx": 0,
            "score_1": 4,
            "score_2": 2,
            "ranking": 1,
        },
    ]
    metrics = {"mean_individual_score": 3, "std_individual_score": 1.0, "tiebreak_usage_rate": 0}
    reply = render_compare_reply([3.0, 3.0], results, metrics)
    assert json.loads(reply) == {
        "rewards": [3.0, 3.0],
        "comparison_results": [
            {
                "response_i": 0,
                "response_j": 1,
                "judge_idx": 0,
                "score_1": 4.0,
                "score_2": 2.0,
                "ranking": 1.0,
            },
            {
                "response_i": 1,
                "response_j": 0,
                "judge_idx": 0,
                "score_1": 4.0,
                "score_2": 2.0,
                "ranking": 1.0,
            },
        ],
        "metrics": {
            "mean_individual_score": 3.0,
            "std_individual_score": 1.0,
            "tiebreak_usage_rate": 0.0,
        },
    }
    assert list(json.loads(reply)) == ["rewards", "comparison_results", "metrics"]
    decoded = msgspec.json.decode(reply, type=CompareReply)
    assert decoded.comparison_results is not None
    assert decoded.comparison_results[1].response_i == 1


def test_a_reply_never_carries_a_non_finite_reward() -> None:
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="finite"):
            render_compare_reply([3.0, bad], None, None)
