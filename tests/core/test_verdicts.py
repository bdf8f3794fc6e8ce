"""Verdict parsing (S-20…S-23, AS-69…AS-76 at the parser level)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrm_trio.core import verdicts
from genrm_trio.core.verdicts import Verdict, mapped_back, parse_verdict


def parse(text: str) -> Verdict | None:
    return parse_verdict(text, default_score=3.0, default_ranking=3.5)


def test_as69_a_fenced_verdict_beats_a_later_bare_one() -> None:
    text = (
        'Reasoning...\n```json\n{"score_1": 4, "score_2": 2, "ranking": 1}\n```\n'
        'On second thought {"score_1": 1, "score_2": 5, "ranking": 6}'
    )
    assert parse(text) == (4, 2, 1)


def test_as70_the_last_valid_bare_candidate_wins() -> None:
    text = (
        '{"score_1": 1, "score_2": 5, "ranking": 6} then {"score_1": 4, "score_2": 2, '
        '"ranking": 1} and finally {"a": 1}'
    )
    assert parse(text) == (4, 2, 1)


def test_as71_first_valid_candidate_inside_a_fence_wins() -> None:
    text = '```json\n{"a": 1}\n{"score_1": 5, "score_2": 1, "ranking": 1}\n{"score_1": 2}\n```'
    assert parse(text) == (5, 1, 1)


def test_the_first_fence_with_a_valid_candidate_wins() -> None:
    text = (
        '```json {"a": 1} ``` ```JSON\n{"score_1": 2, "score_2": 4, "ranking": 5}```'
        ' ```Json {"score_1": 5, "score_2": 1, "ranking": 1}```'
    )
    assert parse(text) == (2, 4, 5)


def test_fences_without_a_valid_candidate_fall_back_to_the_whole_text() -> None:
    text = '```json {"a": 1} ``` {"score_1": 5, "score_2": 1, "ranking": 2} {"b": 2}'
    assert parse(text) == (5, 1, 2)
    unclosed = '```json {"score_1": 1, "score_2": 5, "ranking": 6} {"score_1": 2}'
    assert parse(unclosed) == (2, 3.0, 3.5)
    other_language = '```python {"score_1": 1}``` {"score_1": 4, "score_2": 1, "ranking": 2}'
    assert parse(other_language) == (4, 1, 2)


def test_as72_overall_object_is_unwrapped() -> None:
    text = '{"rubric_evaluations": [], "overall": {"score_1": 5, "score_2": 1, "ranking": 1}}'
    assert parse(text) == (5, 1, 1)


def test_overall_unwrapping_needs_an_object_and_then_only_looks_inside() -> None:
    assert parse('{"overall": 4, "score_1": 2, "score_2": 5, "ranking": 6}') == (2, 5, 6)
    assert parse('{"overall": {"note": "none"}, "score_1": 2}') is None


def test_as73_missing_keys_take_the_defaults() -> None:
    assert parse('{"score_1": 4}') == (4, 3.0, 3.5)
    assert parse_verdict('{"ranking": 2}', default_score=0.5, default_ranking=4) == (0.5, 0.5, 2)


def test_as74_numeric_strings_and_booleans_are_numbers() -> None:
    assert parse('{"score_1": "4", "score_2": " 2 ", "ranking": "1"}') == (4, 2, 1)
    assert parse('{"score_1": true, "score_2": false, "ranking": "+2.5e0"}') == (1, 0, 2.5)
    assert parse('{"score_1": 4.5, "score_2": -1, "ranking": ".5"}') == (4.5, -1, 0.5)


@pytest.mark.parametrize(
    "bad_value",
    ['"not a number"', "null", "[4]", '{"v": 4}', '"1_000"', '"nan"', '"inf"', '"1e999"', '""'],
)
def test_as74_a_value_that_is_not_a_number_invalidates_the_candidate(bad_value: str) -> None:
    assert parse(f'{{"score_1": {bad_value}, "score_2": 2, "ranking": 1}}') is None


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e309", "-1e400"])
def test_non_finite_numbers_invalidate_the_candidate(literal: str) -> None:
    assert parse(f'{{"score_1": {literal}, "score_2": 2, "ranking": 1}}') is None
    earlier_valid = '{"score_1": 5, "score_2": 1, "ranking": 1} '
    assert parse(earlier_valid + f'{{"score_2": {literal}}}') == (5, 1, 1)


def test_huge_integers_are_not_finite_scores() -> None:
    assert parse('{"score_1": ' + "9" * 400 + "}") is None


@pytest.mark.usefixtures("default_digit_cap")
def test_an_integer_beyond_the_digit_cap_under_another_key_is_standard_json() -> None:
    text = '{"note": ' + "9" * 5000 + ', "score_1": 4, "score_2": 2, "ranking": 1}'
    assert parse(text) == (4, 2, 1)
    assert parse('{"score_1": ' + "9" * 5000 + ', "score_2": 2, "ranking": 1}') is None


def test_as75_braces_inside_strings_do_not_count() -> None:
    assert parse('{"note": "}{", "score_1": 4, "score_2": 2, "ranking": 1}') == (4, 2, 1)
    escaped = r'{"note": "a \" } still inside", "score_1": 5, "score_2": 1, "ranking": 2}'
    assert parse(escaped) == (5, 1, 2)


def test_as76_out_of_range_values_are_kept() -> None:
    assert parse('{"score_1": 9, "score_2": 0, "ranking": 7}') == (9, 0, 7)


def test_an_unclosed_brace_yields_nothing_and_scanning_goes_on() -> None:
    assert parse('{ oops {"score_1": 2, "score_2": 4, "ranking": 5}') == (2, 4, 5)
    assert parse('{"score_1": 2, "score_2": 4, "ranking": 5') is None


def test_candidates_do_not_nest_once_found() -> None:
    # The outer object is the candidate; it is invalid, so the inner one is never tried.
    assert parse('{"verdict": {"score_1": 5, "score_2": 1, "ranking": 1}, "x": }') is None


def test_non_json_candidates_are_invalid() -> None:
    assert parse("{'score_1': 4, 'score_2': 2, 'ranking': 1}") is None
    assert parse("{score_1: 4}") is None
    assert parse("") is None
    assert parse("I prefer the first one.") is None


def test_mapped_back_swaps_scores_and_mirrors_the_ranking() -> None:
    assert mapped_back(Verdict(1, 4, 6)) == (4, 1, 1)
    assert mapped_back(Verdict(3, 3, 3.5)) == (3, 3, 3.5)


@pytest.mark.parametrize(
    "hostile",
    [
        "{" * 200_000,
        '{"' * 100_000,
        '{"\\"' * 70_000,
        "{" * 50_000 + "}" * 50_000,
        "```json" * 30_000 + "{" * 30_000,
        "```json {" * 30_000 + "```",
        '{\\"' * 70_000,
        '"{' * 100_000 + "}" * 100_000,
    ],
)
def test_hostile_texts_end_without_raising(hostile: str) -> None:
    assert parse(hostile) is None


def test_a_verdict_after_a_hostile_prefix_is_found() -> None:
    text = "{" * 100_000 + '{"score_1": 4, "score_2": 2, "ranking": 1}'
    assert parse(text) == (4, 2, 1)


# A literal, unoptimised reading of S-20…S-22 to compare the parser against.
def _reference_candidates(text: str) -> list[str]:
    found = []
    i = 0
    while i < len(text):
        if text[i] != "{":
            i += 1
            continue
        depth, in_string, escaped, end = 0, False, False, None
        for j in range(i, len(text)):
            ch = text[j]
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    end = j
                    break
        if end is None:
            i += 1
        else:
            found.append(text[i : end + 1])
            i = end + 1
    return found


def _reference_valid(candidate: str) -> tuple[float, float, float] | None:
    def constant(name: str) -> Any:
        raise ValueError(name)

    try:
        obj = json.loads(candidate, parse_constant=constant)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("overall"), dict):
        obj = obj["overall"]
    keys = ("score_1", "score_2", "ranking")
    if not any(k in obj for k in keys):
        return None
    out = []
    for key, default in zip(keys, (3.0, 3.0, 3.5), strict=True):
        value = obj.get(key, default)
        if isinstance(value, bool):
            number = float(value)
        elif isinstance(value, int | float):
            try:
                number = float(value)
            except OverflowError:
                return None
        elif isinstance(value, str) and re.fullmatch(
            r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", value.strip()
        ):
            number = float(value.strip())
        else:
            return None
        if not math.isfinite(number):
            return None
        out.append(number)
    return out[0], out[1], out[2]


def _reference_parse(text: str) -> tuple[float, float, float] | None:
    for block in re.findall(r"```json\s*([\s\S]*?)```", text, flags=re.IGNORECASE):
        for candidate in _reference_candidates(block):
            verdict = _reference_valid(candidate)
            if verdict is not None:
                return verdict
    last = None
    for candidate in _reference_candidates(text):
        verdict = _reference_valid(candidate)
        if verdict is not None:
            last = verdict
    return last


_pieces = st.sampled_from(
    [
        "{",
        "}",
        '"',
        "\\",
        " ",
        "x",
        ":",
        ",",
        "```json",
        "```",
        '"score_1": 4',
        '"score_2": "2"',
        '"ranking": 1',
        '"overall": ',
        '{"score_1": 5}',
        '{"ranking": 6, "score_2": 1}',
        "NaN",
        "[",
        "]",
    ]
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(_pieces, max_size=30).map("".join))
def test_parser_matches_a_literal_reading_of_the_spec(text: str) -> None:
    assert parse(text) == _reference_parse(text)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from('{}"\\ab\n`jsonJSON:,1'), max_size=80))
def test_scanning_matches_the_literal_algorithm_on_brace_soup(text: str) -> None:
    assert parse(text) == _reference_parse(text)


@settings(max_examples=500, deadline=None)
@given(st.text(st.characters(exclude_categories=())))
def test_parse_verdict_never_raises(text: str) -> None:
    verdict = parse(text)
    assert verdict is None or all(math.isfinite(x) for x in verdict)


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet=st.sampled_from('{}"\\a '), max_size=40))
def test_the_one_track_sweep_agrees_with_the_general_one(text: str) -> None:
    # The sweep for the common case may give up, but when it answers it must be the same answer.
    quick = verdicts._closing_braces_one_track(text)
    assert quick is None or quick == verdicts._closing_braces_any(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": "{"}',  # a '{' inside a string starts a second scan there
        '{"a": "x\\"{"} {"score_1": 2}',
        '{"a": "\\{"}',
    ],
)
def test_a_brace_inside_a_string_is_left_to_the_general_sweep(text: str) -> None:
    assert verdicts._closing_braces_one_track(text) is None
    assert parse(text) == _reference_parse(text)


def test_an_ordinary_judge_text_takes_the_one_track_sweep() -> None:
    text = (
        'Response 1 handles {edge cases}; "quoted \\"text\\"" stays a string.\n'
        '```json\n{"score_1": 4, "score_2": 2, "ranking": 2, "note": {"x": "y"}}\n```'
    )
    assert verdicts._closing_braces_one_track(text) == verdicts._closing_braces_any(text)
    assert parse(text) == (4, 2, 2)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('```json\n {"score_1": 4, "note": "}{\\"{"}\n```', (4, 3, 3.5)),
        ('```json\n{"overall": {"ranking": 2}, "score_1": 6}\n```', (3, 3, 2)),
        ('```json\n{"score_1": 4} then {"score_1": 1}\n```', (4, 3, 3.5)),
        ('```json\n{"score_1": "high"}\n```{"score_2": 5}', (3, 5, 3.5)),
    ],
)
def test_a_fenced_block_reads_as_the_literal_algorithm_does(
    text: str, expected: tuple[float, float, float]
) -> None:
    assert parse(text) == expected == _reference_parse(text)
