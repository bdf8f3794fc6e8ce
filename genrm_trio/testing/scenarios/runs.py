"""Runs from synchronous code: `run_scenario` plays one scenario in a fresh Trio run and shrinks
a failure; `run_seeds` does so for many seeds, across worker processes."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from itertools import repeat

from genrm_trio.testing.scenarios.generator import Shape, generate
from genrm_trio.testing.scenarios.runner import ScenarioReport, run_once
from genrm_trio.testing.scenarios.shrinker import shrink
from genrm_trio.testing.scenarios.steps import (
    Scenario,
    Via,
)


def run_scenario(
    scenario: Scenario,
    *,
    via: Via = "engine",
    shrink_failures: bool = True,
    quiet: bool = True,
    store_url: str | None = None,
    restart_store: Callable[[], None] | None = None,
) -> ScenarioReport:
    """Play a scenario in a fresh Trio run; a failing run is shrunk to a minimal reproduction.

    Call it from synchronous code (it starts its own `trio.run`); from async code use `play`.
    `via="shared"` plays it on two engines sharing the Redis store at `store_url`, which
    `restart_store` (if given) kills and starts again.
    """
    report = run_once(scenario, via, quiet, store_url, restart_store)
    if report.violations and shrink_failures:
        # The run stops at the step that broke an invariant; later steps cannot matter.
        shorter = replace(scenario, steps=scenario.steps[: max(1, report.steps_run)])
        report.minimal = shrink(
            shorter,
            report.violations[0].invariant,
            via=via,
            quiet=quiet,
            store_url=store_url,
            restart_store=restart_store,
        )
        minimal = run_once(report.minimal, via, quiet, store_url, restart_store)
        report.minimal_violations = minimal.violations
    return report


def _run_seed(seed: int, shape: Shape | None, via: Via) -> ScenarioReport:
    return run_scenario(generate(seed, shape), via=via)


def run_seeds(
    seeds: Iterable[int],
    shape: Shape | None = None,
    *,
    via: Via = "engine",
    workers: int = 1,
    on_report: Callable[[ScenarioReport], None] | None = None,
) -> list[ScenarioReport]:
    """Generate and run one scenario per seed, in `workers` processes; failures come back
    shrunk. Reports arrive in seed order."""
    seeds = list(seeds)
    reports: list[ScenarioReport] = []
    if workers <= 1:
        results: Iterable[ScenarioReport] = (_run_seed(seed, shape, via) for seed in seeds)
        for report in results:
            if on_report is not None:
                on_report(report)
            reports.append(report)
        return reports
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        chunk = max(1, len(seeds) // (workers * 8))
        for report in pool.map(_run_seed, seeds, repeat(shape), repeat(via), chunksize=chunk):
            if on_report is not None:
                on_report(report)
            reports.append(report)
    return reports
