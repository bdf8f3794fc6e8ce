"""Engines in one process sharing a real Redis server (X-4, X-1): groups whose members
arrive at different engines, leases, notifications, the store going away and coming back.

What one server does with its groups is tested once, on every store, by tests/runtime and
tests/http; this module tests what takes more than one process, or the store itself."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from genrm_trio.core.outcomes import Masked, Outcome, Rejected, Scored
from genrm_trio.runtime.engine import Engine
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.store.redis_store import check_store_invariants
from genrm_trio.testing import FakeJudge, pair_rule
from genrm_trio.testing._shared_store import harness_time, shared_config, shared_engines
from genrm_trio.testing.harness import member
from genrm_trio.testing.redis_server import RedisServer
from genrm_trio.testing.scenarios.drivers import engine_outcome as verify

SUPERSEDED = "GenRM group 'g' attempt 0 was superseded by attempt 1"


def rewards(outcomes: dict[int, Outcome]) -> dict[int, float]:
    return {i: o.reward for i, o in outcomes.items() if isinstance(o, Scored)}


async def send_all(sends: list[tuple[Engine, dict[str, Any]]]) -> dict[int, Outcome]:
    """Send members concurrently, each to its engine; outcomes by rollout index."""
    results: dict[int, Outcome] = {}

    async def send(engine: Engine, body: dict[str, Any]) -> None:
        results[body["_ng_rollout_index"]] = await verify(engine, body)

    async with trio.open_nursery() as nursery:
        for engine, body in sends:
            nursery.start_soon(send, engine, body)
    return results


async def wait_until(predicate: Any) -> None:
    while not predicate():  # noqa: ASYNC110
        await trio.sleep(0.01)


async def stored_and_waiting(engine: Engine) -> None:
    """One request waits at ``engine`` and its member is in the store: the waiter is listed
    before the transaction's EXEC, so only an empty queue says the EXEC was answered."""
    await wait_until(lambda: engine.statistics().waiters == 1 and engine.queued == 0)


async def test_members_at_different_engines_form_one_group(
    shared_redis_server: RedisServer,
) -> None:
    judge = FakeJudge()
    async with shared_engines(shared_redis_server.url, judge=judge, num_rollouts_per_prompt=4) as (
        a,
        b,
    ):
        results = await send_all(
            [(a, member(0, 4)), (b, member(1, 2)), (a, member(2, 1)), (b, member(3, 5))]
        )
        assert rewards(results) == {0: 4.0, 1: 2.0, 2: 1.0, 3: 5.0}
        assert judge.stats()["requests_total"] == 4  # circular, N = 4: once per comparison
        # A replay at either engine answers the stored reward without a judge call.
        assert (await verify(b, member(0, 4))) == results[0]
        assert (await verify(a, member(3, 5))) == results[3]
        other = await verify(a, member(1, 3))
        assert other == Rejected(
            409,
            "GenRM cohort 'group_id::g::group_attempt::0' already has a different response "
            "for rollout_index=1",
        )
        assert judge.stats()["requests_total"] == 4
        await check_store_invariants(a.store)


async def test_a_duplicate_at_another_engine_waits_for_the_same_outcome(
    shared_redis_server: RedisServer,
) -> None:
    judge = FakeJudge()
    async with shared_engines(shared_redis_server.url, judge=judge) as (a, b):
        async with trio.open_nursery() as nursery:
            first: list[Outcome] = []
            nursery.start_soon(lambda: _append(first, verify(a, member(0, 4))))
            await stored_and_waiting(a)
            nursery.start_soon(lambda: _append(first, verify(b, member(0, 4))))
            await stored_and_waiting(b)
            last = await verify(b, member(1, 2))
        assert [o.reward for o in first] == [4.0, 4.0]  # type: ignore[union-attr]
        assert isinstance(last, Scored) and last.reward == 2.0
        assert judge.stats()["requests_total"] == 2


async def _append(into: list[Outcome], call: Any) -> None:
    into.append(await call)


async def test_supersession_at_another_engine_answers_the_old_waiters(
    shared_redis_server: RedisServer,
) -> None:
    async with shared_engines(shared_redis_server.url) as (a, b):
        async with trio.open_nursery() as nursery:
            old: list[Outcome] = []
            nursery.start_soon(lambda: _append(old, verify(a, member(0))))
            await stored_and_waiting(a)
            new = await send_all([(b, member(0, 4, a=1)), (a, member(1, 2, a=1))])
        assert old == [Rejected(503, SUPERSEDED)]
        assert rewards(new) == {0: 4.0, 1: 2.0}
        assert await verify(b, member(0)) == Rejected(409, SUPERSEDED)
        await check_store_invariants(a.store)


async def test_collection_deadline_fires_without_the_engine_that_started_the_group(
    shared_redis_server: RedisServer, store_clock: MockClock
) -> None:
    async with shared_engines(
        shared_redis_server.url, cohort_collection_timeout_s=0.3, clock=harness_time
    ) as (a, b):
        async with trio.open_nursery() as nursery:
            early: list[Outcome] = []
            nursery.start_soon(lambda: _append(early, verify(a, member(0))))
            await stored_and_waiting(a)
            await a.shutdown()  # the engine that started the group is gone
        assert early == [Rejected(503, "GenRM server is shutting down")]
        await trio.sleep(0.5)
        late = await verify(b, member(1))
        assert isinstance(late, Rejected) and late.status == 503
        assert "did not collect 2 unique rollout indices within 0.3s" in late.detail


async def test_a_stalled_owner_loses_its_lease_and_its_late_result_is_refused(
    shared_redis_server: RedisServer, store_clock: MockClock
) -> None:
    judging = trio.Event()
    resume_judging = trio.Event()
    taken_over = trio.Event()
    b_may_judge = trio.Event()

    async def stalled_judge(*_: Any) -> None:
        judging.set()
        await resume_judging.wait()

    async def never_renew(_: str) -> None:
        await trio.sleep_forever()

    async def held_judge(*_: Any) -> None:
        taken_over.set()
        await b_may_judge.wait()

    judge = FakeJudge()
    owner_hooks = Hooks(on_comparison_start=stalled_judge, on_lease_renewal=never_renew)
    async with shared_engines(
        shared_redis_server.url,
        judge=judge,
        hooks=[owner_hooks, Hooks(on_comparison_start=held_judge)],
        lease_s=0.3,
        clock=harness_time,
    ) as (a, b):
        async with trio.open_nursery() as nursery:
            waiting: list[Outcome] = []
            nursery.start_soon(lambda: _append(waiting, verify(b, member(0, 4))))
            await stored_and_waiting(b)
            # The last member reaches engine a, which claims the evaluation and then stalls
            # (neither judging nor renewing its lease); b takes it over once the lease expires
            # and holds it (judging, renewing) while a wakes up.
            nursery.start_soon(lambda: _append(waiting, verify(a, member(1, 2))))
            await judging.wait()
            await taken_over.wait()
            resume_judging.set()  # a finishes judging with a stale token
            await wait_until(lambda: a.statistics().evaluating == 0)
            # a's sweep may have claimed the group once more before b did; every evaluation a
            # ran was refused by the fence (C-72): the record is still b's.
            assert a.refused == a.claims >= 1 and a.published == 0
            assert not waiting
            b_may_judge.set()
        assert sorted(o.reward for o in waiting) == [2.0, 4.0]  # type: ignore[union-attr]
        assert b.published == 1 and a.published == 0
        assert judge.stats()["requests_total"] == 2 * (a.claims + b.claims)
        replay = await verify(a, member(0, 4))
        assert isinstance(replay, Scored) and replay.reward == 4.0


async def test_lost_notifications_delay_but_never_strand_a_waiter(
    shared_redis_server: RedisServer,
) -> None:
    async with shared_engines(shared_redis_server.url, notifications=False, poll_s=0.2) as (a, b):
        results = await send_all([(a, member(0, 4)), (b, member(1, 2))])
        assert rewards(results) == {0: 4.0, 1: 2.0}


async def test_duplicated_notifications_answer_each_waiter_once(
    shared_redis_server: RedisServer,
) -> None:
    async with shared_engines(shared_redis_server.url) as (a, b):
        async with trio.open_nursery() as nursery:
            waiting: list[Outcome] = []
            nursery.start_soon(lambda: _append(waiting, verify(a, member(0, 4))))
            await stored_and_waiting(a)
            # Notifications naming records nobody waits on, and none at all, change nothing.
            await a.store.call("PUBLISH", a.store.channel, "no-such-record")
            [rid] = a.waiters.records()
            await a.store.call("PUBLISH", a.store.channel, rid)
            await trio.sleep(0.1)
            assert a.statistics().waiters == 1 and not waiting
            await verify(b, member(1, 2))
        for _ in range(2):
            await a.store.call("PUBLISH", a.store.channel, rid)
        await trio.sleep(0.1)
        assert [o.reward for o in waiting] == [4.0]  # type: ignore[union-attr]


async def test_partial_masking_across_engines(shared_redis_server: RedisServer) -> None:
    judge = FakeJudge(rules=[pair_rule(1, 2, "budget_exhausted")])
    async with shared_engines(
        shared_redis_server.url, judge=judge, num_rollouts_per_prompt=4, genrm_parse_retries=0
    ) as (a, b):
        results = await send_all(
            [(a, member(0, 4)), (b, member(1, 2)), (a, member(2, 1)), (b, member(3, 5))]
        )
        assert isinstance(results[1], Masked) and isinstance(results[2], Masked)
        assert "rollout_index=1 lost a comparison to a judge failure" in results[1].text
        assert set(rewards(results)) == {0, 3}
        calls = judge.stats()["requests_total"]
        # A masked member answers its masked row for a regenerated response too (M-8).
        assert await verify(b, member(1, 9)) == results[1]
        assert judge.stats()["requests_total"] == calls


async def test_store_down_answers_503_naming_it_and_recovers(redis_server: RedisServer) -> None:
    judge = FakeJudge()
    async with shared_engines(redis_server.url, judge=judge) as (a, b):
        redis_server.kill()
        down = await verify(a, member(0, 4))
        assert isinstance(down, Rejected) and down.status == 503
        assert down.detail.startswith(
            f"GenRM group store redis://127.0.0.1:{redis_server.port}/0 is unavailable: "
        )
        assert a.store_status() == (a.store.name, False)
        redis_server.start()
        results = await send_all([(a, member(0, 4)), (b, member(1, 2))])
        assert rewards(results) == {0: 4.0, 1: 2.0}
        assert a.store_status() == (a.store.name, True)
        assert judge.stats()["requests_total"] == 2


async def test_a_waiter_is_answered_across_a_store_restart(redis_server: RedisServer) -> None:
    async with shared_engines(redis_server.url, poll_s=0.1) as (a, b):
        async with trio.open_nursery() as nursery:
            waiting: list[Outcome] = []
            nursery.start_soon(lambda: _append(waiting, verify(a, member(0, 4))))
            await stored_and_waiting(a)
            redis_server.kill()
            redis_server.start()  # AOF with appendfsync always: the member survived
            await trio.sleep(0.3)
            last = await verify(b, member(1, 2))
        assert isinstance(last, Scored) and last.reward == 2.0
        assert [o.reward for o in waiting] == [4.0]  # type: ignore[union-attr]


async def test_the_first_requests_after_a_store_restart_are_served(
    redis_server: RedisServer,
) -> None:
    # No sweep runs in between (poll_s is long): the pooled connections, all to the old server
    # process, are what these requests find first.
    async with shared_engines(redis_server.url, poll_s=1000.0) as (a, b):
        done = await send_all([(b, member(0, 4)), (b, member(1, 2))])
        await verify(a, member(0, 4))  # a's pool has connections too
        redis_server.kill()
        redis_server.start()
        for engine in (a, b, b):
            assert await verify(engine, member(0, 4)) == done[0]
        await check_store_invariants(a.store)


async def test_every_process_lost_finished_work_replays_without_judging(
    redis_server: RedisServer,
) -> None:
    judge = FakeJudge(rules=[pair_rule(0, 1, "budget_exhausted")])
    config = dict(num_rollouts_per_prompt=3, genrm_parse_retries=0)
    async with shared_engines(redis_server.url, judge=judge, **config) as (a, b):
        done = await send_all([(a, member(0, 4)), (b, member(1, 2)), (a, member(2, 5))])
        await send_all(
            [
                (a, member(0, 4, g="h", a=2)),
                (b, member(1, 2, g="h", a=2)),
                (b, member(2, 1, g="h", a=2)),
            ]
        )
    redis_server.kill()
    redis_server.start()
    calls = judge.stats()["requests_total"]
    async with shared_engines(redis_server.url, judge=judge, **config) as (c, d):
        assert await verify(c, member(2, 5)) == done[2]
        assert await verify(d, member(0, 7)) == done[0]  # a masked member: its masked row
        assert (await verify(c, member(2, 3))).status == 409  # type: ignore[union-attr]
        fenced = await verify(d, member(0, 4, g="h", a=1))
        assert fenced == Rejected(409, "GenRM group 'h' attempt 1 was superseded by attempt 2")
        assert judge.stats()["requests_total"] == calls
        await check_store_invariants(c.store)


@pytest.mark.parametrize("url", ["memory", "http://x", "redis://", "redis://h:p/0"])
def test_store_addresses_are_checked(url: str) -> None:
    from genrm_trio.store.resp import StoreAddress

    with pytest.raises(ValueError):
        StoreAddress.parse(url)


def test_config_used_by_the_helpers_is_valid() -> None:
    assert shared_config().num_rollouts_per_prompt == 2


async def test_an_owner_gone_during_evaluation_is_taken_over(
    shared_redis_server: RedisServer, store_clock: MockClock
) -> None:
    judging = trio.Event()

    async def hang(*_: Any) -> None:
        judging.set()
        await trio.sleep_forever()

    judge = FakeJudge()
    async with shared_engines(
        shared_redis_server.url,
        judge=judge,
        hooks=[Hooks(on_comparison_start=hang), None],
        lease_s=0.3,
        clock=harness_time,
    ) as (a, b):
        async with trio.open_nursery() as nursery:
            waiting: list[Outcome] = []
            nursery.start_soon(lambda: _append(waiting, verify(b, member(0, 4))))
            await stored_and_waiting(b)
            nursery.start_soon(lambda: _append(waiting, verify(a, member(1, 2))))
            await judging.wait()
            await a.shutdown()  # the owner goes away mid-evaluation; the group is not failed
            await wait_until(lambda: len(waiting) == 2)
        assert Rejected(503, "GenRM server is shutting down") in waiting  # a's own waiter
        assert [o.reward for o in waiting if isinstance(o, Scored)] == [4.0]  # b's, judged by b
        assert (b.claims, b.published, judge.stats()["requests_total"]) == (1, 1, 2)
        replay = await verify(b, member(1, 2))
        assert isinstance(replay, Scored) and replay.reward == 2.0


async def test_a_non_judge_error_in_the_owner_fails_the_group_everywhere(
    shared_redis_server: RedisServer,
) -> None:
    def boom(*_: Any) -> None:
        raise RuntimeError("boom")

    judge = FakeJudge()
    async with shared_engines(
        shared_redis_server.url, judge=judge, hooks=[Hooks(on_evaluation_start=boom), None]
    ) as (a, b):
        async with trio.open_nursery() as nursery:
            waiting: list[Outcome] = []
            nursery.start_soon(lambda: _append(waiting, verify(b, member(0, 4))))
            await stored_and_waiting(b)
            waiting.append(await verify(a, member(1, 2)))  # a fills the group and owns it
            await wait_until(lambda: len(waiting) == 2)
        failed = Rejected(503, "GenRM cohort evaluation failed: RuntimeError: boom")
        assert waiting == [failed, failed]
        assert await verify(b, member(0, 7)) == failed  # any later request: the same failure
        assert judge.stats()["requests_total"] == 0


async def test_a_conversion_failure_answers_the_members_already_waiting(
    shared_redis_server: RedisServer,
) -> None:
    def fail_slot_1(slot: int) -> None:
        if slot == 1:
            raise RuntimeError("cannot convert")

    async with shared_engines(
        shared_redis_server.url,
        hooks=[Hooks(on_conversion=fail_slot_1)] * 2,
        num_rollouts_per_prompt=3,
    ) as (a, b):
        failed = Rejected(503, "GenRM cohort input conversion failed: RuntimeError: cannot convert")
        # Sent together to one engine, the two members share one transaction; when slot 0
        # goes first (Trio picks the order) it waits and slot 1 fails the group in the same
        # transaction. Eight groups make that order all but certain to come up.
        for g in range(8):
            pair = [(a, member(0, 4, g=f"c{g}")), (a, member(1, 2, g=f"c{g}"))]
            assert await send_all(pair) == {0: failed, 1: failed}
            assert await verify(b, member(2, 1, g=f"c{g}")) == failed
            assert a.statistics().waiters == 0 and b.statistics().waiters == 0


@pytest.mark.parametrize("notifications", [True, False])
async def test_a_supersession_at_another_engine_stops_the_owners_judge_calls(
    shared_redis_server: RedisServer, notifications: bool
) -> None:
    # The owner never renews its lease, so only the record's end (its notification, or the
    # sweep that polls for it) can tell it that its evaluation is stale (C-80).
    judging = trio.Event()

    async def stalled_judge(*_: Any) -> None:
        judging.set()
        await trio.sleep_forever()

    async def never_renew(_: str) -> None:
        await trio.sleep_forever()

    owner_hooks = Hooks(on_comparison_start=stalled_judge, on_lease_renewal=never_renew)
    async with shared_engines(
        shared_redis_server.url,
        hooks=[owner_hooks, None],
        notifications=notifications,
        poll_s=0.05,
        cohort_evaluation_timeout_s=600,
    ) as (a, b):
        async with trio.open_nursery() as nursery:
            old: list[Outcome] = []
            nursery.start_soon(lambda: _append(old, verify(b, member(0))))
            await stored_and_waiting(b)
            nursery.start_soon(lambda: _append(old, verify(a, member(1))))
            await judging.wait()
            assert a.statistics().evaluating == 1
            new = await send_all([(b, member(0, 4, a=1)), (b, member(1, 2, a=1))])
            await wait_until(lambda: len(old) == 2)
            await wait_until(lambda: a.statistics().evaluating == 0)
        assert old == [Rejected(503, SUPERSEDED)] * 2
        assert rewards(new) == {0: 4.0, 1: 2.0}
        assert a.published == 0 and a.refused == 0  # stopped, not refused after the fact
        await check_store_invariants(a.store)
