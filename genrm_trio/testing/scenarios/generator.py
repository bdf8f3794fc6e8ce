"""The workload generator: `generate(seed, shape)` draws one scenario (settings, judge faults
and interleaved group scripts), the same for the same seed and shape."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from genrm_trio.testing.scenarios.steps import (
    COLLECTION_TIMEOUT,
    ENGINES,
    FAULT_KINDS,
    NOTIFY_MODES,
    RELEASE_ACTIONS,
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
    comparison_pairs,
)


@dataclass(frozen=True)
class Shape:
    """The knobs of a random workload; `generate` draws one configuration from the tuples."""

    groups: int = 10
    attempts: tuple[int, int] = (1, 3)
    slots: tuple[int, ...] = (2, 3, 4)
    strategies: tuple[str, ...] = ("circular", "all_pairs")
    passes: tuple[int, ...] = (1, 1, 2)
    retries: tuple[int, ...] = (0, 1, 2)
    request_timeouts: tuple[float, ...] = (2.0, 2.0, 4.0)
    early_judging: tuple[bool, ...] = (False, True)
    ttls: tuple[float | None, ...] = (None, 10.0, 20.0)
    caps: tuple[int, ...] = (2, 4, 8)
    copies: tuple[int, int] = (1, 2)
    burst_rate: float = 0.5
    cancel_rate: float = 0.15
    regenerate_rate: float = 0.1
    other_prompt_rate: float = 0.03
    conversion_fault_rate: float = 0.01
    replay_rate: float = 0.3
    stale_rate: float = 0.2
    incomplete_rate: float = 0.1
    fault_rate: float = 0.1
    hold_rate: float = 0.06
    release_rate: float = 0.7
    legacy_rate: float = 0.15
    window: int = 4
    advance_rate: float = 0.06
    in_flight_at_shutdown: int = 0
    shutdown: bool = True
    # Shared mode only (two engines on one store): engine kills and notification faults.
    kill_rate: float = 0.0
    notify_rate: float = 0.0
    restart_rate: float = 0.0
    # Runs of posts sent at once (Burst): the chance that the next eligible post joins the run.
    arrival_burst_rate: float = 0.0
    arrival_burst_max: int = 16


# AS-160: 100 groups x 3 attempts x 4 slots, 1-2 copies, 20% cancelled, 10% of comparisons
# failing, cap 8; the last 40 groups are still in flight when the server shuts down.
# Two engines sharing one Redis store: no early judging (it has no effect there), engines
# killed now and then, and notifications lost or duplicated.
SHARED_SHAPE = Shape(
    groups=8, early_judging=(False,), kill_rate=0.03, notify_rate=0.04, restart_rate=0.01
)

# Two engines sharing one Redis store with whole runs of members posted at once at both
# engines (Burst steps). No kills: which engine fills a group in a burst is the store's choice,
# and the model needs the owner only for a kill.
SHARED_BURST_SHAPE = Shape(
    groups=10,
    slots=(3, 4),
    early_judging=(False,),
    copies=(1, 1),
    cancel_rate=0.05,
    regenerate_rate=0.05,
    advance_rate=0.03,
    window=8,
    notify_rate=0.02,
    restart_rate=0.01,
    arrival_burst_rate=0.9,
)

AS160_SHAPE = Shape(
    groups=100,
    attempts=(3, 3),
    slots=(4,),
    caps=(8,),
    ttls=(None,),
    copies=(1, 2),
    cancel_rate=0.2,
    fault_rate=0.1,
    hold_rate=0.0,
    legacy_rate=0.0,
    incomplete_rate=0.0,
    window=8,
    in_flight_at_shutdown=40,
)

_ADVANCES = (0.25, 0.5, 1.0, 2.5, 4.0, 6.0, 12.0)
# A burst joins only groups that started at least this long before their collection deadline,
# so that none of them can have expired by the burst (steps are nudged off deadlines by ticks).
_BURST_MARGIN_S = 1.0


class BurstRules:
    """Which posts may share a burst, so that its answers and every retained order do not depend
    on the order the store applies them in.

    Only posts that join a group still collecting take part: a fresh member of its group's latest
    attempt, as the original answer (no copy, regeneration, other prompt or conversion fault, and
    none of those earlier in the attempt either), while the group is well within its collection
    deadline. Of those, a burst holds at most one that changes more than a member list: the one
    that starts its group (a new record, the old attempt superseded) or fills it (evaluation,
    then its outcome stamped into the retention order). Everything else is order-free, and the
    model keeps one deadline per instant, which two starts or fills at once would share.
    `classify` is fed every step in order; it tracks the time as the runner moves the clock.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.now = 0.0
        self.latest: dict[str, int] = {}
        self.slots: dict[tuple[str, int], set[int]] = {}
        self.started: dict[tuple[str, int], float] = {}
        self.tainted: set[tuple[str, int]] = set()

    def classify(self, step: Step) -> str | None:
        """ "start", "fill" or "member" for a post that may join a burst, else None."""
        if isinstance(step, Burst):
            kinds = [self.classify(post) for post in step.posts]
            return None if None in kinds or sum(k != "member" for k in kinds) > 1 else "burst"
        self.now += TICK + (step.seconds if isinstance(step, Advance) else 0.0)
        if not isinstance(step, Post):
            return None
        key = (step.group, step.attempt)
        slots = self.slots.setdefault(key, set())
        clean = (
            step.task is None
            and len(step.requests) == 1
            and step.variant == 0
            and not step.other_prompt
            and not step.conversion_fault
        )
        latest = self.latest.get(step.group, 0)
        self.latest[step.group] = max(latest, step.attempt)
        kind: str | None = None
        if clean and key not in self.tainted and step.attempt >= latest:
            if not slots:
                kind = "start"
                self.started[key] = self.now
            elif (
                step.slot not in slots
                and len(slots) < self.size
                and self.now - self.started.get(key, -COLLECTION_TIMEOUT)
                < COLLECTION_TIMEOUT - _BURST_MARGIN_S
            ):
                kind = "fill" if len(slots) == self.size - 1 else "member"
        if not clean:
            self.tainted.add(key)
        slots.add(step.slot)
        return kind

    def allows(self, steps: Iterable[Step]) -> bool:
        """Whether every burst among `steps` keeps to the rules (a shrunk scenario may not)."""
        return all(self.classify(step) is not None or not isinstance(step, Burst) for step in steps)


class _Generator:
    """Draws one scenario from a seed: settings, faults, then interleaved group scripts."""

    def __init__(self, seed: int, shape: Shape) -> None:
        self.rng = random.Random(seed)
        self.shape = shape
        rng = self.rng
        self.size = rng.choice(shape.slots)
        self.passes = rng.choice(shape.passes)
        self.attempts_per_comparison = rng.choice(shape.retries) + 1
        strategy = rng.choice(shape.strategies)
        self.pairs = comparison_pairs(strategy, self.size)
        self.settings: dict[str, Any] = {
            "num_rollouts_per_prompt": self.size,
            "comparison_strategy": strategy,
            "num_judges_per_comparison": self.passes,
            "genrm_parse_retries": self.attempts_per_comparison - 1,
            "judge_request_timeout_s": rng.choice(shape.request_timeouts),
            "cohort_result_ttl_s": rng.choice(shape.ttls),
            "max_terminal_cohorts": rng.choice(shape.caps),
            "early_judging": rng.choice(shape.early_judging),
        }
        self.faults: list[Fault] = []
        self.held: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self.next_request = 0

    def ids(self, count: int) -> tuple[int, ...]:
        first = self.next_request
        self.next_request += count
        return tuple(range(first, first + count))

    def draw_faults(self, group: str, attempt: int, hold_pair: bool) -> list[tuple[int, int]]:
        """Faults for one group attempt, drawn once (legacy runs reuse their attempt); returns
        the pairs that are held."""
        if (group, attempt) in self.held:
            return self.held[(group, attempt)]
        rng, shape = self.rng, self.shape
        held: list[tuple[int, int]] = []
        self.held[(group, attempt)] = held
        kinds = [k for k in FAULT_KINDS if k != "flaky" or self._flaky_allowed()]
        for index, pair in enumerate(self.pairs):
            roll = rng.random()
            if (hold_pair and index == 0) or roll < shape.hold_rate:
                self.faults.append(Fault(group, attempt, pair, "hold"))
                held.append(pair)
            elif roll < shape.hold_rate + shape.fault_rate:
                kind = rng.choice(kinds)
                times = (
                    rng.randint(1, self.attempts_per_comparison - 1) if kind == "flaky" else None
                )
                self.faults.append(Fault(group, attempt, pair, kind, times))
        return held

    def _flaky_allowed(self) -> bool:
        # Passes of one pair share the judge's counter; failures-then-verdict only stays exact
        # with one pass.
        return self.passes == 1 and self.attempts_per_comparison > 1

    def attempt_script(
        self, group: str, task: int | None, attempt: int, variant: int, *, tail: str | None
    ) -> list[Step]:
        """One attempt of one group: posts, copies, disconnects, regenerations, releases."""
        rng, shape = self.rng, self.shape
        held = self.draw_faults(group, attempt, hold_pair=tail == "evaluating")
        quality = [rng.randint(1, 5) for _ in range(self.size)]
        order = list(range(self.size))
        rng.shuffle(order)
        if tail == "collecting":
            order = order[: rng.randint(1, self.size - 1)]
        elif tail is None and rng.random() < shape.incomplete_rate:
            order = order[: rng.randint(1, self.size - 1)]
        steps: list[Step] = []
        later: list[Step] = []

        def post(slot: int, count: int = 1, **options: Any) -> Post:
            return Post(
                self.ids(count),
                group,
                attempt,
                slot,
                options.pop("quality", quality[slot]),
                options.pop("variant", variant),
                task,
                **options,
            )

        for slot in order:
            regenerated = variant + 1
            if rng.random() < shape.regenerate_rate / 2:
                steps.append(post(slot, variant=regenerated, quality=rng.randint(1, 5)))
            copies = rng.randint(*shape.copies)
            burst = task is None and copies > 1 and rng.random() < shape.burst_rate
            fault = tail is None and rng.random() < shape.conversion_fault_rate
            first = post(slot, copies if burst else 1, conversion_fault=fault)
            steps.append(first)
            if rng.random() < shape.cancel_rate:
                steps.append(Disconnect(first.requests[0]))
            if copies > 1 and not burst:
                later.append(post(slot))
            if rng.random() < shape.regenerate_rate / 2:
                later.append(post(slot, variant=regenerated, quality=rng.randint(1, 5)))
            if rng.random() < shape.other_prompt_rate:
                later.append(post(slot, other_prompt=True))
        rng.shuffle(later)
        steps.extend(later)
        if tail is None:
            for pair in held:
                if rng.random() < shape.release_rate:
                    steps.append(Release(group, attempt, pair, rng.choice(RELEASE_ACTIONS)))
            if rng.random() < shape.replay_rate:
                steps.append(post(rng.randrange(self.size)))
        return steps

    def group_script(self, index: int, *, tail: bool) -> list[Step]:
        rng, shape = self.rng, self.shape
        legacy = not tail and rng.random() < shape.legacy_rate
        attempts = rng.randint(*shape.attempts)
        group = f"t{index}" if legacy else f"g{index}"
        task = index if legacy else None
        steps: list[Step] = []
        for run in range(attempts):
            # A legacy group keeps attempt 0 and sends new answers for each run (C-91).
            attempt, variant = (0, 10 * run) if legacy else (run, 0)
            last_of_tail = None
            if tail and run == attempts - 1:
                last_of_tail = rng.choice(("collecting", "evaluating"))
            steps.extend(self.attempt_script(group, task, attempt, variant, tail=last_of_tail))
            if run > 0 and not legacy and rng.random() < shape.stale_rate:
                slot = rng.randrange(self.size)
                steps.append(Post(self.ids(1), group, run - 1, slot, 1, 0, None))
        return steps

    def interleave(self, scripts: Iterable[list[Step]], window: int, *, clock: bool) -> list[Step]:
        rng = self.rng
        pending = list(scripts)
        pending.reverse()
        open_scripts: list[list[Step]] = []
        steps: list[Step] = []
        while pending or open_scripts:
            while pending and len(open_scripts) < window:
                open_scripts.append(pending.pop())
            if clock and rng.random() < self.shape.advance_rate:
                steps.append(Advance(rng.choice(_ADVANCES)))
                continue
            # Drawn only when asked for, so that other shapes keep their scenarios.
            if self.shape.kill_rate and rng.random() < self.shape.kill_rate:
                steps.append(Kill(rng.randrange(ENGINES)))
                continue
            if self.shape.notify_rate and rng.random() < self.shape.notify_rate:
                steps.append(Notify(rng.randrange(ENGINES), rng.choice(NOTIFY_MODES)))
                continue
            if self.shape.restart_rate and rng.random() < self.shape.restart_rate:
                steps.append(RestartStore())
                continue
            script = rng.choice(open_scripts)
            steps.append(script.pop(0))
            if not script:
                open_scripts.remove(script)
        return steps

    def bursts(self, steps: list[Step]) -> list[Step]:
        """Join runs of consecutive posts into bursts that `BurstRules` allows."""
        rng, shape = self.rng, self.shape
        rules = BurstRules(self.size)
        out: list[Step] = []
        run: list[Post] = []
        run_special = False

        def flush() -> None:
            nonlocal run_special
            if len(run) > 1:
                out.append(Burst(tuple(run)))
            else:
                out.extend(run)
            run.clear()
            run_special = False

        for step in steps:
            kind = rules.classify(step)
            if kind is None:
                flush()
                out.append(step)
                continue
            assert isinstance(step, Post)
            special = kind != "member"
            joins = (
                bool(run)
                and len(run) < shape.arrival_burst_max
                and not (special and run_special)
                and all(p.group != step.group or p.attempt == step.attempt for p in run)
                and rng.random() < shape.arrival_burst_rate
            )
            if not joins:
                flush()
            run.append(step)
            run_special = run_special or special
        flush()
        return out

    def scenario(self, seed: int) -> Scenario:
        shape = self.shape
        tail = min(shape.in_flight_at_shutdown, shape.groups)
        regular = [self.group_script(k, tail=False) for k in range(shape.groups - tail)]
        steps = self.interleave(regular, shape.window, clock=True)
        if shape.arrival_burst_rate:
            steps = self.bursts(steps)
        if tail:
            tails = [
                self.group_script(k, tail=True) for k in range(shape.groups - tail, shape.groups)
            ]
            steps += self.interleave(tails, tail, clock=False)
        if shape.shutdown:
            steps.append(Shutdown())
            steps.append(Post(self.ids(1), "g0", 0, 0))
        return Scenario(seed, self.settings, tuple(self.faults), tuple(steps))


def generate(seed: int, shape: Shape | None = None) -> Scenario:
    """A random workload, the same for the same seed and shape."""
    return _Generator(seed, shape or Shape()).scenario(seed)
