"""What a finished group answers: each slot's scored or masked row, or one failure for all.

``score_outcomes`` turns the verdicts of a group whose comparisons have all ended into one
outcome per slot (M-1…M-6): the rollouts touched by a failed comparison are masked, the others
scored from the comparisons that succeeded. ``failure_outcome`` is the one answer of a failed
group (C-86).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.core.outcomes import Masked, Outcome, Rejected, Scored
from genrm_trio.core.pairs import Comparison
from genrm_trio.core.records import FailureKind, Record
from genrm_trio.core.scoring import masked_reward_placeholder, masked_slots, score_group
from genrm_trio.core.verdicts import Verdict

__all__ = ["check_publishable", "failure_outcome", "score_outcomes"]


def failure_outcome(record: Record) -> Outcome:
    """C-86: kind judge answers masked rows, kind cohort answers 503; legacy adds the suffix.

    A failed group has no scored reward to take a mean of, so its masked rows carry the
    placeholder 0.0 whatever ``masked_reward_placeholder`` says (W-33).
    """
    failure = record.failure
    assert failure is not None
    suffix = messages.MIGRATION_SUFFIX if record.legacy else ""
    if failure.kind is FailureKind.JUDGE:
        return Masked(failure.text, suffix)
    return Rejected(503, failure.text + suffix)


def score_outcomes(
    key: str,
    size: int,
    texts: Sequence[tuple[str, str]],
    plan: Sequence[Comparison],
    verdicts: Mapping[int, Verdict],
    failed: Mapping[int, str],
    config: Config,
) -> dict[int, Scored | Masked] | str:
    """Every slot's outcome, or the failure text when every rollout is masked (M-4).

    Raises RuntimeError when the rewards cannot be published (C-64): a count that does not add
    up, or a non-finite reward or metric.
    """
    masked = masked_slots(plan, failed.keys(), size)
    total = len(plan)
    if len(masked) == size:
        first = failed[min(failed)]
        return messages.every_rollout_masked(key, len(failed), total, first)
    score = score_group(size, list(texts), plan, verdicts, masked, config)
    check_publishable(size, score.rewards, masked, score.metrics)
    placeholder = masked_reward_placeholder(
        config.masked_reward_placeholder, score.rewards.values()
    )
    metrics = {
        "genrm_failed_comparison_rate_per_group": len(failed) / total,
        "genrm_masked_rollout_rate_per_group": len(masked) / size,
        "mean_individual_score": score.metrics.mean_individual_score,
        "std_individual_score": score.metrics.std_individual_score,
        "tiebreak_usage_rate": score.metrics.tiebreak_usage_rate,
    }
    outcomes: dict[int, Scored | Masked] = {}
    for slot in range(size):
        if slot in masked:
            first_failure = min(
                index for index in failed if slot in (plan[index].first, plan[index].second)
            )
            outcomes[slot] = Masked(
                messages.rollout_masked(slot, len(failed), total, failed[first_failure]),
                placeholder=placeholder,
            )
        else:
            outcomes[slot] = Scored(score.rewards[slot], metrics)
    return outcomes


def check_publishable(
    size: int, rewards: Mapping[int, float], masked: Collection[int], metrics: Sequence[float]
) -> None:
    """C-64: one reward per scored slot, every reward and metric finite; else RuntimeError."""
    if len(rewards) + len(masked) != size:
        raise RuntimeError(messages.reward_count(len(rewards) + len(masked), size))
    if not all(math.isfinite(r) for r in rewards.values()) or not all(
        math.isfinite(m) for m in metrics
    ):
        raise RuntimeError(messages.NON_FINITE_REWARDS)
