"""The collector's files and rows: task lines in, `/verify` member bodies, failure rows and
JSON lines out. Plain synchronous code.

Files beside the output `<stem>.jsonl`: `<stem>_failures.jsonl` (masked and failed rows, one per
rollout attempt), `<stem>_metrics.json`, and `<stem>_attempts.jsonl`, the journal of group
attempts begun, written before a group's first member is sent so that a resumed run knows which
attempts may have reached the server.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genrm_trio.core.run_metrics import FAILURE_CLASS_KEY

TASK_INDEX = "_ng_task_index"
GROUP_ID = "_ng_group_id"
GROUP_ATTEMPT = "_ng_group_attempt"
ROLLOUT_INDEX = "_ng_rollout_index"

# Failure classes the collector writes itself; the server's masked rows carry `judge_failed`.
POLICY_FAILED = "policy_failed"
VERIFY_FAILED = "verify_failed"
GROUP_INCOMPLETE = "group_incomplete"
COLLECTOR_CLASSES = frozenset({POLICY_FAILED, VERIFY_FAILED, GROUP_INCOMPLETE})

# Keys the collector or the server own; a task line's own values for them are replaced.
_MEMBER_KEYS = (TASK_INDEX, GROUP_ID, GROUP_ATTEMPT, ROLLOUT_INDEX)
_SERVER_KEYS = (
    "response",
    "reward",
    "mask_sample",
    "failure_kind",
    "failure_reason",
    FAILURE_CLASS_KEY,
    "_ng_failure_judge_error",
    "genrm_failed_comparison_rate_per_group",
    "genrm_masked_rollout_rate_per_group",
    "mean_individual_score",
    "std_individual_score",
    "tiebreak_usage_rate",
)


def failures_path(output: Path) -> Path:
    return output.with_name(output.stem + "_failures.jsonl")


def metrics_path(output: Path) -> Path:
    return output.with_name(output.stem + "_metrics.json")


def attempts_path(output: Path) -> Path:
    return output.with_name(output.stem + "_attempts.jsonl")


@dataclass(frozen=True, slots=True)
class Task:
    """One task line: its index (`_ng_task_index`), its line number and its fields."""

    index: int
    line: int
    row: dict[str, Any]


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _task_problem(row: object) -> str | None:
    if not isinstance(row, dict):
        return "expected a JSON object"
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        return "responses_create_params: expected an object"
    if not isinstance(params.get("input"), str | list):
        return "responses_create_params.input: expected a string or an array"
    if isinstance(params["input"], list) and not all(isinstance(i, dict) for i in params["input"]):
        return "responses_create_params.input: expected an array of objects"
    if TASK_INDEX in row and row[TASK_INDEX] is not None and not _is_index(row[TASK_INDEX]):
        return f"{TASK_INDEX}: expected an integer >= 0, got {json.dumps(row[TASK_INDEX])}"
    return None


def read_tasks(lines: Iterable[str], source: str) -> tuple[list[Task], list[str]]:
    """The tasks of a JSON-lines file, and one error text per bad line.

    A task's index is its own `_ng_task_index`, else its line number minus one, so indexes stay
    stable when a bad line is fixed. Blank lines are skipped.
    """
    tasks: list[Task] = []
    errors: list[str] = []
    seen: dict[int, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except ValueError as error:
            errors.append(f"{source}:{number}: invalid JSON: {error}")
            continue
        problem = _task_problem(row)
        if problem is not None:
            errors.append(f"{source}:{number}: {problem}")
            continue
        index = row.get(TASK_INDEX)
        if index is None:
            index = number - 1
        if index in seen:
            errors.append(
                f"{source}:{number}: {TASK_INDEX} {index} is also the task of line {seen[index]}"
            )
            continue
        seen[index] = number
        for key in (*_MEMBER_KEYS, *_SERVER_KEYS):
            row.pop(key, None)
        tasks.append(Task(index, number, row))
    return tasks, errors


def member_body(
    task: Task, group_id: str, attempt: int, slot: int, response: Mapping[str, Any]
) -> dict[str, Any]:
    """The `/verify` body of one rollout: the task's fields, the response and its coordinates."""
    body = dict(task.row)
    body["response"] = response
    body[TASK_INDEX] = task.index
    body[GROUP_ID] = group_id
    body[GROUP_ATTEMPT] = attempt
    body[ROLLOUT_INDEX] = slot
    return body


def failure_row(body: Mapping[str, Any], failure_class: str, reason: str) -> dict[str, Any]:
    """A row for the failure sidecar: the member's body with the failure written on it.

    `reward` 0.0 is a placeholder, as on the server's masked rows: `mask_sample` says so.
    """
    row = {k: v for k, v in body.items() if k not in _SERVER_KEYS or k == "response"}
    row["reward"] = 0.0
    row["mask_sample"] = True
    row["failure_kind"] = failure_class
    row["failure_reason"] = reason
    row[FAILURE_CLASS_KEY] = failure_class
    return row


def encode_line(row: Any) -> bytes:
    """One JSON line. Non-finite numbers are written as NaN/Infinity, as the server echoes them."""
    return json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def raw_line(raw: bytes) -> bytes:
    """A reply's own bytes as one line: a raw line break can only be whitespace between tokens
    in JSON, so it becomes a space."""
    return raw.replace(b"\r", b" ").replace(b"\n", b" ") + b"\n"


@dataclass(frozen=True, slots=True)
class StoredRow:
    """A row read back from one of the collector's files: where it is and what it says."""

    file: str
    line: int
    row: dict[str, Any]


# What resuming and the metrics read from a stored row; the rest (token ids, log-probs, the
# echoed task) is dropped as soon as a line is parsed, so memory follows the row count, not the
# size of the files.
_BOOKKEEPING_KEYS = (
    *_MEMBER_KEYS,
    "reward",
    "mask_sample",
    "failure_kind",
    FAILURE_CLASS_KEY,
)


def bookkeeping(row: dict[str, Any]) -> dict[str, Any]:
    """The part of a stored row that resuming and the metrics use. A failed attempt's row keeps
    its `response`, which a resumed run sends again."""
    kept = {key: row[key] for key in _BOOKKEEPING_KEYS if key in row}
    if row.get(FAILURE_CLASS_KEY) in COLLECTOR_CLASSES and "response" in row:
        kept["response"] = row["response"]
    return kept


def read_rows(
    data: bytes, file: str, keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> tuple[list[StoredRow], int]:
    """The rows of a JSON-lines file (each passed through `keep`, when given) and the byte length
    of its complete lines.

    Bytes after the last line break were cut by a kill mid-write: they are left out, and the
    length says where the file's good part ends. A complete line that is not a JSON object
    raises ValueError naming it.
    """
    complete, separator, _ = data.rpartition(b"\n")
    rows: list[StoredRow] = []
    if not separator:
        return rows, 0
    for number, text in enumerate(complete.split(b"\n"), start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise ValueError(f"{file}:{number}: not a JSON object; the file is damaged")
        rows.append(StoredRow(file, number, keep(row) if keep is not None else row))
    return rows, len(complete) + 1
