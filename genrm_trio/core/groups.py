"""The group state machine: records, members, waiters, attempts, publication and retention.

Events in, decisions out. Nothing here awaits, sleeps or knows about Trio.

Theory of operation
-------------------
A *record* is the state of one group attempt. It is born ``collecting`` with its first accepted
member, moves to ``evaluating`` when its N-th distinct slot is filled, and ends ``completed`` (one
outcome per slot, published at once) or ``failed`` (one failure for everyone). Terminal records
never change phase again.

Every entry point below is one critical section: plain synchronous bookkeeping that runs to the
end without yielding, so no other task can observe a half-made transition (I-1). Work that
has to wait (deadlines, judge calls) belongs to the runtime; the registry tells it what to start
or cancel through the ``Effect`` values it returns, and the runtime reports back through
``collection_expired``, ``comparison_failed`` and ``finish_evaluation``/``fail_evaluation``.

Rules that hold between entry points (checked by ``check_invariants``):
- an explicit group id has at most one record, the one of its newest accepted attempt; while
  that record is active the group's watermark has the same attempt and the group is not idle;
- the terminal index holds exactly the retained terminal records; the idle order holds exactly
  the explicit groups with a watermark and no active record;
- a terminal record has no waiters and no scoring texts; a failed record has no rewards.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.core.critical import critical_section
from genrm_trio.core.identity import ResponseIdentity, same_response
from genrm_trio.core.pairs import Comparison, plan_comparisons
from genrm_trio.core.retention import AgedIndex
from genrm_trio.core.scoring import masked_reward_placeholder, masked_slots, score_group
from genrm_trio.core.verdicts import Verdict


class Phase(enum.Enum):
    COLLECTING = "collecting"
    EVALUATING = "evaluating"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def active(self) -> bool:
        return self in (Phase.COLLECTING, Phase.EVALUATING)


class FailureKind(enum.Enum):
    JUDGE = "judge"  # answered as masked 200 rows
    COHORT = "cohort"  # answered as HTTP 503


# ---- outcomes: what one /verify request is answered with ------------------------------------


class Scored(NamedTuple):
    reward: float
    metrics: Mapping[str, float] | None  # None outside group mode: no group metrics (W-35)


class Masked(NamedTuple):
    text: str
    suffix: str = ""  # the legacy migration suffix, never cut when the text is bounded
    # The row's `reward` (W-33): never a measurement. Decided once when the group's outcome
    # is computed and kept with it, so a replay answers the same bytes.
    placeholder: float = 0.0


class Rejected(NamedTuple):
    status: int  # 409 or 503
    detail: str


Outcome = Scored | Masked | Rejected


class Waiter:
    """A one-shot result slot for one waiting request."""

    __slots__ = ("_wake", "outcome")

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self.outcome: Outcome | None = None

    def resolve(self, outcome: Outcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self._wake()


# ---- what the runtime hands in ---------------------------------------------------------------


class MemberTexts(NamedTuple):
    reasoning: str
    answer: str


class GroupInputs(NamedTuple):
    """Judge-facing inputs converted once per group from its first accepted member."""

    history: list[dict[str, str]]
    principle: str | None
    baseline: str | None
    baseline_digest: str | None


@dataclass(slots=True)
class Arrival:
    """A validated group-mode /verify request, reduced to what the engine needs."""

    group_id: str | None
    attempt: int
    slot: int
    task_index: int | None
    prompt_id: str | None
    digest: str
    # The response's identity (C-21, C-24): a canonical fingerprint, or a ResponseIdentity
    # that holds the raw bytes until the engine settles or releases it.
    fingerprint: bytes | ResponseIdentity
    # Called only for a newly accepted member (never for duplicates or replays); the flag says
    # whether the group's inputs must be converted too. May raise: the group then fails.
    prepare: Callable[[bool], tuple[MemberTexts, GroupInputs | None]]
    # Why the row is a resend of one rollout (C-99), as its masked row says; None for a row of a
    # first dispatch. Only legacy groups read it.
    resend: str | None = None


# ---- effects: what the runtime must do after a transition -----------------------------------


class StartGroup(NamedTuple):
    """Arm the collection deadline of a new record (its group task)."""

    record: Record


class StartComparisons(NamedTuple):
    """Judge these comparisons now: their slots are filled (all of them, or early judging)."""

    record: Record
    comparisons: list[Comparison]


class BeginEvaluation(NamedTuple):
    """The group is full: arm the evaluation deadline."""

    record: Record


class CancelGroup(NamedTuple):
    """Cancel and drain everything the record's group task is running."""

    record: Record


Effect = StartGroup | StartComparisons | BeginEvaluation | CancelGroup


class Answer(NamedTuple):
    outcome: Outcome


class Wait(NamedTuple):
    waiter: Waiter
    record: Record
    slot: int


class Decision(NamedTuple):
    reply: Answer | Wait
    effects: list[Effect]


# ---- state -------------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Member:
    slot: int
    fingerprint: bytes | ResponseIdentity
    texts: MemberTexts | None
    waiters: list[Waiter]
    outcome: Scored | Masked | None = None


@dataclass(slots=True)
class Failure:
    kind: FailureKind
    text: str


class Watermark(NamedTuple):
    attempt: int
    digest: str


@dataclass(slots=True)
class StoreMeta:
    """What a group store keeps beside a record, in the store's clock (docs/group-store.md).

    The core never reads it; a store sets it when the record is first written (the memory store
    too, with fencing token 1 and no lease).
    """

    rid: str  # unique per record, so a waiter never mistakes a later record for its own
    collection_due: float
    fence: int = 0  # bumped at every claim of the evaluation
    lease_until: float | None = None  # None while nobody evaluates
    evaluation_due: float | None = None


@dataclass(slots=True, eq=False)
class Record:
    key: str
    group_id: str | None
    attempt: int
    digest: str
    legacy_key: str | None
    size: int
    started_at: float
    phase: Phase = Phase.COLLECTING
    members: dict[int, Member] = field(default_factory=dict)
    inputs: GroupInputs | None = None
    plan: list[Comparison] = field(default_factory=list)
    dispatched: set[int] = field(default_factory=set)  # comparison indexes handed to the runtime
    # comparison index -> judge error text, filled as comparisons fail (M-10)
    failed_comparisons: dict[int, str] = field(default_factory=dict)
    failure: Failure | None = None
    terminal_time: float | None = None
    meta: StoreMeta | None = None  # the store's bookkeeping; None until a store writes it
    # Opened by a row whose legacy key had already completed, and still collecting (§5.14).
    legacy_resend: bool = False

    @property
    def legacy(self) -> bool:
        return self.group_id is None

    def waiter_count(self) -> int:
        return sum(len(m.waiters) for m in self.members.values())


class Statistics(NamedTuple):
    collecting: int
    evaluating: int
    retained_records: int
    watermarks: int
    idle_entries: int
    waiters: int
    owned_tasks: int
    judge_in_flight: int
    prune_visits: int

    @property
    def active_groups(self) -> int:
        return self.collecting + self.evaluating


class GroupCounts(NamedTuple):
    """The groups of a group store as the server's gauges report them: this process's registry
    with the memory store, the whole deployment's with a shared one."""

    collecting: int
    evaluating: int
    retained_records: int
    watermarks: int
    # Age of the oldest group still collecting, in seconds; 0.0 when none collects.
    oldest_collecting_s: float


class InvariantViolation(AssertionError):
    pass


# How finished rows name their group without their prompt (NeMo Gym strips it before
# /aggregate_metrics): ("group", group id, attempt) or ("task", task index, attempt).
RowsGroup = tuple[str, str | int, int]


def rows_group(group_id: str | None, attempt: int, task_index: int | None) -> RowsGroup | None:
    """The identity rows of one group share, or None for a legacy group without a task index."""
    if group_id is not None:
        return ("group", group_id, attempt)
    if task_index is not None:
        return ("task", task_index, attempt)
    return None


def _fields(record: Record) -> dict[str, Any]:
    """The fields a structured log record about this group carries (X-6)."""
    return messages.log_fields(record.key, record.attempt)


def _legacy_task_index(record: Record) -> int | None:
    """The task index a legacy group's key was made from (C-1), if any; read from the key so
    that stored records need no field of their own for it."""
    if record.group_id is not None:
        return None
    prefix, _, rest = (record.legacy_key or record.key).partition("::")
    if prefix != "task_idx":
        return None
    return int(rest.partition("::")[0])


def group_key(
    group_id: str | None, attempt: int, task_index: int | None, prompt_id: str | None, digest: str
) -> str:
    """The group key of C-1, used in messages and logs."""
    if group_id is not None:
        return f"group_id::{group_id}::group_attempt::{attempt}"
    if task_index is not None:
        return f"task_idx::{task_index}::{digest}::group_attempt::{attempt}"
    if prompt_id is not None:
        return f"prompt_id::{prompt_id}::{digest}::group_attempt::{attempt}"
    return f"{digest}::group_attempt::{attempt}"


class GroupRegistry:
    """Every record, watermark and retention index of one server instance."""

    def __init__(self, config: Config, log: Callable[..., None] | None = None) -> None:
        """``log(level, text, extra=fields)`` receives every log record (``Logger.log`` fits)."""
        self.config = config
        self.size = config.num_rollouts_per_prompt
        self._log = log or (lambda level, text, **_: None)
        self.closed = False
        self.explicit: dict[str, Record] = {}
        self.legacy: dict[str, Record] = {}
        self.watermarks: dict[str, Watermark] = {}
        self.terminal_index: AgedIndex[int, Record] = AgedIndex()
        self.idle_order: AgedIndex[str, None] = AgedIndex()
        self.active: dict[int, Record] = {}
        self.prune_visits = 0
        # Terminal groups by (disposition, kind), and rollouts answered masked by them (§9.3).
        self.finished: dict[tuple[str, str], int] = {}
        self.rollouts_masked = 0
        # Legacy keys whose group completed, with when. A completed legacy record leaves nothing
        # behind (C-91); remembering its key lets the row that opens a group under it again be
        # flagged at once, since that group completes only if every member comes again.
        self.completed_legacy: AgedIndex[str, None] = AgedIndex()
        self.legacy_resends_collecting = 0
        # Slots this server answered masked, by the identity the group's rows carry (the latest
        # group of a legacy task index), kept as long as a result would be: /aggregate_metrics
        # counts them even when a collector left the masked rows out.
        self.masked_answers: AgedIndex[RowsGroup, frozenset[int]] = AgedIndex()

    # ---- arrival (C-40..C-44) ---------------------------------------------------------------

    def arrive(self, arrival: Arrival, now: float, wake: Callable[[], None]) -> Decision:
        """Resolve the request's record and run its member step, in one critical section."""
        with critical_section():
            if self.closed:
                return Decision(Answer(Rejected(503, messages.SHUTTING_DOWN)), [])
            self.prune(now)
            effects: list[Effect] = []
            if arrival.group_id is None:
                if arrival.resend is not None:
                    return Decision(Answer(self._answer_legacy_resend(arrival, now)), effects)
                record = self._resolve_legacy(arrival, now)
                reply = self._member_step(record, arrival, now, wake, effects)
                return Decision(reply, effects)
            resolved = self._resolve_explicit(arrival, now, effects)
            if isinstance(resolved, Rejected):
                return Decision(Answer(resolved), effects)
            record, recreated = resolved
            reply = self._member_step(record, arrival, now, wake, effects)
            if record.phase.active or (
                isinstance(reply, Answer)
                and isinstance(reply.outcome, Rejected)
                and reply.outcome.status == 409
            ):
                return Decision(reply, effects)
            # An accepted request that resolved to a finished record refreshes only the
            # watermark's idle time, never the result's expiry (C-41 step 4).
            if recreated is not None:
                self.watermarks[arrival.group_id] = recreated
            if self.watermarks[arrival.group_id].attempt == record.attempt:
                self.idle_order.stamp(arrival.group_id, None, now)
            return Decision(reply, effects)

    def _resolve_legacy(self, arrival: Arrival, now: float) -> Record:
        key = group_key(
            None, arrival.attempt, arrival.task_index, arrival.prompt_id, arrival.digest
        )
        record = self.legacy.get(key)
        if record is None:
            record = self._new_record(key, None, arrival.attempt, arrival.digest, now)
            record.legacy_key = key
            self.legacy[key] = record
            completed_at = self.completed_legacy.stamped(key)
            if completed_at is not None:
                record.legacy_resend = True
                self.legacy_resends_collecting += 1
                self._log(
                    30,
                    messages.legacy_resend(
                        key,
                        arrival.slot,
                        self.size,
                        now - completed_at,
                        self.config.cohort_collection_timeout_s,
                    ),
                    extra={**_fields(record), "slot": arrival.slot},
                )
        return record

    def _answer_legacy_resend(self, arrival: Arrival, now: float) -> Masked:
        """C-99: a row sent again on its own never opens or joins a legacy group, which could
        only complete if every member came again; it is answered at once, masked, with what
        the server knows of its key."""
        key = group_key(
            None, arrival.attempt, arrival.task_index, arrival.prompt_id, arrival.digest
        )
        record = self.legacy.get(key)
        resend = arrival.resend
        assert resend is not None
        if record is not None and record.phase is Phase.FAILED:
            assert record.failure is not None
            # A failure keeps its text; as a resend is never judged, it is a masked row even
            # when a request of the group itself got a 503 (kind cohort).
            return Masked(record.failure.text, messages.MIGRATION_SUFFIX)
        if record is not None:
            state = messages.legacy_resend_active(record.phase.value)
        else:
            completed_at = self.completed_legacy.stamped(key)
            state = (
                messages.LEGACY_RESEND_UNKNOWN
                if completed_at is None
                else messages.legacy_resend_completed(now - completed_at)
            )
        text = messages.legacy_resend_answer(key, arrival.slot, self.size, resend, state)
        self._log(
            20, text, extra={**messages.log_fields(key, arrival.attempt), "slot": arrival.slot}
        )
        return Masked(text)

    def _resolve_explicit(
        self, arrival: Arrival, now: float, effects: list[Effect]
    ) -> tuple[Record, Watermark | None] | Rejected:
        gid = arrival.group_id
        assert gid is not None
        watermark = self.watermarks.get(gid)
        record = self.explicit.get(gid)
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
            if record is not None:
                self._supersede(record, arrival.attempt, now, effects)
            self.watermarks[gid] = Watermark(arrival.attempt, arrival.digest)
            self.idle_order.discard(gid)
            key = group_key(gid, arrival.attempt, None, None, arrival.digest)
            fresh = self._new_record(key, gid, arrival.attempt, arrival.digest, now)
            self.explicit[gid] = fresh
            return fresh, None
        if record is None or record.attempt != arrival.attempt:
            return Rejected(409, messages.not_retained(gid, arrival.attempt))
        return record, recreated

    def _new_record(
        self, key: str, group_id: str | None, attempt: int, digest: str, now: float
    ) -> Record:
        record = Record(
            key=key,
            group_id=group_id,
            attempt=attempt,
            digest=digest,
            legacy_key=None,
            size=self.size,
            started_at=now,
        )
        self.active[id(record)] = record
        return record

    def _member_step(
        self,
        record: Record,
        arrival: Arrival,
        now: float,
        wake: Callable[[], None],
        effects: list[Effect],
    ) -> Answer | Wait:
        slot = arrival.slot
        if record.phase is Phase.FAILED:
            return Answer(self.failure_outcome(record))
        member = record.members.get(slot)
        if member is not None:
            if isinstance(member.outcome, Masked):
                return Answer(member.outcome)
            if not same_response(member.fingerprint, arrival.fingerprint):
                return Answer(Rejected(409, messages.different_response(record.key, slot)))
            if record.phase is Phase.COMPLETED:
                assert member.outcome is not None
                return Answer(member.outcome)
            waiter = Waiter(wake)
            member.waiters.append(waiter)
            return Wait(waiter, record, slot)
        if record.phase is not Phase.COLLECTING:
            return Answer(
                Rejected(409, messages.phase_closed(record.key, record.phase.value, slot))
            )
        first = not record.members
        try:
            texts, inputs = arrival.prepare(first)
        except Exception as exc:
            # Validated input cannot make extraction fail; this is a defect or an injected
            # fault, and it fails the whole group rather than one request.
            self._fail(record, FailureKind.COHORT, messages.conversion_failed(exc), now, effects)
            return Answer(self.failure_outcome(record))
        if first:
            record.inputs = inputs
            record.plan = self._plan(inputs)
        waiter = Waiter(wake)
        record.members[slot] = Member(slot, arrival.fingerprint, texts, [waiter])
        if first:
            effects.append(StartGroup(record))
        if len(record.members) == record.size:
            self._begin_evaluation(record, effects)
        elif self.config.early_judging:
            self._dispatch(record, self._ready_with(record, slot), effects)
        return Wait(waiter, record, slot)

    def _plan(self, inputs: GroupInputs | None) -> list[Comparison]:
        return plan_comparisons(
            self.config.comparison_strategy,
            self.size,
            self.config.num_judges_per_comparison,
            baseline_digest=inputs.baseline_digest if inputs is not None else None,
        )

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

    def _dispatch(self, record: Record, ready: list[Comparison], effects: list[Effect]) -> None:
        fresh = [c for c in ready if c.index not in record.dispatched]
        if fresh:
            record.dispatched.update(c.index for c in fresh)
            effects.append(StartComparisons(record, fresh))

    def _begin_evaluation(self, record: Record, effects: list[Effect]) -> None:
        self._settle_legacy_resend(record)
        record.phase = Phase.EVALUATING
        self._dispatch(record, record.plan, effects)
        effects.append(BeginEvaluation(record))

    def identity_done(self, record: Record, slot: int, identity: ResponseIdentity) -> None:
        """The request that brought ``identity`` is answered or gone, and with it the bytes.

        If the identity is its member's and the member must still tell responses apart (its
        group is active, or completed with a reward a replay can get), it is settled: its
        digest and canonical fingerprint are kept (C-34). Otherwise the bytes are let go.
        """
        with critical_section():
            member = record.members.get(slot)
            kept = (
                member is not None
                and member.fingerprint is identity
                and (
                    record.phase.active
                    or (
                        record.phase is Phase.COMPLETED
                        and not record.legacy
                        and isinstance(member.outcome, Scored)
                    )
                )
            )
            if kept:
                identity.settle()
            else:
                identity.release()

    def detach(self, record: Record, slot: int, waiter: Waiter) -> None:
        """Remove one cancelled request's waiter (C-51); the member and the group stay."""
        with critical_section():
            member = record.members.get(slot)
            if member is not None and waiter in member.waiters:
                member.waiters.remove(waiter)

    # ---- deadlines and evaluation results -------------------------------------------------

    def collection_expired(self, record: Record, now: float) -> None:
        with critical_section():
            if record.phase is Phase.COLLECTING:
                text = messages.not_collected(
                    record.key, record.size, self.config.cohort_collection_timeout_s
                )
                self._fail(record, FailureKind.COHORT, text, now, [])

    def comparison_failed(self, record: Record, comparison: Comparison, text: str) -> None:
        """Note a failed comparison as it fails, before anything else ends the group (M-10)."""
        with critical_section():
            if not record.phase.active:
                return
            record.failed_comparisons[comparison.index] = text
            self._log(
                30,
                f"GenRM dropped comparison ({comparison.first}, {comparison.second}) (judge "
                f"{comparison.judge_pass}) of {len(record.plan)} after a judge failure: {text}",
                extra={
                    **_fields(record),
                    "pair": [comparison.first, comparison.second],
                    "judge_pass": comparison.judge_pass,
                },
            )

    def evaluation_deadline(self, record: Record, finished: int, now: float) -> None:
        with critical_section():
            if record.phase is Phase.EVALUATING:
                text = messages.evaluation_deadline(
                    self.config.cohort_evaluation_timeout_s,
                    finished,
                    len(record.plan),
                    len(record.failed_comparisons),
                )
                self._fail(record, FailureKind.JUDGE, text, now, [])

    def fail_evaluation(self, record: Record, text: str, now: float) -> None:
        """A non-judge error or an outside cancellation ends the evaluation (kind cohort)."""
        with critical_section():
            if record.phase.active:
                self._fail(record, FailureKind.COHORT, text, now, [])

    def finish_evaluation(
        self, record: Record, verdicts: Mapping[int, Verdict], now: float
    ) -> None:
        """Every comparison has ended: mask, score and publish at once (M-1..M-6, C-70)."""
        with critical_section():
            if record.phase is Phase.FAILED:
                return  # superseded or shut down: a late result never publishes
            if record.phase is not Phase.EVALUATING:
                raise RuntimeError(f"cannot publish a {record.phase.value} group")
            plan = record.plan
            failed = record.failed_comparisons
            masked = masked_slots(plan, failed.keys(), record.size)
            total = len(plan)
            if len(masked) == record.size:
                first = failed[min(failed)]
                text = messages.every_rollout_masked(record.key, len(failed), total, first)
                self._fail(record, FailureKind.JUDGE, text, now, [])
                return
            texts = [record.members[slot].texts for slot in range(record.size)]
            score = score_group(
                record.size,
                [(t.reasoning, t.answer) if t is not None else ("", "") for t in texts],
                plan,
                verdicts,
                masked,
                self.config,
            )
            self._check_publishable(record, score.rewards, masked, score.metrics)
            placeholder = masked_reward_placeholder(
                self.config.masked_reward_placeholder, score.rewards.values()
            )
            metrics = {
                "genrm_failed_comparison_rate_per_group": len(failed) / total,
                "genrm_masked_rollout_rate_per_group": len(masked) / record.size,
                "mean_individual_score": score.metrics.mean_individual_score,
                "std_individual_score": score.metrics.std_individual_score,
                "tiebreak_usage_rate": score.metrics.tiebreak_usage_rate,
            }
            outcomes: dict[int, Scored | Masked] = {}
            for slot in record.members:
                if slot in masked:
                    first_failure = min(
                        index for index in failed if slot in (plan[index].first, plan[index].second)
                    )
                    outcomes[slot] = Masked(
                        messages.rollout_masked(slot, len(failed), total, failed[first_failure]),
                        placeholder=placeholder,
                    )
                else:
                    outcomes[slot] = Scored(score.rewards[slot], metrics)
            # Every outcome is built before any is stored: a defect above leaves the record
            # without rewards, and it fails as a whole (I-5).
            for slot, member in record.members.items():
                member.outcome = outcomes[slot]
            self._publish(record, now)

    def _check_publishable(
        self,
        record: Record,
        rewards: Mapping[int, float],
        masked: set[int],
        metrics: Sequence[float],
    ) -> None:
        if len(rewards) + len(masked) != record.size:
            raise RuntimeError(messages.reward_count(len(rewards) + len(masked), record.size))
        if not all(math.isfinite(r) for r in rewards.values()) or not all(
            math.isfinite(m) for m in metrics
        ):
            raise RuntimeError(messages.NON_FINITE_REWARDS)

    # ---- transitions -------------------------------------------------------------------------

    def _publish(self, record: Record, now: float) -> None:
        record.phase = Phase.COMPLETED
        total = len(record.plan)
        scored = masked = 0
        for slot, member in record.members.items():
            assert member.outcome is not None
            if isinstance(member.outcome, Masked):
                masked += 1
                self._log(
                    30,
                    f"GenRM masked one rollout of key='{messages.log_key(record.key)}': "
                    f"{member.outcome.text}",
                    extra={**_fields(record), "slot": slot},
                )
            else:
                scored += 1
            for waiter in member.waiters:
                waiter.resolve(member.outcome)
            member.waiters = []
            member.texts = None
        failed_comparisons = len(record.failed_comparisons)
        self._count_finished("partially_masked" if masked else "completed", "none", masked)
        self._note_masked(
            record,
            [slot for slot, m in record.members.items() if isinstance(m.outcome, Masked)],
            now,
        )
        self._drop_working_state(record)
        self._log(
            30 if masked else 20,
            f"GenRM cohort disposition=completed key='{messages.log_key(record.key)}' "
            f"attempt={record.attempt} members={len(record.members)} scored={scored} "
            f"masked={masked} failed_comparisons={failed_comparisons}/{total}",
            extra=_fields(record),
        )
        self._become_terminal(record, now)

    def _fail(
        self, record: Record, kind: FailureKind, text: str, now: float, effects: list[Effect]
    ) -> None:
        if not record.phase.active:
            return
        self._settle_legacy_resend(record)
        record.phase = Phase.FAILED
        record.failure = Failure(kind, text)
        outcome = self.failure_outcome(record)
        for member in record.members.values():
            for waiter in member.waiters:
                waiter.resolve(outcome)
            member.waiters = []
            member.texts = None
        masked = len(record.members) if kind is FailureKind.JUDGE else 0
        self._count_finished("failed", kind.value, masked)
        if kind is FailureKind.JUDGE:
            self._note_masked(record, list(record.members), now)
        self._drop_working_state(record)
        effects.append(CancelGroup(record))
        self._log(
            30,
            f"GenRM cohort disposition=failed key='{messages.log_key(record.key)}' "
            f"attempt={record.attempt} members={len(record.members)} kind={kind.value} "
            f'reason="{text[:500]}"',
            extra=_fields(record),
        )
        self._become_terminal(record, now)

    def _count_finished(self, disposition: str, kind: str, masked: int) -> None:
        key = (disposition, kind)
        self.finished[key] = self.finished.get(key, 0) + 1
        self.rollouts_masked += masked

    def _note_masked(self, record: Record, slots: list[int], now: float) -> None:
        group = rows_group(record.group_id, record.attempt, _legacy_task_index(record))
        if slots and group is not None:
            self.masked_answers.stamp(group, frozenset(slots), now)

    def masked_rollouts(self, group: RowsGroup) -> frozenset[int] | None:
        """The slots this server answered masked for the group rows name, if it knows."""
        return self.masked_answers.get(group)

    def _settle_legacy_resend(self, record: Record) -> None:
        """A resent legacy group stops counting once it leaves ``collecting``."""
        if record.legacy_resend:
            record.legacy_resend = False
            self.legacy_resends_collecting -= 1

    @staticmethod
    def _drop_working_state(record: Record) -> None:
        """C-34: a finished record keeps fingerprints, outcomes and its failure, nothing else."""
        record.inputs = None
        record.plan = []
        record.dispatched = set()
        record.failed_comparisons = {}

    def _become_terminal(self, record: Record, now: float) -> None:
        """C-88: stamp the terminal time and enter the retention indexes."""
        self.active.pop(id(record), None)
        record.terminal_time = now
        if record.legacy and record.phase is Phase.COMPLETED:
            # A completed legacy group retires at once and leaves nothing behind (C-91).
            if self.legacy.get(record.legacy_key or "") is record:
                del self.legacy[record.legacy_key or ""]
            self.completed_legacy.stamp(record.legacy_key or record.key, None, now)
            return
        self.terminal_index.stamp(id(record), record, now)
        if record.group_id is not None:
            watermark = self.watermarks.get(record.group_id)
            if watermark is not None and watermark.attempt == record.attempt:
                self.idle_order.stamp(record.group_id, None, now)

    def _supersede(self, record: Record, attempt: int, now: float, effects: list[Effect]) -> None:
        """C-80: the old record fails if active, and leaves the registry and indexes either way."""
        gid = record.group_id
        assert gid is not None
        if record.phase.active:
            self._fail(
                record,
                FailureKind.COHORT,
                messages.superseded(gid, record.attempt, attempt),
                now,
                effects,
            )
        self.terminal_index.discard(id(record))
        if self.explicit.get(gid) is record:
            del self.explicit[gid]

    def failure_outcome(self, record: Record) -> Outcome:
        """C-86: kind judge answers masked rows, kind cohort answers 503; legacy adds the suffix.

        A failed group has no scored reward to take a mean of, so its masked rows carry the
        placeholder 0.0 whatever ``masked_reward_placeholder`` says (W-33).
        """
        failure = record.failure
        assert failure is not None
        suffix = messages.MIGRATION_SUFFIX if record.legacy else ""
        if failure.kind is FailureKind.JUDGE:
            return Masked(failure.text, suffix)
        return Rejected(503, failure.text + suffix)

    # ---- retention (R-3, R-4) ----------------------------------------------------------------

    def prune(self, now: float) -> None:
        ttl = self.config.cohort_result_ttl_s
        cap = self.config.max_terminal_cohorts
        self.prune_visits += self.terminal_index.prune(now, ttl, cap, self._drop_record)
        self.prune_visits += self.idle_order.prune(now, ttl, cap, self._drop_watermark)
        # Kept as long as a result would be, and pruned from the head the same way; it is
        # no retention index of R-3, so its visits stay out of prune_visits.
        self.completed_legacy.prune(now, ttl, cap, lambda key, _: None)
        self.masked_answers.prune(now, ttl, cap, lambda key, _: None)

    def _drop_record(self, _: int, record: Record) -> None:
        if record.group_id is not None:
            if self.explicit.get(record.group_id) is record:
                del self.explicit[record.group_id]
        elif self.legacy.get(record.legacy_key or "") is record:
            del self.legacy[record.legacy_key or ""]

    def _drop_watermark(self, group_id: str, _: None) -> None:
        self.watermarks.pop(group_id, None)

    # ---- shutdown (C-96) ---------------------------------------------------------------------

    def shut_down(self, now: float) -> list[Effect]:
        """Mark the registry closed and fail every active group; returns what to cancel."""
        with critical_section():
            self.closed = True
            effects: list[Effect] = []
            for record in list(self.active.values()):
                self._fail(record, FailureKind.COHORT, messages.SHUTTING_DOWN, now, effects)
            return effects

    def clear(self) -> None:
        with critical_section():
            self.explicit.clear()
            self.legacy.clear()
            self.watermarks.clear()
            self.terminal_index.clear()
            self.idle_order.clear()
            self.active.clear()
            self.completed_legacy.clear()
            self.masked_answers.clear()
            self.legacy_resends_collecting = 0

    # ---- shared stores ---------------------------------------------------------------------

    def adopt(
        self,
        record: Record | None,
        watermark: tuple[str, Watermark, float | None] | None = None,
        completed_legacy: tuple[str, float] | None = None,
    ) -> None:
        """Take in one group's state as a shared store kept it, filed in the indexes by the
        rules of R-1: active records are active, terminal ones are in the terminal index (by
        their terminal time), a watermark with an idle-since time is in the idle order."""
        with critical_section():
            if record is not None:
                if record.group_id is not None:
                    self.explicit[record.group_id] = record
                else:
                    self.legacy[record.legacy_key or record.key] = record
                if record.phase.active:
                    self.active[id(record)] = record
                    if record.legacy_resend:
                        self.legacy_resends_collecting += 1
                else:
                    assert record.terminal_time is not None
                    self.terminal_index.stamp(id(record), record, record.terminal_time)
            if watermark is not None:
                group_id, mark, idle_since = watermark
                self.watermarks[group_id] = mark
                if idle_since is not None:
                    self.idle_order.stamp(group_id, None, idle_since)
            if completed_legacy is not None:
                self.completed_legacy.stamp(completed_legacy[0], None, completed_legacy[1])

    def settled_outcome(self, record: Record, slot: int) -> Outcome | None:
        """What a waiter on ``slot`` of a finished record is answered (C-86), else None."""
        if record.phase is Phase.FAILED:
            return self.failure_outcome(record)
        member = record.members.get(slot)
        if record.phase is Phase.COMPLETED and member is not None:
            return member.outcome
        return None

    def plan_for(self, inputs: GroupInputs | None) -> list[Comparison]:
        """The comparisons of a group with these inputs (a pure function of the configuration)."""
        return self._plan(inputs)

    # ---- verification hooks (I-21, I-22) -----------------------------------------------------

    def statistics(self, *, owned_tasks: int = 0, judge_in_flight: int = 0) -> Statistics:
        active = list(self.active.values())
        return Statistics(
            collecting=sum(1 for r in active if r.phase is Phase.COLLECTING),
            evaluating=sum(1 for r in active if r.phase is Phase.EVALUATING),
            retained_records=len(self.terminal_index),
            watermarks=len(self.watermarks),
            idle_entries=len(self.idle_order),
            waiters=sum(r.waiter_count() for r in active),
            owned_tasks=owned_tasks,
            judge_in_flight=judge_in_flight,
            prune_visits=self.prune_visits,
        )

    def group_counts(self, now: float) -> GroupCounts:
        """The counts of ``statistics`` the gauges report, and how long the oldest group still
        collecting has been collecting (a group that never fills shows up here first)."""
        collecting = evaluating = 0
        oldest = now
        for record in self.active.values():
            if record.phase is Phase.COLLECTING:
                collecting += 1
                oldest = min(oldest, record.started_at)
            else:
                evaluating += 1
        return GroupCounts(
            collecting, evaluating, len(self.terminal_index), len(self.watermarks), now - oldest
        )

    def check_invariants(self) -> None:
        """Raise InvariantViolation on any breach of I-2..I-4."""

        def require(ok: bool, what: str) -> None:
            if not ok:
                raise InvariantViolation(what)

        records = list(self.explicit.values()) + list(self.legacy.values())
        retained = {id(r) for r in records if not r.phase.active}
        require(set(self.terminal_index.keys()) == retained, "terminal index != retained records")
        for record in self.active.values():
            require(record.phase.active, "a terminal record is listed as active")
            if record.group_id is not None:
                require(self.explicit.get(record.group_id) is record, "active record unregistered")
                watermark = self.watermarks.get(record.group_id)
                require(
                    watermark is not None and watermark.attempt == record.attempt,
                    f"active group {record.group_id!r} has no matching watermark",
                )
                require(record.group_id not in self.idle_order, "active group in the idle order")
            else:
                require(self.legacy.get(record.key) is record, "active legacy record unregistered")
        idle_expected = {
            gid
            for gid in self.watermarks
            if not (gid in self.explicit and self.explicit[gid].phase.active)
        }
        require(set(self.idle_order.keys()) == idle_expected, "idle order != idle groups")
        for gid, record in self.explicit.items():
            require(record.group_id == gid, "record filed under another group id")
            watermark = self.watermarks.get(gid)
            if watermark is not None:
                require(
                    watermark == Watermark(record.attempt, record.digest),
                    f"group {gid!r}: record and watermark disagree",
                )
        for record in records:
            if not record.phase.active:
                for member in record.members.values():
                    require(not member.waiters, "terminal record has waiters")
                    require(member.texts is None, "terminal record keeps scoring texts")
                require(
                    record.inputs is None and not record.plan and not record.failed_comparisons,
                    "terminal record keeps its inputs or plan",
                )
            if record.phase is Phase.FAILED:
                require(
                    all(m.outcome is None for m in record.members.values()),
                    "failed record has rewards",
                )
        resends = [r for r in self.active.values() if r.legacy_resend]
        require(
            all(r.legacy and r.phase is Phase.COLLECTING for r in resends)
            and len(resends) == self.legacy_resends_collecting,
            "resent legacy groups miscounted",
        )
        if self.closed:
            require(not self.active, "active groups after shutdown")
