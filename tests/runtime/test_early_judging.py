"""Early judging (X-2): comparisons start once both slots are filled; publication does not."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from genrm_trio.testing import FakeJudge, pair_rule
from genrm_trio.testing.harness import member, running_server

# With a lease (a shared store) nobody owns a group while it collects: its comparisons start
# when it is full, in the process that claims it, and the configuration warns at start.
EARLY = "early judging needs a group to be this process's from its first member (no lease)"


@pytest.mark.stores("memory", why=EARLY)
async def test_comparisons_run_during_collection_but_publication_waits(autojump_clock) -> None:
    judge = FakeJudge(latency="fixed:1", position_bias=1)
    async with running_server(
        judge=judge, num_rollouts_per_prompt=4, early_judging=True, cohort_collection_timeout_s=30
    ) as s:
        async with trio.open_nursery() as nursery:
            early = [s.start_verify(nursery, member(i, q=i + 1)) for i in (0, 1, 2)]
            await trio.sleep(3)
            # (0, 1) and (1, 2) were judged while slot 3 was still missing; nobody is answered.
            assert s.calls() == 2
            assert not any(p.done.is_set() for p in early)
            start = trio.current_time()
            last = await s.verify(member(3, q=4))
            # Only (2, 3) and (3, 0) were left to judge after the last member arrived.
            assert trio.current_time() - start == 1
            rewards = [(await p.result()).reward for p in early] + [last.reward]
        assert s.calls() == 4
    async with running_server(judge=FakeJudge(position_bias=1), num_rollouts_per_prompt=4) as s:
        expected = [r.reward for r in await s.complete(qualities=[1, 2, 3, 4])]
    assert rewards == expected == [1.5, 2.5, 3.5, 4.5]


@pytest.mark.stores("memory", why=EARLY)
async def test_collection_deadline_cancels_early_comparisons(autojump_clock) -> None:
    judge = FakeJudge(rules=[{"action": "hang"}])
    async with running_server(
        judge=judge, num_rollouts_per_prompt=3, early_judging=True, cohort_collection_timeout_s=1
    ) as s:
        replies = await s.verify_all([member(0), member(1)])
        assert {r.status for r in replies} == {503}
        assert "did not collect 3 unique rollout indices" in replies[0].detail
        await s.settle()
        stats = judge.stats()
        assert stats["requests_total"] == 1 and stats["cancelled"] == 1
        assert stats["in_flight"] == 0
        assert s.engine.statistics().owned_tasks == 0


@pytest.mark.stores("memory", why=EARLY)
async def test_supersession_cancels_early_comparisons() -> None:
    judge = FakeJudge(rules=[{"match": {"response_1": "answer-0 [[q=3]]"}, "action": "hang"}])
    async with running_server(judge=judge, num_rollouts_per_prompt=3, early_judging=True) as s:
        async with trio.open_nursery() as nursery:
            old = [s.start_verify(nursery, member(i)) for i in (0, 1)]
            await s.settle()
            assert judge.stats()["in_flight"] == 1
            new = await s.verify_all([member(i, a=1, regenerated=True) for i in range(3)])
            for pending in old:
                stale = await pending.result()
                assert (stale.status, stale.detail) == (
                    503,
                    "GenRM group 'g' attempt 0 was superseded by attempt 1",
                )
        assert [r.reward for r in new] == [3.0, 3.0, 3.0]
        assert judge.stats()["in_flight"] == 0


@pytest.mark.stores("memory", why=EARLY)
async def test_a_comparison_failing_during_collection_masks_its_pair_at_publication() -> None:
    judge = FakeJudge(rules=[pair_rule(0, 1, "http_status", status=400)])
    async with running_server(judge=judge, num_rollouts_per_prompt=4, early_judging=True) as s:
        async with trio.open_nursery() as nursery:
            early = [s.start_verify(nursery, member(i)) for i in (0, 1)]
            await s.settle()
            assert s.calls() == 1
            assert not any(p.done.is_set() for p in early)
            rest = await s.verify_all([member(2), member(3)])
            rows = [await p.result() for p in early] + rest
    assert [r.masked for r in rows] == [True, True, False, False]
    assert "pair=(0, 1)" in rows[0].body["failure_reason"]
    assert rows[2].body["genrm_failed_comparison_rate_per_group"] == 0.25


async def test_duplicates_never_start_a_comparison_twice() -> None:
    async with running_server(num_rollouts_per_prompt=4, early_judging=True) as s:
        rows = await s.verify_all(
            [member(0), member(1), member(1), member(0), member(2), member(3)]
        )
        assert [r.reward for r in rows] == [3.0] * 6
        assert s.calls() == 4


@pytest.mark.stores("memory", why=EARLY)
async def test_a_full_group_is_judged_before_groups_still_collecting(autojump_clock) -> None:
    # One judge slot, 1 s per call. Group "busy" holds the slot with its early (0, 1); group
    # "early" queues its own (0, 1) while still collecting; then group "full" arrives whole.
    # The slot goes to "full" each time it comes free, so "full" is answered after its three
    # calls (4 s), not after "early"'s call too (5 s, as a first-in first-out queue would).
    async with running_server(
        judge=FakeJudge(latency="fixed:1"),
        num_rollouts_per_prompt=3,
        judge_max_concurrency=1,
        early_judging=True,
        cohort_collection_timeout_s=60,
        cohort_evaluation_timeout_s=60,
    ) as s:
        async with trio.open_nursery() as nursery:
            for group in ("busy", "early"):
                for slot in (0, 1):
                    s.start_verify(nursery, member(slot, g=group))
                    await s.settle()
            start = trio.current_time()
            replies = await s.verify_all([member(i, g="full") for i in range(3)])
            assert [r.status for r in replies] == [200, 200, 200]
            assert trio.current_time() - start == 4
            # Only then does "early" get the slot for its one ready comparison.
            await trio.sleep(0.5)
            assert s.calls() == 1 + 3 + 1
            nursery.cancel_scope.cancel()
