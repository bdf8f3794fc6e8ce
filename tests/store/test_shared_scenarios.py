"""The race harness on two engines sharing a real Redis store (§6, X-4): seeded scenarios
with each post sent to the engine the seed picks, every invariant checked against the store after
every step, and the faults of a shared deployment as steps: an engine killed while its group
collects or while it evaluates, notifications lost or duplicated, Redis killed and restarted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from genrm_trio.store.redis_store import RedisGroupStore
from genrm_trio.testing.redis_server import RedisServer
from genrm_trio.testing.scenarios import (
    SHARED_BURST_SHAPE,
    SHARED_SHAPE,
    Advance,
    Burst,
    Fault,
    Kill,
    Notify,
    Post,
    Release,
    RestartStore,
    Scenario,
    ScenarioReport,
    Step,
    engine_for,
    generate,
    run_scenario,
)

SETTINGS = {"num_rollouts_per_prompt": 2, "max_terminal_cohorts": 4}


def restarter(server: RedisServer) -> Callable[[], None]:
    def restart() -> None:
        server.kill()
        server.start()  # append-only file with appendfsync always: nothing is lost

    return restart


def play(
    server: RedisServer, steps: tuple[Step, ...], faults: tuple[Fault, ...] = ()
) -> ScenarioReport:
    scenario = Scenario(seed=0, settings=SETTINGS, faults=faults, steps=steps)
    return run_scenario(
        scenario,
        via="shared",
        store_url=server.url,
        restart_store=restarter(server),
        shrink_failures=False,
    )


def test_seed_zero_routes_as_these_scenarios_assume() -> None:
    assert [engine_for(0, Post((r,), "g", 0, 0)) for r in range(6)] == [1, 1, 0, 1, 1, 0]


@pytest.mark.parametrize("seed", range(20))
def test_seeded_scenarios_on_two_engines_sharing_redis(
    seed: int, shared_redis_server: RedisServer
) -> None:
    scenario = generate(seed, SHARED_SHAPE)
    report = run_scenario(
        scenario,
        via="shared",
        store_url=shared_redis_server.url,
        restart_store=restarter(shared_redis_server),
    )
    assert report.ok, report.reproduction()
    assert report.steps_run == len(scenario.steps)
    assert report.counts["scored"] > 0


def test_an_engine_killed_while_its_group_collects(shared_redis_server: RedisServer) -> None:
    report = play(
        shared_redis_server,
        (
            Post((2,), "g", 0, 0, quality=4),  # engine 0 holds the first waiter
            Kill(0),  # its request ends with the engine; the member stays in the store
            Post((0,), "g", 0, 0, quality=4),  # the retry, at engine 1, attaches to it
            Post((1,), "g", 0, 1, quality=2),
        ),
    )
    assert report.ok, report.reproduction()
    assert report.counts["cancelled requests"] == 1
    assert report.counts["scored"] == 2 and report.counts["groups completed"] == 1


def test_an_engine_killed_while_it_evaluates(shared_redis_server: RedisServer) -> None:
    report = play(
        shared_redis_server,
        (
            Post((2,), "g", 0, 0, quality=4),  # waits at engine 0
            Post((0,), "g", 0, 1, quality=2),  # fills the group at engine 1, which judges it
            Kill(1),
            # The lease (10 s) outlives the evaluation deadline (3 s): the sweep that finds it
            # expired fails the group with the deadline's text, and engine 0's waiter gets it.
            Advance(12.0),
            Post((5,), "g", 0, 0, quality=4),  # a replay gets the same failure
        ),
        faults=(Fault("g", 0, (0, 1), "hold"),),
    )
    assert report.ok, report.reproduction()
    assert report.counts["groups failed after their lease expired"] == 1
    assert report.counts["masked (evaluation deadline)"] == 2
    assert report.counts["cancelled requests"] == 1


def test_a_supersession_at_one_engine_stops_the_other_engines_judge_calls(
    shared_redis_server: RedisServer,
) -> None:
    report = play(
        shared_redis_server,
        (
            Post((2,), "g", 0, 0),
            Post((0,), "g", 0, 1),  # engine 1 judges; its call for (0, 1) is held
            Post((5,), "g", 1, 0),  # attempt 1 at engine 0: the held call ends at once (C-80)
        ),
        faults=(Fault("g", 0, (0, 1), "hold"),),
    )
    assert report.ok, report.reproduction()
    assert report.counts["503 superseded"] == 2


def test_redis_restarted_while_a_group_is_judged(shared_redis_server: RedisServer) -> None:
    report = play(
        shared_redis_server,
        (
            Post((2,), "g", 0, 0, quality=4),  # waits at engine 0
            Post((0,), "g", 0, 1, quality=2),  # engine 1 judges; (0, 1) is held
            RestartStore(),  # every connection drops, engine 0's subscription too
            Release("g", 0, (0, 1)),  # engine 1 stores the outcome on the restarted server
            Post((5,), "g", 0, 0, quality=4),  # a replay at engine 0
        ),
        faults=(Fault("g", 0, (0, 1), "hold"),),
    )
    assert report.ok, report.reproduction()
    assert report.counts["scored"] == 3


@pytest.mark.parametrize("mode", ["lost", "duplicated"])
def test_lost_or_duplicated_notifications_change_no_answer(
    shared_redis_server: RedisServer, mode: str
) -> None:
    report = play(
        shared_redis_server,
        (
            Notify(0, mode),
            Notify(1, mode),
            Post((2,), "g", 0, 0, quality=4),  # waits at engine 0
            Post((3,), "h", 0, 0, quality=1),  # waits at engine 1
            Post((0,), "g", 0, 1, quality=2),  # engine 1 ends g: engine 0 learns it remotely
            Post((5,), "h", 0, 1, quality=5),  # engine 0 ends h: engine 1 learns it remotely
        ),
    )
    assert report.ok, report.reproduction()
    assert report.counts["scored"] == 4


def test_the_store_checks_catch_a_retention_cap_that_is_not_kept(
    shared_redis_server: RedisServer, monkeypatch: Any
) -> None:
    monkeypatch.setattr(RedisGroupStore, "_trim_command", lambda self, now: ["PING"])
    steps = tuple(
        Post((10 * g + slot,), f"g{g}", 0, slot, quality=1 + slot)
        for g in range(5)
        for slot in range(2)
    )
    report = play(shared_redis_server, steps)
    assert not report.ok
    assert report.violations[0].invariant in ("R-1", "I-21")


def test_shared_mode_steps_change_nothing_in_memory() -> None:
    steps = (Post((0,), "g", 0, 0, quality=4), Kill(0), Notify(0, "lost"), Post((1,), "g", 0, 1))
    report = run_scenario(Scenario(seed=0, settings=SETTINGS, faults=(), steps=steps))
    assert report.ok, report.reproduction()
    assert report.counts["scored"] == 2 and report.counts["cancelled requests"] == 0


@pytest.mark.parametrize("seed", range(12))
def test_seeded_bursts_of_arrivals_at_both_engines(
    seed: int, shared_redis_server: RedisServer
) -> None:
    # Runs of members posted at the same instant, each to the engine the seed picks: their
    # transactions race on the same groups' keys at both engines.
    scenario = generate(seed, SHARED_BURST_SHAPE)
    assert any(isinstance(step, Burst) for step in scenario.steps)
    report = run_scenario(
        scenario,
        via="shared",
        store_url=shared_redis_server.url,
        restart_store=restarter(shared_redis_server),
    )
    assert report.ok, report.reproduction()
    assert report.steps_run == len(scenario.steps)
    assert report.counts["scored"] > 0


def test_a_group_started_and_another_filled_at_once_at_both_engines(
    shared_redis_server: RedisServer,
) -> None:
    # Seed 0 routes requests 0, 1 and 3 to engine 1 and request 2 to engine 0 (see the routing
    # test above): in the burst, "g" starts at engine 1 while "h" fills at engine 0.
    report = play(
        shared_redis_server,
        (
            Post((0,), "h", 0, 1, quality=5),
            Burst((Post((1,), "g", 0, 0, quality=2), Post((2,), "h", 0, 0, quality=1))),
            Post((3,), "g", 0, 1, quality=4),
        ),
    )
    assert report.ok, report.reproduction()
    assert report.counts["scored"] == 4
