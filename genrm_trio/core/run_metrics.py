"""Metrics over a run's finished rows: the one definition that the collector's metrics file and
`POST /aggregate_metrics` both report.

A row is *scored* when it carries no failure class and a finite reward; every other row is a
failure of some class. Reward statistics cover scored rows only, except that rows of the classes
named in `count_as_zero` enter them with reward 0.0 (the rows themselves are never rewritten).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

__all__ = [
    "FAILURE_CLASS_KEY",
    "MASKED_CLASS",
    "NO_REWARD_CLASS",
    "RunMetrics",
    "failure_class",
    "summarize_rows",
]

# NeMo Gym's collector tags a failed row with this key; our collector writes the same one.
FAILURE_CLASS_KEY = "_ng_failure_class"
# A masked row whose `failure_kind` is missing or not a string.
MASKED_CLASS = "masked"
# A row that claims no failure but has no finite reward: it cannot count as scored.
NO_REWARD_CLASS = "no_reward"


class RunMetrics(msgspec.Struct, kw_only=True):
    """Counts and reward statistics over a set of rows."""

    rows: int = 0
    scored: int = 0
    failed: int = 0
    mask_rate: float = 0.0
    failures_by_class: dict[str, int] = msgspec.field(default_factory=dict)
    counted_as_zero: int = 0
    reward_mean: float | None = None
    reward_std: float | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    reward_median: float | None = None


def _finite_reward(row: Mapping[str, Any]) -> float | None:
    value = row.get("reward")
    # bool is an int subclass; a row with "reward": true is not a score.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    reward = float(value)
    return reward if math.isfinite(reward) else None


def failure_class(row: Mapping[str, Any]) -> str | None:
    """The row's failure class, or None for a scored row.

    An explicit `_ng_failure_class` wins; a masked row is classed by its `failure_kind`.
    """
    explicit = row.get(FAILURE_CLASS_KEY)
    if isinstance(explicit, str) and explicit:
        return explicit
    if row.get("mask_sample") is True:
        kind = row.get("failure_kind")
        return kind if isinstance(kind, str) and kind else MASKED_CLASS
    if _finite_reward(row) is None:
        return NO_REWARD_CLASS
    return None


def _median(sorted_values: list[float]) -> float:
    middle = len(sorted_values) // 2
    if len(sorted_values) % 2:
        return sorted_values[middle]
    return (sorted_values[middle - 1] + sorted_values[middle]) / 2.0


def summarize_rows(
    rows: Iterable[Mapping[str, Any]], count_as_zero: Iterable[str] = ()
) -> RunMetrics:
    """Metrics over `rows`. The spread is the population standard deviation."""
    zero_classes = frozenset(count_as_zero)
    rewards: list[float] = []
    by_class: dict[str, int] = {}
    total = scored = counted_as_zero = 0
    for row in rows:
        total += 1
        cls = failure_class(row)
        if cls is None:
            scored += 1
            reward = _finite_reward(row)
            assert reward is not None  # failure_class classes a row without one
            rewards.append(reward)
            continue
        by_class[cls] = by_class.get(cls, 0) + 1
        if cls in zero_classes:
            counted_as_zero += 1
            rewards.append(0.0)
    failed = total - scored
    metrics = RunMetrics(
        rows=total,
        scored=scored,
        failed=failed,
        mask_rate=failed / total if total else 0.0,
        failures_by_class=dict(sorted(by_class.items())),
        counted_as_zero=counted_as_zero,
    )
    if rewards:
        mean = math.fsum(rewards) / len(rewards)
        ordered = sorted(rewards)
        metrics.reward_mean = mean
        metrics.reward_std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))
        metrics.reward_min = ordered[0]
        metrics.reward_max = ordered[-1]
        metrics.reward_median = _median(ordered)
    return metrics
