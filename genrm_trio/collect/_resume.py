"""What a resumed collection must redo, from what the previous run wrote. Plain synchronous code.

A task's group is complete when one attempt of it has a row for every slot 0..N-1 from the
reward server (scored in the output, masked in the failure sidecar). Anything else is redone as
a new attempt of the whole group: the attempt number goes one past the highest attempt written or
journaled for that group, so the server supersedes whatever the killed run left behind (C-80,
C-84), and every member is regenerated, or resent from the failure rows when the last attempt
failed after the policy had answered for every slot. A partial group is never sent: rows of an
attempt that is neither complete nor a whole failed attempt (a kill mid-write) are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from genrm_trio.collect._rows import (
    COLLECTOR_CLASSES,
    GROUP_ATTEMPT,
    GROUP_ID,
    POLICY_FAILED,
    ROLLOUT_INDEX,
    TASK_INDEX,
    StoredRow,
    Task,
)
from genrm_trio.core.run_metrics import FAILURE_CLASS_KEY

OUTPUT = "output"
FAILURES = "failures"

Status = Literal["complete", "failed", "torn", "journaled"]


@dataclass(slots=True)
class AttemptOnDisk:
    """What the files hold for one attempt of one task's group."""

    task_index: int
    group_id: str
    attempt: int
    rows: list[StoredRow] = field(default_factory=list)

    def status(self, size: int) -> Status:
        if not self.rows:
            return "journaled"
        slots = [row.row.get(ROLLOUT_INDEX) for row in self.rows]
        numbers = [number for number in map(_int, slots) if number is not None]
        if len(numbers) != len(slots) or sorted(numbers) != list(range(size)):
            return "torn"
        collector = [_is_collector_row(row) for row in self.rows]
        if all(collector):
            return "failed"
        if not any(collector):
            return "complete"
        return "torn"


def _is_collector_row(stored: StoredRow) -> bool:
    return stored.file == FAILURES and stored.row.get(FAILURE_CLASS_KEY) in COLLECTOR_CLASSES


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """One group attempt to run: regenerate every member (`saved` None) or resend `saved`."""

    task: Task
    group_id: str
    attempt: int
    saved: list[dict[str, Any]] | None = None


@dataclass(slots=True)
class ResumePlan:
    todo: list[GroupPlan]
    complete: list[int]
    keep: list[StoredRow]
    dropped: list[StoredRow]


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def attempts_by_task(
    rows: Iterable[StoredRow], journal: Iterable[tuple[int, str, int]] = ()
) -> dict[int, dict[tuple[str, int], AttemptOnDisk]]:
    """Rows grouped by task and by (group id, attempt); journaled attempts appear even with no
    rows. Rows without integer coordinates belong to no attempt and are left out."""
    found: dict[int, dict[tuple[str, int], AttemptOnDisk]] = {}
    for task_index, group_id, attempt in journal:
        found.setdefault(task_index, {}).setdefault(
            (group_id, attempt), AttemptOnDisk(task_index, group_id, attempt)
        )
    for stored in rows:
        task = _int(stored.row.get(TASK_INDEX))
        number = _int(stored.row.get(GROUP_ATTEMPT))
        name = stored.row.get(GROUP_ID)
        if task is None or number is None or not isinstance(name, str):
            continue
        found.setdefault(task, {}).setdefault(
            (name, number), AttemptOnDisk(task, name, number)
        ).rows.append(stored)
    return found


def _latest(attempts: dict[tuple[str, int], AttemptOnDisk]) -> AttemptOnDisk:
    return max(attempts.values(), key=lambda a: a.attempt)


def _saved_responses(attempt: AttemptOnDisk) -> list[dict[str, Any]] | None:
    """The responses of a failed attempt by slot, when every slot has one from the policy."""
    by_slot = sorted(attempt.rows, key=lambda stored: stored.row[ROLLOUT_INDEX])
    responses = []
    for stored in by_slot:
        response = stored.row.get("response")
        if stored.row.get(FAILURE_CLASS_KEY) == POLICY_FAILED or not isinstance(response, dict):
            return None
        responses.append(response)
    return responses


def plan_resume(
    tasks: Sequence[Task],
    size: int,
    rows: Iterable[StoredRow],
    journal: Iterable[tuple[int, str, int]],
    new_group_id: Callable[[Task], str],
) -> ResumePlan:
    """The groups to run, the tasks already complete, and which stored rows to keep.

    `new_group_id(task)` names the group of a task that has never been started.
    """
    rows = list(rows)
    found = attempts_by_task(rows, journal)
    todo: list[GroupPlan] = []
    complete: list[int] = []
    dropped_ids: set[int] = set()
    for task in tasks:
        attempts = found.get(task.index)
        if not attempts:
            todo.append(GroupPlan(task, new_group_id(task), 0))
            continue
        latest = _latest(attempts)
        for attempt in attempts.values():
            status = attempt.status(size)
            # A failed attempt's rows stay as the record of that attempt; a torn attempt, or a
            # complete one that a later attempt replaced, would put a group in the files twice.
            if status == "torn" or (status == "complete" and attempt is not latest):
                dropped_ids.update(id(stored) for stored in attempt.rows)
        if latest.status(size) == "complete":
            complete.append(task.index)
            continue
        saved = _saved_responses(latest) if latest.status(size) == "failed" else None
        todo.append(GroupPlan(task, latest.group_id, latest.attempt + 1, saved))
    keep = [stored for stored in rows if id(stored) not in dropped_ids]
    dropped = [stored for stored in rows if id(stored) in dropped_ids]
    return ResumePlan(todo, complete, keep, dropped)


def final_rows(
    tasks: Sequence[Task], size: int, rows: Iterable[StoredRow]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Rows of each task's latest attempt that finished (complete or failed as a whole), the
    failure rows of its earlier attempts, and the number of tasks whose group is complete."""
    found = attempts_by_task(rows)
    final: list[dict[str, Any]] = []
    earlier: list[dict[str, Any]] = []
    complete = 0
    for task in tasks:
        attempts = found.get(task.index)
        if not attempts:
            continue
        finished = [a for a in attempts.values() if a.status(size) in ("complete", "failed")]
        if not finished:
            continue
        last = max(finished, key=lambda a: a.attempt)
        complete += last.status(size) == "complete"
        final.extend(stored.row for stored in last.rows)
        for attempt in finished:
            if attempt is not last and attempt.status(size) == "failed":
                earlier.extend(stored.row for stored in attempt.rows)
    return final, earlier, complete
