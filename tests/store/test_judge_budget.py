"""The deployment's judge budget in a real Redis: exchanges of several processes against one
``judge_max_concurrency``, taking turns, leases that return a dead process's slots, and
counts that correct themselves (store/_judge_budget.py)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from trio.testing import MockClock

from genrm_trio.core.outcomes import Outcome, Scored
from genrm_trio.runtime.engine import Engine
from genrm_trio.store._judge_budget import BudgetReply, StoredJudgeBudget
from genrm_trio.store.redis_store import RedisGroupStore
from genrm_trio.store.resp import StoreAddress
from genrm_trio.testing import FakeJudge
from genrm_trio.testing._shared_store import harness_time, new_store, shared_config, shared_engines
from genrm_trio.testing.harness import member
from genrm_trio.testing.redis_server import RedisServer
from genrm_trio.testing.scenarios.drivers import engine_outcome as verify

LEASE_S = 10.0


class Clock:
    """The store's clock, set by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def budget(url: str, clock: Clock, capacity: int = 8) -> StoredJudgeBudget:
    store = RedisGroupStore(
        shared_config(), StoreAddress.parse(url), "budget:", LEASE_S, clock=clock
    )
    return StoredJudgeBudget(store, capacity)


async def test_the_capacity_holds_across_processes(shared_redis_server: RedisServer) -> None:
    clock = Clock()
    stored = budget(shared_redis_server.url, clock)
    assert await stored.exchange("a", 0, 5) == BudgetReply(5, 0, 5)
    # b asks for 6 while a holds 5: it gets the 3 left and waits for the rest.
    assert await stored.exchange("b", 0, 6) == BudgetReply(3, 0, 8)
    assert await stored.exchange("a", 5, 1) == BudgetReply(0, 1, 8)  # a waits behind b
    # a keeps 2 of its 5: of the three that come free, one is left for b, ahead in line.
    assert await stored.exchange("a", 2, 1) == BudgetReply(1, 1, 6)
    assert await stored.exchange("b", 3, 3) == BudgetReply(2, 0, 8)
    assert await stored.exchange("a", 3, 1) == BudgetReply(0, 1, 8)
    await stored.store.aclose()


async def test_processes_that_all_want_more_take_turns(shared_redis_server: RedisServer) -> None:
    clock = Clock()
    stored = budget(shared_redis_server.url, clock, capacity=4)
    assert (await stored.exchange("a", 0, 4)).granted == 4
    assert (await stored.exchange("b", 0, 4)).granted == 0
    assert (await stored.exchange("c", 0, 4)).granted == 0
    # a gives its slots back one at a time. Each goes to the process at the head of the line,
    # whichever asks first, and a process served goes to the back: b, c, b, c.
    holding = {"b": 0, "c": 0}
    turns = []
    for step in range(4):
        await stored.exchange("a", 3 - step, 0)
        for process in ("c", "b") if step % 2 == 0 else ("b", "c"):
            reply = await stored.exchange(process, holding[process], 4)
            if reply.granted:
                holding[process] += reply.granted
                turns.append(process)
    assert turns == ["b", "c", "b", "c"]
    await stored.store.aclose()


async def test_a_dead_process_s_slots_come_back_when_its_lease_expires(
    shared_redis_server: RedisServer,
) -> None:
    clock = Clock()
    stored = budget(shared_redis_server.url, clock)
    assert (await stored.exchange("dead", 0, 8)).granted == 8
    clock.now += LEASE_S - 0.001
    assert await stored.exchange("alive", 0, 8) == BudgetReply(0, 0, 8)
    clock.now += 0.002
    assert await stored.exchange("alive", 0, 8) == BudgetReply(8, 0, 8)
    await stored.store.aclose()


async def test_every_exchange_renews_the_lease(shared_redis_server: RedisServer) -> None:
    clock = Clock()
    stored = budget(shared_redis_server.url, clock)
    assert (await stored.exchange("a", 0, 8)).granted == 8
    for _ in range(3):
        clock.now += LEASE_S * 0.9
        await stored.exchange("a", 8, 0)
    assert (await stored.exchange("b", 0, 1)).granted == 0
    await stored.store.aclose()


async def test_counts_are_absolute_so_a_lost_store_state_corrects_itself(
    shared_redis_server: RedisServer,
) -> None:
    clock = Clock()
    stored = budget(shared_redis_server.url, clock)
    assert (await stored.exchange("a", 0, 6)).granted == 6
    shared_redis_server.flush()  # the store forgot everything; a still runs 6 attempts
    assert await stored.exchange("a", 6, 0) == BudgetReply(0, 0, 6)
    assert (await stored.exchange("b", 0, 8)).granted == 2
    await stored.store.aclose()


async def test_a_process_that_needs_nothing_leaves_no_key(shared_redis_server: RedisServer) -> None:
    clock = Clock()
    stored = budget(shared_redis_server.url, clock)
    await stored.exchange("a", 0, 9)
    await stored.exchange("b", 0, 1)  # waits: a holds all 8
    await stored.exchange("b", 0, 0)  # no longer
    await stored.exchange("a", 0, 0)
    assert await stored.store.call("KEYS", "budget:*") == []
    await stored.store.aclose()


async def test_notifications_when_slots_come_free_for_others_and_when_one_waits(
    shared_redis_server: RedisServer,
) -> None:
    clock = Clock()
    stored = budget(shared_redis_server.url, clock, capacity=1)
    listener = await stored.store.client.connect()
    await listener.pipeline([["SUBSCRIBE", stored.channel]])
    messages = []

    async def listen() -> None:
        while True:
            messages.append((await listener.receive())[2])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(listen)
        await stored.exchange("a", 0, 1)
        await stored.exchange("a", 0, 0)  # nobody waits: no message
        await stored.exchange("a", 0, 1)
        await stored.exchange("b", 0, 1)  # b begins to wait
        await stored.exchange("b", 0, 1)  # still waiting: no second message
        await stored.exchange("a", 0, 0)  # a's slot comes free while b waits
        with trio.fail_after(5):
            while len(messages) < 2:  # noqa: ASYNC110
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert messages == [b"waiting", b"freed"]
    await listener.aclose()
    await stored.store.aclose()


# ---- engines sharing the budget ---------------------------------------------------------------


def prompt_of(call: dict[str, Any]) -> str:
    return str(call["body"]["messages"][0]["content"])


async def send_group(engine: Engine, g: int, size: int) -> list[Outcome]:
    """Every member of group g to one engine, which therefore judges it."""
    outcomes: list[Outcome] = []

    async def one(slot: int) -> None:
        outcomes.append(await verify(engine, member(slot, 1 + slot, g=f"g{g}", prompt=f"p{g}")))

    async with trio.open_nursery() as nursery:
        for slot in range(size):
            nursery.start_soon(one, slot)
    return outcomes


async def wait_until(predicate: Any) -> None:
    while not predicate():  # noqa: ASYNC110
        await trio.sleep(0.005)


@pytest.mark.parametrize(("process_cap", "peak"), [(None, 8), (3, 6)])
async def test_two_engines_never_have_more_than_the_budget_at_the_judge(
    shared_redis_server: RedisServer, process_cap: int | None, peak: int
) -> None:
    judge = FakeJudge(latency="fixed:0.05")
    async with shared_engines(
        shared_redis_server.url,
        judge=judge,
        num_rollouts_per_prompt=4,
        judge_max_concurrency=8,
        judge_process_max_concurrency=process_cap,
    ) as (a, b):
        # Each engine fills (and so judges) 8 groups of 4: 32 comparisons each, any 8 of which
        # would fill its own cap of 8.
        async with trio.open_nursery() as nursery:
            for g in range(16):
                nursery.start_soon(send_group, (a, b)[g % 2], g, 4)
        assert judge.stats()["requests_total"] == 64
        assert judge.stats()["max_in_flight"] == peak
        assert a.judge.attempts_total > 0 and b.judge.attempts_total > 0


async def test_an_engine_that_starts_judging_later_gets_its_turn(
    shared_redis_server: RedisServer, store_clock: MockClock
) -> None:
    judge = FakeJudge(latency="fixed:0.05")
    # Without notifications no group filled at a is offered to b (which would judge a's groups
    # with its slots); the budget's timer (poll_s) still tells a that b waits.
    async with shared_engines(
        shared_redis_server.url,
        judge=judge,
        notifications=False,
        num_rollouts_per_prompt=4,
        judge_max_concurrency=8,
        clock=harness_time,
    ) as (a, b):
        async with trio.open_nursery() as nursery:
            for g in range(8):
                nursery.start_soon(send_group, a, g, 4)
            await wait_until(lambda: a.judge.in_flight == 8)
            for g in range(8, 16):
                nursery.start_soon(send_group, b, g, 4)
            with trio.fail_after(10):
                await wait_until(lambda: a.judge.slots.queue.yielding)  # a knows b waits
            known = len(judge.requests())
        from_a = [int(prompt_of(call)[1:]) < 8 for call in judge.requests()]
        # a had all 8 slots and 32 comparisons to judge. Once it knows b waits, each slot it
        # frees goes back to the budget, and it gets no more than half of them: b is served
        # after at most a's calls in flight then and a half share more, not after all 32 of
        # a's (passing slots on among its own comparisons, a would keep them all).
        assert from_a[:8] == [True] * 8
        assert from_a.index(False) < known + 8 + 4
        assert judge.stats()["max_in_flight"] == 8


async def test_a_dead_engine_s_slots_come_back_after_its_lease(
    shared_redis_server: RedisServer, store_clock: MockClock
) -> None:
    config = shared_config(num_rollouts_per_prompt=4, judge_max_concurrency=4)
    stuck = FakeJudge(latency="fixed:1000")
    dead = Engine(
        config,
        new_store(shared_redis_server.url, config, lease_s=0.5, clock=harness_time, poll_s=0.05),
        judge_transport=stuck.transport(),
    )
    async with trio.open_nursery() as nursery:
        killed = trio.CancelScope()

        async def run_until_killed() -> None:
            with killed:
                async with trio.open_nursery() as inner:
                    await inner.start(dead.run)
                    inner.start_soon(send_group, dead, 0, 4)
                    await trio.sleep_forever()

        nursery.start_soon(run_until_killed)
        await wait_until(lambda: dead.judge.in_flight == 4)
        killed.cancel()  # gone without giving its slots back, as after SIGKILL
    judge = FakeJudge()
    async with shared_engines(
        shared_redis_server.url,
        judge=judge,
        lease_s=0.5,
        num_rollouts_per_prompt=4,
        judge_max_concurrency=4,
        clock=harness_time,
    ) as (a, b):
        outcomes = await send_group(a, 1, 4)
        # The dead engine's group is taken over and judged too, once its evaluation lease
        # has expired.
        await wait_until(lambda: a.published + b.published == 2)
    assert sorted(o.reward for o in outcomes if isinstance(o, Scored)) == [1.0, 2.0, 3.0, 4.0]
    assert judge.stats()["requests_total"] == 8
