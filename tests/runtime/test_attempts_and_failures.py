"""Attempts, supersession and group failures through /verify (§10.9, §10.10)."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from genrm_trio.fakes.judge import FakeJudge, pair_rule, parse_latency
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.testing.harness import member, running_server

SUPERSEDED = "GenRM group 'g' attempt 0 was superseded by attempt 1"


async def test_higher_attempt_supersedes_waiters_and_fences_the_old_attempt() -> None:
    # AS-99, AS-100
    async with running_server() as server, trio.open_nursery() as nursery:
        old = server.start_verify(nursery, member(0))
        await server.settle()
        new = await server.verify_all([member(0, 4, a=1), member(1, 2, a=1)])
        stale = await old.result()
        assert (stale.status, stale.detail) == (503, SUPERSEDED)
        assert [r.reward for r in new] == [4.0, 2.0]
        assert server.calls() == 2
        again = await server.verify(member(0))
        assert (again.status, again.detail) == (409, SUPERSEDED)
        assert (await server.verify(member(0, 4, a=1))).reward == 4.0


async def test_higher_attempt_with_another_prompt_supersedes_nothing() -> None:
    # AS-101, AS-102
    async with running_server() as server, trio.open_nursery() as nursery:
        waiting = server.start_verify(nursery, member(0))
        await server.settle()
        other = await server.verify(member(0, a=1, prompt="3+3?"))
        text = "GenRM group 'g' received inconsistent prompt or principle content"
        assert (other.status, other.detail) == (409, text)
        principle = await server.verify(member(1, principle="Be brief"))
        assert (principle.status, principle.detail) == (409, text)
        await server.verify(member(1))
        assert (await waiting.result()).reward == 3.0


def with_baseline(i: int, baseline: str) -> dict[str, object]:
    params = {"input": "2+2?", "metadata": {"baseline_response": baseline}}
    return member(i, responses_create_params=params)


async def test_another_baseline_in_the_same_group_is_inconsistent() -> None:
    # AS-84: the baseline is part of the prompt digest under fixed_baseline.
    async with (
        running_server(comparison_strategy="fixed_baseline") as server,
        trio.open_nursery() as nursery,
    ):
        waiting = server.start_verify(nursery, with_baseline(0, "BASE"))
        await server.settle()
        other = await server.verify(with_baseline(1, "ANOTHER BASE"))
        text = "GenRM group 'g' received inconsistent prompt or principle content"
        assert (other.status, other.detail) == (409, text)
        assert server.calls() == 0
        rows = [await server.verify(with_baseline(1, "BASE")), await waiting.result()]
        assert [row.status for row in rows] == [200, 200]
        assert not any(row.masked for row in rows)


async def test_late_judge_replies_of_a_superseded_attempt_change_nothing(autojump_clock) -> None:
    # AS-103
    judge = FakeJudge(latency="fixed:1")
    async with running_server(judge=judge) as server, trio.open_nursery() as nursery:
        old = [server.start_verify(nursery, member(i)) for i in range(2)]
        await trio.sleep(0.1)
        judge.latency = parse_latency("none")
        new = await server.verify_all([member(i, 5, a=1) for i in range(2)])
        assert [r.reward for r in new] == [5.0, 5.0]
        for pending in old:
            stale = await pending.result()
            assert (stale.status, stale.detail) == (503, SUPERSEDED)
        await trio.sleep(2)
        assert (await server.verify(member(0))).status == 409
        assert (await server.verify(member(1, 5, a=1))).reward == 5.0
        assert judge.stats()["in_flight"] == 0


async def test_superseding_a_finished_attempt_leaves_one_record() -> None:
    # AS-104
    async with running_server() as server:
        await server.complete("a", 0)
        async with trio.open_nursery() as nursery:
            server.start_verify(nursery, member(0, g="a", a=1))
            await server.settle()
            old = await server.verify(member(0, g="a"))
            assert old.status == 409 and "superseded by attempt 1" in old.detail
            groups = await server.groups()
            assert (groups["retained_records"], groups["active_groups"]) == (0, 1)
            server.engine.check_invariants()
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("status", "calls"), [(401, 2), (429, 8), (500, 8)])
async def test_failed_group_replays_its_failure_until_a_new_attempt(
    status: int, calls: int
) -> None:
    # AS-105
    judge = FakeJudge(rules=[{"action": "http_status", "status": status}])
    async with running_server(judge=judge) as server:
        rows = await server.complete()
        assert all(r.masked for r in rows)
        assert server.calls() == calls
        late = await server.verify(member(0, regenerated=True))
        assert late.masked and late.body["failure_reason"] == rows[0].body["failure_reason"]
        assert server.calls() == calls
        judge.set_rules([])
        fresh = await server.complete("g", 1)
        assert [r.masked for r in fresh] == [False, False]
        assert server.calls() == calls + 2


async def test_collection_deadline_answers_503_to_everyone_later(autojump_clock) -> None:
    # AS-106
    async with running_server(cohort_collection_timeout_s=0.05) as server:
        first = await server.verify(member(0))
        text = (
            "GenRM cohort 'group_id::g::group_attempt::0' did not collect 2 unique rollout "
            "indices within 0.05s"
        )
        assert (first.status, first.detail) == (503, text)
        for body in (member(1, regenerated=True), member(0)):
            later = await server.verify(body)
            assert (later.status, later.detail) == (503, text)
        assert server.calls() == 0


async def test_collection_deadline_fires_with_nobody_waiting(
    autojump_clock, caplog: pytest.LogCaptureFixture
) -> None:
    # AS-107
    caplog.set_level(logging.INFO, logger="genrm_trio")
    async with running_server(cohort_collection_timeout_s=0.1) as server:
        async with trio.open_nursery() as nursery:
            pending = server.start_verify(nursery, member(0))
            await trio.sleep(0.01)
            pending.disconnect()
        # Past the deadline, and past the sweep that finds it with a shared store.
        await trio.sleep(0.2 + server.config.group_store_poll_s)
        assert "disposition=failed" in caplog.text
        later = await server.verify(member(1))
        assert later.status == 503 and "did not collect" in later.detail


async def test_last_member_racing_the_collection_deadline_is_all_or_nothing(
    autojump_clock,
) -> None:
    # AS-108
    for delay in (0.0, 0.008, 0.01, 0.012):
        async with running_server(cohort_collection_timeout_s=0.01) as server:
            async with trio.open_nursery() as nursery:
                first = server.start_verify(nursery, member(0))
                await trio.sleep(delay)
                second = await server.verify(member(1))
                results = {(await first.result()).status, second.status}
            assert results in ({200}, {503})
            server.engine.check_invariants()


async def test_evaluation_deadline_masks_and_cancels_the_judge(autojump_clock) -> None:
    # AS-109
    judge = FakeJudge(rules=[{"action": "hang"}])
    async with running_server(
        judge=judge, cohort_collection_timeout_s=0.05, cohort_evaluation_timeout_s=0.2
    ) as server:
        rows = await server.complete()
        assert all(r.masked for r in rows)
        assert rows[0].body["failure_reason"] == (
            "GenRM cohort evaluation deadline exceeded after 0.2s (0 of 2 comparisons "
            "finished, 0 failed)"
        )
        stats = judge.stats()
        assert stats["cancelled"] == 2 and stats["in_flight"] == 0


async def test_conversion_failure_fails_the_group_until_a_new_attempt() -> None:
    # AS-110
    def convert(slot: int) -> None:
        if slot == 1 and not recovered:
            raise RuntimeError("bad request conversion")

    recovered = False
    async with running_server(hooks=Hooks(on_conversion=convert)) as server:
        replies = await server.verify_all([member(0), member(1)])
        text = "GenRM cohort input conversion failed: RuntimeError: bad request conversion"
        assert [(r.status, r.detail) for r in replies] == [(503, text), (503, text)]
        again = await server.verify(member(1))
        assert (again.status, again.detail) == (503, text)
        assert server.calls() == 0
        recovered = True
        assert [r.reward for r in await server.complete("g", 1)] == [3.0, 3.0]


async def test_hook_error_fails_evaluation_at_once(caplog: pytest.LogCaptureFixture) -> None:
    # AS-111
    def boom(i: int, j: int, p: int) -> None:
        if (i, j) == (1, 2):
            raise RuntimeError("boom")

    judge = FakeJudge(rules=[pair_rule(0, 1, "hang")])
    async with running_server(
        judge=judge, hooks=Hooks(on_comparison_start=boom), num_rollouts_per_prompt=4
    ) as server:
        with trio.fail_after(0.5):
            rows = await server.complete()
        assert {(r.status, r.detail) for r in rows} == {
            (503, "GenRM cohort evaluation failed: RuntimeError: boom")
        }
        assert judge.stats()["in_flight"] == 0
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None


async def test_non_finite_rewards_fail_the_group() -> None:
    # AS-112
    judge = FakeJudge(
        rules=[{"action": "verdict", "score_1": 1e308, "score_2": 1e308, "ranking": 3.5}]
    )
    async with running_server(judge=judge) as server:
        rows = await server.complete()
    assert all(r.status == 503 and "non-finite cohort rewards" in r.detail for r in rows)


async def test_failed_legacy_group_demands_a_fresh_group_id(autojump_clock) -> None:
    # AS-113
    async with running_server(cohort_collection_timeout_s=0.05) as server:
        first = await server.verify(member(0, g=None, _ng_task_index=3))
        assert first.status == 503
        for body in (
            member(0, g=None, _ng_task_index=3),
            member(1, g=None, regenerated=True, _ng_task_index=3),
        ):
            later = await server.verify(body)
            assert later.status == 503
            assert "did not collect" in later.detail and "fresh _ng_group_id" in later.detail
        assert server.calls() == 0
        fresh = await server.complete("fresh")
        assert [r.status for r in fresh] == [200, 200]


async def test_legacy_judge_failure_rows_carry_the_migration_suffix() -> None:
    # AS-114
    judge = FakeJudge(rules=[{"action": "http_status", "status": 500}])
    async with running_server(judge=judge) as server:
        rows = await server.verify_all([member(i, g=None, _ng_task_index=4) for i in range(2)])
        assert all(r.masked and "fresh _ng_group_id" in r.body["failure_reason"] for r in rows)
        calls = server.calls()
        late = await server.verify(member(0, g=None, _ng_task_index=4))
        assert late.body["failure_reason"] == rows[0].body["failure_reason"]
        assert server.calls() == calls


async def test_completed_legacy_group_never_replays(autojump_clock) -> None:
    # AS-115
    async with running_server(cohort_collection_timeout_s=0.1) as server:
        await server.verify_all([member(i, g=None) for i in range(2)])
        late = await server.verify(member(0, g=None))
        assert late.status == 503 and "did not collect" in late.detail
