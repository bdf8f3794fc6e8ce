"""Seeded workloads played against both stores: one in-memory engine, and two engines sharing a
real Redis server with every request sent to a random one of them. Every answer (status, text,
reward), the judge-call count and the store's invariants must agree (§6, X-4)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio

from genrm_trio.core import messages
from genrm_trio.core.outcomes import Masked, Outcome, Rejected, Scored
from genrm_trio.runtime.engine import Engine
from genrm_trio.store.redis_store import RedisGroupStore, check_store_invariants
from genrm_trio.testing import FakeJudge, pair_rule
from genrm_trio.testing._shared_store import shared_config, shared_engines
from genrm_trio.testing.harness import member
from genrm_trio.testing.redis_server import RedisServer
from genrm_trio.testing.scenarios.drivers import engine_outcome

SETTINGS: dict[str, Any] = {
    "num_rollouts_per_prompt": 3,
    "genrm_parse_retries": 0,
    "max_terminal_cohorts": 3,
    "cohort_collection_timeout_s": 600.0,
    "cohort_evaluation_timeout_s": 600.0,
}


def workload(seed: int, steps: int = 40) -> list[dict[str, Any]]:
    """Bodies to send one after another: members of a few explicit and legacy groups, with
    duplicates, regenerated responses, other qualities, attempt bumps and stale attempts."""
    rng = random.Random(seed)
    attempts = {g: 0 for g in ("g0", "g1", "g2", "g3")}
    bodies = []
    for _ in range(steps):
        slot = rng.randrange(3)
        if rng.random() < 0.2:
            task = rng.randrange(2)
            bodies.append(member(slot, 1 + slot, g=None, a=0, _ng_task_index=task))
            continue
        group = rng.choice(list(attempts))
        roll = rng.random()
        if roll < 0.08:
            attempts[group] += 1
        attempt = attempts[group]
        if roll > 0.94 and attempt > 0:
            attempt -= 1  # a stale attempt
        quality = 1 + (slot + len(group) * attempt) % 4
        regenerated = rng.random() < 0.1
        bodies.append(member(slot, quality, g=group, a=attempt, regenerated=regenerated))
    return bodies


def seen(outcome: Outcome) -> tuple[Any, ...]:
    if isinstance(outcome, Scored):
        return ("scored", round(outcome.reward, 9))
    if isinstance(outcome, Masked):
        return ("masked", outcome.text + outcome.suffix)
    assert isinstance(outcome, Rejected)
    if outcome.detail.startswith(messages.SHUTTING_DOWN):
        # Shutdown fails the groups of an in-memory engine (legacy ones with the migration
        # suffix); one process of a shared store fails none, it only answers its waiters.
        return ("rejected", outcome.status, messages.SHUTTING_DOWN)
    return ("rejected", outcome.status, outcome.detail)


async def play(engines: list[Engine], bodies: list[dict[str, Any]], seed: int) -> list[Any]:
    """Send each body to a random engine and let everything it starts settle before the next;
    now and then a waiting request disconnects (the same ones in every run of a seed)."""
    rng = random.Random(seed)
    drops = random.Random(seed + 1)  # draws the same numbers whatever the engine count
    answers: dict[int, tuple[Any, ...]] = {}
    scopes: dict[int, trio.CancelScope] = {}

    async def send(index: int, engine: Engine, body: dict[str, Any]) -> None:
        with scopes.setdefault(index, trio.CancelScope()):
            answers[index] = seen(await engine_outcome(engine, body))
            return
        answers[index] = ("disconnected",)

    def settled(sent: int) -> bool:
        waiting = sum(e.statistics().waiters for e in engines)
        busy = any(e.statistics().evaluating for e in engines) or any(e.queued for e in engines)
        return not busy and len(answers) + waiting == sent

    async def notified() -> bool:
        """No engine has a waiter on a record that has already finished (a notification
        still on its way)."""
        for engine in engines:
            if isinstance(engine.store, RedisGroupStore):
                if await engine.store.ended_records(engine.waiters.records()):
                    return False
        return True

    async def settle(sent: int) -> None:
        while not (settled(sent) and await notified()):  # noqa: ASYNC110
            await trio.sleep(0.002)

    async with trio.open_nursery() as nursery:
        for index, body in enumerate(bodies):
            nursery.start_soon(send, index, rng.choice(engines), body)
            await settle(index + 1)
            waiting = sorted(i for i in scopes if i not in answers)
            if drops.random() < 0.15 and waiting:
                scopes[waiting[drops.randrange(len(waiting))]].cancel()  # a client goes away
                await settle(index + 1)
        for engine in engines:
            engine.begin_shutdown()  # the groups still collecting answer "shutting down"
    return [answers[i] for i in range(len(bodies))]


FAULTS = [pair_rule(1, 2, "budget_exhausted", times=2)]


@pytest.mark.parametrize("seed", range(20))
async def test_both_stores_answer_a_seeded_workload_alike(
    seed: int, shared_redis_server: RedisServer
) -> None:
    bodies = workload(seed)
    memory_judge = FakeJudge(rules=FAULTS)
    engine = Engine(shared_config(**SETTINGS), judge_transport=memory_judge.transport())
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            expected = await play([engine], bodies, seed)
            await engine.shutdown()
        shared_judge = FakeJudge(rules=FAULTS)
        async with shared_engines(
            shared_redis_server.url, 2, judge=shared_judge, **SETTINGS
        ) as engines:
            got = await play(list(engines), bodies, seed)
            await check_store_invariants(engines[0].store)
    kinds = {answer[0] for answer in expected}
    assert "scored" in kinds and "rejected" in kinds  # the workload reaches both outcomes
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have == want, f"request {index}: {bodies[index]['_ng_rollout_index']}"
    assert shared_judge.stats()["requests_total"] == memory_judge.stats()["requests_total"]
