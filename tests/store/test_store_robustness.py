"""The shared store under trouble that is not the store going away: writers colliding on one
group without end, scripts the server forgot, and defects in the engine's background work."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from genrm_trio.core.outcomes import Rejected, Scored
from genrm_trio.core.transition import CollectionDue, _Step
from genrm_trio.testing._shared_store import PREFIX, harness_time, shared_engines
from genrm_trio.testing.harness import member
from genrm_trio.testing.redis_server import RedisServer
from genrm_trio.testing.scenarios.drivers import engine_outcome as verify


async def test_a_group_written_under_every_attempt_is_answered_503_and_nothing_is_stored(
    shared_redis_server: RedisServer,
) -> None:
    async with shared_engines(shared_redis_server.url, count=1) as (engine,):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(verify, engine, member(0))
            while engine.statistics().waiters != 1 or engine.queued:  # noqa: ASYNC110
                await trio.sleep(0.01)
            engine.store.max_conflicts = 4
            record_key = engine.store.record_key("e:g")
            before = shared_redis_server.command("GET", record_key)
            attempts = 0
            real_transact = engine.store.transact

            async def meddled(ref: str, event: Any, *, before_commit: Any = None) -> Any:
                def meddling(decision: Any) -> Any:
                    nonlocal attempts
                    attempts += 1
                    # Another writer rewrites the watched record between the read and the EXEC.
                    shared_redis_server.command("SET", record_key, before)
                    return before_commit(decision) if before_commit is not None else None

                return await real_transact(ref, event, before_commit=meddling)

            engine.store.transact = meddled  # type: ignore[method-assign]
            outcome = await verify(engine, member(1))
            assert isinstance(outcome, Rejected) and outcome.status == 503, outcome
            assert "group 'e:g' changed under 4 transactions in a row" in outcome.detail
            assert "resend the request" in outcome.detail
            assert attempts == 4
            assert engine.store.conflicts == 4
            # Nothing of member 1 was written; resent once the collisions stop, it is stored.
            assert shared_redis_server.command("GET", record_key) == before
            engine.store.transact = real_transact  # type: ignore[method-assign]
            resent = await verify(engine, member(1))
            assert isinstance(resent, Scored) and resent.reward == 3.0


async def test_scripts_are_loaded_again_after_the_server_forgot_them(
    shared_redis_server: RedisServer,
) -> None:
    async with shared_engines(
        shared_redis_server.url, count=1, max_terminal_cohorts=1, num_rollouts_per_prompt=2
    ) as (engine,):
        for group in ("a", "b"):
            # As after a Redis restart without its script cache.
            shared_redis_server.command("SCRIPT", "FLUSH")
            for slot in (0, 1):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(verify, engine, member(slot, 3, g=group))
        # The trim ran by EVALSHA after the flush: the cap of one finished group holds.
        terminal = shared_redis_server.command("ZRANGE", f"{PREFIX}terminal", 0, -1)
        assert terminal == [b"e:b"]
        shared_redis_server.command("SCRIPT", "FLUSH")
        assert await engine.store.due(engine.store.due_set) == []
        calls = shared_redis_server.info("commandstats")
        assert "cmdstat_evalsha" in calls and "cmdstat_eval" not in calls


async def test_a_defect_in_one_groups_sweep_fails_that_group_and_spares_the_others(
    shared_redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    store_clock: MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with shared_engines(
        shared_redis_server.url, count=1, cohort_collection_timeout_s=0.2, clock=harness_time
    ) as (engine,):
        real = _Step.apply

        def broken_for_g(self: _Step, event: Any, before_each: Any = None) -> None:
            if isinstance(event, CollectionDue) and self.group.ref == "e:g":
                raise ValueError("a defect in the deadline step")
            real(self, event, before_each)

        monkeypatch.setattr(_Step, "apply", broken_for_g)
        with caplog.at_level(logging.ERROR, logger="genrm_trio"):
            results: dict[str, Any] = {}

            async def post(group: str) -> None:
                results[group] = await verify(engine, member(0, g=group))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, "g")
                nursery.start_soon(post, "h")
        failed, expired = results["g"], results["h"]
        assert isinstance(failed, Rejected) and failed.status == 503
        assert "GenRM cohort evaluation failed: ValueError: a defect in the deadline step" in (
            failed.detail
        )
        assert isinstance(expired, Rejected) and "did not collect" in expired.detail
        assert any("ref='e:g'" in r.getMessage() for r in caplog.records), caplog.text
        # The engine lives on and serves a new group.
        monkeypatch.setattr(_Step, "apply", real)
        async with trio.open_nursery() as nursery:
            scored: list[Any] = []

            async def post_scored(slot: int) -> None:
                scored.append(await verify(engine, member(slot, 3, g="after")))

            for slot in range(engine.config.num_rollouts_per_prompt):
                nursery.start_soon(post_scored, slot)
        assert all(isinstance(o, Scored) for o in scored), scored


async def test_a_defect_in_the_sweep_or_the_listener_does_not_end_the_engine(
    shared_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with shared_engines(shared_redis_server.url, count=1, num_rollouts_per_prompt=2) as (
        engine,
    ):
        real = engine.store.ended_records
        failures = 0

        async def flaky(rids: list[str]) -> Any:
            nonlocal failures
            if failures < 3:
                failures += 1
                raise ValueError("a defect while polling outcomes")
            return await real(rids)

        engine.store.ended_records = flaky  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR, logger="genrm_trio"):
            while failures < 3:  # noqa: ASYNC110
                await trio.sleep(0.05)
        assert "GenRM group store sweep failed" in caplog.text or (
            "GenRM notification listener failed" in caplog.text
        )
        async with trio.open_nursery() as nursery:
            outcomes: list[Any] = []

            async def post(slot: int) -> None:
                outcomes.append(await verify(engine, member(slot, 4 - slot)))

            for slot in (0, 1):
                nursery.start_soon(post, slot)
        assert sorted(o.reward for o in outcomes) == [3.0, 4.0]
        assert not engine.closed
