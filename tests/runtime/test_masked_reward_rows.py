"""`masked_reward_placeholder` through the real app on the fake judge: what a masked row's
`reward` holds, that nothing else of the row changes, and that replays answer the same bytes
(W-33, M-8)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from genrm_trio.testing import FakeJudge, pair_rule
from genrm_trio.testing.harness import Reply, member, running_server

# Circular pairing, no position bias: a scored rollout's reward is its own quality. Pair (4, 5)
# fails, so rollouts 4 and 5 are masked and 0..3 are scored with 1, 3, 5 and 2 (mean 2.75).
QUALITIES = [1, 3, 5, 2, 4, 4]
SCORED_MEAN = 2.75
N = len(QUALITIES)


def judge() -> FakeJudge:
    return FakeJudge(rules=[pair_rule(4, 5, "http_status", status=400)])


def bodies(**extra: Any) -> list[dict[str, Any]]:
    return [member(i, q, instance_config={"task": "t"}, **extra) for i, q in enumerate(QUALITIES)]


async def group(policy: str, **settings: Any) -> list[Reply]:
    async with running_server(
        judge=judge(), num_rollouts_per_prompt=N, masked_reward_placeholder=policy, **settings
    ) as server:
        return await server.verify_all(bodies())


def without_reward(reply: Reply) -> dict[str, Any]:
    return {key: value for key, value in reply.body.items() if key != "reward"}


async def test_group_mean_gives_masked_rows_the_mean_of_the_scored_rewards() -> None:
    # AS-172
    rows = await group("group_mean")
    assert [r.masked for r in rows] == [False] * 4 + [True] * 2
    assert [r.reward for r in rows[:4]] == [1.0, 3.0, 5.0, 2.0]
    assert [r.reward for r in rows[4:]] == [SCORED_MEAN, SCORED_MEAN]
    # A trainer that counts the masked rows in its mean gets the mean of the scored rows.
    assert statistics.fmean(r.reward for r in rows) == SCORED_MEAN
    masked = rows[4].body
    assert masked["mask_sample"] is True
    assert masked["failure_kind"] == masked["_ng_failure_class"] == "judge_failed"
    assert masked["failure_reason"].startswith(
        "GenRM rollout_index=4 lost a comparison to a judge failure (1 of 6 comparisons failed)"
    )
    assert masked["instance_config"] == {"task": "t", "mask_sample": True}
    assert "genrm_masked_rollout_rate_per_group" not in masked
    assert b'"reward":2.75,"mask_sample":true,' in rows[4].raw


async def test_only_the_masked_rows_reward_differs_from_zero() -> None:
    zero = await group("zero")
    mean = await group("group_mean")
    assert [r.reward for r in zero[4:]] == [0.0, 0.0]
    assert b'"reward":0.0,"mask_sample":true,' in zero[4].raw
    assert [r.raw for r in mean[:4]] == [r.raw for r in zero[:4]]
    assert [without_reward(r) for r in mean] == [without_reward(r) for r in zero]


async def test_replays_answer_the_same_bytes() -> None:
    # AS-172, M-8
    async with running_server(
        judge=judge(), num_rollouts_per_prompt=N, masked_reward_placeholder="group_mean"
    ) as server:
        first = await server.verify_all(bodies())
        calls = server.calls()
        again = await server.verify_all(bodies())
        one = await server.verify(bodies()[5])
        # A regenerated answer for a masked slot gets that slot's masked row (M-8).
        regenerated = await server.verify(member(5, 4, regenerated=True))
        assert server.calls() == calls
    assert [r.raw for r in again] == [r.raw for r in first]
    assert one.raw == first[5].raw
    assert regenerated.reward == SCORED_MEAN
    assert regenerated.body["failure_reason"] == first[5].body["failure_reason"]


async def test_a_spooled_masked_row_is_the_same_bytes(tmp_path: Path) -> None:
    in_memory = await group("group_mean", waiting_body_memory_bytes=None)
    spooled = await group("group_mean", waiting_body_memory_bytes=0, spool_dir=str(tmp_path))
    assert [r.raw for r in spooled] == [r.raw for r in in_memory]


@pytest.mark.parametrize("policy", ["zero", "group_mean"])
async def test_a_group_whose_every_rollout_is_masked_carries_zero(policy: str) -> None:
    # AS-173
    outage = FakeJudge(rules=[{"action": "http_status", "status": 400}])
    async with running_server(
        judge=outage, num_rollouts_per_prompt=4, masked_reward_placeholder=policy
    ) as server:
        rows = await server.complete(qualities=[1, 2, 3, 4])
        again = await server.complete(qualities=[1, 2, 3, 4])
    assert all(r.masked and r.reward == 0.0 for r in rows)
    assert "every rollout was masked" in rows[0].body["failure_reason"]
    assert [r.raw for r in again] == [r.raw for r in rows]


async def test_compare_has_no_masked_entries_to_fill() -> None:
    # /compare is fail-fast (M-9, W-43): the key changes neither its rewards nor its failures.
    answers = {
        "conversation_history": [{"role": "user", "content": "2+2?"}],
        "response_objs": [member(i, q)["response"] for i, q in enumerate(QUALITIES)],
    }
    replies = {}
    for policy in ("zero", "group_mean"):
        async with running_server(
            judge=FakeJudge(), num_rollouts_per_prompt=N, masked_reward_placeholder=policy
        ) as server:
            replies[policy] = await server.compare(answers)
        async with running_server(
            judge=judge(), num_rollouts_per_prompt=N, masked_reward_placeholder=policy
        ) as server:
            failed = await server.compare(answers)
        assert failed.status == 503
        assert "pair=(4, 5)" in failed.detail
    assert replies["group_mean"].raw == replies["zero"].raw
    assert replies["zero"].body["rewards"] == [float(q) for q in QUALITIES]
