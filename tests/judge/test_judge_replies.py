"""Reply interpretation: JSON, usable or not, budget exhaustion and verdict texts (J-10…J-17)."""

from __future__ import annotations

from typing import Any

import pytest

from genrm_trio.core.verdicts import Verdict
from genrm_trio.judge._replies import (
    ReplyNotJson,
    ReplyReading,
    chat_verdict_text,
    decode_reply,
    read_chat_reply,
    read_responses_reply,
)

FENCED_421 = '```json\n{"score_1": 4, "score_2": 2, "ranking": 1}\n```'
V421 = Verdict(4.0, 2.0, 1.0)


def chat(content: Any, finish: Any = "stop") -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": content}}
    if finish != "absent":
        choice["finish_reason"] = finish
    return {"choices": [choice]}


def responses(texts: list[Any], status: Any = "completed", **extra: Any) -> dict[str, Any]:
    parts = [{"type": "output_text", "text": text} for text in texts]
    output = [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": FENCED_421}]},
        {"type": "message", "role": "assistant", "content": parts},
    ]
    reply: dict[str, Any] = {"object": "response", "output": output, **extra}
    if status != "absent":
        reply["status"] = status
    return reply


def read_chat(reply: Any) -> ReplyReading:
    return read_chat_reply(reply, default_score=3.0, default_ranking=3.5)


def read_responses(reply: Any) -> ReplyReading:
    return read_responses_reply(reply, default_score=3.0, default_ranking=3.5)


def unusable(problem: str, exhausted: bool = False) -> ReplyReading:
    return ReplyReading(verdict=None, problem=problem, usable=False, exhausted=exhausted)


UNPARSEABLE = ReplyReading(verdict=None, problem="no verdict found", usable=True, exhausted=False)


def found(verdict: Verdict) -> ReplyReading:
    return ReplyReading(verdict=verdict, problem=None, usable=True, exhausted=False)


# --- J-10 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"<html>not json</html>",
        b'{"choices": [',
        b"NaN",
        b'{"x": Infinity}',
        b'"\xff\xfe"',
        b"[" * 200_000 + b"]" * 200_000,
    ],
    ids=["empty", "html", "cut", "nan", "infinity", "invalid-utf8", "deep-nesting"],
)
def test_bodies_that_are_not_standard_json_are_rejected(body: bytes) -> None:
    with pytest.raises(ReplyNotJson):
        decode_reply(body)


@pytest.mark.usefixtures("default_digit_cap")
def test_json_is_read_whatever_it_holds() -> None:
    assert decode_reply(b"null") is None
    assert decode_reply(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}
    # Beyond Python's 4,300-digit cap an integer is still standard JSON, read exactly.
    assert decode_reply(b'{"n": ' + b"1" * 5000 + b"}") == {"n": (10**5000 - 1) // 9}
    assert decode_reply(b"-" + b"1" * 5000) == -((10**5000 - 1) // 9)
    assert decode_reply(b'{"a": 1, "a": 2}') == {"a": 2}


# --- J-11, J-12, J-13: chat ---------------------------------------------------------------


def test_chat_reply_with_fenced_verdict_succeeds() -> None:
    assert read_chat(chat(FENCED_421)) == found(V421)
    assert read_chat(chat(FENCED_421, finish=None)) == found(V421)
    assert read_chat(chat(FENCED_421, finish="absent")) == found(V421)


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (None, "not a JSON object"),
        ([chat(FENCED_421)], "not a JSON object"),
        ({}, "no choices"),
        ({"choices": []}, "no choices"),
        ({"choices": {"0": {}}}, "no choices"),
        ({"choices": ["text"]}, "content is not a string"),
        ({"choices": [{"finish_reason": "stop"}]}, "content is not a string"),
        (chat(None), "content is not a string"),
        (chat(["a"]), "content is not a string"),
        (chat(""), "empty verdict text"),
        (chat(" \n\t"), "empty verdict text"),
        (chat("<think>x</think>  "), "empty verdict text"),
        (chat('<think> {"score_1": 5, "score_2": 1, "ranking": 1}'), "unfinished reasoning"),
        (chat(FENCED_421, finish="content_filter"), "finish_reason=content_filter"),
        (chat(FENCED_421, finish="tool_calls"), "finish_reason=tool_calls"),
        (chat(FENCED_421, finish=7), "finish_reason=7"),
    ],
)
def test_unusable_chat_replies_name_their_problem(reply: Any, problem: str) -> None:
    assert read_chat(reply) == unusable(problem)


def test_verdict_inside_reasoning_is_ignored() -> None:
    content = '<think>{"score_1":1,"score_2":5,"ranking":6}</think>' + FENCED_421
    assert read_chat(chat(content)) == found(V421)
    content = '<think>{"score_1":1,"score_2":5,"ranking":6}</think>no verdict here'
    assert read_chat(chat(content)) == UNPARSEABLE


def test_chat_verdict_text_follows_the_last_closing_think() -> None:
    assert chat_verdict_text("a</think>b</think>c") == "c"
    assert chat_verdict_text("<think>a</think>b<think>c") is None
    assert chat_verdict_text("<think>a</think><think>b</think>c") == "c"
    assert chat_verdict_text("plain") == "plain"


def test_completed_chat_reply_without_verdict_is_usable_but_unparseable() -> None:
    assert read_chat(chat("I prefer the first one.")) == UNPARSEABLE
    assert read_chat(chat('{"score_1": NaN, "score_2": 1, "ranking": 1}')) == UNPARSEABLE


def test_length_finish_with_a_verdict_is_accepted() -> None:
    assert read_chat(chat(FENCED_421, finish="length")) == found(V421)


@pytest.mark.parametrize(
    "content",
    ["<think>comparing the two responses, weighing", "partial answer", "", None],
)
def test_length_finish_without_a_verdict_is_budget_exhaustion(content: Any) -> None:
    assert read_chat(chat(content, finish="length")) == unusable(
        "finish_reason=length", exhausted=True
    )


def test_hostile_finish_reason_is_shown_shortened() -> None:
    reading = read_chat(chat(FENCED_421, finish="x" * 10_000))
    assert reading.problem == "finish_reason=" + "x" * 200


# --- J-14, J-15: responses ------------------------------------------------------------------


def test_responses_reply_with_verdict_succeeds_for_completed_null_or_absent_status() -> None:
    for status in ("completed", None, "absent"):
        assert read_responses(responses([FENCED_421], status=status)) == found(V421)


def test_responses_verdict_text_joins_message_parts_and_skips_null_texts() -> None:
    texts = ['{"score_1": 4, ', None, '"score_2": 2, "ranking": 1}']
    assert read_responses(responses(texts)) == found(V421)


def test_responses_verdict_text_ignores_reasoning_and_refusals() -> None:
    reply = {
        "status": "completed",
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": FENCED_421}]},
            {"type": "message", "content": [{"type": "refusal", "refusal": FENCED_421}]},
        ],
    }
    assert read_responses(reply) == unusable("empty verdict text")


def test_responses_text_is_not_think_stripped() -> None:
    reply = responses(['<think> {"score_1": 5, "score_2": 1, "ranking": 1}'])
    assert read_responses(reply) == found(Verdict(5.0, 1.0, 1.0))


@pytest.mark.parametrize("status", ["failed", "cancelled", "in_progress", "queued"])
def test_responses_with_other_status_are_unusable(status: str) -> None:
    assert read_responses(responses([FENCED_421], status=status)) == unusable(f"status={status}")


def test_incomplete_for_max_output_tokens_is_budget_exhaustion() -> None:
    reply = responses([], status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    assert read_responses(reply) == unusable("status=incomplete", exhausted=True)


def test_incomplete_for_another_reason_is_not_budget_exhaustion() -> None:
    reply = responses([], status="incomplete", incomplete_details={"reason": "content_filter"})
    assert read_responses(reply) == unusable("status=incomplete")


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (None, "not a JSON object"),
        ("text", "not a JSON object"),
        ({}, "empty verdict text"),
        ({"output": "text"}, "empty verdict text"),
        ({"output": [{"type": "message", "content": "text"}]}, "empty verdict text"),
        (responses(["   "]), "empty verdict text"),
    ],
)
def test_unusable_responses_replies_name_their_problem(reply: Any, problem: str) -> None:
    assert read_responses(reply) == unusable(problem)


def test_completed_responses_reply_without_verdict_is_usable_but_unparseable() -> None:
    assert read_responses(responses(["I prefer the first one."])) == UNPARSEABLE
