"""The reward a masked row carries (W-33, `masked_reward_placeholder`), without an event loop:
decided once when the group's outcome is computed, 0.0 when no rollout was scored."""

from __future__ import annotations

import math
import statistics
import sys
from typing import Any

import pytest
from one_group import Groups, arrival

from genrm_trio.config import ConfigError, config_from_mapping
from genrm_trio.core.outcomes import Masked, Scored
from genrm_trio.core.scoring import masked_reward_placeholder
from genrm_trio.core.transition import Finish
from genrm_trio.core.verdicts import Verdict

BASE = {"judge_base_url": "http://judge/v1", "judge_model": "m"}


def test_zero_is_zero_whatever_was_scored() -> None:
    assert masked_reward_placeholder("zero", [1.0, 3.0, 2.0]) == 0.0
    assert masked_reward_placeholder("zero", []) == 0.0


def test_group_mean_is_the_mean_of_the_scored_rewards() -> None:
    # The group: rewards [1, 3, 2] and one masked row.
    placeholder = masked_reward_placeholder("group_mean", [1.0, 3.0, 2.0])
    assert placeholder == 2.0
    # A trainer that counts the masked row in its group mean gets the mean of the scored rows.
    assert statistics.fmean([1.0, 3.0, 2.0, placeholder]) == 2.0
    assert (
        masked_reward_placeholder("group_mean", [0.1, 0.2, 0.4]) == math.fsum([0.1, 0.2, 0.4]) / 3
    )


def test_group_mean_with_nothing_scored_is_zero() -> None:
    assert masked_reward_placeholder("group_mean", []) == 0.0


def test_group_mean_of_rewards_whose_sum_overflows_is_still_their_finite_mean() -> None:
    big = sys.float_info.max / 2
    placeholder = masked_reward_placeholder("group_mean", [big, big, big])
    assert math.isfinite(placeholder)
    assert math.isclose(placeholder, big, rel_tol=1e-15)


def _masked_group(groups: Groups) -> list[Any]:
    """N = 4 under circular, pair (1, 2) failed; answer k scores 1 + k in each comparison."""
    decisions = [groups.arrive(arrival(i)) for i in range(4)]
    record = groups.record()
    failed = next(c for c in record.plan if (c.first, c.second) == (1, 2))
    verdicts = {
        c.index: Verdict(1.0 + c.first, 1.0 + c.second, 3.5)
        for c in record.plan
        if c.index != failed.index
    }
    lost = {failed.index: "GenRM judge X pair=(1, 2): boom"}
    groups.send("e:g", Finish(record.rid, record.fence, verdicts, lost, 4, False), 1.0)
    return [groups.answer(d) for d in decisions]


@pytest.mark.parametrize(("policy", "expected"), [("zero", 0.0), ("group_mean", 2.5)])
def test_masked_rows_of_a_partially_masked_group_carry_the_placeholder(
    policy: str, expected: float
) -> None:
    groups = Groups(num_rollouts_per_prompt=4, masked_reward_placeholder=policy)
    outcomes = _masked_group(groups)
    assert [type(o) for o in outcomes] == [Scored, Masked, Masked, Scored]
    assert [outcomes[0].reward, outcomes[3].reward] == [1.0, 4.0]
    assert [outcomes[1].placeholder, outcomes[2].placeholder] == [expected, expected]
    # The mask, the failure text and the scored rows are the same under either policy.
    assert outcomes[1].text.startswith("GenRM rollout_index=1 lost a comparison")
    assert outcomes[0].metrics["genrm_masked_rollout_rate_per_group"] == 0.5


def test_a_late_request_for_a_masked_slot_gets_the_placeholder_it_was_published_with() -> None:
    groups = Groups(num_rollouts_per_prompt=4, masked_reward_placeholder="group_mean")
    outcomes = _masked_group(groups)
    late = groups.arrive(arrival(2, fp=b"regenerated" * 3), now=2.0)
    assert groups.answer(late) == outcomes[2]
    assert outcomes[2].placeholder == 2.5


def test_a_group_whose_every_rollout_is_masked_carries_zero() -> None:
    groups = Groups(masked_reward_placeholder="group_mean")
    decisions = [groups.arrive(arrival(i)) for i in range(2)]
    record = groups.record()
    lost = {0: "first", 1: "second"}
    groups.send("e:g", Finish(record.rid, record.fence, {}, lost, 2, False), 1.0)
    outcomes = [groups.answer(d) for d in decisions]
    assert all(isinstance(o, Masked) and o.placeholder == 0.0 for o in outcomes)
    assert "every rollout was masked" in outcomes[0].text
    late = groups.arrive(arrival(0), now=2.0)
    assert groups.answer(late) == outcomes[0]


def test_a_group_past_its_evaluation_deadline_carries_zero() -> None:
    groups = Groups(masked_reward_placeholder="group_mean")
    decisions = [groups.arrive(arrival(i)) for i in range(2)]
    record = groups.record()
    groups.send("e:g", Finish(record.rid, record.fence, {}, {}, 1, True), 5.0)
    outcomes = [groups.answer(d) for d in decisions]
    assert all(isinstance(o, Masked) and o.placeholder == 0.0 for o in outcomes)
    assert outcomes[0].text.startswith("GenRM cohort evaluation deadline exceeded")


def test_the_key_takes_only_its_two_values() -> None:
    base = BASE
    assert config_from_mapping(base).masked_reward_placeholder == "zero"
    config = config_from_mapping({**base, "masked_reward_placeholder": "group_mean"})
    assert config.masked_reward_placeholder == "group_mean"
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({**base, "masked_reward_placeholder": "mean"})
    assert str(caught.value) == (
        "invalid configuration: masked_reward_placeholder: must be one of zero, group_mean "
        "(got 'mean')"
    )
