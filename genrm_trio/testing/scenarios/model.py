"""The model a run is checked against: §5 and §3.3 written out again, small and slow,
predicting every answer, judge call, statistic and retention index after each step."""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.fakes.judge import verdict_for_qualities
from genrm_trio.judge.transport import CLOSED_BEFORE_REPLY
from genrm_trio.testing._invariants import CallKey, Expected
from genrm_trio.testing.harness import JUDGE_URL
from genrm_trio.testing.scenarios.steps import (
    COLLECTION_TIMEOUT,
    CONVERSION_FAULT,
    EVALUATION_TIMEOUT,
    Fault,
    Post,
    Release,
    comparison_pairs,
    prompt,
)

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
    owner: int | None = None  # shared mode: the engine that claimed the evaluation
    orphaned: bool = False  # shared mode: its owner died; the group waits for its lease

    @property
    def active(self) -> bool:
        return self.phase in ("collecting", "evaluating")


class Model:
    """§5 and §3.3 written out again, small and slow, for the answers a run must give."""

    def __init__(
        self, config: Config, faults: Iterable[Fault], *, shared_lease: float | None = None
    ) -> None:
        # Shared mode (engines on one store, `shared_lease` their lease): a shutdown or a
        # killed engine fails no group; a dead owner's evaluation ends when its lease expires.
        self.shared_lease = shared_lease
        self.engine = 0  # the engine the current post was sent to
        self.routes: dict[int, int] = {}  # request -> engine (shared mode)
        self.size = config.num_rollouts_per_prompt
        self.early = config.early_judging
        self.ttl = config.cohort_result_ttl_s
        self.cap = config.max_terminal_cohorts
        self.request_timeout = config.judge_request_timeout_s
        self.max_attempts = config.genrm_parse_retries + 1
        self.default = (config.default_score, config.default_score, config.default_ranking)
        self.max_tokens = str(config.genrm_responses_create_params.get("max_output_tokens"))
        self.url = JUDGE_URL + "/chat/completions"
        pairs = comparison_pairs(config.comparison_strategy, self.size)
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
        if self.closed and self.shared_lease is not None:
            return found  # no engine is left to sweep the store
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
        if record.orphaned:
            # The first sweep after the lease expired fails it: the deadline has passed.
            assert self.shared_lease is not None
            return record.evaluation_started + self.shared_lease
        return record.evaluation_started + EVALUATION_TIMEOUT

    def collides(self, now: float) -> bool:
        """Would a step at `now` meet a deadline, or start one at an instant already taken?

        Every timeout of a held or hung call counts, even one its group's deadline will come
        before: the group may fill and move its deadline past it.
        """
        taken = set(self.deadlines())
        for record in self.active.values():
            taken.update(c.deadline for c in record.comparisons if c.state in ("held", "hang"))
        offsets: tuple[float, ...] = (
            0.0,
            COLLECTION_TIMEOUT,
            EVALUATION_TIMEOUT,
            self.request_timeout,
        )
        if self.shared_lease is not None:
            offsets += (self.shared_lease,)
        return any(now + offset in taken for offset in offsets)

    def expire(self, now: float) -> None:
        record = self.deadlines().get(now)
        if record is None:
            return
        if now == self._end_of_phase(record) and record.phase == "collecting":
            text = messages.not_collected(record.key, self.size, COLLECTION_TIMEOUT)
            self._fail(record, "cohort", text, now)
            return
        if now == self._end_of_phase(record) and record.orphaned:
            # Taken over by a sweep with the deadline passed: nothing of the dead owner's
            # judging was stored, so no comparison counts as finished or failed.
            text = messages.evaluation_deadline(EVALUATION_TIMEOUT, 0, len(record.comparisons), 0)
            self.counts["groups failed after their lease expired"] += 1
            self._fail(record, "judge", text, now)
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

    def post(self, post: Post, now: float, engine: int = 0) -> None:
        self.engine = engine
        starts: list[_Record] = []
        for request in post.requests:
            self.routes[request] = engine
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
            record.owner = self.engine
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

    def kill(self, engine: int) -> None:
        """Shared mode: an engine dies. Its requests end (their connections drop), its judge
        calls are cancelled, and the groups it evaluated wait for their leases to expire."""
        if self.closed or self.shared_lease is None:
            return  # one engine in memory: the step has nothing to kill
        for request in list(self.waiting):
            if self.routes.get(request) == engine:
                self.disconnect(request)
        self._orphan_evaluations(engine)

    def _orphan_evaluations(self, engine: int) -> None:
        for record in self.active.values():
            if record.phase == "evaluating" and record.owner == engine and not record.orphaned:
                record.orphaned = True
                self.counts["evaluations left by their owner"] += 1
                for comparison in record.comparisons:
                    if comparison.state in ("held", "hang", "running"):
                        comparison.state = "cancelled"

    def shutdown(self, now: float) -> None:
        if self.closed:
            return
        if self.shared_lease is not None:
            # Every engine shuts down: waiters are answered, evaluations stop, and the groups
            # stay in the store for the processes that may still serve them.
            for engine in {r.owner for r in self.active.values()} | set(self.routes.values()):
                if engine is not None:
                    self._orphan_evaluations(engine)
            shutting_down = Expected("rejected", 503, messages.SHUTTING_DOWN)
            for request in list(self.waiting):
                record, slot = self.waiting.pop(request)
                record.members[slot].waiters.remove(request)
                self._answer(request, shutting_down)
            self.closed = True
            return
        self.closed = True
        for record in list(self.active.values()):
            self._fail(record, "cohort", messages.SHUTTING_DOWN, now)
        self.explicit.clear()
        self.legacy.clear()
        self.watermarks.clear()
        self.terminal.clear()
        self.idle.clear()

    def retained(self, now: float) -> tuple[dict[str, int], list[str], list[str]]:
        """Watermarks (group -> attempt), the idle order and the terminal index as a prune at
        `now` would leave them: what a shared store, which trims after every write and whose
        readers ignore what has expired, holds at `now`."""
        terminal = list(self.terminal.values())
        while terminal and self._expired(now, terminal[0][0], len(terminal)):
            terminal.pop(0)
        idle = list(self.idle.items())
        dropped = set()
        while idle and self._expired(now, idle[0][1], len(idle)):
            dropped.add(idle.pop(0)[0])
        marks = {gid: mark[0] for gid, mark in self.watermarks.items() if gid not in dropped}
        return marks, [gid for gid, _ in idle], [record.key for _, record in terminal]

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
