"""One group's rewards from its comparisons' verdicts, shared by `/verify` and `/compare`
(S-30…S-34, S-50, S-51, M-2), and the reward placeholder its masked rows carry (W-33).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

from genrm_trio.config import Config, MaskedRewardPlaceholder
from genrm_trio.core._adjustments import adjust_scores
from genrm_trio.core._aggregation import GroupMetrics, aggregate
from genrm_trio.core.pairs import Comparison
from genrm_trio.core.verdicts import Verdict, mapped_back

__all__ = [
    "GroupScore",
    "masked_reward_placeholder",
    "masked_slots",
    "oriented_results",
    "score_group",
]


class GroupScore(NamedTuple):
    """Final reward of every scored rollout (by slot) and the group metrics."""

    rewards: dict[int, float]
    metrics: GroupMetrics


def oriented_results(
    plan: Sequence[Comparison], verdicts: Mapping[int, Verdict]
) -> list[tuple[int, int, Verdict]]:
    """(i, j, verdict) of every successful comparison, rollout-first, in comparison order.

    Baseline-first verdicts are mapped back (S-51); this is also what `comparison_results`
    of `/compare` report.
    """
    results: list[tuple[int, int, Verdict]] = []
    for comparison in sorted(plan, key=lambda c: c.index):
        verdict = verdicts.get(comparison.index)
        if verdict is None:
            continue
        if comparison.swapped:
            verdict = mapped_back(verdict)
        i, j = comparison.oriented
        results.append((i, j, verdict))
    return results


def score_group(
    n: int,
    texts: Sequence[tuple[str, str]],
    plan: Sequence[Comparison],
    verdicts: Mapping[int, Verdict],
    masked: Collection[int],
    config: Config,
) -> GroupScore:
    """Rewards of the rollouts not in `masked`, and metrics over every successful comparison.

    `texts[k]` is (reasoning, answer) of rollout k; `verdicts` maps a comparison index to its
    verdict in presentation order. Every comparison of a scored rollout must have a verdict:
    a scored rollout is scored from all of its comparisons (S-34). Under ``fixed_baseline`` the
    baseline is slot `n` for aggregation only (S-50).
    """
    if len(texts) != n:
        raise ValueError(f"expected texts of {n} rollouts, got {len(texts)}")
    scored = [k for k in range(n) if k not in masked]
    for comparison in plan:
        if comparison.index not in verdicts and any(slot in comparison.pair for slot in scored):
            raise ValueError(f"comparison {comparison.index} of a scored rollout has no verdict")
    slots = n + 1 if config.comparison_strategy == "fixed_baseline" else n
    base, metrics = aggregate(slots, oriented_results(plan, verdicts), config.default_score)
    final = adjust_scores(
        [base[k] for k in scored],
        [texts[k][0] for k in scored],
        [texts[k][1] for k in scored],
        config,
    )
    return GroupScore(dict(zip(scored, final, strict=True)), metrics)


def masked_slots(plan: Sequence[Comparison], failed: Collection[int], n: int) -> set[int]:
    """Rollouts with at least one failed comparison (M-2); the baseline is never masked."""
    masked: set[int] = set()
    for comparison in plan:
        if comparison.index in failed:
            masked.update(slot for slot in comparison.pair if slot < n)
    return masked


def masked_reward_placeholder(policy: MaskedRewardPlaceholder, rewards: Collection[float]) -> float:
    """The `reward` every masked row of a group carries (W-33), decided once at publication.

    `rewards` are the group's final scored rewards (after adjustments). ``zero`` gives 0.0;
    ``group_mean`` gives their mean, so a trainer that counts the masked rows in its group mean
    gets the mean of the scored rows. With no scored reward (every rollout masked) it is 0.0.
    """
    if policy == "zero" or not rewards:
        return 0.0
    count = len(rewards)
    try:
        return math.fsum(rewards) / count
    except OverflowError:
        # Finite rewards whose sum overflows: their shares cannot, and they sum to the mean.
        return math.fsum(reward / count for reward in rewards)
