"""The collector's rows: task lines, member bodies, failure rows and reading its files back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genrm_trio.collect._rows import (
    POLICY_FAILED,
    StoredRow,
    Task,
    attempts_path,
    bookkeeping,
    encode_line,
    failure_row,
    failures_path,
    member_body,
    metrics_path,
    raw_line,
    read_rows,
    read_tasks,
)
from genrm_trio.core.run_metrics import failure_class


def _line(**row: object) -> str:
    return json.dumps(row)


PARAMS = {"input": [{"role": "user", "content": "2+2?"}], "temperature": 0.7}


def test_tasks_take_their_line_index_or_their_own_task_index() -> None:
    lines = [
        _line(responses_create_params=PARAMS, extra="a"),
        "",
        _line(responses_create_params={"input": "plain"}, _ng_task_index=40),
        _line(responses_create_params=PARAMS),
    ]
    tasks, errors = read_tasks(lines, "tasks.jsonl")
    assert errors == []
    assert [(t.index, t.line) for t in tasks] == [(0, 1), (40, 3), (3, 4)]
    assert tasks[0].row == {"responses_create_params": PARAMS, "extra": "a"}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "tasks.jsonl:2: invalid JSON"),
        ("[1, 2]", "tasks.jsonl:2: expected a JSON object"),
        ('{"prompt": "x"}', "tasks.jsonl:2: responses_create_params: expected an object"),
        (
            '{"responses_create_params": {"input": 5}}',
            "tasks.jsonl:2: responses_create_params.input: expected a string or an array",
        ),
        (
            '{"responses_create_params": {"input": ["x"]}}',
            "tasks.jsonl:2: responses_create_params.input: expected an array of objects",
        ),
        (
            '{"responses_create_params": {"input": "x"}, "_ng_task_index": -1}',
            "tasks.jsonl:2: _ng_task_index: expected an integer >= 0, got -1",
        ),
        (
            '{"responses_create_params": {"input": "x"}, "_ng_task_index": 0}',
            "tasks.jsonl:2: _ng_task_index 0 is also the task of line 1",
        ),
    ],
)
def test_a_bad_line_is_named_and_the_other_lines_are_kept(text: str, problem: str) -> None:
    lines = [_line(responses_create_params=PARAMS), text, _line(responses_create_params=PARAMS)]
    tasks, errors = read_tasks(lines, "tasks.jsonl")
    assert len(errors) == 1
    assert errors[0].startswith(problem), errors[0]
    assert [t.line for t in tasks] == [1, 3]


def test_a_task_line_cannot_choose_the_coordinates_or_the_outcome() -> None:
    row = {
        "responses_create_params": PARAMS,
        "_ng_group_id": "mine",
        "_ng_group_attempt": 7,
        "_ng_rollout_index": 3,
        "reward": 1.0,
        "response": {"output": []},
        "kept": True,
    }
    tasks, _ = read_tasks([json.dumps(row)], "t")
    body = member_body(tasks[0], "run-0", 2, 5, {"id": "r", "output": []})
    assert body == {
        "responses_create_params": PARAMS,
        "kept": True,
        "response": {"id": "r", "output": []},
        "_ng_task_index": 0,
        "_ng_group_id": "run-0",
        "_ng_group_attempt": 2,
        "_ng_rollout_index": 5,
    }


def test_a_failure_row_is_masked_and_classed() -> None:
    task = Task(4, 5, {"responses_create_params": PARAMS})
    row = failure_row(member_body(task, "g", 0, 1, {"output": []}), POLICY_FAILED, "why")
    assert row["mask_sample"] is True
    assert row["failure_kind"] == POLICY_FAILED
    assert row["failure_reason"] == "why"
    assert failure_class(row) == POLICY_FAILED
    assert row["response"] == {"output": []}


def test_sidecar_names_follow_the_output_stem() -> None:
    out = Path("/runs/eval.jsonl")
    assert failures_path(out) == Path("/runs/eval_failures.jsonl")
    assert metrics_path(out) == Path("/runs/eval_metrics.json")
    assert attempts_path(out) == Path("/runs/eval_attempts.jsonl")


def test_lines_keep_non_finite_numbers_and_never_break() -> None:
    assert encode_line({"x": float("nan")}) == b'{"x":NaN}\n'
    assert raw_line(b'{"a":\n 1}') == b'{"a":  1}\n'


def test_a_line_cut_by_a_kill_is_left_out() -> None:
    data = b'{"a":1}\n{"b":2}\n{"c":'
    rows, good = read_rows(data, "out")
    assert rows == [StoredRow("out", 1, {"a": 1}), StoredRow("out", 2, {"b": 2})]
    assert data[:good] == b'{"a":1}\n{"b":2}\n'
    assert read_rows(b'{"a":', "out") == ([], 0)
    assert read_rows(b"", "out") == ([], 0)


def test_a_damaged_line_inside_the_file_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="out:2: not a JSON object"):
        read_rows(b'{"a":1}\n{"b":\n{"c":3}\n', "out")


def test_only_the_bookkeeping_of_a_stored_row_is_kept_in_memory() -> None:
    task = Task(0, 1, {"responses_create_params": PARAMS, "big": "x" * 1000})
    body = member_body(task, "g", 1, 2, {"output": [], "logprobs": [0.0] * 100})
    scored = {**body, "reward": 4.0, "mask_sample": False, "failure_kind": None}
    kept = read_rows(encode_line(scored), "out", bookkeeping)[0][0].row
    assert kept == {
        "_ng_task_index": 0,
        "_ng_group_id": "g",
        "_ng_group_attempt": 1,
        "_ng_rollout_index": 2,
        "reward": 4.0,
        "mask_sample": False,
        "failure_kind": None,
    }
    # A failed attempt keeps its response: a resumed run sends it again.
    failed = failure_row(body, "verify_failed", "lost")
    assert bookkeeping(failed)["response"] == body["response"]
    assert "big" not in bookkeeping(failed)
