"""Run metrics over finished rows: scored rows, mask rate, failure classes, zero-counting."""

from __future__ import annotations

import math

import pytest

from genrm_trio.core.run_metrics import RunMetrics, failure_class, summarize_rows


def scored(reward: float) -> dict[str, object]:
    return {"reward": reward, "mask_sample": False, "failure_kind": None}


def masked(kind: str | None = "judge_failed") -> dict[str, object]:
    return {"reward": 0.0, "mask_sample": True, "failure_kind": kind, "failure_reason": "x"}


def test_statistics_cover_scored_rows_only() -> None:
    metrics = summarize_rows([scored(1.0), scored(3.0), masked(), masked()])
    assert metrics.rows == 4
    assert metrics.scored == 2
    assert metrics.failed == 2
    assert metrics.mask_rate == 0.5
    assert metrics.failures_by_class == {"judge_failed": 2}
    assert metrics.reward_mean == 2.0
    assert metrics.reward_std == 1.0
    assert (metrics.reward_min, metrics.reward_median, metrics.reward_max) == (1.0, 2.0, 3.0)


def test_named_classes_count_as_zero_in_the_statistics() -> None:
    rows = [scored(3.0), masked(), {"_ng_failure_class": "timeout", "reward": 0.0}]
    metrics = summarize_rows(rows, count_as_zero=["judge_failed"])
    assert metrics.counted_as_zero == 1
    assert metrics.reward_mean == 1.5
    assert metrics.failures_by_class == {"judge_failed": 1, "timeout": 1}
    # the rows given are never rewritten
    assert rows[1]["reward"] == 0.0 and rows[1]["mask_sample"] is True


def test_an_explicit_failure_class_wins_over_the_mask() -> None:
    assert failure_class({**masked(), "_ng_failure_class": "verify_503"}) == "verify_503"
    assert failure_class(masked(None)) == "masked"


@pytest.mark.parametrize("reward", [None, "1.0", True, math.nan, math.inf])
def test_a_row_without_a_finite_reward_is_not_scored(reward: object) -> None:
    assert failure_class({"reward": reward}) == "no_reward"
    assert summarize_rows([{"reward": reward}]).scored == 0


def test_no_rows_gives_empty_statistics() -> None:
    assert summarize_rows([]) == RunMetrics()


def test_only_failures_and_no_zero_classes_leaves_rewards_unknown() -> None:
    metrics = summarize_rows([masked(), masked()])
    assert metrics.mask_rate == 1.0
    assert metrics.reward_mean is None
