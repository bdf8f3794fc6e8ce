"""`genrm-trio collect` before any network: usage errors, and a resumed run's files cut back to
whole groups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from genrm_trio.cli import main
from genrm_trio.collect._command import prepare
from genrm_trio.collect._rows import Task, encode_line, member_body

UNREACHABLE = "http://127.0.0.1:9"


def _collect(tmp_path: Path, *extra: str) -> int:
    tasks = tmp_path / "tasks.jsonl"
    if not tasks.exists():
        tasks.write_text('{"responses_create_params": {"input": "x"}}\n')
    return main(
        [
            "collect", "--policy-url", UNREACHABLE, "--server-url", UNREACHABLE,
            "--input", str(tasks), "--output", str(tmp_path / "out.jsonl"), "--repeats", "2",
            "--wait-ready", "0", *extra,
        ]
    )  # fmt: skip


def test_an_existing_output_is_never_overwritten(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text('{"reward": 1}\n')
    assert _collect(tmp_path) == 2
    assert "out.jsonl already exists; pass --resume" in capsys.readouterr().err
    assert _collect(tmp_path, "--resume") == 2
    assert "no out_attempts.jsonl, so it was not written by genrm-trio collect" in (
        capsys.readouterr().err
    )
    assert out.read_text() == '{"reward": 1}\n'


def test_a_resume_must_keep_the_group_size(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "out_attempts.jsonl").write_text('{"run_id": "r", "repeats": 4}\n')
    assert _collect(tmp_path, "--resume") == 2
    assert "collected with --repeats 4; resume with the same value (got 2)" in (
        capsys.readouterr().err
    )


def test_an_unreadable_input_is_a_usage_error(tmp_path: Path, capsys: Any) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.mkdir()
    assert _collect(tmp_path) == 2
    assert "cannot read" in capsys.readouterr().err
    assert not (tmp_path / "out_attempts.jsonl").exists()


@pytest.mark.parametrize(
    "flag", ["--repeats=0", "--concurrency=-1", "--verify-timeout=0", "--verify-retries=-1"]
)
def test_bad_flags_exit_2(tmp_path: Path, flag: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _collect(tmp_path, flag)
    assert exit_info.value.code == 2


def test_resume_cuts_the_files_back_to_whole_groups(tmp_path: Path) -> None:
    task = Task(0, 1, {"responses_create_params": {"input": "x"}})
    other = Task(1, 2, {"responses_create_params": {"input": "y"}})
    out = tmp_path / "out.jsonl"

    def scored(t: Task, slot: int) -> bytes:
        body = member_body(t, f"r-{t.index}", 0, slot, {"id": f"{t.index}-{slot}", "output": []})
        return encode_line({**body, "reward": 2.0, "mask_sample": False})

    # Task 0 complete; task 1 cut off: one scored row and half of a second line.
    out.write_bytes(scored(task, 0) + scored(task, 1) + scored(other, 0) + b'{"resp')
    (tmp_path / "out_failures.jsonl").write_bytes(b"")
    (tmp_path / "out_attempts.jsonl").write_bytes(
        encode_line({"run_id": "r", "repeats": 2})
        + encode_line({"_ng_task_index": 0, "_ng_group_id": "r-0", "_ng_group_attempt": 0})
        + encode_line({"_ng_task_index": 1, "_ng_group_id": "r-1", "_ng_group_attempt": 0})
        + b'{"_ng_task'
    )
    prepared = prepare(out, [task, other], 2, True, tmp_path / "tasks.jsonl")
    assert prepared.complete == 1
    assert [(p.task.index, p.group_id, p.attempt) for p in prepared.plans] == [(1, "r-1", 1)]
    assert prepared.dropped == 1
    assert out.read_bytes() == scored(task, 0) + scored(task, 1)
    journal = (tmp_path / "out_attempts.jsonl").read_bytes()
    assert journal.endswith(b"\n") and len(journal.splitlines()) == 3
    assert json.loads(journal.splitlines()[0]) == {"run_id": "r", "repeats": 2}


def test_a_server_that_never_answers_stops_the_run_before_any_file(
    tmp_path: Path, capsys: Any
) -> None:
    assert _collect(tmp_path, "--wait-ready", "0.3") == 1
    assert "the server at http://127.0.0.1:9/healthz was not ready in 0.3s" in (
        capsys.readouterr().err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.jsonl"]
