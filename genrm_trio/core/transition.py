"""The group state machine: one group, one event, one decision.

Events in, decisions out. Nothing here awaits, sleeps or knows about Trio or about any store.

Theory of operation
-------------------
A *group* (``Group``) is everything one group id (or one legacy key) has in a store: the record
of its newest attempt, its watermark and, once idle, since when. A *record* is one group
attempt. It is born ``collecting`` with its first accepted member, moves to ``evaluating`` when
its N-th distinct slot is filled, and ends ``completed`` (one outcome per slot, published at
once) or ``failed`` (one failure for everyone). Terminal records never change phase again.

``transition(group, event, ...)`` applies one event to one group, in place, as one critical
section: plain synchronous code that runs to its end without yielding (I-1), so no other task
can observe a half-made transition. Every store runs this same function on the group it loaded
(the memory store on the group it holds, the Redis store under WATCH/MULTI/EXEC, running it
again when the group changed under it) and keeps what it leaves. It changes the group in place
rather than returning a new one: the memory store keeps its groups as these very objects, and
copying a group of 16 members at every arrival would cost more than the rest of the transition;
a store that must be able to drop the result (the Redis store, when its EXEC finds the group
changed) decodes a fresh group for every try. The returned ``Decision`` names
everything that follows: the answer or the wait of each arriving request, an evaluation that
starts collecting here or is claimed here (with a snapshot of what it judges), comparisons ready
to judge, a group offered to another process, the records that ended with every slot's answer,
and the log lines, to be written once the transition is stored.

The events:

- ``Arrive``: resolves each request's record (C-40…C-44) and runs its member step;
- ``CollectionDue``: a collecting record past its collection deadline fails (C-95);
- ``TakeOverDue``: an evaluating record whose lease ran out is claimed again, or fails by its
  evaluation deadline (core/ownership.py);
- ``Renew``: the owner keeps its lease;
- ``Finish``: every comparison ended: mask, score and publish at once, or fail (M-1…M-7, C-70);
- ``Fail``: a non-judge error ends the evaluation (kind cohort, C-63);
- ``Abandon``: an evaluation was cancelled for no reason the record holds;
- ``ShutDown``: the process stops (C-96).

Rules that hold between transitions (checked by core/invariants.py):
- an explicit group has at most one record, the one of its newest accepted attempt; while that
  record is active the group's watermark has the same attempt and the group is not idle;
- a terminal record keeps no scoring texts, inputs or plan (C-34); a failed record has no
  rewards; a completed legacy record leaves nothing behind but its key's completion time (C-91).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from genrm_trio.config import Config
from genrm_trio.core import messages, ownership
from genrm_trio.core._legacy import answer_legacy_resend, legacy_resend_log
from genrm_trio.core._publication import failure_outcome, score_outcomes
from genrm_trio.core.arrivals import Arrival
from genrm_trio.core.critical import critical_section
from genrm_trio.core.identity import same_response
from genrm_trio.core.outcomes import Ended, Masked, Outcome, Rejected, Scored
from genrm_trio.core.ownership import Tenure
from genrm_trio.core.pairs import Comparison, plan_comparisons
from genrm_trio.core.records import (
    Failure,
    FailureKind,
    GroupInputs,
    Member,
    Phase,
    Record,
    RowsGroup,
    Watermark,
    group_key,
    legacy_task_index,
    record_fields,
    rows_group,
)
from genrm_trio.core.texts import judge_answer_text
from genrm_trio.core.verdicts import Verdict

__all__ = [
    "Abandon",
    "Answer",
    "Arrive",
    "Claim",
    "Collecting",
    "CollectionDue",
    "Decision",
    "Event",
    "Fail",
    "Finish",
    "Finished",
    "Group",
    "Job",
    "Renew",
    "Rules",
    "ShutDown",
    "TakeOverDue",
    "Wait",
    "Work",
    "plan_for",
    "transition",
]


@dataclass(slots=True, eq=False)
class Group:
    """One group as a store keeps it: ``ref`` is the store's name for it (``e:<group id>`` or
    ``l:<legacy key>``)."""

    ref: str
    record: Record | None = None
    watermark: Watermark | None = None  # explicit groups only
    idle_since: float | None = None  # explicit groups whose watermark has no active record
    completed_at: float | None = None  # legacy groups: when a group under this key completed
    # How often its idle time was stamped: a store that keeps groups in idle order moves the
    # group to the end at each stamp, even one at the same instant as the last.
    idle_stamps: int = 0

    @property
    def empty(self) -> bool:
        return self.record is None and self.watermark is None and self.completed_at is None


class Rules(NamedTuple):
    """What decides a transition besides the group and the event: the configuration, and the
    store's tenure (core/ownership.py)."""

    config: Config
    tenure: Tenure


# ---- events -------------------------------------------------------------------------------------


class Arrive(NamedTuple):
    """Requests of this group, in the order they came. ``hand_over``: a group this transition
    fills is offered to the other processes, this being the offering process's load."""

    arrivals: Sequence[Arrival]
    hand_over: int | None = None


class CollectionDue(NamedTuple):
    pass


class TakeOverDue(NamedTuple):
    pass


class Renew(NamedTuple):
    rid: str
    fence: int


class Finish(NamedTuple):
    rid: str
    fence: int
    verdicts: Mapping[int, Verdict]
    failed: Mapping[int, str]  # comparison index -> judge error text (M-10)
    finished: int  # comparisons that ended
    expired: bool  # the evaluation deadline ended it (M-7)


class Fail(NamedTuple):
    """A non-judge error; ``rid`` None: whichever record is active (a defect found by a sweep)."""

    rid: str | None
    fence: int | None
    text: str


class Abandon(NamedTuple):
    rid: str


class ShutDown(NamedTuple):
    pass


Event = Arrive | CollectionDue | TakeOverDue | Renew | Finish | Fail | Abandon | ShutDown


# ---- the decision -------------------------------------------------------------------------------


class Answer(NamedTuple):
    outcome: Outcome


class Wait(NamedTuple):
    """The request waits for the end of record ``rid``; ``kept``: its response's identity is
    now its member's (a new member), so it must outlive the request if the group needs it."""

    rid: str
    slot: int
    kept: bool


Reply = Answer | Wait


class Work(NamedTuple):
    """What an evaluation judges with, taken when it starts: its record, its owner's token,
    and the group's judge inputs. It never reads the record again."""

    rid: str
    fence: int
    ref: str
    key: str
    attempt: int
    history: list[dict[str, str]]
    principle: str | None
    comparisons: int  # in the group's plan


class Job(NamedTuple):
    """One comparison to judge, with its two judge-facing answer texts."""

    rid: str
    fence: int
    comparison: Comparison
    text_1: str
    text_2: str


class Collecting(NamedTuple):
    """A group began collecting and its evaluation is this process's from now (no lease):
    arm its collection deadline."""

    work: Work
    collection_due: float


class Claim(NamedTuple):
    """An evaluation this process now owns: judge ``jobs`` (those not handed out already) by
    ``evaluation_due``, renewing the claim every ``renew_every`` seconds if it has a lease."""

    work: Work
    started_at: float
    evaluation_due: float
    renew_every: float | None
    jobs: list[Job]


class Finished(NamedTuple):
    """A record that ended, with what its end counts for (§9.3)."""

    ended: Ended
    disposition: str  # completed, partially_masked or failed
    kind: str  # none, judge or cohort
    masked: int  # rollouts answered masked
    rows: RowsGroup | None  # the identity its rows share, for /aggregate_metrics
    masked_slots: frozenset[int]


# (level, text, the structured log record's fields), written once the transition is stored
LogLine = tuple[int, str, dict[str, Any]]


@dataclass(slots=True, eq=False)
class Decision:
    """Everything one transition asks of the process that made it, in the store's clock."""

    ref: str
    now: float
    replies: list[Reply] = field(default_factory=list)
    collecting: Collecting | None = None
    jobs: list[Job] = field(default_factory=list)
    claim: Claim | None = None
    offered: int | None = None  # the group was offered, at this load
    finished: list[Finished] = field(default_factory=list)
    logs: list[LogLine] = field(default_factory=list)
    # Renew, Finish and Fail of an owner: its claim still held (else nothing was changed).
    held: bool = True


def plan_for(config: Config, size: int, inputs: GroupInputs | None) -> list[Comparison]:
    """The comparisons of a group with these inputs (a pure function of the configuration)."""
    return plan_comparisons(
        config.comparison_strategy,
        size,
        config.num_judges_per_comparison,
        baseline_digest=inputs.baseline_digest if inputs is not None else None,
    )


def transition(
    group: Group,
    event: Event,
    *,
    now: float,
    rules: Rules,
    rid: str,
    before_each: Callable[[], None] | None = None,
) -> Decision:
    """Apply ``event`` to ``group`` in place and say what follows; ``rid`` names a record this
    transition creates (a second one in the same transition gets ``rid`` and a suffix).

    ``before_each`` runs before each arrival of an ``Arrive``: a store that prunes its
    retention indexes at every resolution (R-3) does it there.
    """
    with critical_section():
        step = _Step(group, rules, now, rid)
        step.apply(event, before_each)
        return step.finish()


class _Step:
    """One transition in progress."""

    def __init__(self, group: Group, rules: Rules, now: float, rid: str) -> None:
        self.group = group
        self.config = rules.config
        self.tenure = rules.tenure
        self.size = rules.config.num_rollouts_per_prompt
        self.now = now
        self.rid = rid
        self.created = 0
        self.decision = Decision(group.ref, now)

    def _log(self, level: int, text: str, fields: Mapping[str, Any]) -> None:
        """A line to log once the transition is stored (a transition run again logs once)."""
        self.decision.logs.append((level, text, dict(fields)))

    def apply(self, event: Event, before_each: Callable[[], None] | None = None) -> None:
        record = self.group.record
        if isinstance(event, Arrive):
            for arrival in event.arrivals:
                if before_each is not None:
                    before_each()
                self._expire()
                self.decision.replies.append(self._arrive(arrival, event.hand_over))
        elif isinstance(event, CollectionDue):
            if record is not None and record.phase is Phase.COLLECTING:
                if record.collection_due <= self.now:
                    text = messages.not_collected(
                        record.key, record.size, self.config.cohort_collection_timeout_s
                    )
                    self._fail(record, FailureKind.COHORT, text)
        elif isinstance(event, TakeOverDue):
            self._take_over(record)
        elif isinstance(event, Renew):
            self.decision.held = ownership.owned_by(record, event.rid, event.fence)
            if self.decision.held:
                assert record is not None
                ownership.renew(record, self.now, self.tenure)
        elif isinstance(event, Finish):
            self.decision.held = ownership.owned_by(record, event.rid, event.fence)
            if self.decision.held:
                assert record is not None
                self._finish(record, event)
        elif isinstance(event, Fail):
            if event.rid is None:
                if record is not None and record.phase.active:
                    self._fail(record, FailureKind.COHORT, event.text)
            else:
                assert event.fence is not None
                self.decision.held = ownership.owned_by(record, event.rid, event.fence)
                if self.decision.held:
                    assert record is not None
                    self._fail(record, FailureKind.COHORT, event.text)
        elif isinstance(event, Abandon | ShutDown):
            # A group with a lease stays for the other processes; one without dies with this
            # process (C-96).
            if self.tenure.exclusive and record is not None and record.phase.active:
                if isinstance(event, ShutDown):
                    self._fail(record, FailureKind.COHORT, messages.SHUTTING_DOWN)
                elif record.rid == event.rid:
                    self._fail(record, FailureKind.COHORT, messages.EVALUATION_CANCELLED)

    def finish(self) -> Decision:
        """Drop what concerns a record that did not survive the transition (a batch that
        filled a group and then superseded it)."""
        decision = self.decision
        record = self.group.record
        live = record.rid if record is not None and record.phase.active else None
        if decision.collecting is not None and decision.collecting.work.rid != live:
            decision.collecting = None
        if decision.claim is not None and decision.claim.work.rid != live:
            decision.claim = None
            decision.offered = None
        decision.jobs = [job for job in decision.jobs if job.rid == live]
        return decision

    # ---- arrival (C-40..C-44) -------------------------------------------------------------

    def _expire(self) -> None:
        """Retention by age (R-3, R-4) as this group sees it: what has outlived the result TTL
        is gone, whether or not a store has pruned it yet."""
        ttl = self.config.cohort_result_ttl_s
        if ttl is None:
            return
        group, now = self.group, self.now
        record = group.record
        if record is not None and record.terminal_time is not None:
            if now - record.terminal_time >= ttl:
                group.record = None
        if group.idle_since is not None and now - group.idle_since >= ttl:
            group.watermark = group.idle_since = None
        if group.completed_at is not None and now - group.completed_at >= ttl:
            group.completed_at = None

    def _arrive(self, arrival: Arrival, hand_over: int | None) -> Reply:
        if arrival.group_id is None:
            if arrival.resend is not None:
                return Answer(self._legacy_resend(arrival))
            record = self._legacy_record(arrival)
            return self._member(record, arrival, hand_over)
        resolved = self._explicit_record(arrival)
        if isinstance(resolved, Rejected):
            return Answer(resolved)
        record, recreated = resolved
        reply = self._member(record, arrival, hand_over)
        if record.phase.active or (
            isinstance(reply, Answer)
            and isinstance(reply.outcome, Rejected)
            and reply.outcome.status == 409
        ):
            return reply
        # An accepted request that resolved to a finished record refreshes only the watermark's
        # idle time, never the result's expiry (C-41 step 4).
        group = self.group
        if recreated is not None:
            group.watermark = recreated
        if group.watermark is not None and group.watermark.attempt == record.attempt:
            self._stamp_idle()
        return reply

    def _explicit_record(self, arrival: Arrival) -> tuple[Record, Watermark | None] | Rejected:
        group = self.group
        gid = arrival.group_id
        assert gid is not None
        watermark, record = group.watermark, group.record
        recreated: Watermark | None = None
        if watermark is None and record is not None:
            watermark = recreated = Watermark(record.attempt, record.digest)
        if (watermark is not None and watermark.digest != arrival.digest) or (
            record is not None and record.digest != arrival.digest
        ):
            return Rejected(409, messages.inconsistent_prompt(gid))
        if watermark is not None and arrival.attempt < watermark.attempt:
            return Rejected(409, messages.superseded(gid, arrival.attempt, watermark.attempt))
        if watermark is None or arrival.attempt > watermark.attempt:
            if record is not None and record.phase.active:
                # C-80: the old attempt fails, and leaves the group either way.
                text = messages.superseded(gid, record.attempt, arrival.attempt)
                self._fail(record, FailureKind.COHORT, text)
            group.watermark = Watermark(arrival.attempt, arrival.digest)
            group.idle_since = None
            key = group_key(gid, arrival.attempt, None, None, arrival.digest)
            group.record = self._new_record(key, arrival)
            return group.record, None
        if record is None or record.attempt != arrival.attempt:
            return Rejected(409, messages.not_retained(gid, arrival.attempt))
        return record, recreated

    def _legacy_record(self, arrival: Arrival) -> Record:
        group = self.group
        record = group.record
        if record is not None:
            return record
        key = group_key(
            None, arrival.attempt, arrival.task_index, arrival.prompt_id, arrival.digest
        )
        record = group.record = self._new_record(key, arrival)
        record.legacy_key = key
        if group.completed_at is not None:
            record.legacy_resend = True
            self._log(
                *legacy_resend_log(record, arrival.slot, self.now - group.completed_at, self.config)
            )
        return record

    def _legacy_resend(self, arrival: Arrival) -> Masked:
        """C-99: a row sent again on its own never opens or joins a legacy group."""
        text, log = answer_legacy_resend(self.group, arrival, self.now, self.size)
        if log is not None:
            self._log(*log)
        return text

    def _new_record(self, key: str, arrival: Arrival) -> Record:
        rid = self.rid if not self.created else f"{self.rid}.{self.created}"
        self.created += 1
        record = Record(
            rid=rid,
            key=key,
            group_id=arrival.group_id,
            attempt=arrival.attempt,
            digest=arrival.digest,
            legacy_key=None,
            size=self.size,
            started_at=self.now,
            collection_due=self.now + self.config.cohort_collection_timeout_s,
        )
        ownership.start(record, self.tenure)
        return record

    def _member(self, record: Record, arrival: Arrival, hand_over: int | None) -> Reply:
        slot = arrival.slot
        if record.phase is Phase.FAILED:
            return Answer(failure_outcome(record))
        member = record.members.get(slot)
        if member is not None:
            if isinstance(member.outcome, Masked):
                return Answer(member.outcome)
            if not same_response(member.fingerprint, arrival.fingerprint):
                return Answer(Rejected(409, messages.different_response(record.key, slot)))
            if record.phase is Phase.COMPLETED:
                assert member.outcome is not None
                return Answer(member.outcome)
            return Wait(record.rid, slot, kept=False)
        if record.phase is not Phase.COLLECTING:
            return Answer(
                Rejected(409, messages.phase_closed(record.key, record.phase.value, slot))
            )
        first = not record.members
        try:
            texts = arrival.source.texts()
            inputs = arrival.source.inputs() if first else None
        except Exception as exc:
            # Validated input cannot make extraction fail; this is a defect or an injected
            # fault, and it fails the whole group rather than one request.
            self._fail(record, FailureKind.COHORT, messages.conversion_failed(exc))
            return Answer(failure_outcome(record))
        if first:
            record.inputs = inputs
            record.plan = plan_for(self.config, record.size, inputs)
            if self.tenure.exclusive:  # owned from its first member (core/ownership.py)
                self.decision.collecting = Collecting(self._work(record), record.collection_due)
        record.members[slot] = Member(slot, arrival.fingerprint, texts)
        if len(record.members) == record.size:
            self._begin_evaluation(record, hand_over)
        elif self.config.early_judging and self.tenure.exclusive:
            self._dispatch(record, self._ready_with(record, slot))
        return Wait(record.rid, slot, kept=True)

    def _ready_with(self, record: Record, slot: int) -> list[Comparison]:
        """Comparisons of `slot` whose other side is present too (the baseline always is)."""
        members = record.members
        return [
            c
            for c in record.plan
            if slot in (c.first, c.second)
            and (c.first in members or c.first == record.size)
            and (c.second in members or c.second == record.size)
        ]

    def _dispatch(self, record: Record, ready: list[Comparison]) -> list[Job]:
        fresh = [c for c in ready if c.index not in record.dispatched]
        record.dispatched.update(c.index for c in fresh)
        jobs = self._jobs(record, fresh)
        self.decision.jobs += jobs
        return jobs

    def _begin_evaluation(self, record: Record, hand_over: int | None) -> None:
        record.legacy_resend = False  # counted only while it collects
        record.phase = Phase.EVALUATING
        timeout = self.config.cohort_evaluation_timeout_s
        if ownership.fill(record, self.now, self.tenure, timeout, hand_over):
            fresh = [c for c in record.plan if c.index not in record.dispatched]
            record.dispatched.update(c.index for c in fresh)
            self._claimed(record, self._jobs(record, fresh))
        else:
            self.decision.offered = hand_over

    def _claimed(self, record: Record, jobs: list[Job]) -> None:
        assert record.evaluation_due is not None
        self.decision.claim = Claim(
            self._work(record), record.started_at, record.evaluation_due, self._renewal(), jobs
        )

    def _renewal(self) -> float | None:
        lease = self.tenure.lease_s
        return None if lease is None else lease / 3

    def _work(self, record: Record) -> Work:
        inputs = record.inputs
        assert inputs is not None
        return Work(
            record.rid,
            record.fence,
            self.group.ref,
            record.key,
            record.attempt,
            inputs.history,
            inputs.principle,
            len(record.plan),
        )

    def _jobs(self, record: Record, comparisons: list[Comparison]) -> list[Job]:
        inputs = record.inputs
        assert inputs is not None

        def text(slot: int) -> str:
            if slot == record.size:
                assert inputs.baseline is not None
                return judge_answer_text(inputs.baseline)
            texts = record.members[slot].texts
            assert texts is not None
            return judge_answer_text(texts.answer)

        return [
            Job(record.rid, record.fence, c, text(c.first), text(c.second)) for c in comparisons
        ]

    # ---- evaluation ---------------------------------------------------------------------------

    def _take_over(self, record: Record | None) -> None:
        verdict = ownership.take_over(record, self.now)
        if verdict is None:
            return
        assert record is not None
        if not verdict.claim:
            self._evaluation_deadline(record, 0, 0)
            return
        ownership.claim(record, self.now, self.tenure)
        self._claimed(record, self._jobs(record, record.plan))
        if verdict.offered:
            return
        # Among processes racing for the same expired lease, only the one whose transition is
        # stored logs it: a decision's lines are written once it is.
        self._log(
            30,
            f"GenRM took over the evaluation of key='{messages.log_key(record.key)}' "
            "after its owner's lease expired",
            record_fields(record),
        )

    def _evaluation_deadline(self, record: Record, finished: int, failed: int) -> None:
        text = messages.evaluation_deadline(
            self.config.cohort_evaluation_timeout_s, finished, len(record.plan), failed
        )
        self._fail(record, FailureKind.JUDGE, text)

    def _finish(self, record: Record, event: Finish) -> None:
        """Every comparison has ended: mask, score and publish at once (M-1..M-6, C-70)."""
        if event.expired:
            self._evaluation_deadline(record, event.finished, len(event.failed))
            return
        texts = [record.members[slot].texts for slot in range(record.size)]
        scored = score_outcomes(
            record.key,
            record.size,
            [(t.reasoning, t.answer) if t is not None else ("", "") for t in texts],
            record.plan,
            event.verdicts,
            event.failed,
            self.config,
        )
        if isinstance(scored, str):
            self._fail(record, FailureKind.JUDGE, scored)
            return
        # Every outcome is built before any is stored: a defect above leaves the record
        # without rewards, and it fails as a whole (I-5).
        for slot, member in record.members.items():
            member.outcome = scored[slot]
        self._publish(record, len(event.failed))

    # ---- ends -------------------------------------------------------------------------------

    def _publish(self, record: Record, failed_comparisons: int) -> None:
        record.phase = Phase.COMPLETED
        total = len(record.plan)
        outcomes: dict[int, Scored | Masked] = {}
        for slot, member in record.members.items():
            assert member.outcome is not None
            outcomes[slot] = member.outcome
            if isinstance(member.outcome, Masked):
                self._log(
                    30,
                    f"GenRM masked one rollout of key='{messages.log_key(record.key)}': "
                    f"{member.outcome.text}",
                    {**record_fields(record), "slot": slot},
                )
            member.texts = None
        masked = [slot for slot, o in outcomes.items() if isinstance(o, Masked)]
        self._ended(
            record,
            Ended(record.rid, outcomes, None),
            "partially_masked" if masked else "completed",
            "none",
            masked,
        )
        self._log(
            30 if masked else 20,
            f"GenRM cohort disposition=completed key='{messages.log_key(record.key)}' "
            f"attempt={record.attempt} members={len(record.members)} "
            f"scored={len(outcomes) - len(masked)} masked={len(masked)} "
            f"failed_comparisons={failed_comparisons}/{total}",
            record_fields(record),
        )
        self._become_terminal(record)

    def _fail(self, record: Record, kind: FailureKind, text: str) -> None:
        if not record.phase.active:
            return
        record.legacy_resend = False
        record.phase = Phase.FAILED
        record.failure = Failure(kind, text)
        for member in record.members.values():
            member.texts = None
        masked = list(record.members) if kind is FailureKind.JUDGE else []
        self._ended(
            record, Ended(record.rid, {}, failure_outcome(record)), "failed", kind.value, masked
        )
        self._log(
            30,
            f"GenRM cohort disposition=failed key='{messages.log_key(record.key)}' "
            f"attempt={record.attempt} members={len(record.members)} kind={kind.value} "
            f'reason="{text[:500]}"',
            record_fields(record),
        )
        self._become_terminal(record)

    def _ended(
        self, record: Record, ended: Ended, disposition: str, kind: str, masked: list[int]
    ) -> None:
        # C-34: a finished record keeps fingerprints, outcomes and its failure, nothing else.
        record.inputs = None
        record.plan = []
        record.dispatched = set()
        rows = rows_group(record.group_id, record.attempt, legacy_task_index(record))
        self.decision.finished.append(
            Finished(ended, disposition, kind, len(masked), rows, frozenset(masked))
        )

    def _become_terminal(self, record: Record) -> None:
        """C-88: stamp the terminal time; a completed legacy group retires at once (C-91)."""
        group = self.group
        record.terminal_time = self.now
        if record.legacy:
            if record.phase is Phase.COMPLETED:
                if group.record is record:
                    group.record = None
                group.completed_at = self.now
            return
        watermark = group.watermark
        if watermark is not None and watermark.attempt == record.attempt:
            self._stamp_idle()

    def _stamp_idle(self) -> None:
        self.group.idle_since = self.now
        self.group.idle_stamps += 1
