"""Group scoring end to end: worked examples E1…E8 (§4.8), partial masking (S-34, M-2) and the
fixed_baseline orientation (S-50, S-51).
"""

from __future__ import annotations

from typing import Any

import pytest

from genrm_trio.config import Config
from genrm_trio.core.pairs import Comparison, plan_comparisons
from genrm_trio.core.scoring import masked_slots, oriented_results, score_group
from genrm_trio.core.verdicts import Verdict

TOLERANCE = 1e-9


def config(**overrides: Any) -> Config:
    return Config(judge_base_url="http://judge.test/v1", judge_model="genrm", **overrides)


def plain_texts(n: int) -> list[tuple[str, str]]:
    return [("", f"answer-{k}") for k in range(n)]


def test_e1_all_pairs_two() -> None:
    cfg = config(comparison_strategy="all_pairs", num_rollouts_per_prompt=2)
    plan = plan_comparisons("all_pairs", 2, 1)
    score = score_group(2, plain_texts(2), plan, {0: Verdict(4, 2, 1)}, (), cfg)
    assert score.rewards == pytest.approx({0: 4.0, 1: 2.0}, abs=TOLERANCE)
    assert score.metrics.tiebreak_usage_rate == 0.0


def test_e2_tie_broken_but_reported_unbroken() -> None:
    cfg = config(comparison_strategy="all_pairs", num_rollouts_per_prompt=2)
    plan = plan_comparisons("all_pairs", 2, 1)
    verdicts = {0: Verdict(3, 3, 2)}
    score = score_group(2, plain_texts(2), plan, verdicts, (), cfg)
    assert score.rewards == pytest.approx({0: 4.5, 1: 1.5}, abs=TOLERANCE)
    assert score.metrics.tiebreak_usage_rate == 1.0
    assert oriented_results(plan, verdicts) == [(0, 1, (3, 3, 2))]


def test_e3_circular_three() -> None:
    cfg = config(num_rollouts_per_prompt=3)
    plan = plan_comparisons("circular", 3, 1)
    verdicts = {0: Verdict(4, 2, 1), 1: Verdict(3, 5, 5), 2: Verdict(3, 4, 4)}
    score = score_group(3, plain_texts(3), plan, verdicts, (), cfg)
    assert score.rewards == pytest.approx({0: 4.0, 1: 2.5, 2: 4.0}, abs=TOLERANCE)
    assert score.metrics.mean_individual_score == pytest.approx(3.5, abs=TOLERANCE)
    assert score.metrics.std_individual_score == pytest.approx(0.9574271077563381, abs=TOLERANCE)
    assert score.metrics.tiebreak_usage_rate == 0.0


def test_e4_position_swap_cancels_a_biased_judge() -> None:
    cfg = config(num_rollouts_per_prompt=2)
    plan = plan_comparisons("circular", 2, 1)
    score = score_group(
        2, plain_texts(2), plan, {0: Verdict(4, 2, 1), 1: Verdict(4, 2, 1)}, (), cfg
    )
    assert score.rewards == pytest.approx({0: 3.0, 1: 3.0}, abs=TOLERANCE)
    assert score.metrics.mean_individual_score == pytest.approx(3.0, abs=TOLERANCE)
    assert score.metrics.std_individual_score == pytest.approx(1.0, abs=TOLERANCE)


def test_e5_circular_four_with_bonuses_and_length_weights() -> None:
    cfg = config(
        num_rollouts_per_prompt=4,
        reasoning_bonus=0.5,
        answer_bonus=0.25,
        top_percentile=0.5,
        group_answer_length_penalty_coeff=0.4,
    )
    plan = plan_comparisons("circular", 4, 1)
    verdicts = {
        0: Verdict(4, 2, 1),
        1: Verdict(3, 3, 2),
        2: Verdict(5, 1, 1),
        3: Verdict(2, 4, 5),
    }
    texts = [("r" * r, "a" * a) for r, a in zip([0, 12, 7, 30], [40, 10, 10, 25], strict=True)]
    score = score_group(4, texts, plan, verdicts, (), cfg)
    assert score.rewards == pytest.approx({0: 3.75, 1: 3.65, 2: 3.9, 3: 1.45}, abs=TOLERANCE)
    assert score.metrics.mean_individual_score == pytest.approx(3.0, abs=TOLERANCE)
    assert score.metrics.std_individual_score == pytest.approx(1.224744871391589, abs=TOLERANCE)
    assert score.metrics.tiebreak_usage_rate == pytest.approx(0.25, abs=TOLERANCE)


def test_e5_base_scores_without_adjustments() -> None:
    plan = plan_comparisons("circular", 4, 1)
    verdicts = {0: Verdict(4, 2, 1), 1: Verdict(3, 3, 2), 2: Verdict(5, 1, 1), 3: Verdict(2, 4, 5)}
    score = score_group(4, plain_texts(4), plan, verdicts, (), config(num_rollouts_per_prompt=4))
    assert score.rewards == pytest.approx({0: 4.0, 1: 3.25, 2: 3.25, 3: 1.5}, abs=TOLERANCE)


def test_e6_style_adjustment() -> None:
    cfg = config(comparison_strategy="all_pairs", group_style_penalty_coeff=1)
    plan = plan_comparisons("all_pairs", 2, 1)
    texts = [("", "plain answer"), ("", "# Title\n- item\n**bold**")]
    score = score_group(2, texts, plan, {0: Verdict(3, 3, 3.5)}, (), cfg)
    assert score.rewards == pytest.approx({0: 3.5, 1: 2.5}, abs=TOLERANCE)


def test_e7_fixed_baseline_maps_a_baseline_first_verdict_back() -> None:
    cfg = config(comparison_strategy="fixed_baseline", num_rollouts_per_prompt=1)
    plan = [Comparison(0, 0, 1, 0, swapped=False), Comparison(1, 1, 0, 1, swapped=True)]
    verdicts = {0: Verdict(5, 1, 1), 1: Verdict(1, 4, 6)}
    assert oriented_results(plan, verdicts) == [(0, 1, (5, 1, 1)), (0, 1, (4, 1, 1))]
    score = score_group(1, [("", "answer-0")], plan, verdicts, (), cfg)
    assert score.rewards == pytest.approx({0: 4.5}, abs=TOLERANCE)


def test_e7_with_the_s51_order_and_a_rule_based_judge() -> None:
    cfg = config(
        comparison_strategy="fixed_baseline", num_rollouts_per_prompt=1, num_judges_per_comparison=2
    )
    for digest in ("a" * 64, "b" * 64, "c" * 64):
        plan = plan_comparisons("fixed_baseline", 1, 2, baseline_digest=digest)
        # The judge: answer shown first -> (5, 1, 1); baseline shown first -> (1, 4, 6).
        verdicts = {c.index: Verdict(1, 4, 6) if c.swapped else Verdict(5, 1, 1) for c in plan}
        score = score_group(1, [("", "answer-0")], plan, verdicts, (), cfg)
        assert score.rewards == pytest.approx({0: 4.5}, abs=TOLERANCE)


def test_s50_adjustments_see_rollouts_only() -> None:
    cfg = config(
        comparison_strategy="fixed_baseline",
        num_rollouts_per_prompt=2,
        group_answer_length_penalty_coeff=1.0,
    )
    plan = plan_comparisons("fixed_baseline", 2, 1, baseline_digest="0" * 64)
    verdicts = {c.index: Verdict(3, 3, 3.5) for c in plan}
    score = score_group(2, [("", "aa"), ("", "aaaa")], plan, verdicts, (), cfg)
    assert score.rewards == pytest.approx({0: 3.5, 1: 2.5}, abs=TOLERANCE)


def test_e8_masked_rollouts_play_no_part_in_adjustments() -> None:
    cfg = config(num_rollouts_per_prompt=4, group_answer_length_penalty_coeff=0.4)
    plan = plan_comparisons("circular", 4, 1)
    # (1, 2) failed: rollouts 1 and 2 are masked; 0 and 3 keep all their comparisons.
    verdicts = {0: Verdict(3, 3, 3.5), 2: Verdict(3, 3, 3.5), 3: Verdict(3, 3, 3.5)}
    masked = masked_slots(plan, {1}, 4)
    assert masked == {1, 2}
    texts = [("", "a" * length) for length in (10, 1000, 8, 30)]
    score = score_group(4, texts, plan, verdicts, masked, cfg)
    assert score.rewards == pytest.approx({0: 3.2, 3: 2.8}, abs=TOLERANCE)


def test_s34_scored_rollouts_keep_comparisons_against_masked_ones() -> None:
    cfg = config(num_rollouts_per_prompt=4)
    plan = plan_comparisons("circular", 4, 1)
    verdicts = {0: Verdict(5, 1, 1), 2: Verdict(4, 2, 1), 3: Verdict(1, 3, 6)}
    score = score_group(4, plain_texts(4), plan, verdicts, {1, 2}, cfg)
    # Rollout 0: 5 as response_1 against 1, and 3 as response_2 against 3.
    assert score.rewards == pytest.approx({0: 4.0, 3: 1.5}, abs=TOLERANCE)
    assert score.metrics.mean_individual_score == pytest.approx(16 / 6, abs=TOLERANCE)


def test_m2_masked_sets() -> None:
    all_pairs = plan_comparisons("all_pairs", 4, 2)
    assert masked_slots(all_pairs, {1}, 4) == {0, 2}
    assert masked_slots(all_pairs, {6 + 5}, 4) == {2, 3}
    assert masked_slots(all_pairs, set(), 4) == set()
    baseline = plan_comparisons("fixed_baseline", 4, 2, baseline_digest="0" * 64)
    assert masked_slots(baseline, {2, 6}, 4) == {2}
    assert masked_slots(baseline, {c.index for c in baseline}, 4) == {0, 1, 2, 3}


def test_a_scored_rollout_without_every_verdict_is_a_defect() -> None:
    plan = plan_comparisons("circular", 3, 1)
    with pytest.raises(ValueError, match="no verdict"):
        score_group(
            3, plain_texts(3), plan, {0: Verdict(4, 2, 1), 1: Verdict(4, 2, 1)}, (), config()
        )


def test_texts_must_cover_every_rollout() -> None:
    with pytest.raises(ValueError, match="texts"):
        score_group(3, plain_texts(2), plan_comparisons("circular", 3, 1), {}, (), config())


def test_metrics_cover_every_successful_comparison_only() -> None:
    cfg = config(comparison_strategy="all_pairs", num_rollouts_per_prompt=3)
    plan = plan_comparisons("all_pairs", 3, 1)
    # (0, 2) failed: 0 and 2 are masked, 1 is scored from (0, 1) and (1, 2).
    verdicts = {0: Verdict(2, 2, 1), 2: Verdict(4, 4, 3.5)}
    score = score_group(3, plain_texts(3), plan, verdicts, masked_slots(plan, {1}, 3), cfg)
    assert score.rewards == pytest.approx({1: (-0.5 + 4) / 2}, abs=TOLERANCE)
    assert score.metrics.tiebreak_usage_rate == 1.0
    assert score.metrics.mean_individual_score == 3.0
