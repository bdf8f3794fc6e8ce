"""The model a run is checked against: §5 and §3.3 written out again, small and slow,
predicting every answer, judge call, statistic and retention index after each step."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.testing._invariants import Expected
from genrm_trio.testing.scenarios.judge_model import JudgeModel
from genrm_trio.testing.scenarios.model_records import ModelMember, ModelRecord
from genrm_trio.testing.scenarios.retained_model import RetainedModel
from genrm_trio.testing.scenarios.steps import (
    COLLECTION_TIMEOUT,
    CONVERSION_FAULT,
    EVALUATION_TIMEOUT,
    Fault,
    Post,
    Release,
    prompt,
)


class Model:
    """§5 and §3.3 written out again, small and slow, for the answers a run must give."""

    def __init__(
        self,
        config: Config,
        faults: Iterable[Fault],
        *,
        lease: float | None = None,
        trimmed: bool = False,
    ) -> None:
        # The store's lease (core/ownership.py): with one, a shutdown or a killed engine fails
        # no group, and a dead owner's evaluation ends when its lease expires. Without one,
        # the groups die with the process.
        self.lease = lease
        # The store trims its retention after every write and hides what has expired (the
        # Redis store), rather than pruning at arrivals (the memory store, R-3).
        self.trimmed = trimmed
        self.engine = 0  # the engine the current post was sent to
        self.routes: dict[int, int] = {}  # request -> engine (shared mode)
        self.size = config.num_rollouts_per_prompt
        self.early = config.early_judging
        self.request_timeout = config.judge_request_timeout_s
        self.counts: Counter[str] = Counter()
        self.judge = JudgeModel(config, faults, self.counts)
        self.closed = False
        self.explicit: dict[str, ModelRecord] = {}
        self.legacy: dict[str, ModelRecord] = {}
        self.retained = RetainedModel(config, self.counts)
        # The retention indexes, shared with the model of their pruning.
        self.watermarks = self.retained.watermarks
        self.terminal = self.retained.terminal
        self.idle = self.retained.idle
        self.active: dict[int, ModelRecord] = {}
        self.waiting: dict[int, tuple[ModelRecord, int]] = {}
        # per step: filled by the model, emptied by the runner after each check
        self.answered: dict[int, Expected] = {}
        self.cancelled: set[int] = set()

    # -- time ------------------------------------------------------------------------------

    def deadlines(self) -> dict[float, ModelRecord]:
        """Every instant at which something will happen on its own, and to which record."""
        found: dict[float, ModelRecord] = {}
        if self.closed and self.lease is not None:
            return found  # no engine is left to sweep the store
        for record in self.active.values():
            ends = self._end_of_phase(record)
            found[ends] = record
            for comparison in record.comparisons:
                if comparison.state in ("held", "hang") and comparison.deadline < ends:
                    found[comparison.deadline] = record
        return found

    def _end_of_phase(self, record: ModelRecord) -> float:
        if record.phase == "collecting":
            return record.started_at + COLLECTION_TIMEOUT
        if record.orphaned:
            # The first sweep after the lease expired fails it: the deadline has passed.
            assert self.lease is not None
            return record.evaluation_started + self.lease
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
        if self.lease is not None:
            offsets += (self.lease,)
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
                self.judge.conclude(record, comparison, "fatal", cause, now)
        self._finish_if_done(record, now)

    def _seconds(self) -> str:
        return messages.format_seconds(self.request_timeout)

    # -- arrivals (C-40 … C-44) ---------------------------------------------------------

    def post(self, post: Post, now: float, engine: int = 0) -> None:
        self.engine = engine
        starts: list[ModelRecord] = []
        for request in post.requests:
            self.routes[request] = engine
            self._arrive(post, request, now, starts)
        for record in starts:
            self._start_ready(record, now)

    def _answer(self, request: int, expected: Expected) -> None:
        self.answered[request] = expected

    def _arrive(self, post: Post, request: int, now: float, starts: list[ModelRecord]) -> None:
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
    ) -> ModelRecord:
        record = ModelRecord(key, gid, post.marker, post.attempt, digest, None, now)
        record.comparisons = self.judge.comparisons()
        self.active[id(record)] = record
        self.counts["records"] += 1
        return record

    def _member_step(
        self, record: ModelRecord, post: Post, request: int, now: float, starts: list[ModelRecord]
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
        record.members[post.slot] = ModelMember(post.slot, identity, post.quality, [request])
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

    def _start_ready(self, record: ModelRecord, now: float) -> None:
        """Judge every comparison not started yet whose two slots are filled (C-60; early
        judging starts them before the group is full)."""
        if not record.active:
            return
        members = record.members
        for comparison in record.comparisons:
            if comparison.state == "idle" and comparison.first in members:
                if comparison.second in members:
                    comparison.state = "running"
                    self.judge.next_attempt(record, comparison, now)
        self._finish_if_done(record, now)

    def release(self, step: Release, now: float) -> None:
        for record in list(self.active.values()):
            if record.marker != step.group or record.attempt != step.attempt:
                continue
            for comparison in record.comparisons:
                if comparison.state != "held" or (comparison.first, comparison.second) != step.pair:
                    continue
                kind = {"fatal": "fatal", "transient": "transient"}.get(step.action or "")
                self.judge.conclude(record, comparison, *self.judge.attempt_outcome(kind), now)
                self.judge.next_attempt(record, comparison, now)
            self._finish_if_done(record, now)

    def _finish_if_done(self, record: ModelRecord, now: float) -> None:
        if record.phase != "evaluating":
            return
        if any(c.state != "done" for c in record.comparisons):
            return
        outcomes = self.judge.outcomes(record)
        if isinstance(outcomes, str):
            self._fail(record, "judge", outcomes, now, prefix=True)
            return
        for slot, member in record.members.items():
            member.outcome = outcomes[slot]
        record.phase = "completed"
        masked = any(o.kind == "masked" for o in outcomes.values())
        self.counts["groups completed with masks" if masked else "groups completed"] += 1
        for member in record.members.values():
            assert member.outcome is not None
            self._resolve(member.waiters, member.outcome)
        self._terminal(record, now)

    # -- failure, terminal state, retention (C-80 … C-92, R-1 … R-4) ----------------------

    def _fail(
        self, record: ModelRecord, kind: str, text: str, now: float, *, prefix: bool = False
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

    def _terminal(self, record: ModelRecord, now: float) -> None:
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

    def _supersede(self, record: ModelRecord, attempt: int, now: float) -> None:
        assert record.group is not None
        if record.active:
            text = messages.superseded(record.group, record.attempt, attempt)
            self._fail(record, "cohort", text, now)
            self.counts["superseded while active"] += 1
        self.terminal.pop(id(record), None)
        if self.explicit.get(record.group) is record:
            del self.explicit[record.group]

    def _prune(self, now: float) -> None:
        for record in self.retained.prune(now):
            if record.group is not None:
                if self.explicit.get(record.group) is record:
                    del self.explicit[record.group]
            elif self.legacy.get(record.legacy_key or "") is record:
                del self.legacy[record.legacy_key or ""]

    def kill(self, engine: int) -> None:
        """Shared mode: an engine dies. Its requests end (their connections drop), its judge
        calls are cancelled, and the groups it evaluated wait for their leases to expire."""
        if self.closed or self.lease is None:
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
        if self.lease is not None:
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
        self.retained.clear()

    # -- what the store and statistics() must say ------------------------------------------

    def retention(self, now: float) -> tuple[dict[str, int], list[str], list[str]]:
        """Watermarks (group -> attempt), the idle order (group ids) and the terminal index
        (record keys) the store must hold at ``now``."""
        return self.retained.at(now, trimmed=self.trimmed)

    def expected_statistics(self, now: float) -> dict[str, int]:
        """What the store and its engines must count at ``now`` (prune visits apart)."""
        expected = self.statistics()
        if self.trimmed:
            marks, idle, terminal = self.retention(now)
            expected.update(
                retained_records=len(terminal), watermarks=len(marks), idle_entries=len(idle)
            )
        if self.lease is not None:
            # Nobody owns a group that collects; only a live owner runs a task for one that is
            # judged.
            running = [r for r in self.active.values() if r.phase == "evaluating"]
            expected["owned_tasks"] = sum(1 for r in running if not r.orphaned)
        return expected

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
