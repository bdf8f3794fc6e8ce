"""Takeover of groups whose evaluation owner went away: exactly one new owner per expired lease,
however many processes race for it (X-4)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from genrm_trio.core.outcomes import Outcome, Rejected, Scored
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.store.redis_store import check_store_invariants
from genrm_trio.testing import FakeJudge
from genrm_trio.testing._shared_store import harness_time, shared_engines
from genrm_trio.testing.harness import member
from genrm_trio.testing.redis_server import RedisServer
from genrm_trio.testing.scenarios.drivers import engine_outcome as verify

GROUPS = 32
TAKEN_OVER = "GenRM took over the evaluation of key="


async def wait_until(predicate: Any) -> None:
    while not predicate():  # noqa: ASYNC110
        await trio.sleep(0.01)


async def test_survivors_racing_for_expired_groups_take_each_over_once(
    shared_redis_server: RedisServer, caplog: pytest.LogCaptureFixture, store_clock: MockClock
) -> None:
    # The owner claims every group as it fills, then neither judges nor renews; it goes away
    # without a single judge call, so every call the judge sees is a survivor's.
    async def hold(*_: Any) -> None:
        await trio.sleep_forever()

    owner_hooks = Hooks(on_evaluation_start=hold, on_lease_renewal=hold)
    judge = FakeJudge()
    async with shared_engines(
        shared_redis_server.url,
        3,
        judge=judge,
        hooks=[owner_hooks, None, None],
        lease_s=0.3,
        poll_s=1000.0,  # no sweep runs unless the test runs it
        clock=harness_time,
    ) as (owner, b, c):
        first: list[Outcome] = []

        async def send(body: dict[str, Any]) -> None:
            first.append(await verify(owner, body))

        async with trio.open_nursery() as nursery:
            for g in range(GROUPS):
                for slot in range(2):
                    nursery.start_soon(send, member(slot, 1 + (g + slot) % 5, g=f"g{g}"))
            await wait_until(lambda: owner.claims == GROUPS and owner.queued == 0)
            await owner.shutdown()
        assert first == [Rejected(503, "GenRM server is shutting down")] * (2 * GROUPS)
        assert judge.stats()["requests_total"] == 0
        await trio.sleep(0.4)  # every lease has expired
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="genrm_trio"):
            # Both survivors sweep at once, several times over: every expired group is raced.
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(b.sweep_once)
                    nursery.start_soon(c.sweep_once)
            # Every claim is made by now (a sweep counts its claims as it stores them).
            await wait_until(lambda: b.statistics().evaluating + c.statistics().evaluating == 0)
        assert b.claims + c.claims == GROUPS
        assert b.published + c.published == GROUPS
        assert b.refused == c.refused == 0
        # Each comparison judged once: N = 2 under circular pairing is two comparisons a group.
        assert judge.stats()["requests_total"] == 2 * GROUPS
        for g in range(GROUPS):
            for slot, engine in ((0, b), (1, c)):
                row = await verify(engine, member(slot, 1 + (g + slot) % 5, g=f"g{g}"))
                assert isinstance(row, Scored) and row.reward == 1 + (g + slot) % 5
        assert judge.stats()["requests_total"] == 2 * GROUPS
        await check_store_invariants(b.store)
        taken = [r for r in caplog.records if r.getMessage().startswith(TAKEN_OVER)]
        assert len(taken) == GROUPS


async def test_a_process_judging_more_than_its_share_offers_the_groups_it_fills(
    shared_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Every member reaches engine a, so a fills every group; judge calls take a while, so a's
    # evaluations pile up while b judges nothing.
    judge = FakeJudge(latency="fixed:0.2")
    async with shared_engines(shared_redis_server.url, judge=judge, lease_s=5.0) as (a, b):
        await wait_until(lambda: a.store.processes == 2)  # a's sweep has counted the deployment
        outcomes: list[Outcome] = []

        async def send(body: dict[str, Any]) -> None:
            outcomes.append(await verify(a, body))

        with caplog.at_level(logging.WARNING, logger="genrm_trio"):
            async with trio.open_nursery() as nursery:
                for g in range(GROUPS):
                    for slot in range(2):
                        nursery.start_soon(send, member(slot, 1 + slot, g=f"o{g}"))
                    await trio.sleep(0.01)
        rewards = sorted(o.reward for o in outcomes if isinstance(o, Scored))
        assert rewards == [1.0] * GROUPS + [2.0] * GROUPS
        # b judged a share of the groups a filled; each group was judged once, by one of them.
        assert a.offers > 0 and b.claims > 0
        assert a.claims + b.claims == GROUPS
        assert judge.stats()["requests_total"] == 2 * GROUPS
        assert not [r for r in caplog.records if r.getMessage().startswith(TAKEN_OVER)]
        await check_store_invariants(a.store)
