"""What a group attempt is made of: its record, its members, its watermark and its keys.

Plain data, read and changed only by the group state machine (``core/transition.py``) and
written as they are by the stores (``store/``). A record holds no waiters and no bodies: those
stay with the requests, in the process that holds them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from genrm_trio.core import messages
from genrm_trio.core.identity import ResponseIdentity
from genrm_trio.core.outcomes import Masked, Scored
from genrm_trio.core.pairs import Comparison

__all__ = [
    "Failure",
    "FailureKind",
    "GroupInputs",
    "Member",
    "MemberTexts",
    "Phase",
    "Record",
    "RowsGroup",
    "Watermark",
    "group_key",
    "legacy_task_index",
    "record_fields",
    "rows_group",
]


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


class MemberTexts(NamedTuple):
    reasoning: str
    answer: str


class GroupInputs(NamedTuple):
    """Judge-facing inputs converted once per group from its first accepted member."""

    history: list[dict[str, str]]
    principle: str | None
    baseline: str | None
    baseline_digest: str | None


@dataclass(slots=True, eq=False)
class Member:
    slot: int
    fingerprint: bytes | ResponseIdentity
    texts: MemberTexts | None
    outcome: Scored | Masked | None = None


@dataclass(slots=True)
class Failure:
    kind: FailureKind
    text: str


class Watermark(NamedTuple):
    attempt: int
    digest: str


@dataclass(slots=True, eq=False)
class Record:
    """The state of one group attempt, from its first accepted member to its retirement.

    Besides the attempt itself it carries who may evaluate it, in the store's clock
    (core/ownership.py): the fencing token, bumped at every claim, and the lease of a claim
    that must be renewed. ``rid`` is unique per record, so that nothing mistakes a later record
    of the same group for an earlier one.
    """

    rid: str
    key: str
    group_id: str | None
    attempt: int
    digest: str
    legacy_key: str | None
    size: int
    started_at: float
    collection_due: float
    phase: Phase = Phase.COLLECTING
    members: dict[int, Member] = field(default_factory=dict)
    inputs: GroupInputs | None = None
    # The comparisons of the group (a function of the configuration and the inputs), and those
    # already handed to an evaluation while the group collects (early judging).
    plan: list[Comparison] = field(default_factory=list)
    dispatched: set[int] = field(default_factory=set)
    failure: Failure | None = None
    terminal_time: float | None = None
    # Opened by a row whose legacy key had already completed, and still collecting (§5.14).
    legacy_resend: bool = False
    fence: int = 0  # 0: nobody has claimed the evaluation yet
    lease_until: float | None = None  # None: no lease runs (nobody evaluates, or for good)
    evaluation_due: float | None = None

    @property
    def legacy(self) -> bool:
        return self.group_id is None


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


def legacy_task_index(record: Record) -> int | None:
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


def record_fields(record: Record) -> dict[str, Any]:
    """The fields a structured log record about this group carries (X-6)."""
    return messages.log_fields(record.key, record.attempt)
