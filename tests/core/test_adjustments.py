"""Length and style adjustments (S-40…S-48, AS-80, AS-81, E5, E6, E8)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrm_trio.config import Config
from genrm_trio.core._adjustments import adjust_scores, group_relative_weights, style_density


def config(**overrides: Any) -> Config:
    return Config(judge_base_url="http://judge.test/v1", judge_model="genrm", **overrides)


def test_s48_header_then_plain_answer() -> None:
    assert style_density("# Title\nPlain answer") == pytest.approx(1 / 20, abs=1e-12)


@pytest.mark.parametrize(
    "answer",
    [
        "####### x",
        "a # b",
        "1.not",
        "-not",
        "**open",
        "__open",
        "**two\nlines**",
        "```\n# h\n- i\n**b**\n```",
        "plain text",
        "",
        "   \n ",
    ],
)
def test_s48_things_that_are_not_style(answer: str) -> None:
    assert style_density(answer) == 0.0


def test_s48_emoji_count_per_code_point() -> None:
    assert style_density("😀😀") == 1.0
    assert style_density("😀😀 ok") == pytest.approx(0.4, abs=1e-12)


def test_s46_each_kind_of_element_counts() -> None:
    answer = "## Head\n  3. three\n * star\n+ plus\n**b** and __u__ ✅"
    # header, ordered item, two unordered items, two bold spans, one emoji
    assert style_density(answer) == pytest.approx(7 / len(answer), abs=1e-12)


def test_s46_code_blocks_are_removed_from_text_and_length() -> None:
    answer = "# T\n```python\n# not a header\n- nor a list\n```\nrest"
    assert style_density(answer) == pytest.approx(1 / len("# T\n\nrest"), abs=1e-12)


def test_s47_cjk_counts_as_style() -> None:
    assert style_density("答案") == 1.0


def test_s43_weights() -> None:
    assert group_relative_weights([0, 0.5, 1]) == [0.5, 0.0, -0.5]
    assert group_relative_weights([2, 2, 2]) == [0.0, 0.0, 0.0]
    assert group_relative_weights([]) == []
    assert sum(group_relative_weights([3, 10, 7, 1])) == pytest.approx(0.0, abs=1e-12)


def test_e5_bonuses_and_length_weights() -> None:
    cfg = config(
        reasoning_bonus=0.5,
        answer_bonus=0.25,
        top_percentile=0.5,
        group_answer_length_penalty_coeff=0.4,
    )
    reasoning = ["", "r" * 12, "r" * 7, "r" * 30]
    answers = ["a" * 40, "a" * 10, "a" * 10, "a" * 25]
    final = adjust_scores([4.0, 3.25, 3.25, 1.5], reasoning, answers, cfg)
    assert final == pytest.approx([3.75, 3.65, 3.9, 1.45], abs=1e-9)


def test_e6_style_adjustment() -> None:
    answers = ["plain answer", "# Title\n- item\n**bold**"]
    assert [style_density(a) for a in answers] == pytest.approx([0, 3 / 23], abs=1e-12)
    final = adjust_scores([3.0, 3.0], ["", ""], answers, config(group_style_penalty_coeff=1))
    assert final == pytest.approx([3.5, 2.5], abs=1e-9)


def test_e8_only_the_given_rollouts_are_weighed() -> None:
    cfg = config(group_answer_length_penalty_coeff=0.4)
    final = adjust_scores([3.0, 3.0], ["", ""], ["a" * 10, "a" * 30], cfg)
    assert final == pytest.approx([3.2, 2.8], abs=1e-9)


@pytest.mark.parametrize(
    "styled",
    ["####### x", "a # b", "1.not", "-not", "**open", "```\n# h\n- i\n```"],
)
def test_as80_unstyled_answers_get_no_style_adjustment(styled: str) -> None:
    cfg = config(group_style_penalty_coeff=1)
    assert adjust_scores([3.0, 3.0], ["", ""], [styled, "plain text"], cfg) == [3.0, 3.0]


def test_as80_emoji_answer_is_penalised() -> None:
    cfg = config(group_style_penalty_coeff=1)
    final = adjust_scores([3.0, 3.0], ["", ""], ["😀😀 ok", "plain text"], cfg)
    assert final == pytest.approx([2.5, 3.5], abs=1e-9)


def test_as81_no_reasoning_bonus_when_all_reasoning_is_empty() -> None:
    cfg = config(reasoning_bonus=1)
    assert adjust_scores([4.0, 2.0], ["", "  "], ["a", "bb"], cfg) == [4.0, 2.0]


def test_s41_threshold_is_the_third_best_of_sixteen_at_020() -> None:
    scores = [float(s) for s in range(16)]  # slot 13 is third best
    reasoning = ["r" * 50] * 16
    cfg = config(reasoning_bonus=1, top_percentile=0.2)
    reasoning[13] = "short"
    assert adjust_scores(scores, reasoning, [""] * 16, cfg)[13] == 14.0
    reasoning[13], reasoning[12] = "r" * 50, "short"
    assert adjust_scores(scores, reasoning, [""] * 16, cfg) == scores


def test_s42_shortest_trimmed_length_and_lowest_slot_win() -> None:
    cfg = config(answer_bonus=1, top_percentile=1.0)
    final = adjust_scores([1.0, 2.0, 3.0], ["", "", ""], ["  abc  ", "ab", "ab"], cfg)
    assert final == [1.0, 3.0, 3.0]


def test_s42_both_bonuses_use_the_threshold_from_before_either() -> None:
    cfg = config(reasoning_bonus=1, answer_bonus=0.5, top_percentile=0.25)
    final = adjust_scores(
        [4.0, 4.0, 1.0, 1.0], ["r", "rr", "rr", "rr"], ["aa", "a", "aa", "aa"], cfg
    )
    # The reasoning bonus lifts slot 0 to 5, but slot 1 still meets the threshold of 4.
    assert final == [5.0, 4.5, 1.0, 1.0]


def test_s42_both_bonuses_can_go_to_one_rollout() -> None:
    cfg = config(reasoning_bonus=1, answer_bonus=0.5, top_percentile=0.5)
    final = adjust_scores([4.0, 2.0], ["r", "rr"], ["a", "aa"], cfg)
    assert final == [5.5, 2.0]


def test_s40_one_rollout_is_never_adjusted() -> None:
    cfg = config(
        reasoning_bonus=1, group_answer_length_penalty_coeff=1, group_style_penalty_coeff=1
    )
    assert adjust_scores([2.0], ["r"], ["# a"], cfg) == [2.0]


def test_s40_nothing_changes_with_every_coefficient_zero() -> None:
    assert adjust_scores([1.0, 5.0], ["", "long"], ["# a", "b"], config()) == [1.0, 5.0]


def test_s32_style_comes_after_length() -> None:
    cfg = config(
        group_reasoning_length_penalty_coeff=1.0,
        group_style_penalty_coeff=1.0,
    )
    final = adjust_scores([3.0, 3.0], ["r", "rrr"], ["# a\nb", "plain"], cfg)
    assert final == pytest.approx([3.0 + 0.5 - 0.5, 3.0 - 0.5 + 0.5], abs=1e-9)


def test_list_items_in_a_long_run_of_newlines() -> None:
    answer = "\n" * 200_000 + "- item\n" + " \n" * 100_000 + "2. two"
    assert style_density(answer) == pytest.approx(2 / len(answer.strip()), abs=1e-15)


# S-46 written directly with multiline regular expressions, to compare against.
def _reference_density(text: str) -> float:
    text = re.sub(r"```[\s\S]*?```", "", text)
    length = len(text.strip())
    if not length:
        return 0.0
    patterns = [
        (r"^#{1,6}\s", re.MULTILINE),
        (r"^\s*\d+\.\s", re.MULTILINE),
        (r"^\s*[-*+]\s", re.MULTILINE),
        (r"\*\*[^*\n]+\*\*", 0),
        (r"__[^_\n]+__", 0),
        (
            "[\u24c2-\U0001f251\U0001f300-\U0001f5ff\U0001f600-\U0001f64f"
            "\U0001f680-\U0001f6ff\U0001f900-\U0001f9ff\U0001fa00-\U0001faff]",
            0,
        ),
    ]
    return sum(len(re.findall(p, text, flags)) for p, flags in patterns) / length


@settings(max_examples=1500, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("#-*+_ 1.\n\t\u2003ab`😀")), max_size=40))
def test_style_density_matches_the_regular_expressions(text: str) -> None:
    assert style_density(text) == _reference_density(text)
