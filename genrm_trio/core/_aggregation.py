"""The `simple_tiebreaker` aggregation: verdicts of a group's comparisons to one base score per
slot, plus the group metrics (S-30…S-33).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from genrm_trio.core.verdicts import Verdict

__all__ = ["GroupMetrics", "aggregate"]

# The midpoint of the 1..6 ranking scale: a tie is broken towards the side the ranking favours.
_RANKING_MIDPOINT = 3.5


class GroupMetrics(NamedTuple):
    """Statistics over the successful comparisons of a group (S-33)."""

    mean_individual_score: float
    std_individual_score: float
    tiebreak_usage_rate: float


def aggregate(
    slots: int, results: Sequence[tuple[int, int, Verdict]], default_score: float
) -> tuple[list[float], GroupMetrics]:
    """Base score of every slot 0..slots-1 and the group metrics.

    `results` holds (i, j, verdict) in comparison order, oriented rollout-first. A slot with no
    comparison gets `default_score`. With no results at all the metrics are (0.0, 0.0, 0.0).
    """
    totals = [0.0] * slots
    counts = [0] * slots
    individual: list[float] = []
    ties = 0
    for i, j, (score_1, score_2, ranking) in results:
        if not (0 <= i < slots and 0 <= j < slots):
            raise ValueError(f"comparison ({i}, {j}) is outside slots 0..{slots - 1}")
        individual.append(score_1)
        individual.append(score_2)
        if score_1 == score_2:
            ties += 1
            adjustment = _RANKING_MIDPOINT - ranking
            score_1 += adjustment
            score_2 -= adjustment
        totals[i] += score_1
        totals[j] += score_2
        counts[i] += 1
        counts[j] += 1
    base = [
        total / count if count else default_score
        for total, count in zip(totals, counts, strict=True)
    ]
    if not results:
        return base, GroupMetrics(0.0, 0.0, 0.0)
    mean = _sum(individual) / len(individual)
    variance = _sum([(score - mean) * (score - mean) for score in individual]) / len(individual)
    return base, GroupMetrics(mean, math.sqrt(variance), ties / len(results))


def _sum(values: list[float]) -> float:
    """Exactly rounded sum; scores so large that it overflows give inf or nan instead of an
    error, for the finiteness check before publication (C-64) to report."""
    try:
        return math.fsum(values)
    except OverflowError:
        return sum(values)
