"""Seeded race scenarios for the group engine: a workload generator, a model of §5 that
predicts every answer, and a step runner that checks every invariant after every step.

Theory of operation
-------------------
`generate(seed, shape)` draws a configuration, a judge fault per (group attempt, pair), and a
list of steps: posts of members (with duplicate copies, regenerated answers, another prompt, an
injected conversion fault), client disconnects, releases of held judge calls, clock advances
and a shutdown. The same seed always gives the same scenario.

`run_scenario(scenario)` plays the steps on a `MockClock` that moves only when the runner moves
it, so every step lands on a known instant: after each step it waits until every task is
blocked, then feeds the same step to the `model` and compares. Deadlines that fall between two
steps are visited one by one, each with its own check. The runner nudges a step forward by a
tick when it could start a deadline that coincides with another one, so the order of events is
never up to the scheduler, and seeds Trio's scheduler so a seed replays exactly.

After every step (see `invariants`): the engine's own `check_invariants()`, all-or-nothing
publication, every answer against the model (reward by slot, masks, texts), requests answered
exactly when the model resolves them, judge calls per (group, attempt, pair) against the model,
`statistics()`, the watermarks and both retention indexes (in order) against the model, the
prune-visit bound, and the critical-section instrument.

A failing run is shrunk (`shrink`) to a short list of steps that still breaks the same
invariant, and `ScenarioReport.reproduction()` prints it with the way to replay it.

Modules: `steps` (what a scenario is made of), `generator`, `model`, `runner` (drivers and the
step runner), `shrinker`, and `runs` (`run_scenario` and `run_seeds`).
"""

from genrm_trio.testing.scenarios.generator import (
    AS160_SHAPE,
    SHARED_BURST_SHAPE,
    SHARED_SHAPE,
    Shape,
    generate,
)
from genrm_trio.testing.scenarios.runner import ScenarioReport, play
from genrm_trio.testing.scenarios.runs import run_scenario, run_seeds
from genrm_trio.testing.scenarios.shrinker import shrink
from genrm_trio.testing.scenarios.steps import (
    Advance,
    Burst,
    Disconnect,
    Fault,
    Kill,
    Notify,
    Post,
    Release,
    RestartStore,
    Scenario,
    Shutdown,
    Step,
    Via,
    engine_for,
)

__all__ = [
    "AS160_SHAPE",
    "SHARED_BURST_SHAPE",
    "SHARED_SHAPE",
    "Advance",
    "Burst",
    "Disconnect",
    "Fault",
    "Kill",
    "Notify",
    "Post",
    "Release",
    "RestartStore",
    "Scenario",
    "ScenarioReport",
    "Shape",
    "Shutdown",
    "Step",
    "Via",
    "engine_for",
    "generate",
    "play",
    "run_scenario",
    "run_seeds",
    "shrink",
]
