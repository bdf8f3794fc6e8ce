"""Seeded race scenarios under load: every invariant holds after every step (§10.15)."""

from __future__ import annotations

from collections import Counter

import trio.testing

from genrm_trio.testing.scenarios import (
    AS160_SHAPE,
    Scenario,
    ScenarioReport,
    Shape,
    generate,
    play,
    run_scenario,
    run_seeds,
)

CI_SEEDS = range(200)  # x 10 groups each: the CI-sized run of about 2,000 groups
EVERY_OUTCOME = (
    "scored",
    "masked (lost a comparison)",
    "masked (every rollout)",
    "masked (evaluation deadline)",
    "409 different response",
    "409 superseded",
    "409 not retained",
    "409 inconsistent prompt",
    "503 not collected",
    "503 superseded",
    "503 shutting down",
    "503 conversion failed",
    "cancelled requests",
    "results pruned",
    "watermarks pruned",
    "superseded while active",
    "groups completed",
    "groups completed with masks",
    "groups failed (judge)",
    "groups failed (cohort)",
)


def failures(reports: list[ScenarioReport]) -> str:
    bad = [r for r in reports if not r.ok]
    return "\n\n".join(r.reproduction() for r in bad[:3])


def test_as160_load_with_cancellations_failures_pruning_and_shutdown() -> None:
    # AS-160: 100 groups x 3 attempts x 4 slots, 1-2 copies per request, 20% of requests
    # cancelled, 10% of comparisons failing, cap 8, shutdown with 40 groups in flight.
    scenario = generate(160, AS160_SHAPE)
    report = run_scenario(scenario)
    assert report.ok, report.reproduction()
    assert not [v for v in report.violations if v.invariant == "I-1"]
    assert report.counts["task steps checked (I-1)"] > 10_000
    assert report.groups == 100
    assert dict(scenario.settings)["max_terminal_cohorts"] == 8
    assert report.active_at_shutdown is not None and report.active_at_shutdown >= 40
    assert report.counts["scored"] >= 100
    assert report.counts["cancelled requests"] >= 50
    assert report.counts["results pruned"] > 0 and report.counts["503 shutting down"] > 0


def test_as162_two_hundred_seeds_keep_every_invariant_after_every_step() -> None:
    # AS-162 and the CI-sized run: 200 seeds of arrivals, duplicates, regenerated answers,
    # disconnects, attempt bumps, judge faults, clock jumps, prunes and shutdown.
    reports = run_seeds(CI_SEEDS, workers=2)
    assert all(r.ok for r in reports), failures(reports)
    assert sum(r.groups for r in reports) >= 2000
    total: Counter[str] = Counter()
    for report in reports:
        total.update(report.counts)
    missing = [name for name in EVERY_OUTCOME if not total[name]]
    assert not missing, f"the workload never produced {missing}"
    modes = {bool(r.scenario.settings["early_judging"]) for r in reports}
    strategies = {r.scenario.settings["comparison_strategy"] for r in reports}
    assert modes == {False, True} and strategies == {"circular", "all_pairs"}


def test_seeds_through_the_http_app_agree_with_the_model() -> None:
    reports = run_seeds(range(1000, 1012), via="http")
    assert all(r.ok for r in reports), failures(reports)


def test_a_seed_replays_exactly() -> None:
    scenario = generate(7)
    assert generate(7) == scenario
    assert Scenario.from_json(scenario.to_json()) == scenario
    first, second = run_scenario(scenario), run_scenario(scenario)
    assert first.ok and second.ok
    assert first.trace == second.trace and first.counts == second.counts
    assert len(first.trace) > 20


def test_different_seeds_give_different_workloads() -> None:
    assert generate(1).steps != generate(2).steps


def test_a_workload_can_be_shaped() -> None:
    shape = Shape(groups=3, attempts=(1, 1), slots=(4,), legacy_rate=0.0, shutdown=False)
    scenario = generate(5, shape)
    report = run_scenario(scenario)
    assert report.ok, report.reproduction()
    assert report.groups == 3 and scenario.settings["num_rollouts_per_prompt"] == 4
    assert report.summary().startswith(f"seed 5 via engine: {report.steps_run} steps, 3 groups")


async def test_a_scenario_plays_inside_a_trio_test(mock_clock: trio.testing.MockClock) -> None:
    report = await play(generate(11), mock_clock)
    assert report.ok, report.reproduction()
    assert report.reproduction() == "seed 11: no violation"
