"""The resume planner: what a resumed collection keeps, drops and redoes (pure, no I/O)."""

from __future__ import annotations

from typing import Any

from genrm_trio.collect._resume import final_rows, plan_resume
from genrm_trio.collect._rows import (
    GROUP_INCOMPLETE,
    POLICY_FAILED,
    VERIFY_FAILED,
    StoredRow,
    Task,
    failure_row,
    member_body,
)

N = 3
TASKS = [Task(i, i + 1, {"responses_create_params": {"input": f"task {i}"}}) for i in range(3)]


def _body(task: int, attempt: int, slot: int) -> dict[str, Any]:
    response = {"id": f"r-{task}-{attempt}-{slot}", "output": []}
    return member_body(TASKS[task], f"run-{task}", attempt, slot, response)


class Files:
    """Rows as the collector writes them, with line numbers per file."""

    def __init__(self) -> None:
        self.rows: list[StoredRow] = []
        self.lines = {"output": 0, "failures": 0}

    def _add(self, file: str, row: dict[str, Any]) -> StoredRow:
        self.lines[file] += 1
        stored = StoredRow(file, self.lines[file], row)
        self.rows.append(stored)
        return stored

    def scored(self, task: int, attempt: int, slot: int) -> StoredRow:
        return self._add("output", {**_body(task, attempt, slot), "reward": 3.0})

    def masked(self, task: int, attempt: int, slot: int) -> StoredRow:
        row = {
            **_body(task, attempt, slot),
            "reward": 0.0,
            "mask_sample": True,
            "failure_kind": "judge_failed",
            "_ng_failure_class": "judge_failed",
        }
        return self._add("failures", row)

    def failed(self, task: int, attempt: int, slot: int, cls: str) -> StoredRow:
        return self._add("failures", failure_row(_body(task, attempt, slot), cls, "why"))

    def group(self, task: int, attempt: int, masked: tuple[int, ...] = ()) -> None:
        for slot in range(N):
            (self.masked if slot in masked else self.scored)(task, attempt, slot)

    def failed_group(self, task: int, attempt: int, cls: str) -> None:
        for slot in range(N):
            self.failed(task, attempt, slot, cls)


def _plan(files: Files, journal: list[tuple[int, str, int]] | None = None) -> Any:
    return plan_resume(TASKS, N, files.rows, journal or [], lambda t: f"new-{t.index}")


def _todo(plan: Any) -> dict[int, tuple[str, int, bool]]:
    return {p.task.index: (p.group_id, p.attempt, p.saved is not None) for p in plan.todo}


def test_complete_groups_are_kept_and_missing_ones_start_at_attempt_zero() -> None:
    files = Files()
    files.group(0, 0)
    files.group(1, 0, masked=(0, 2))
    plan = _plan(files)
    assert plan.complete == [0, 1]
    assert _todo(plan) == {2: ("new-2", 0, False)}
    assert plan.dropped == []
    assert len(plan.keep) == 2 * N


def test_a_journaled_attempt_with_no_rows_is_replaced_by_the_next_attempt() -> None:
    # Killed after the journal line: members may have reached the server.
    plan = _plan(Files(), journal=[(0, "run-0", 0), (1, "run-1", 0), (1, "run-1", 1)])
    assert _todo(plan) == {0: ("run-0", 1, False), 1: ("run-1", 2, False), 2: ("new-2", 0, False)}


def test_rows_of_a_group_cut_off_mid_write_are_dropped_and_the_group_redone() -> None:
    files = Files()
    files.group(0, 0)
    # Task 1: the masked row reached the sidecar, the scored rows never reached the output.
    cut = files.masked(1, 0, 1)
    plan = _plan(files, journal=[(0, "run-0", 0), (1, "run-1", 0)])
    assert plan.complete == [0]
    assert plan.dropped == [cut]
    assert cut not in plan.keep
    assert _todo(plan)[1] == ("run-1", 1, False)


def test_a_failed_attempt_is_resent_from_its_saved_responses_as_the_next_attempt() -> None:
    files = Files()
    for slot in range(N):
        files.failed(0, 0, slot, GROUP_INCOMPLETE if slot else VERIFY_FAILED)
    plan = _plan(files, journal=[(0, "run-0", 0)])
    [redo] = [p for p in plan.todo if p.task.index == 0]
    assert (redo.group_id, redo.attempt) == ("run-0", 1)
    assert redo.saved == [{"id": f"r-0-0-{slot}", "output": []} for slot in range(N)]
    # The failed attempt's rows stay: one failure row per attempt is the record.
    assert plan.dropped == []


def test_a_policy_failure_is_regenerated_not_resent() -> None:
    files = Files()
    files.failed_group(0, 0, POLICY_FAILED)
    assert _todo(_plan(files))[0] == ("run-0", 1, False)


def test_a_group_completed_after_failed_attempts_is_complete_once() -> None:
    files = Files()
    files.failed_group(0, 0, VERIFY_FAILED)
    files.failed_group(0, 1, POLICY_FAILED)
    files.group(0, 2, masked=(1,))
    plan = _plan(files, journal=[(0, "run-0", 0), (0, "run-0", 2)])
    assert 0 in plan.complete
    assert 0 not in _todo(plan)
    final, earlier, complete = final_rows(TASKS, N, plan.keep)
    assert [r["_ng_group_attempt"] for r in final] == [2] * N
    assert (
        sorted(r["_ng_failure_class"] for r in earlier) == [POLICY_FAILED] * N + [VERIFY_FAILED] * N
    )
    assert complete == 1


def test_an_older_complete_attempt_replaced_by_a_newer_one_is_dropped() -> None:
    files = Files()
    files.group(0, 0)
    newer = [files.scored(0, 1, slot) for slot in range(N)]
    plan = _plan(files)
    assert plan.complete[0] == 0
    assert [s.row["_ng_group_attempt"] for s in plan.dropped] == [0] * N
    assert all(stored in plan.keep for stored in newer)


def test_a_later_journaled_attempt_makes_a_written_group_incomplete() -> None:
    # Attempt 1 was begun (and supersedes attempt 0 at the server) but never written.
    files = Files()
    files.group(0, 0)
    plan = _plan(files, journal=[(0, "run-0", 0), (0, "run-0", 1)])
    assert 0 not in plan.complete
    assert _todo(plan)[0] == ("run-0", 2, False)


def test_rows_with_another_group_size_are_not_a_complete_group() -> None:
    files = Files()
    for slot in range(N + 1):
        files.scored(0, 0, slot)
    plan = _plan(files)
    assert 0 not in plan.complete
    assert len(plan.dropped) == N + 1


def test_final_rows_of_a_task_that_never_completed_are_its_last_failed_attempt() -> None:
    files = Files()
    files.failed_group(0, 0, VERIFY_FAILED)
    files.failed_group(0, 1, POLICY_FAILED)
    files.group(1, 0)
    final, earlier, complete = final_rows(TASKS, N, files.rows)
    assert complete == 1
    assert sorted({(r["_ng_task_index"], r["_ng_group_attempt"]) for r in final}) == [
        (0, 1),
        (1, 0),
    ]
    assert {r["_ng_failure_class"] for r in earlier} == {VERIFY_FAILED}
