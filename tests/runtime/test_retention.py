"""Retention and pruning through /verify on the mock clock (§10.12, TTL 10 unless stated)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from genrm_trio.testing import FakeJudge
from genrm_trio.testing.harness import Server, member, running_server

NOT_RETAINED = (
    "GenRM group 'a' attempt 0 already finished and its result is no longer retained; retry "
    "with a higher _ng_group_attempt"
)


async def at(t: float) -> None:
    await trio.sleep_until(t)


def retained(server: Server) -> set[Any]:
    return {r.group_id or r.key for r in server.engine.store.terminal_order()}


def watermarks(server: Server) -> set[str]:
    return {g.ref[2:] for g in server.engine.store.groups() if g.watermark is not None}


async def test_results_and_watermarks_expire_independently(autojump_clock) -> None:
    # AS-133, as a client sees it: a replay renews the watermark's idle time, never the result's.
    async with running_server(cohort_result_ttl_s=10) as server, trio.open_nursery() as n:
        await at(100)
        await server.complete("a")
        await at(101)
        await server.complete("b")
        await at(109)
        assert (await server.verify(member(0, g="a"))).reward == 3.0
        await at(110.5)
        # a's result is gone (finished at 100), its watermark is not (renewed at 109).
        gone = await server.verify(member(0, g="a"))
        assert (gone.status, gone.detail) == (409, NOT_RETAINED)
        await at(111.5)
        # b's result and watermark are gone (both since 101): attempt 0 starts afresh.
        fresh = server.start_verify(n, member(0, g="b"))
        await server.settle()
        assert not fresh.done.is_set()
        gone = await server.verify(member(0, g="a"))
        assert (gone.status, gone.detail) == (409, NOT_RETAINED)
        n.cancel_scope.cancel()


INDEXES = (
    "the memory store's own retention indexes and their pruning at each arrival (R-3, I-9); "
    "the Redis store trims its sorted sets after every write (tests/store)"
)


@pytest.mark.stores("memory", why=INDEXES)
async def test_active_groups_never_evict_finished_work(autojump_clock) -> None:
    # AS-134
    async with running_server(cohort_result_ttl_s=None, max_terminal_cohorts=1) as server:
        async with trio.open_nursery() as n:
            a0 = server.start_verify(n, member(0, g="a"))
            await server.settle()
            await server.complete("b")
            await server.complete("c")
            calls = server.calls()
            assert (await server.verify(member(0, g="c"))).reward == 3.0
            assert server.calls() == calls
            assert watermarks(server) == {"a", "c"}
            await server.verify(member(1, g="a"))
            await a0.result()
        await server.verify(member(0, g="a"))
        assert retained(server) == {"a"}


@pytest.mark.stores("memory", why=INDEXES)
async def test_a_long_collection_keeps_its_watermark(autojump_clock) -> None:
    # AS-135
    async with running_server(cohort_result_ttl_s=10, cohort_collection_timeout_s=1000) as server:
        async with trio.open_nursery() as n:
            await at(100)
            server.start_verify(n, member(0, g="a"))
            await at(102)
            await server.complete("done")
            await at(112)
            server.start_verify(n, member(0, g="other"))
            await server.settle()
            assert retained(server) == set()
            assert watermarks(server) == {"a", "other"}
            n.cancel_scope.cancel()


@pytest.mark.stores("memory", why=INDEXES)
async def test_pruning_cost_is_bounded_by_what_it_removes(autojump_clock) -> None:
    # AS-136, AS-137, AS-138
    async with running_server(
        cohort_result_ttl_s=10, cohort_collection_timeout_s=10_000, max_terminal_cohorts=4096
    ) as server:
        async with trio.open_nursery() as n:
            for k in range(1000):
                server.start_verify(n, member(0, g=f"active-{k}"))
            await server.settle()
            await server.complete("finished")
            before = server.engine.statistics().prune_visits
            for k in range(3):
                server.start_verify(n, member(0, g=f"late-{k}"))
                await server.settle()
            assert server.engine.statistics().prune_visits - before <= 6
            n.cancel_scope.cancel()
    async with running_server(cohort_result_ttl_s=10) as server:
        for k in range(1024):
            await server.complete(f"done-{k}")
        before = server.engine.statistics().prune_visits
        await trio.sleep(11)
        async with trio.open_nursery() as n:
            server.start_verify(n, member(0, g="trigger"))
            await server.settle()
            removed = 2048
            assert server.engine.statistics().prune_visits - before <= removed + 2
            assert retained(server) == set()
            n.cancel_scope.cancel()


@pytest.mark.stores("memory", why=INDEXES)
async def test_statistics_return_to_zero_after_everything_expires(autojump_clock) -> None:
    # AS-139
    async with running_server(cohort_result_ttl_s=10, cohort_collection_timeout_s=1) as server:
        await server.complete("a")
        server.engine.check_invariants()
        await server.complete("a", 1)
        server.engine.check_invariants()
        await server.verify_all([member(i, g=None) for i in range(2)])
        server.engine.check_invariants()
        await trio.sleep(20)
        server.engine.store.prune(trio.current_time())
        stats = server.engine.statistics()
        assert (
            stats.active_groups,
            stats.retained_records,
            stats.watermarks,
            stats.idle_entries,
            stats.waiters,
        ) == (0, 0, 0, 0, 0)
        server.engine.check_invariants()


async def test_rejected_request_does_not_refresh_the_watermark(autojump_clock) -> None:
    # AS-142 (ttl), AS-143
    async with running_server(cohort_result_ttl_s=10, cohort_collection_timeout_s=0.05) as server:
        await at(100)
        await server.complete("a")
        await at(108)
        await server.verify(member(0, g="a"))
        await at(111)
        for _ in range(2):
            gone = await server.verify(member(0, g="a"))
            assert (gone.status, gone.detail) == (409, NOT_RETAINED)
        assert server.calls() == 2
        await at(119)
        fresh = await server.verify(member(0, g="a"))
        assert fresh.status == 503 and "did not collect" in fresh.detail


async def test_count_cap_evicts_a_result_but_keeps_its_watermark(autojump_clock) -> None:
    # AS-142 (count)
    async with running_server(
        max_terminal_cohorts=2, cohort_result_ttl_s=None, cohort_collection_timeout_s=0.05
    ) as server:
        await server.complete("a")
        for task in (1, 2):
            await server.verify(member(0, g=None, _ng_task_index=task))
        await server.verify(member(0, g=None, _ng_task_index=9, prompt="x"))
        gone = await server.verify(member(0, g="a"))
        assert (gone.status, gone.detail) == (409, NOT_RETAINED)
        assert (await server.complete("a", 1))[0].reward == 3.0


@pytest.mark.stores("memory", why=INDEXES)
async def test_result_outliving_its_watermark_still_fences(autojump_clock) -> None:
    # AS-144
    async with running_server(max_terminal_cohorts=2, cohort_result_ttl_s=None) as server:
        await server.complete("a", 0)
        await server.complete("b", 1)
        await server.verify(member(0, g="a"))
        await server.complete("c")
        async with trio.open_nursery() as n:
            server.start_verify(n, member(0, g="d"))
            await server.settle()
            n.cancel_scope.cancel()
        assert "b" not in watermarks(server) and "b" in retained(server)
        other = await server.verify(member(0, g="b", a=1, prompt="other"))
        assert other.status == 409 and "inconsistent prompt or principle" in other.detail
        calls = server.calls()
        assert (await server.verify(member(0, g="b", a=1))).reward == 3.0
        assert server.calls() == calls
        older = await server.verify(member(0, g="b", a=0))
        assert older.status == 409 and "superseded by attempt 1" in older.detail


@pytest.mark.stores("memory", why=INDEXES)
async def test_superseded_record_uses_no_retention_slot(autojump_clock) -> None:
    # AS-147
    judge = FakeJudge(rules=[{"match": {"response_1": "answer-0 [[q=3]]"}, "action": "hang"}])
    async with running_server(
        judge=judge, max_terminal_cohorts=1, cohort_result_ttl_s=10, cohort_collection_timeout_s=100
    ) as s:
        async with trio.open_nursery() as n:
            old = [s.start_verify(n, member(i)) for i in range(2)]
            await s.settle()
            new0 = s.start_verify(n, member(0, a=1, regenerated=True))
            for pending in old:
                stale = await pending.result()
                assert stale.status == 503 and "superseded by attempt 1" in stale.detail
            await s.settle()
            assert judge.stats()["in_flight"] == 0
            await trio.sleep(11)
            await s.settle()
            s.engine.store.prune(trio.current_time())
            assert retained(s) == set()
            assert s.engine.store.group("e:g").watermark.attempt == 1
            late = await s.verify(member(0))
            assert late.status == 409 and "superseded by attempt 1" in late.detail
            new1 = await s.verify(member(1, a=1, regenerated=True))
            assert [(await new0.result()).reward, new1.reward] == [3.0, 3.0]
