"""Partial masking through /verify: only rollouts of failed comparisons are masked (§10.11)."""

from __future__ import annotations

import logging

import pytest
import trio

from genrm_trio.runtime.hooks import Hooks
from genrm_trio.testing import FakeJudge, pair_rule
from genrm_trio.testing.harness import running_server

METRICS = (
    "genrm_failed_comparison_rate_per_group",
    "genrm_masked_rollout_rate_per_group",
    "mean_individual_score",
    "std_individual_score",
    "tiebreak_usage_rate",
)


def q16(k: int) -> int:
    return 1 + (k % 4)


async def test_one_failed_pair_of_sixteen_masks_exactly_two(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # AS-116, AS-117, AS-129
    caplog.set_level(logging.INFO, logger="genrm_trio")
    judge = FakeJudge(position_bias=1, rules=[pair_rule(5, 6, "budget_exhausted")])
    async with running_server(
        judge=judge, num_rollouts_per_prompt=16, genrm_parse_retries=1
    ) as server:
        rows = await server.complete(qualities=[q16(k) for k in range(16)])
        assert server.calls() == 17
    masked = [r.body["_ng_rollout_index"] for r in rows if r.masked]
    assert masked == [5, 6]
    reason = rows[5].body["failure_reason"]
    assert reason.startswith(
        "GenRM rollout_index=5 lost a comparison to a judge failure (1 of 16 comparisons "
        "failed): GenRM judge "
    )
    assert "pair=(5, 6)" in reason and "exhausted max_output_tokens" in reason
    expected = [q16(k) + 0.5 for k in range(16)]
    assert [r.reward for r in rows if not r.masked] == [
        v for k, v in enumerate(expected) if k not in (5, 6)
    ]
    assert rows[4].reward == 1.5 and rows[7].reward == 4.5
    scored = [r.body for r in rows if not r.masked]
    assert {tuple(b[m] for m in METRICS) for b in scored} == {tuple(scored[0][m] for m in METRICS)}
    assert scored[0]["genrm_failed_comparison_rate_per_group"] == 0.0625
    assert scored[0]["genrm_masked_rollout_rate_per_group"] == 0.125
    assert not any(m in rows[5].body for m in METRICS)
    text = caplog.text
    assert text.count("GenRM dropped comparison (5, 6) (judge 0) of 16 after a judge failure") == 1
    assert text.count("GenRM masked one rollout of key='group_id::g::group_attempt::0'") == 2
    assert "disposition=completed" in text and "scored=14 masked=2 failed_comparisons=1/16" in text


async def test_two_distant_failed_pairs_mask_four() -> None:
    # AS-118
    judge = FakeJudge(
        position_bias=1,
        rules=[pair_rule(2, 3, "budget_exhausted"), pair_rule(9, 10, "budget_exhausted")],
    )
    async with running_server(
        judge=judge, num_rollouts_per_prompt=16, genrm_parse_retries=1
    ) as server:
        rows = await server.complete(qualities=[q16(k) for k in range(16)])
    assert [r.body["_ng_rollout_index"] for r in rows if r.masked] == [2, 3, 9, 10]
    assert all(r.reward == q16(k) + 0.5 for k, r in enumerate(rows) if not r.masked)
    assert rows[0].body["genrm_failed_comparison_rate_per_group"] == 0.125
    assert rows[0].body["genrm_masked_rollout_rate_per_group"] == 0.25


async def test_adjacent_failures_then_replays_and_late_answers() -> None:
    # AS-119, AS-128, AS-131
    judge = FakeJudge(
        position_bias=1,
        rules=[
            pair_rule(1, 2, "http_status", status=400),
            pair_rule(2, 3, "http_status", status=400),
        ],
    )
    async with running_server(judge=judge, num_rollouts_per_prompt=4) as server:
        rows = await server.complete(qualities=[1, 2, 3, 4])
        assert [r.masked for r in rows] == [False, True, True, True]
        assert rows[0].reward == 1.5
        assert rows[0].body["genrm_failed_comparison_rate_per_group"] == 0.5
        assert rows[0].body["genrm_masked_rollout_rate_per_group"] == 0.75
        assert server.calls() == 4
        again = await server.complete(qualities=[1, 2, 3, 4])
        assert [r.body for r in again] == [r.body for r in rows]
        assert server.calls() == 4
        from genrm_trio.testing.harness import member

        regenerated = await server.verify(member(2, 3, regenerated=True))
        assert regenerated.masked
        assert regenerated.body["failure_reason"] == rows[2].body["failure_reason"]
        assert regenerated.body["response"]["id"] == "r-g-0-2-again"
        assert (await server.verify(member(0, 1, regenerated=True))).status == 409
        assert (await server.verify(member(0, 1))).reward == 1.5
        assert server.calls() == 4
        await server.verify(member(0, 1, a=1))
        for slot in (0, 2):
            old = await server.verify(member(slot, [1, 2, 3, 4][slot]))
            assert old.status == 409
            assert old.detail == "GenRM group 'g' attempt 0 was superseded by attempt 1"


async def test_masked_rollouts_play_no_part_in_length_adjustments() -> None:
    # AS-120 (E8)
    judge = FakeJudge(rules=[pair_rule(1, 2, "http_status", status=400)])
    async with running_server(
        judge=judge, num_rollouts_per_prompt=4, group_answer_length_penalty_coeff=0.4
    ) as server:
        from genrm_trio.testing.harness import member

        lengths = [10, 1000, 8, 30]
        bodies = []
        for slot, length in enumerate(lengths):
            body = member(slot)
            text = f"answer-{slot} [[q=3]]"
            body["response"]["output"][0]["content"][0]["text"] = text + "x" * (length - len(text))
            bodies.append(body)
        rows = await server.verify_all(bodies)
    assert rows[0].reward == pytest.approx(3.2, abs=1e-9)
    assert rows[3].reward == pytest.approx(2.8, abs=1e-9)


async def test_all_pairs_scores_survivors_from_all_their_comparisons() -> None:
    # AS-121
    judge = FakeJudge(position_bias=1, rules=[pair_rule(0, 1, "http_status", status=400)])
    async with running_server(
        judge=judge, num_rollouts_per_prompt=4, comparison_strategy="all_pairs"
    ) as server:
        rows = await server.complete(qualities=[1, 2, 3, 4])
    assert [r.masked for r in rows] == [True, True, False, False]
    assert rows[2].reward == pytest.approx(10 / 3, abs=1e-9)
    assert rows[3].reward == pytest.approx(4.0, abs=1e-9)
    assert rows[2].body["genrm_failed_comparison_rate_per_group"] == pytest.approx(1 / 6)
    assert rows[2].body["genrm_masked_rollout_rate_per_group"] == 0.5


async def test_every_rollout_masked_fails_the_group(caplog: pytest.LogCaptureFixture) -> None:
    # AS-122, AS-123
    caplog.set_level(logging.INFO, logger="genrm_trio")
    judge = FakeJudge(
        rules=[
            pair_rule(0, 1, "http_status", status=400),
            pair_rule(2, 3, "http_status", status=400),
        ]
    )
    async with running_server(
        judge=judge, num_rollouts_per_prompt=4, comparison_strategy="all_pairs"
    ) as server:
        rows = await server.complete()
    reason = rows[0].body["failure_reason"]
    assert all(r.masked and r.body["failure_reason"] == reason for r in rows)
    assert "every rollout was masked (2 of 6 comparisons failed); first failure:" in reason
    assert "pair=(0, 1)" in reason
    async with running_server(
        judge=FakeJudge(rules=[{"action": "http_status", "status": 500}]),
        num_rollouts_per_prompt=4,
    ) as server:
        rows = await server.complete()
        assert server.calls() == 16
    assert all(r.masked for r in rows)
    assert "disposition=failed" in caplog.text and "kind=judge" in caplog.text


async def test_non_judge_error_beats_masking_and_cancels_the_hung_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # AS-124
    async def boom(i: int, j: int, p: int) -> None:
        if (i, j) == (1, 2):
            await trio.sleep(0.2)
            raise RuntimeError("hook failure")

    judge = FakeJudge(rules=[pair_rule(0, 1, "http_status", status=400), pair_rule(2, 3, "hang")])
    async with running_server(
        judge=judge, hooks=Hooks(on_comparison_start=boom), num_rollouts_per_prompt=4
    ) as server:
        with trio.fail_after(2):
            rows = await server.complete()
        assert [r.status for r in rows] == [503] * 4
        assert rows[0].detail == "GenRM cohort evaluation failed: RuntimeError: hook failure"
        assert judge.stats()["in_flight"] == 0
    dropped = caplog.text.index("GenRM dropped comparison (0, 1)")
    assert dropped < caplog.text.index("GenRM cohort evaluation failed")


async def test_evaluation_deadline_masks_everyone_after_logging_the_dropped_pair(
    autojump_clock, caplog: pytest.LogCaptureFixture
) -> None:
    # AS-125
    judge = FakeJudge(rules=[pair_rule(0, 1, "http_status", status=400), pair_rule(1, 2, "hang")])
    async with running_server(
        judge=judge, num_rollouts_per_prompt=4, cohort_evaluation_timeout_s=1.0
    ) as server:
        start = trio.current_time()
        rows = await server.complete()
        assert trio.current_time() - start == pytest.approx(1.0)
    assert all(r.masked for r in rows)
    assert (
        rows[0]
        .body["failure_reason"]
        .startswith(
            "GenRM cohort evaluation deadline exceeded after 1.0s (3 of 4 comparisons finished, "
            "1 failed)"
        )
    )
    assert "GenRM dropped comparison (0, 1)" in caplog.text


async def test_request_deadline_masks_only_its_pair(autojump_clock) -> None:
    # AS-126
    judge = FakeJudge(rules=[pair_rule(1, 2, "hang")])
    async with running_server(
        judge=judge,
        num_rollouts_per_prompt=4,
        judge_request_timeout_s=0.3,
        cohort_evaluation_timeout_s=5.0,
    ) as server:
        start = trio.current_time()
        rows = await server.complete()
        assert trio.current_time() - start < 0.6
    assert [r.masked for r in rows] == [False, True, True, False]
    assert "TimeoutError" in rows[1].body["failure_reason"]


async def test_fixed_baseline_masks_only_the_rollout_of_the_failed_pass() -> None:
    # AS-85
    judge = FakeJudge(
        rules=[
            {
                "match": {"response_1": "answer-2 ", "any_order": True},
                "action": "http_status",
                "status": 400,
            },
            {"match": {"response_2": "answer-2 "}, "action": "http_status", "status": 400},
        ]
    )
    async with running_server(
        judge=judge,
        num_rollouts_per_prompt=4,
        comparison_strategy="fixed_baseline",
        num_judges_per_comparison=2,
    ) as server:
        from genrm_trio.testing.harness import member

        bodies = [
            member(
                i,
                prompt="2+2?",
                responses_create_params={
                    "input": "2+2?",
                    "metadata": {"baseline_response": "BASE"},
                },
            )
            for i in range(4)
        ]
        rows = await server.verify_all(bodies)
    assert [r.masked for r in rows] == [False, False, True, False]
    reason = rows[2].body["failure_reason"]
    assert "pair=(2, 4)" in reason or "pair=(4, 2)" in reason
    assert rows[0].body["genrm_failed_comparison_rate_per_group"] == 0.25
    assert rows[0].body["genrm_masked_rollout_rate_per_group"] == 0.25


async def test_equal_deadlines_let_the_evaluation_deadline_win(autojump_clock) -> None:
    # AS-132
    judge = FakeJudge(rules=[pair_rule(0, 1, "hang")])
    async with running_server(
        judge=judge, judge_request_timeout_s=0.5, cohort_evaluation_timeout_s=0.5
    ) as server:
        rows = await server.complete()
    assert all(r.masked for r in rows)
    assert "evaluation deadline exceeded" in rows[0].body["failure_reason"]
