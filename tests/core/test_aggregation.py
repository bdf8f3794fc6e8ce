"""simple_tiebreaker aggregation and group metrics (S-30…S-33)."""

from __future__ import annotations

import math

import pytest

from genrm_trio.core._aggregation import GroupMetrics, aggregate
from genrm_trio.core.verdicts import Verdict


def test_s30_a_tie_is_broken_by_the_ranking() -> None:
    base, metrics = aggregate(2, [(0, 1, Verdict(3, 3, 2))], 3.0)
    assert base == [4.5, 1.5]
    assert metrics == GroupMetrics(3.0, 0.0, 1.0)


def test_s30_a_tie_with_a_neutral_ranking_stays_a_tie() -> None:
    base, metrics = aggregate(2, [(0, 1, Verdict(4, 4, 3.5))], 3.0)
    assert base == [4.0, 4.0]
    assert metrics.tiebreak_usage_rate == 1.0


def test_e3_circular_three() -> None:
    results = [
        (0, 1, Verdict(4, 2, 1)),
        (1, 2, Verdict(3, 5, 5)),
        (2, 0, Verdict(3, 4, 4)),
    ]
    base, metrics = aggregate(3, results, 3.0)
    assert base == pytest.approx([4.0, 2.5, 4.0], abs=1e-9)
    assert metrics.mean_individual_score == pytest.approx(3.5, abs=1e-9)
    assert metrics.std_individual_score == pytest.approx(0.9574271077563381, abs=1e-9)
    assert metrics.tiebreak_usage_rate == 0.0


def test_s31_a_slot_without_comparisons_gets_the_default_score() -> None:
    base, _ = aggregate(3, [(0, 1, Verdict(5, 1, 1))], 2.5)
    assert base == [5.0, 1.0, 2.5]


def test_s33_metrics_use_pre_tiebreak_scores_of_every_comparison() -> None:
    results = [(0, 1, Verdict(2, 2, 1)), (1, 0, Verdict(5, 3, 6))]
    base, metrics = aggregate(2, results, 3.0)
    assert base == [(4.5 + 3) / 2, (-0.5 + 5) / 2]
    assert metrics.mean_individual_score == 3.0
    assert metrics.std_individual_score == pytest.approx(1.224744871391589, abs=1e-12)
    assert metrics.tiebreak_usage_rate == 0.5


def test_no_results_give_defaults_and_zero_metrics() -> None:
    assert aggregate(2, [], 3.0) == ([3.0, 3.0], GroupMetrics(0.0, 0.0, 0.0))


def test_a_comparison_outside_the_slots_is_an_error() -> None:
    with pytest.raises(ValueError, match="outside"):
        aggregate(2, [(0, 2, Verdict(1, 1, 1))], 3.0)


def test_overflowing_scores_give_non_finite_results_not_errors() -> None:
    base, metrics = aggregate(2, [(0, 1, Verdict(1e308, 1e308, 3.5))] * 2, 3.0)
    assert base == [math.inf, math.inf]
    assert metrics.mean_individual_score == math.inf
    assert not math.isfinite(metrics.std_individual_score)
