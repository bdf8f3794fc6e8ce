"""Playing one scenario: the step runner that checks every invariant after every step, and its
report; ``drivers`` holds how the steps reach the server."""

from __future__ import annotations

import importlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio
import trio.testing

from genrm_trio.store.group_store import StoreView
from genrm_trio.testing import _invariants as invariants
from genrm_trio.testing._invariants import Seen, Violation, _registry_label
from genrm_trio.testing.controlled_judge import ControlledJudge
from genrm_trio.testing.instrument import CriticalSectionInstrument
from genrm_trio.testing.scenarios.drivers import Driver, open_driver
from genrm_trio.testing.scenarios.model import Model
from genrm_trio.testing.scenarios.steps import (
    CONVERSION_FAULT,
    TICK,
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
    describe_step,
    posts_of,
    request_body,
    scenario_config,
)

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
        return len({(s.group, s.task) for s in posts_of(self.scenario.steps)})

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
        used = {(s.marker, s.attempt) for s in posts_of(scenario.steps)}
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
    """Plays one scenario against one server (one or more engines) and checks it after every
    step. Whatever differs between the stores is the driver's (drivers.py) or the model's to
    know: the runner plays and checks every store the same way."""

    def __init__(
        self,
        scenario: Scenario,
        via: Via,
        clock: trio.testing.MockClock,
        store_url: str | None = None,
        restart_store: Callable[[], None] | None = None,
    ) -> None:
        self.scenario = scenario
        self.via = via
        self.clock = clock
        self.store_url = store_url
        self.restart_store = restart_store
        self.config = scenario_config(scenario.settings)
        self.routes: dict[int, int] = {}
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
        self._driver: Driver | None = None
        self._model: Model | None = None
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
    def driver(self) -> Driver:
        assert self._driver is not None, "the runner is not running"
        return self._driver

    @property
    def model(self) -> Model:
        assert self._model is not None, "the runner is not running"
        return self._model

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

    def _random(self, what: str) -> random.Random:
        """A draw that depends only on the seed and on `what`, so shrinking keeps it."""
        return random.Random(f"{self.scenario.seed}:{what}")

    async def run(self) -> ScenarioReport:
        trio.lowlevel.add_instrument(self.instrument)
        try:
            async with open_driver(
                self.via,
                self.config,
                self.judge,
                self._convert,
                self.store_url,
                self.restart_store,
            ) as driver:
                self._driver = driver
                self._model = Model(
                    self.config,
                    self.scenario.faults,
                    lease=driver.tenure.lease_s,
                    trimmed=driver.trims_after_writes,
                )
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
        if self._model is not None:
            self.report.counts.update(self.model.counts)
        self.report.counts["task steps checked (I-1)"] = self.instrument.steps
        return self.report

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
            await self.driver.settle()
            # Collection deadlines and expired leases a store keeps are found by a sweep:
            # here, one at the deadline's instant, by an engine the seed picks.
            sweeper = self._random(f"sweep@{when}").randrange(len(self.driver.engines))
            await self.driver.sweep(sweeper)
            await self.driver.settle()
            self.model.expire(when)
            await self._check(f"{label} (deadline at t={when})")
            if self.report.violations:
                return
        # No deadline falls on `target` (it was nudged off them), so the jump wakes nobody.
        await self._move_to(target)

    async def _step(self, label: str, step: Step) -> None:
        await self._advance(step.seconds if isinstance(step, Advance) else 0.0, label)
        if self.report.violations:
            return
        model, driver = self.model, self.driver
        if isinstance(step, Post):
            self.fail_conversion = step.conversion_fault
            engine = self._send(step)
            await driver.settle()
            self.fail_conversion = False
            model.post(step, self.now, engine)
        elif isinstance(step, Burst):
            # Every post starts before any is applied; the model then takes them in the
            # burst's order, which the generator made irrelevant to the answers.
            engines = [self._send(post) for post in step.posts]
            await driver.settle()
            for post, engine in zip(step.posts, engines, strict=True):
                model.post(post, self.now, engine)
        elif isinstance(step, Disconnect):
            scope = self.scopes.get(step.request)
            if scope is not None and step.request not in self.ended:
                scope.cancel()
            await driver.settle()
            model.disconnect(step.request)
        elif isinstance(step, Release):
            self.judge.release(
                group=step.group, attempt=step.attempt, pair=step.pair, **_release(step)
            )
            await driver.settle()
            model.release(step, self.now)
        elif isinstance(step, Shutdown):
            await self._shutdown(label, check=True)
            return
        elif isinstance(step, Kill):
            if not model.closed:
                await driver.kill(step.engine, self._drop_connections)
            await driver.settle()
            model.kill(step.engine)
        elif isinstance(step, Notify):
            driver.notify(step.engine, step.mode)
            await driver.settle()
        elif isinstance(step, RestartStore):
            driver.restart_store()
            await driver.settle()
        else:
            await driver.settle()
        await self._check(label)

    def _drop_connections(self, engine: int) -> None:
        """The clients of a killed engine lose their connections."""
        for request, routed in self.routes.items():
            if routed == engine and request not in self.ended:
                self.scopes[request].cancel()

    def _send(self, post: Post) -> int:
        """Start every copy of `post`; returns the engine they go to (the same for every copy:
        the model knows which one owns the evaluation a post starts)."""
        body = request_body(post)
        engine = self.driver.route(self.scenario.seed, post)
        for request in post.requests:
            self.routes[request] = engine
            self.nursery.start_soon(self._request, request, body, engine)
        return engine

    async def _shutdown(self, label: str, *, check: bool) -> None:
        """Shut the server down; every task must be drained once all of them are blocked."""
        if self.model.closed:
            await self.driver.settle()
            if check:
                await self._check(label)
            return
        self.report.active_at_shutdown = len(self.model.active)
        finished = trio.Event()

        async def shut_down() -> None:
            await self.driver.shutdown()
            finished.set()

        self.nursery.start_soon(shut_down)
        await self.driver.settle()
        self.model.shutdown(self.now)
        if check:
            await self._check(label)
        if not finished.is_set():
            message = "shutdown was still draining tasks when every task was blocked"
            self.report.violations.append(Violation("I-12", f"{label} (t={self.now})", message))
            while not finished.is_set():
                # Let the grace periods run out so that the run can end.
                self.clock.jump(self.config.shutdown_grace_s)
                await self.driver.settle()

    async def _request(self, request: int, body: dict[str, Any], engine: int) -> None:
        scope = trio.CancelScope()
        self.scopes[request] = scope
        try:
            with scope:
                self.answers[request] = await self.driver.verify(body, engine)
        finally:
            self.ended.add(request)
            if request not in self.answers:
                self.cancelled.add(request)

    # -- checks ----------------------------------------------------------------------------

    async def _check(self, label: str) -> None:
        step = f"{label} (t={self.now})"
        model = self.model
        found, view = await self._store_violations(step)
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
        if view is not None:
            stats = self.driver.statistics(view)
            found += invariants.statistics_violations(
                stats, model.expected_statistics(self.now), step
            )
            if view.prune_visits is not None:
                found += invariants.prune_violations(
                    self.prune_visits,
                    view.prune_visits,
                    model.retained.removed,
                    model.retained.prunes,
                    step,
                )
                self.prune_visits = view.prune_visits
        changed = self.ledger.update(self.judge) | model.judge.changed_calls
        found += invariants.judge_call_violations(
            self.ledger.counts, model.judge.calls, changed, step
        )
        found += invariants.in_flight_violations(self.judge, model.in_flight(), step)
        model.answered, model.cancelled, model.judge.changed_calls = {}, set(), set()
        model.retained.prunes = model.retained.removed = 0
        self.report.violations += found

    async def _store_violations(self, step: str) -> tuple[list[Violation], StoreView | None]:
        """The store's groups after its own checks (I-2…I-4), I-5 and I-7 on their records,
        and its retention against the model's."""
        try:
            view = await self.driver.view()
        except AssertionError as exc:
            message = str(exc) or type(exc).__name__
            return [Violation(_registry_label(message), step, message)], None
        groups = view.groups
        found = invariants.publication_violations(
            [g.record for g in groups.values() if g.record is not None], step
        )
        terminal = []
        for ref in view.terminal:
            record = groups[ref].record if ref in groups else None
            terminal.append(record.key if record is not None else f"<no record {ref}>")
        marks, idle, expected_terminal = self.model.retention(self.now)
        found += invariants.retention_violations(
            groups.values(), view.idle, terminal, marks, idle, expected_terminal, step
        )
        return found, view

    def _check_after_shutdown(self) -> None:
        if self.report.violations:
            return
        step = "after shutdown"
        found: list[Violation] = []
        running = sorted(r for r in self.scopes if r not in self.ended)
        if running:
            found.append(Violation("I-4", step, f"requests {running} never got an answer"))
        left: dict[str, int] = {}
        for engine in self.driver.engines:
            for key, value in engine.statistics()._asdict().items():
                if value and key != "prune_visits":
                    left[key] = left.get(key, 0) + value
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
    scenario: Scenario,
    clock: trio.testing.MockClock,
    *,
    via: Via = "engine",
    store_url: str | None = None,
    restart_store: Callable[[], None] | None = None,
) -> ScenarioReport:
    """Play a scenario inside a running Trio loop whose clock is `clock` (no autojump);
    `via="shared"` plays it on two engines sharing the Redis store at `store_url`, which
    `restart_store` (if given) kills and starts again."""
    return await _Runner(scenario, via, clock, store_url, restart_store).run()


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


def run_once(
    scenario: Scenario,
    via: Via,
    quiet: bool,
    store_url: str | None = None,
    restart_store: Callable[[], None] | None = None,
) -> ScenarioReport:
    clock = trio.testing.MockClock()
    # Trio shuffles each batch of runnable tasks with this generator; seeding it makes a run
    # repeat exactly, down to the order in which tasks take their steps.
    scheduler = getattr(importlib.import_module("trio._core._run"), "_r", None)
    if isinstance(scheduler, random.Random):
        scheduler.seed(scenario.seed)
    started = time.perf_counter()
    with _quiet(quiet):
        report = trio.run(
            partial(
                play, scenario, clock, via=via, store_url=store_url, restart_store=restart_store
            ),
            clock=clock,
        )
    report.seconds = time.perf_counter() - started
    return report
