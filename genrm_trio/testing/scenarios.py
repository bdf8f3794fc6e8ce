"""Seeded race scenarios for the group engine: a workload generator, a model of SPEC §5 that
predicts every answer, and a step runner that checks every invariant after every step.

Theory of operation
-------------------
`generate(seed, shape)` draws a configuration, a judge fault per (group attempt, pair), and a
list of steps: posts of members (with duplicate copies, regenerated answers, another prompt, an
injected conversion fault), client disconnects, releases of held judge calls, clock advances
and a shutdown. The same seed always gives the same scenario.

`run_scenario(scenario)` plays the steps on a `MockClock` that moves only when the runner moves
it, so every step lands on a known instant: after each step it waits until every task is
blocked, then feeds the same step to `_Model` and compares. Deadlines that fall between two
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
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import math
import multiprocessing
import random
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from itertools import repeat
from typing import Any, Literal, Protocol

import msgspec
import trio
import trio.testing

from genrm_trio.config import Config, config_from_mapping
from genrm_trio.core import messages
from genrm_trio.core.groups import Masked, Outcome, Rejected, Scored
from genrm_trio.http.bodies import METRIC_KEYS
from genrm_trio.http.parsing import parse_verify_body
from genrm_trio.judge.transport import CLOSED_BEFORE_REPLY
from genrm_trio.runtime.engine import Engine
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.testing import invariants
from genrm_trio.testing.controlled_judge import ControlledJudge, group_marker
from genrm_trio.testing.fake_judge import verdict_for_qualities
from genrm_trio.testing.fixtures import GenRMServer, serve
from genrm_trio.testing.harness import JUDGE_URL, SCENARIO_DEFAULTS, Reply
from genrm_trio.testing.instrument import CriticalSectionInstrument
from genrm_trio.testing.invariants import CallKey, Expected, Seen, Violation

__all__ = [
    "AS160_SHAPE",
    "Advance",
    "Disconnect",
    "Fault",
    "Post",
    "Release",
    "Scenario",
    "ScenarioReport",
    "Shape",
    "Shutdown",
    "Step",
    "Via",
    "generate",
    "play",
    "run_scenario",
    "run_seeds",
    "shrink",
]

# Every time in a scenario is a multiple of TICK, so sums stay exact and ties are real ties.
TICK = 1 / 1024
COLLECTION_TIMEOUT = 5.0
EVALUATION_TIMEOUT = 3.0
CONVERSION_FAULT = "injected conversion fault"
FAULT_KINDS = (
    "unparseable",
    "empty",
    "transient",
    "rate_limited",
    "flaky",
    "fatal",
    "non_json",
    "close",
    "truncated",
    "budget",
    "hang",
)
RELEASE_ACTIONS = (None, "fatal", "transient")
Via = Literal["engine", "http"]


# ---- steps ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Post:
    """Post one member; several request ids send identical copies at the same instant."""

    requests: tuple[int, ...]
    group: str
    attempt: int
    slot: int
    quality: int = 3
    variant: int = 0  # 0 is the original answer; any other number a regenerated one
    task: int | None = None  # a legacy group: `_ng_task_index`, no `_ng_group_id`
    other_prompt: bool = False
    conversion_fault: bool = False

    @property
    def marker(self) -> str:
        """The group name the judge sees; another prompt is another legacy group."""
        return self.group + ("~" if self.other_prompt else "")


@dataclass(frozen=True)
class Disconnect:
    request: int


@dataclass(frozen=True)
class Release:
    """Answer the held judge calls of one pair: normally, or with a fault."""

    group: str
    attempt: int
    pair: tuple[int, int]
    action: str | None = None  # None, "fatal" (HTTP 400) or "transient" (HTTP 500)


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Shutdown:
    pass


Step = Post | Disconnect | Release | Advance | Shutdown
_STEP_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls for cls in (Post, Disconnect, Release, Advance, Shutdown)
}


@dataclass(frozen=True)
class Fault:
    """How the judge treats every pass of one pair of one group attempt."""

    group: str
    attempt: int
    pair: tuple[int, int]
    kind: str  # one of FAULT_KINDS, or "hold"
    times: int | None = None  # "flaky": failures before a verdict


@dataclass(frozen=True)
class Scenario:
    seed: int
    settings: Mapping[str, Any]
    faults: tuple[Fault, ...]
    steps: tuple[Step, ...]

    def to_json(self) -> str:
        steps = [{"step": type(s).__name__, **asdict(s)} for s in self.steps]
        faults = [asdict(f) for f in self.faults]
        payload = {"seed": self.seed, "settings": dict(self.settings), "faults": faults}
        return json.dumps({**payload, "steps": steps}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        data = json.loads(text)
        steps = []
        for raw in data["steps"]:
            kind = _STEP_TYPES[raw.pop("step")]
            if kind is Post:
                raw["requests"] = tuple(raw["requests"])
            if kind is Release:
                raw["pair"] = tuple(raw["pair"])
            steps.append(kind(**raw))
        faults = tuple(Fault(**{**f, "pair": tuple(f["pair"])}) for f in data["faults"])
        return cls(data["seed"], data["settings"], faults, tuple(steps))


def describe_step(step: Step) -> str:
    if isinstance(step, Post):
        who = f"task {step.task}" if step.task is not None else f"group {step.group!r}"
        extras = [f"q={step.quality}"]
        if step.variant:
            extras.append(f"regenerated#{step.variant}")
        if step.other_prompt:
            extras.append("another prompt")
        if step.conversion_fault:
            extras.append("conversion fault")
        copies = f" x{len(step.requests)}" if len(step.requests) > 1 else ""
        ids = ",".join(str(r) for r in step.requests)
        return (
            f"post r{ids}{copies}: {who} attempt {step.attempt} slot {step.slot} "
            f"({', '.join(extras)})"
        )
    if isinstance(step, Disconnect):
        return f"disconnect r{step.request}"
    if isinstance(step, Release):
        how = f" with {step.action}" if step.action else ""
        return f"release {step.group}:{step.attempt} pair {step.pair}{how}"
    if isinstance(step, Advance):
        return f"advance {step.seconds}s"
    return "shutdown"


# ---- the generator ----------------------------------------------------------------------------


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


# AS-160: 100 groups x 3 attempts x 4 slots, 1-2 copies, 20% cancelled, 10% of comparisons
# failing, cap 8; the last 40 groups are still in flight when the server shuts down.
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


def _pairs(strategy: str, size: int) -> list[tuple[int, int]]:
    if strategy == "circular":
        return [(i, (i + 1) % size) for i in range(size)]
    return [(i, j) for i in range(size) for j in range(i + 1, size)]


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
        self.pairs = _pairs(strategy, self.size)
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
            script = rng.choice(open_scripts)
            steps.append(script.pop(0))
            if not script:
                open_scripts.remove(script)
        return steps

    def scenario(self, seed: int) -> Scenario:
        shape = self.shape
        tail = min(shape.in_flight_at_shutdown, shape.groups)
        regular = [self.group_script(k, tail=False) for k in range(shape.groups - tail)]
        steps = self.interleave(regular, shape.window, clock=True)
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


# ---- what a request looks like ------------------------------------------------------------------


def prompt(post: Post) -> str:
    return f"{'another ' if post.other_prompt else ''}prompt for {post.group}"


def request_body(post: Post) -> dict[str, Any]:
    """The /verify body of a post: SPEC §10's member with its group marker in the answer."""
    again = f" again#{post.variant}" if post.variant else ""
    text = (
        f"answer-{post.slot}{again} [[q={post.quality}]] {group_marker(post.marker, post.attempt)}"
    )
    body: dict[str, Any] = {
        "responses_create_params": {"input": prompt(post)},
        "response": {
            "id": f"r-{post.marker}-{post.attempt}-{post.slot}-{post.variant}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                }
            ],
        },
    }
    if post.task is None:
        body["_ng_group_id"] = post.group
    else:
        body["_ng_task_index"] = post.task
    body["_ng_group_attempt"] = post.attempt
    body["_ng_rollout_index"] = post.slot
    return body


def scenario_config(settings: Mapping[str, Any]) -> Config:
    return config_from_mapping(
        {
            **SCENARIO_DEFAULTS,
            "cohort_collection_timeout_s": COLLECTION_TIMEOUT,
            "cohort_evaluation_timeout_s": EVALUATION_TIMEOUT,
            "judge_max_concurrency": 4096,
            **settings,
        }
    )


# ---- the model --------------------------------------------------------------------------------

_Verdict = tuple[float, float, float]


@dataclass(eq=False)
class _Comparison:
    index: int
    first: int
    second: int
    judge_pass: int
    state: Literal["idle", "running", "held", "hang", "done", "cancelled"] = "idle"
    outcomes: list[str] = field(default_factory=list)  # attempt classes so far
    deadline: float = math.inf  # when a held or hanging attempt times out
    verdict: _Verdict | None = None
    failure: str | None = None  # the judge error text, or its known beginning


@dataclass(eq=False)
class _Member:
    slot: int
    identity: tuple[str, int, int, int, int]
    quality: int
    waiters: list[int]
    outcome: Expected | None = None


@dataclass(eq=False)
class _Record:
    key: str
    group: str | None  # explicit group id
    marker: str
    attempt: int
    digest: str
    legacy_key: str | None
    started_at: float
    phase: Literal["collecting", "evaluating", "completed", "failed"] = "collecting"
    members: dict[int, _Member] = field(default_factory=dict)
    comparisons: list[_Comparison] = field(default_factory=list)
    evaluation_started: float = math.inf
    failure: Expected | None = None

    @property
    def active(self) -> bool:
        return self.phase in ("collecting", "evaluating")


class _Model:
    """SPEC §5 and §3.3 written out again, small and slow, for the answers a run must give."""

    def __init__(self, config: Config, faults: Iterable[Fault]) -> None:
        self.size = config.num_rollouts_per_prompt
        self.early = config.early_judging
        self.ttl = config.cohort_result_ttl_s
        self.cap = config.max_terminal_cohorts
        self.request_timeout = config.judge_request_timeout_s
        self.max_attempts = config.genrm_parse_retries + 1
        self.default = (config.default_score, config.default_score, config.default_ranking)
        self.max_tokens = str(config.genrm_responses_create_params.get("max_output_tokens"))
        self.url = JUDGE_URL + "/chat/completions"
        pairs = _pairs(config.comparison_strategy, self.size)
        passes = config.num_judges_per_comparison
        self.plan = [
            (p * len(pairs) + k, i, j, p) for p in range(passes) for k, (i, j) in enumerate(pairs)
        ]
        self.controls: dict[tuple[str, int, tuple[int, int]], list[Any]] = {}
        for fault in faults:
            uses = passes if fault.kind == "hold" else fault.times
            where = (fault.group, fault.attempt, fault.pair)
            if where in self.controls:
                raise ValueError(
                    f"two faults for group {fault.group!r} attempt {fault.attempt} "
                    f"pair {fault.pair}"
                )
            self.controls[where] = [fault.kind, uses]
        self.closed = False
        self.explicit: dict[str, _Record] = {}
        self.legacy: dict[str, _Record] = {}
        self.watermarks: dict[str, tuple[int, str]] = {}
        self.terminal: OrderedDict[int, tuple[float, _Record]] = OrderedDict()
        self.idle: OrderedDict[str, float] = OrderedDict()
        self.active: dict[int, _Record] = {}
        self.waiting: dict[int, tuple[_Record, int]] = {}
        self.calls: Counter[CallKey] = Counter()
        self.counts: Counter[str] = Counter()
        # per step: filled by the model, emptied by the runner after each check
        self.answered: dict[int, Expected] = {}
        self.cancelled: set[int] = set()
        self.changed_calls: set[CallKey] = set()
        self.prunes = 0
        self.removed = 0

    # -- time ------------------------------------------------------------------------------

    def deadlines(self) -> dict[float, _Record]:
        """Every instant at which something will happen on its own, and to which record."""
        found: dict[float, _Record] = {}
        for record in self.active.values():
            ends = self._end_of_phase(record)
            found[ends] = record
            for comparison in record.comparisons:
                if comparison.state in ("held", "hang") and comparison.deadline < ends:
                    found[comparison.deadline] = record
        return found

    def _end_of_phase(self, record: _Record) -> float:
        if record.phase == "collecting":
            return record.started_at + COLLECTION_TIMEOUT
        return record.evaluation_started + EVALUATION_TIMEOUT

    def collides(self, now: float) -> bool:
        """Would a step at `now` meet a deadline, or start one at an instant already taken?

        Every timeout of a held or hung call counts, even one its group's deadline will come
        before: the group may fill and move its deadline past it.
        """
        taken = set(self.deadlines())
        for record in self.active.values():
            taken.update(c.deadline for c in record.comparisons if c.state in ("held", "hang"))
        offsets = (0.0, COLLECTION_TIMEOUT, EVALUATION_TIMEOUT, self.request_timeout)
        return any(now + offset in taken for offset in offsets)

    def expire(self, now: float) -> None:
        record = self.deadlines().get(now)
        if record is None:
            return
        if now == self._end_of_phase(record) and record.phase == "collecting":
            text = messages.not_collected(record.key, self.size, COLLECTION_TIMEOUT)
            self._fail(record, "cohort", text, now)
            return
        if now == self._end_of_phase(record):
            done = [c for c in record.comparisons if c.state == "done"]
            failed = sum(1 for c in done if c.failure is not None)
            text = messages.evaluation_deadline(
                EVALUATION_TIMEOUT, len(done), len(record.comparisons), failed
            )
            self._fail(record, "judge", text, now)
            return
        for comparison in record.comparisons:
            if comparison.state in ("held", "hang") and comparison.deadline == now:
                cause = f"TimeoutError: no complete reply within {self._seconds()}s"
                self._conclude(record, comparison, "fatal", cause, now)
        self._finish_if_done(record, now)

    def _seconds(self) -> str:
        return messages.format_seconds(self.request_timeout)

    # -- arrivals (C-40 … C-44) ---------------------------------------------------------

    def post(self, post: Post, now: float) -> None:
        starts: list[_Record] = []
        for request in post.requests:
            self._arrive(post, request, now, starts)
        for record in starts:
            self._start_ready(record, now)

    def _answer(self, request: int, expected: Expected) -> None:
        self.answered[request] = expected

    def _arrive(self, post: Post, request: int, now: float, starts: list[_Record]) -> None:
        if self.closed:
            self._answer(request, Expected("rejected", 503, messages.SHUTTING_DOWN))
            return
        self._prune(now)
        digest = _digest(prompt(post))
        if post.task is not None:
            key = f"task_idx::{post.task}::{digest}::group_attempt::{post.attempt}"
            record = self.legacy.get(key)
            if record is None:
                record = self._new_record(key, None, post, digest, now)
                record.legacy_key = key
                self.legacy[key] = record
            self._member_step(record, post, request, now, starts)
            return
        gid = post.group
        watermark = self.watermarks.get(gid)
        record = self.explicit.get(gid)
        recreated = None
        if watermark is None and record is not None:
            watermark = recreated = (record.attempt, record.digest)
        if (watermark is not None and watermark[1] != digest) or (
            record is not None and record.digest != digest
        ):
            self._answer(request, Expected("rejected", 409, messages.inconsistent_prompt(gid)))
            return
        if watermark is not None and post.attempt < watermark[0]:
            text = messages.superseded(gid, post.attempt, watermark[0])
            self._answer(request, Expected("rejected", 409, text))
            return
        if watermark is None or post.attempt > watermark[0]:
            if record is not None:
                self._supersede(record, post.attempt, now)
            self.watermarks[gid] = (post.attempt, digest)
            self.idle.pop(gid, None)
            key = f"group_id::{gid}::group_attempt::{post.attempt}"
            record = self._new_record(key, gid, post, digest, now)
            self.explicit[gid] = record
            self._member_step(record, post, request, now, starts)
            return
        if record is None or record.attempt != post.attempt:
            text = messages.not_retained(gid, post.attempt)
            self._answer(request, Expected("rejected", 409, text))
            return
        self._member_step(record, post, request, now, starts)
        answer = self.answered.get(request)
        if record.active or (answer is not None and answer.status == 409):
            return
        # An accepted request that reached the finished record refreshes the watermark only.
        if recreated is not None:
            self.watermarks[gid] = recreated
        self.idle[gid] = now
        self.idle.move_to_end(gid)

    def _new_record(
        self, key: str, gid: str | None, post: Post, digest: str, now: float
    ) -> _Record:
        record = _Record(key, gid, post.marker, post.attempt, digest, None, now)
        record.comparisons = [_Comparison(*entry) for entry in self.plan]
        self.active[id(record)] = record
        self.counts["records"] += 1
        return record

    def _member_step(
        self, record: _Record, post: Post, request: int, now: float, starts: list[_Record]
    ) -> None:
        if record.phase == "failed":
            assert record.failure is not None
            self._answer(request, record.failure)
            return
        # What the response (and so its fingerprint) is made of, see `request_body`.
        identity = (post.marker, post.attempt, post.slot, post.variant, post.quality)
        member = record.members.get(post.slot)
        if member is not None:
            if member.outcome is not None and member.outcome.kind == "masked":
                self._answer(request, member.outcome)
            elif member.identity != identity:
                text = messages.different_response(record.key, post.slot)
                self._answer(request, Expected("rejected", 409, text))
            elif record.phase == "completed":
                assert member.outcome is not None
                self._answer(request, member.outcome)
            else:
                member.waiters.append(request)
                self.waiting[request] = (record, post.slot)
            return
        if record.phase != "collecting":
            text = messages.phase_closed(record.key, record.phase, post.slot)
            self._answer(request, Expected("rejected", 409, text))
            return
        if post.conversion_fault:
            text = f"GenRM cohort input conversion failed: RuntimeError: {CONVERSION_FAULT}"
            self._fail(record, "cohort", text, now)
            assert record.failure is not None
            self._answer(request, record.failure)
            return
        record.members[post.slot] = _Member(post.slot, identity, post.quality, [request])
        self.waiting[request] = (record, post.slot)
        if len(record.members) == self.size:
            record.phase = "evaluating"
            record.evaluation_started = now
            starts.append(record)
        elif self.early:
            starts.append(record)

    def disconnect(self, request: int) -> None:
        place = self.waiting.pop(request, None)
        if place is None:
            return
        record, slot = place
        record.members[slot].waiters.remove(request)
        self.cancelled.add(request)

    # -- judging (J-20 … J-24, C-60 … C-65, M-1 … M-6) ----------------------------------

    def _start_ready(self, record: _Record, now: float) -> None:
        """Judge every comparison not started yet whose two slots are filled (C-60; early
        judging starts them before the group is full)."""
        if not record.active:
            return
        members = record.members
        for comparison in record.comparisons:
            if comparison.state == "idle" and comparison.first in members:
                if comparison.second in members:
                    comparison.state = "running"
                    self._next_attempt(record, comparison, now)
        self._finish_if_done(record, now)

    def _next_attempt(self, record: _Record, comparison: _Comparison, now: float) -> None:
        """Make judge calls until the comparison concludes or waits on a held or hung call."""
        pair = (comparison.first, comparison.second)
        while comparison.state == "running":
            key: CallKey = (record.marker, record.attempt, pair)
            self.calls[key] += 1
            self.changed_calls.add(key)
            self.counts["judge calls"] += 1
            kind = self._take_control(record, pair)
            if kind in ("hold", "hang"):
                comparison.state = "held" if kind == "hold" else "hang"
                comparison.deadline = now + self.request_timeout
                return
            self._conclude(record, comparison, *self._attempt_outcome(kind), now)

    def _take_control(self, record: _Record, pair: tuple[int, int]) -> str | None:
        control = self.controls.get((record.marker, record.attempt, pair))
        if control is None or control[1] == 0:
            return None
        if control[1] is not None:
            control[1] -= 1
        return str(control[0])

    def _attempt_outcome(self, kind: str | None) -> tuple[str, str]:
        """(class, cause) of one judge attempt under a fault kind (J-21)."""
        injected = '{"error":"injected"}'
        if kind in ("transient", "rate_limited", "flaky"):
            status = {"transient": 500, "rate_limited": 429, "flaky": 503}[kind]
            return "transient", f"HTTPStatusError: HTTP {status}; response={injected}"
        if kind == "fatal":
            return "fatal", f"HTTPStatusError: HTTP 400; response={injected}"
        if kind == "non_json":
            return "fatal", "JSONDecodeError: judge reply is not valid JSON: <html>not json</html>"
        if kind == "close":
            return "transient", f"RemoteProtocolError: {CLOSED_BEFORE_REPLY}"
        if kind == "truncated":
            return "transient", "RemoteProtocolError: the judge closed the connection after"
        if kind == "budget":
            return "exhausted", ""
        if kind == "empty":
            return "unusable", ""
        if kind == "unparseable":
            return "unparseable", ""
        return "verdict", ""

    def _conclude(
        self, record: _Record, comparison: _Comparison, outcome: str, cause: str, now: float
    ) -> None:
        """One attempt ended with `outcome`: retry, or settle the comparison (J-22 … J-24)."""
        comparison.outcomes.append(outcome)
        comparison.state = "running"
        attempt = len(comparison.outcomes)
        if outcome == "verdict":
            quality = {slot: m.quality for slot, m in record.members.items()}
            # The fake judge's rule, with no position bias and a tie ranking of 3.5.
            comparison.verdict = verdict_for_qualities(
                quality[comparison.first], quality[comparison.second]
            )
        elif outcome == "fatal":
            comparison.failure = self._judge_error(comparison, attempt, cause)
        elif attempt == self.max_attempts:
            if outcome == "transient":
                comparison.failure = self._judge_error(comparison, attempt, cause)
            elif "unparseable" in comparison.outcomes:
                comparison.verdict = self.default
            else:
                exhausted = comparison.outcomes.count("exhausted")
                cause = f"Judge returned no completed answer after {attempt} attempts"
                if exhausted:
                    cause += f" ({exhausted} of them exhausted max_output_tokens={self.max_tokens}"
                else:
                    cause += "; last reply: empty verdict text"
                comparison.failure = self._judge_error(comparison, attempt, cause)
        else:
            return  # retried at once: the backoff base is 0
        comparison.state = "done"

    def _judge_error(self, comparison: _Comparison, attempt: int, cause: str) -> str:
        return (
            f"GenRM judge {self.url} pair=({comparison.first}, {comparison.second}) "
            f"judge={comparison.judge_pass} attempt={attempt}/{self.max_attempts} "
            f"deadline={self._seconds()}s: {cause}"
        )

    def release(self, step: Release, now: float) -> None:
        for record in list(self.active.values()):
            if record.marker != step.group or record.attempt != step.attempt:
                continue
            for comparison in record.comparisons:
                if comparison.state != "held" or (comparison.first, comparison.second) != step.pair:
                    continue
                kind = {"fatal": "fatal", "transient": "transient"}.get(step.action or "")
                self._conclude(record, comparison, *self._attempt_outcome(kind), now)
                self._next_attempt(record, comparison, now)
            self._finish_if_done(record, now)

    def _finish_if_done(self, record: _Record, now: float) -> None:
        if record.phase != "evaluating":
            return
        if any(c.state != "done" for c in record.comparisons):
            return
        failed = [c for c in record.comparisons if c.failure is not None]
        total = len(record.comparisons)
        masked: dict[int, str] = {}
        for comparison in failed:
            assert comparison.failure is not None
            for slot in (comparison.first, comparison.second):
                masked.setdefault(slot, comparison.failure)
        if len(masked) == self.size:
            assert failed[0].failure is not None
            text = messages.every_rollout_masked(record.key, len(failed), total, failed[0].failure)
            self._fail(record, "judge", text, now, prefix=True)
            return
        rewards, metrics = self._score(record, set(masked))
        metrics["genrm_failed_comparison_rate_per_group"] = len(failed) / total
        metrics["genrm_masked_rollout_rate_per_group"] = len(masked) / self.size
        for slot, member in record.members.items():
            if slot in masked:
                text = messages.rollout_masked(slot, len(failed), total, masked[slot])
                member.outcome = Expected("masked", 200, text, prefix=True)
            else:
                member.outcome = Expected("scored", reward=rewards[slot], metrics=metrics)
        record.phase = "completed"
        self.counts["groups completed with masks" if masked else "groups completed"] += 1
        for member in record.members.values():
            assert member.outcome is not None
            self._resolve(member.waiters, member.outcome)
        self._terminal(record, now)

    def _score(
        self, record: _Record, masked: set[int]
    ) -> tuple[dict[int, float], dict[str, float]]:
        """S-30 … S-33 with no length or style adjustments: a mean per slot, the metrics."""
        totals = dict.fromkeys(range(self.size), 0.0)
        counts = dict.fromkeys(range(self.size), 0)
        scores: list[float] = []
        ties = 0
        done = [c for c in record.comparisons if c.verdict is not None]
        for comparison in done:
            assert comparison.verdict is not None
            first, second, ranking = comparison.verdict
            scores += [first, second]
            if first == second:
                ties += 1
                first, second = first + (3.5 - ranking), second - (3.5 - ranking)
            totals[comparison.first] += first
            totals[comparison.second] += second
            counts[comparison.first] += 1
            counts[comparison.second] += 1
        rewards = {
            k: totals[k] / counts[k] if counts[k] else self.default[0]
            for k in range(self.size)
            if k not in masked
        }
        mean = sum(scores) / len(scores)
        std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
        return rewards, {
            "mean_individual_score": mean,
            "std_individual_score": std,
            "tiebreak_usage_rate": ties / len(done),
        }

    # -- failure, terminal state, retention (C-80 … C-92, R-1 … R-4) ----------------------

    def _fail(
        self, record: _Record, kind: str, text: str, now: float, *, prefix: bool = False
    ) -> None:
        if not record.active:
            return
        suffix = messages.MIGRATION_SUFFIX if record.group is None else ""
        if kind == "judge":
            record.failure = Expected("masked", 200, text, prefix=prefix, suffix=suffix)
        else:
            record.failure = Expected("rejected", 503, text, suffix=suffix)
        record.phase = "failed"
        self.counts[f"groups failed ({kind})"] += 1
        for comparison in record.comparisons:
            if comparison.state in ("held", "hang", "running"):
                comparison.state = "cancelled"
        for member in record.members.values():
            self._resolve(member.waiters, record.failure)
        self._terminal(record, now)

    def _resolve(self, waiters: list[int], outcome: Expected) -> None:
        for request in waiters:
            self.waiting.pop(request, None)
            self._answer(request, outcome)
        waiters.clear()

    def _terminal(self, record: _Record, now: float) -> None:
        self.active.pop(id(record), None)
        if record.group is None and record.phase == "completed":
            if self.legacy.get(record.legacy_key or "") is record:
                del self.legacy[record.legacy_key or ""]
            return
        self.terminal[id(record)] = (now, record)
        if record.group is not None:
            watermark = self.watermarks.get(record.group)
            if watermark is not None and watermark[0] == record.attempt:
                self.idle[record.group] = now
                self.idle.move_to_end(record.group)

    def _supersede(self, record: _Record, attempt: int, now: float) -> None:
        assert record.group is not None
        if record.active:
            text = messages.superseded(record.group, record.attempt, attempt)
            self._fail(record, "cohort", text, now)
            self.counts["superseded while active"] += 1
        self.terminal.pop(id(record), None)
        if self.explicit.get(record.group) is record:
            del self.explicit[record.group]

    def _prune(self, now: float) -> None:
        self.prunes += 1
        while self.terminal:
            stamped, record = next(iter(self.terminal.values()))
            if not self._expired(now, stamped, len(self.terminal)):
                break
            self.terminal.popitem(last=False)
            self.removed += 1
            self.counts["results pruned"] += 1
            if record.group is not None:
                if self.explicit.get(record.group) is record:
                    del self.explicit[record.group]
            elif self.legacy.get(record.legacy_key or "") is record:
                del self.legacy[record.legacy_key or ""]
        while self.idle:
            gid, stamped = next(iter(self.idle.items()))
            if not self._expired(now, stamped, len(self.idle)):
                break
            self.idle.popitem(last=False)
            self.removed += 1
            self.counts["watermarks pruned"] += 1
            self.watermarks.pop(gid, None)

    def _expired(self, now: float, stamped: float, entries: int) -> bool:
        return (self.ttl is not None and now - stamped >= self.ttl) or entries > self.cap

    def shutdown(self, now: float) -> None:
        if self.closed:
            return
        self.closed = True
        for record in list(self.active.values()):
            self._fail(record, "cohort", messages.SHUTTING_DOWN, now)
        self.explicit.clear()
        self.legacy.clear()
        self.watermarks.clear()
        self.terminal.clear()
        self.idle.clear()

    # -- what statistics() must say -------------------------------------------------------

    def statistics(self) -> dict[str, int]:
        active = list(self.active.values())
        return {
            "collecting": sum(1 for r in active if r.phase == "collecting"),
            "evaluating": sum(1 for r in active if r.phase == "evaluating"),
            "retained_records": len(self.terminal),
            "watermarks": len(self.watermarks),
            "idle_entries": len(self.idle),
            "waiters": len(self.waiting),
            "owned_tasks": len(active),
            "judge_in_flight": self.in_flight(),
        }

    def in_flight(self) -> int:
        return sum(
            1
            for record in self.active.values()
            for comparison in record.comparisons
            if comparison.state in ("held", "hang")
        )


def _digest(text: str) -> str:
    canonical = json.dumps(
        {"input": text, "principle": None}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


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
        self.model = _Model(self.config, scenario.faults)
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


def _run_once(scenario: Scenario, via: Via, quiet: bool) -> ScenarioReport:
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


def run_scenario(
    scenario: Scenario,
    *,
    via: Via = "engine",
    shrink_failures: bool = True,
    quiet: bool = True,
) -> ScenarioReport:
    """Play a scenario in a fresh Trio run; a failing run is shrunk to a minimal reproduction.

    Call it from synchronous code (it starts its own `trio.run`); from async code use `play`.
    """
    report = _run_once(scenario, via, quiet)
    if report.violations and shrink_failures:
        # The run stops at the step that broke an invariant; later steps cannot matter.
        shorter = replace(scenario, steps=scenario.steps[: max(1, report.steps_run)])
        report.minimal = shrink(shorter, report.violations[0].invariant, via=via, quiet=quiet)
        report.minimal_violations = _run_once(report.minimal, via, quiet).violations
    return report


def shrink(
    scenario: Scenario,
    invariant: str,
    *,
    via: Via = "engine",
    budget: int = 300,
    quiet: bool = True,
) -> Scenario:
    """The shortest sub-list of steps found that still breaks `invariant` (greedy chunk removal)."""

    def fails(steps: list[Step]) -> bool:
        candidate = replace(scenario, steps=tuple(steps))
        report = _run_once(candidate, via, quiet)
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
    used = {(s.marker, s.attempt) for s in steps if isinstance(s, Post)}
    faults = tuple(f for f in scenario.faults if (f.group, f.attempt) in used)
    return replace(scenario, steps=tuple(steps), faults=faults)


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
