"""Shrinking a failing scenario to a short list of steps that still breaks the same invariant."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from genrm_trio.testing.scenarios.generator import BurstRules
from genrm_trio.testing.scenarios.runner import run_once
from genrm_trio.testing.scenarios.steps import (
    Scenario,
    Step,
    Via,
    posts_of,
)


def shrink(
    scenario: Scenario,
    invariant: str,
    *,
    via: Via = "engine",
    budget: int = 300,
    quiet: bool = True,
    store_url: str | None = None,
    restart_store: Callable[[], None] | None = None,
) -> Scenario:
    """The shortest sub-list of steps found that still breaks `invariant` (greedy chunk removal)."""

    size = int(scenario.settings.get("num_rollouts_per_prompt", 1))

    def fails(steps: list[Step]) -> bool:
        if not BurstRules(size).allows(steps):
            return False  # a burst whose order would matter: not a scenario the model can judge
        candidate = replace(scenario, steps=tuple(steps))
        report = run_once(candidate, via, quiet, store_url, restart_store)
        return any(v.invariant == invariant for v in report.violations)

    steps = list(scenario.steps)
    chunk = max(1, len(steps) // 2)
    while budget > 0 and steps:
        index, progress = 0, False
        while index < len(steps) and budget > 0:
            candidate = steps[:index] + steps[index + chunk :]
            budget -= 1
            if candidate and fails(candidate):
                steps, progress = candidate, True
            else:
                index += chunk
        if chunk > 1:
            chunk //= 2
        elif not progress:
            break
    # Faults of groups no remaining step posts to cannot matter.
    used = {(s.marker, s.attempt) for s in posts_of(steps)}
    faults = tuple(f for f in scenario.faults if (f.group, f.attempt) in used)
    return replace(scenario, steps=tuple(steps), faults=faults)
