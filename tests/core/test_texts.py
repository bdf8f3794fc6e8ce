"""Scoring texts (S-1), the judge's view of an answer (J-5), history (J-7, §2.7) and the
effective principle (J-6).
"""

from __future__ import annotations

from typing import Any

import pytest

from genrm_trio.core.texts import (
    convert_history,
    effective_principle,
    extract_scoring_text,
    judge_answer_text,
    normalize_compare_history,
)


def test_s1_answer_concatenates_output_text_parts_only() -> None:
    response = {
        "output": [
            {
                "type": "message",
                "content": [
                    {"type": "output_text", "text": "4"},
                    {"type": "refusal", "refusal": "no", "text": "no"},
                    {"type": "output_text", "text": "2"},
                ],
            }
        ]
    }
    assert extract_scoring_text(response) == ("", "42")


def test_s1_reasoning_and_answer_across_items() -> None:
    response = {
        "id": "resp_1",
        "output": [
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "think "}, {"text": "more"}],
            },
            {"type": "function_call", "name": "f", "arguments": "{}"},
            {"type": "message", "content": [{"type": "output_text", "text": "first"}]},
            {"type": "reasoning", "summary": [{"text": "!"}]},
            {"type": "message", "content": [{"type": "output_text", "text": " second"}]},
        ],
    }
    assert extract_scoring_text(response) == ("think more!", "first second")


@pytest.mark.parametrize(
    "response",
    [
        None,
        "text",
        [],
        {},
        {"output": "not a list"},
        {"output": [1, "x", None, {"type": "message"}, {"type": "message", "content": "s"}]},
        {"output": [{"type": "message", "content": [None, {"type": "output_text", "text": None}]}]},
        {"output": [{"type": "reasoning", "summary": [{"text": 5}, "x"]}]},
    ],
)
def test_s1_malformed_parts_are_ignored(response: Any) -> None:
    assert extract_scoring_text(response) == ("", "")


@pytest.mark.parametrize(("answer", "shown"), [("", "None"), (" \n\t", "None"), (" x ", " x ")])
def test_j5_blank_answers_are_shown_as_none(answer: str, shown: str) -> None:
    assert judge_answer_text(answer) == shown


def test_j7_string_and_text_parts_give_the_same_history() -> None:
    expected = [{"role": "user", "content": "Hello"}]
    assert convert_history("Hello") == expected
    assert (
        convert_history([{"role": "user", "content": [{"type": "input_text", "text": "Hello"}]}])
        == expected
    )


def test_j7_items_roles_and_content() -> None:
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "name": "f"},
        {"content": "no role"},
        {"role": 7, "content": "odd role"},
        {"role": "tool", "content": "dropped"},
        {
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "a"},
                {"type": "input_image", "text": "ignored"},
                {"type": "input_text", "text": "b"},
                {"type": "input_text", "text": None},
            ],
        },
        {"role": "system", "content": None},
        "not an item",
    ]
    assert convert_history(items) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "no role"},
        {"role": "user", "content": "odd role"},
        {"role": "assistant", "content": "ab"},
        {"role": "system", "content": ""},
    ]


def test_j7_anything_else_is_an_empty_history() -> None:
    assert convert_history(None) == []
    assert convert_history(3) == []


def test_compare_history_is_normalised() -> None:
    items = [
        {"role": "developer", "content": "rules", "name": "x"},
        {"role": "tool", "content": "dropped"},
        {"role": "user", "content": "hi"},
    ]
    assert normalize_compare_history(items) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "hi"},
    ]


def test_j6_effective_principle() -> None:
    assert effective_principle("Be kind.", "Default.", True) == "Be kind."
    assert effective_principle("   ", "Default.", True) == "Default."
    assert effective_principle(None, "Default.", True) == "Default."
    assert effective_principle("Be kind.", "Default.", False) is None
    assert effective_principle(None, "", True) is None
