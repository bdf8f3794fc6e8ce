"""Playing one scenario: the drivers that reach the server (straight into the engine, or over
HTTP), the step runner that checks every invariant after every step, and its report."""

from __future__ import annotations

import importlib
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import msgspec
import trio
import trio.testing

from genrm_trio.config import Config
from genrm_trio.core.groups import Masked, Outcome, Rejected, Scored
from genrm_trio.http.bodies import METRIC_KEYS
from genrm_trio.http.parsing import parse_verify_body
from genrm_trio.runtime.engine import Engine
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.testing import invariants
from genrm_trio.testing.controlled_judge import ControlledJudge
from genrm_trio.testing.fixtures import GenRMServer, serve
from genrm_trio.testing.harness import Reply
from genrm_trio.testing.instrument import CriticalSectionInstrument
from genrm_trio.testing.invariants import Seen, Violation
from genrm_trio.testing.scenarios.model import Model
from genrm_trio.testing.scenarios.steps import (
    CONVERSION_FAULT,
    TICK,
    Advance,
    Disconnect,
    Fault,
    Post,
    Release,
    Scenario,
    Shutdown,
    Step,
    Via,
    describe_step,
    request_body,
    scenario_config,
)

# ---- drivers: how a run reaches the server ------------------------------------------------------


class _Driver(Protocol):
    engine: Engine

    async def verify(self, body: dict[str, Any]) -> Seen: ...

    async def shutdown(self) -> None: ...


def seen_outcome(outcome: Outcome) -> Seen:
    if isinstance(outcome, Scored):
        return Seen("scored", 200, reward=outcome.reward, metrics=outcome.metrics)
    if isinstance(outcome, Masked):
        return Seen("masked", 200, outcome.text + outcome.suffix)
    assert isinstance(outcome, Rejected)
    return Seen("rejected", outcome.status, outcome.detail)


def seen_reply(reply: Reply) -> Seen:
    body = reply.body
    if reply.status != 200:
        return Seen("rejected", reply.status, str(body.get("detail")))
    if body.get("mask_sample"):
        return Seen("masked", 200, str(body["failure_reason"]))
    metrics = {name: float(body[name]) for name in METRIC_KEYS if name in body}
    return Seen("scored", 200, reward=float(body["reward"]), metrics=metrics or None)


class _EngineDriver:
    """Straight into `Engine.verify` with a parsed body: the fast path for long runs."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def verify(self, body: dict[str, Any]) -> Seen:
        parsed = parse_verify_body(msgspec.json.encode(body), self.engine.config)
        return seen_outcome(await self.engine.verify(parsed))

    async def shutdown(self) -> None:
        await self.engine.shutdown()


class _HttpDriver:
    """Through the HTTP app over ASGI, as a client would."""

    def __init__(self, server: GenRMServer) -> None:
        self.server = server
        self.engine = server.engine

    async def verify(self, body: dict[str, Any]) -> Seen:
        return seen_reply(await self.server.verify(body))

    async def shutdown(self) -> None:
        await self.engine.shutdown()


@asynccontextmanager
async def _driver(
    via: Via, config: Config, judge: ControlledJudge, hooks: Hooks
) -> AsyncIterator[_Driver]:
    if via == "http":
        async with serve(config, judge=judge, hooks=hooks, check_on_exit=False) as server:
            yield _HttpDriver(server)
        return
    engine = Engine(config, judge_transport=judge.transport(), hooks=hooks)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        try:
            yield _EngineDriver(engine)
        finally:
            with trio.CancelScope(shield=True):
                await engine.shutdown()


# ---- the runner -------------------------------------------------------------------------------


@dataclass
class ScenarioReport:
    """The result of one run: violations, counts of every outcome, and the answers given."""

    scenario: Scenario
    via: Via
    violations: list[Violation] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    trace: list[str] = field(default_factory=list)
    steps_run: int = 0
    active_at_shutdown: int | None = None
    seconds: float = 0.0
    minimal: Scenario | None = None
    minimal_violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def groups(self) -> int:
        return len({(s.group, s.task) for s in self.scenario.steps if isinstance(s, Post)})

    def summary(self) -> str:
        head = f"seed {self.scenario.seed} via {self.via}: {self.steps_run} steps, "
        head += f"{self.groups} groups, {len(self.violations)} violation(s)"
        lines = [head] + [f"  {name}: {count}" for name, count in sorted(self.counts.items())]
        return "\n".join(lines + [f"  {v}" for v in self.violations[:20]])

    def reproduction(self) -> str:
        """The smallest failing scenario found, step by step, with the way to replay it."""
        if not self.violations:
            return f"seed {self.scenario.seed}: no violation"
        scenario = self.minimal or self.scenario
        first = (self.minimal_violations or self.violations)[0]
        lines = [
            f"genrm-trio race scenario, seed {scenario.seed} via {self.via}: {first}",
            f"{len(scenario.steps)} of {len(self.scenario.steps)} generated steps still fail; "
            f"settings {dict(scenario.settings)}",
        ]
        used = {(s.marker, s.attempt) for s in scenario.steps if isinstance(s, Post)}
        for fault in scenario.faults:
            if (fault.group, fault.attempt) in used:
                times = f" x{fault.times}" if fault.times else ""
                lines.append(
                    f"  fault {fault.group}:{fault.attempt} pair {fault.pair}: {fault.kind}{times}"
                )
        for index, step in enumerate(scenario.steps):
            lines.append(f"  step {index}: {describe_step(step)}")
        lines += [
            "replay: save the last line as scenario.json, then run",
            "  python -c 'from genrm_trio.testing.scenarios import Scenario, run_scenario; "
            'print(run_scenario(Scenario.from_json(open("scenario.json").read()), '
            f'via="{self.via}").summary())\'',
            scenario.to_json(),
        ]
        return "\n".join(lines)


class _Runner:
    """Plays one scenario against one server instance and checks it after every step."""

    def __init__(self, scenario: Scenario, via: Via, clock: trio.testing.MockClock) -> None:
        self.scenario = scenario
        self.via = via
        self.clock = clock
        self.config = scenario_config(scenario.settings)
        self.model = Model(self.config, scenario.faults)
        self.judge = ControlledJudge()
        for fault in scenario.faults:
            self._install(fault)
        self.report = ScenarioReport(scenario, via)
        self.instrument = CriticalSectionInstrument()
        self.ledger = invariants.JudgeLedger()
        self.scopes: dict[int, trio.CancelScope] = {}
        self.answers: dict[int, Seen] = {}
        self.ended: set[int] = set()
        self.cancelled: set[int] = set()
        self.fail_conversion = False
        self.reported_instrument = 0
        self.prune_visits = 0
        self._driver: _Driver | None = None
        self._nursery: trio.Nursery | None = None

    def _install(self, fault: Fault) -> None:
        where: dict[str, Any] = {"group": fault.group, "attempt": fault.attempt, "pair": fault.pair}
        judge, kind = self.judge, fault.kind
        if kind == "hold":
            judge.hold(times=self.config.num_judges_per_comparison, **where)
        elif kind == "unparseable":
            judge.fail("text", text="no verdict here", **where)
        elif kind == "transient":
            judge.fail("http_status", status=500, **where)
        elif kind == "rate_limited":
            judge.fail("http_status", status=429, **where)
        elif kind == "flaky":
            judge.fail("http_status", status=503, times=fault.times, **where)
        elif kind == "fatal":
            judge.fail("http_status", status=400, **where)
        elif kind == "truncated":
            judge.fail("truncated_body", **where)
        elif kind == "budget":
            judge.fail("budget_exhausted", **where)
        else:
            judge.fail(kind, **where)  # empty, non_json, close, hang

    @property
    def driver(self) -> _Driver:
        assert self._driver is not None, "the runner is not running"
        return self._driver

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None, "the runner is not running"
        return self._nursery

    def _convert(self, slot: int) -> None:
        if self.fail_conversion:
            raise RuntimeError(CONVERSION_FAULT)

    @property
    def now(self) -> float:
        return trio.current_time()

    async def run(self) -> ScenarioReport:
        hooks = Hooks(on_conversion=self._convert)
        trio.lowlevel.add_instrument(self.instrument)
        try:
            async with _driver(self.via, self.config, self.judge, hooks) as driver:
                self._driver = driver
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    for index, step in enumerate(self.scenario.steps):
                        await self._step(str(index), step)
                        self.report.steps_run += 1
                        if self.report.violations:
                            break
                    if not self.model.closed:
                        await self._shutdown("end", check=not self.report.violations)
                    if not self.report.violations:
                        self._check_after_shutdown()
                    nursery.cancel_scope.cancel()
        finally:
            trio.lowlevel.remove_instrument(self.instrument)
        self.report.counts.update(self.model.counts)
        self.report.counts["task steps checked (I-1)"] = self.instrument.steps
        return self.report

    async def _quiesce(self) -> None:
        await trio.testing.wait_all_tasks_blocked()

    async def _move_to(self, target: float) -> None:
        self.clock.jump(target - self.now)

    async def _advance(self, seconds: float, label: str) -> None:
        target = self.now + TICK + seconds
        while self.model.collides(target):
            target += TICK
        while True:
            due = [t for t in self.model.deadlines() if t < target]
            if not due:
                break
            when = min(due)
            await self._move_to(when)
            await self._quiesce()
            self.model.expire(when)
            self._check(f"{label} (deadline at t={when})")
            if self.report.violations:
                return
        # No deadline falls on `target` (it was nudged off them), so the jump wakes nobody.
        await self._move_to(target)

    async def _step(self, label: str, step: Step) -> None:
        await self._advance(step.seconds if isinstance(step, Advance) else 0.0, label)
        if self.report.violations:
            return
        model = self.model
        if isinstance(step, Post):
            self.fail_conversion = step.conversion_fault
            body = request_body(step)
            for request in step.requests:
                self.nursery.start_soon(self._request, request, body)
            await self._quiesce()
            self.fail_conversion = False
            model.post(step, self.now)
        elif isinstance(step, Disconnect):
            scope = self.scopes.get(step.request)
            if scope is not None and step.request not in self.ended:
                scope.cancel()
            await self._quiesce()
            model.disconnect(step.request)
        elif isinstance(step, Release):
            self.judge.release(
                group=step.group, attempt=step.attempt, pair=step.pair, **_release(step)
            )
            await self._quiesce()
            model.release(step, self.now)
        elif isinstance(step, Shutdown):
            await self._shutdown(label, check=True)
            return
        else:
            await self._quiesce()
        self._check(label)

    async def _shutdown(self, label: str, *, check: bool) -> None:
        """Shut the server down; every task must be drained once all of them are blocked."""
        if self.model.closed:
            await self._quiesce()
            if check:
                self._check(label)
            return
        self.report.active_at_shutdown = len(self.model.active)
        finished = trio.Event()

        async def shut_down() -> None:
            await self.driver.shutdown()
            finished.set()

        self.nursery.start_soon(shut_down)
        await self._quiesce()
        self.model.shutdown(self.now)
        if check:
            self._check(label)
        if not finished.is_set():
            message = "shutdown was still draining tasks when every task was blocked"
            self.report.violations.append(Violation("I-12", f"{label} (t={self.now})", message))
            while not finished.is_set():
                # Let the grace periods run out so that the run can end.
                self.clock.jump(self.config.shutdown_grace_s)
                await self._quiesce()

    async def _request(self, request: int, body: dict[str, Any]) -> None:
        scope = trio.CancelScope()
        self.scopes[request] = scope
        try:
            with scope:
                self.answers[request] = await self.driver.verify(body)
        finally:
            self.ended.add(request)
            if request not in self.answers:
                self.cancelled.add(request)

    # -- checks ----------------------------------------------------------------------------

    def _check(self, label: str) -> None:
        step = f"{label} (t={self.now})"
        found: list[Violation] = []
        engine, model = self.driver.engine, self.model
        found += invariants.registry_violations(engine, step)
        found += invariants.publication_violations(engine.registry, step)
        found += invariants.retention_violations(
            engine.registry,
            {gid: mark[0] for gid, mark in model.watermarks.items()},
            list(model.idle),
            [record.key for _, record in model.terminal.values()],
            step,
        )
        found += invariants.instrument_violations(self.instrument, self.reported_instrument, step)
        self.reported_instrument = len(self.instrument.violations)
        answers, self.answers = self.answers, {}
        cancelled, self.cancelled = self.cancelled, set()
        found += invariants.waiter_violations(
            answers, model.answered, cancelled, model.cancelled, step
        )
        for request, seen in sorted(answers.items()):
            expected = model.answered.get(request)
            label_ = _label(seen)
            self.report.counts[label_] += 1
            self.report.trace.append(f"{label} r{request} {label_}")
            if expected is not None:
                found += invariants.outcome_violations(request, expected, seen, step)
        self.report.counts["cancelled requests"] += len(cancelled)
        stats = engine.statistics()
        found += invariants.statistics_violations(stats, model.statistics(), step)
        found += invariants.prune_violations(
            self.prune_visits, stats.prune_visits, model.removed, model.prunes, step
        )
        self.prune_visits = stats.prune_visits
        changed = self.ledger.update(self.judge) | model.changed_calls
        found += invariants.judge_call_violations(self.ledger.counts, model.calls, changed, step)
        found += invariants.in_flight_violations(self.judge, model.in_flight(), step)
        model.answered, model.cancelled, model.changed_calls = {}, set(), set()
        model.prunes = model.removed = 0
        self.report.violations += found

    def _check_after_shutdown(self) -> None:
        if self.report.violations:
            return
        step = "after shutdown"
        found: list[Violation] = []
        running = sorted(r for r in self.scopes if r not in self.ended)
        if running:
            found.append(Violation("I-4", step, f"requests {running} never got an answer"))
        stats = self.driver.engine.statistics()
        left = {k: v for k, v in stats._asdict().items() if v and k != "prune_visits"}
        if left:
            found.append(Violation("I-4", step, f"statistics() after shutdown: {left}"))
        if self.judge.stats()["in_flight"]:
            found.append(Violation("I-12", step, "judge calls still in flight after shutdown"))
        self.report.violations += found


def _release(step: Release) -> dict[str, Any]:
    if step.action == "fatal":
        return {"action": "http_status", "status": 400}
    if step.action == "transient":
        return {"action": "http_status", "status": 500}
    return {}


_LABELS = (
    ("already has a different response", "409 different response"),
    ("no longer retained", "409 not retained"),
    ("inconsistent prompt", "409 inconsistent prompt"),
    ("did not collect", "503 not collected"),
    ("shutting down", "503 shutting down"),
    ("input conversion failed", "503 conversion failed"),
    ("evaluation failed", "503 evaluation failed"),
    ("evaluation was cancelled", "503 evaluation cancelled"),
)


def _label(seen: Seen) -> str:
    """A short name for one kind of answer, for the outcome counts."""
    if seen.kind == "scored":
        return "scored"
    if seen.kind == "masked":
        if "evaluation deadline exceeded" in seen.text:
            return "masked (evaluation deadline)"
        if "every rollout was masked" in seen.text:
            return "masked (every rollout)"
        return "masked (lost a comparison)"
    if "superseded by attempt" in seen.text:
        return f"{seen.status} superseded"
    for phrase, label in _LABELS:
        if phrase in seen.text:
            return label
    return f"{seen.status} other"


async def play(
    scenario: Scenario, clock: trio.testing.MockClock, *, via: Via = "engine"
) -> ScenarioReport:
    """Play a scenario inside a running Trio loop whose clock is `clock` (no autojump)."""
    return await _Runner(scenario, via, clock).run()


@contextmanager
def _quiet(enabled: bool) -> Iterator[None]:
    logger = logging.getLogger("genrm_trio")
    previous = logger.level
    if enabled:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


def run_once(scenario: Scenario, via: Via, quiet: bool) -> ScenarioReport:
    clock = trio.testing.MockClock()
    # Trio shuffles each batch of runnable tasks with this generator; seeding it makes a run
    # repeat exactly, down to the order in which tasks take their steps.
    scheduler = getattr(importlib.import_module("trio._core._run"), "_r", None)
    if isinstance(scheduler, random.Random):
        scheduler.seed(scenario.seed)
    started = time.perf_counter()
    with _quiet(quiet):
        report = trio.run(partial(play, scenario, clock, via=via), clock=clock)
    report.seconds = time.perf_counter() - started
    return report
