"""`genrm-trio demo` as a user runs it: the tables, the summary line and the JSON rows (§8.3).

Each demo run is a real process with its own fake judge and server on free ports.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

SAFETY_S = 20.0
GROUP_SIZE = 16
MASKED_SETS = [set(), {0, 15}, {4, 5, 6}, set(range(GROUP_SIZE))]
JUDGE_CALLS = [16, 17, 18, 32]
FAILED_COMPARISONS = [0, 1, 2, 16]
LAST_LINE = "demo ok: 43 scored, 21 masked, 1 group(s) failed, 83 judge calls"
METRICS = (
    "genrm_failed_comparison_rate_per_group",
    "genrm_masked_rollout_rate_per_group",
    "mean_individual_score",
    "std_individual_score",
    "tiebreak_usage_rate",
)
COORDINATES = ("_ng_group_id", "_ng_group_attempt", "_ng_rollout_index", "_ng_task_index")
PLAIN_NAMES = ("group_id", "group_attempt", "rollout_index", "task_index")
HEADER = re.compile(
    r"task (\d+): (.+) group=(\S+) judge calls=(\d+) failed comparisons=(\d+)/16 masked=(\d+)/16"
)
ROLLOUT = re.compile(r"\s*(\d+)\s+(-|-?\d+\.\d{4})\s+(yes|no)(?:\s+(.*))?")


@dataclass
class Rollout:
    idx: int
    reward: str
    masked: bool
    reason: str


@dataclass
class Task:
    number: int
    group: str
    calls: int
    failed: int
    masked: int
    rollouts: list[Rollout]


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "genrm_trio.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=SAFETY_S,
        check=False,
    )


def parse_tables(stdout: str) -> list[Task]:
    tasks: list[Task] = []
    for line in stdout.splitlines():
        if header := HEADER.fullmatch(line):
            number, _, group, calls, failed, masked = header.groups()
            tasks.append(Task(int(number), group, int(calls), int(failed), int(masked), []))
        elif rollout := ROLLOUT.fullmatch(line):
            idx, reward, masked_text, reason = rollout.groups()
            assert tasks, f"rollout line before any task header: {line!r}"
            tasks[-1].rollouts.append(Rollout(int(idx), reward, masked_text == "yes", reason or ""))
    return tasks


def json_rows(run: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def demo_runs() -> Iterator[dict[str, subprocess.CompletedProcess[str]]]:
    yield {
        "first": run_demo(),
        "second": run_demo(),
        "responses": run_demo("--judge-api", "responses"),
        "json": run_demo("--json"),
        "json_again": run_demo("--json"),
    }


def test_demo_tables_and_summary(demo_runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    # AS-170
    run = demo_runs["first"]
    assert run.returncode == 0, run.stderr
    assert "demo self-check failed" not in run.stderr
    lines = run.stdout.splitlines()
    assert lines[-1] == LAST_LINE
    tasks = parse_tables(run.stdout)
    assert [t.number for t in tasks] == [1, 2, 3, 4]
    assert [t.group for t in tasks] == ["demo-1-0", "demo-2-0", "demo-3-0", "demo-4-0"]
    assert [t.calls for t in tasks] == JUDGE_CALLS
    assert [t.failed for t in tasks] == FAILED_COMPARISONS
    assert [t.masked for t in tasks] == [len(m) for m in MASKED_SETS]
    assert sum(len(t.rollouts) for t in tasks) == 64
    for task, expected in zip(tasks, MASKED_SETS, strict=True):
        assert [r.idx for r in task.rollouts] == list(range(GROUP_SIZE))
        assert {r.idx for r in task.rollouts if r.masked} == expected
        for rollout in task.rollouts:
            if rollout.masked:
                assert rollout.reward == "-"
                assert 0 < len(rollout.reason) <= 100
            else:
                assert math.isfinite(float(rollout.reward))
                assert rollout.reason == ""


def test_demo_output_is_identical_across_runs(
    demo_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    # AS-170
    first, second = demo_runs["first"], demo_runs["second"]
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    # The JSON rows carry whole failure texts, judge URL included: they repeat exactly too.
    assert demo_runs["json_again"].stdout == demo_runs["json"].stdout


def test_demo_on_the_responses_api_gives_the_same_masks_and_rewards(
    demo_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    # AS-170
    chat, responses = demo_runs["first"], demo_runs["responses"]
    assert responses.returncode == 0, responses.stderr
    assert responses.stdout.splitlines()[-1] == LAST_LINE

    def masks_and_rewards(stdout: str) -> list[list[tuple[int, str, bool]]]:
        return [[(r.idx, r.reward, r.masked) for r in t.rollouts] for t in parse_tables(stdout)]

    assert len(parse_tables(responses.stdout)) == 4
    assert masks_and_rewards(responses.stdout) == masks_and_rewards(chat.stdout)


def check_scored_row(row: dict[str, Any]) -> None:
    """W-20…W-22."""
    keys = list(row)
    assert keys[-9:] == ["reward", "mask_sample", "failure_kind", "failure_reason", *METRICS]
    reward = row["reward"]
    assert isinstance(reward, int | float) and not isinstance(reward, bool)
    assert math.isfinite(reward)
    assert (row["mask_sample"], row["failure_kind"], row["failure_reason"]) == (False, None, None)
    for metric in METRICS:
        value = row[metric]
        assert isinstance(value, int | float) and not isinstance(value, bool)
        assert math.isfinite(value)
    assert "_ng_failure_class" not in row and "_ng_failure_judge_error" not in row


def check_masked_row(row: dict[str, Any]) -> None:
    """W-30…W-32."""
    keys = list(row)
    assert keys[-6:] == [
        "reward",
        "mask_sample",
        "failure_kind",
        "failure_reason",
        "_ng_failure_class",
        "_ng_failure_judge_error",
    ]
    assert row["instance_config"] == {"mask_sample": True}
    assert row["reward"] == 0.0
    assert (row["mask_sample"], row["failure_kind"]) == (True, "judge_failed")
    assert row["_ng_failure_class"] == "judge_failed"
    reason = row["failure_reason"]
    assert isinstance(reason, str) and 0 < len(reason) <= 2000
    assert row["_ng_failure_judge_error"] == reason
    assert not set(METRICS) & set(row)


def test_demo_json_rows_are_scored_or_masked_rows(
    demo_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    # AS-171
    run = demo_runs["json"]
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    rows = json_rows(run)
    assert all(line.startswith(("{", "demo ok: ")) for line in lines)
    assert len(rows) == 64
    for number, expected in enumerate(MASKED_SETS, start=1):
        group = [row for row in rows if row["_ng_group_id"] == f"demo-{number}-0"]
        assert [row["_ng_rollout_index"] for row in group] == list(range(GROUP_SIZE))
        assert {row["_ng_rollout_index"] for row in group if row["mask_sample"]} == expected
        scored = [row for row in group if not row["mask_sample"]]
        for row in group:
            for coordinate in COORDINATES:
                assert coordinate in row
            assert (row["_ng_group_attempt"], row["_ng_task_index"]) == (0, None)
            assert not set(PLAIN_NAMES) & set(row)
            assert "_ng_rollout_id" not in row
            assert isinstance(row["response"]["output"], list)
            assert "input" in row["responses_create_params"]
            if row["mask_sample"]:
                check_masked_row(row)
            else:
                check_scored_row(row)
        # W-20: the group metrics are the same on every scored row of the group (M-6).
        assert len({tuple(row[m] for m in METRICS) for row in scored}) <= 1
        for row in scored:
            assert row["genrm_masked_rollout_rate_per_group"] == len(expected) / GROUP_SIZE
            assert row["genrm_failed_comparison_rate_per_group"] == (
                FAILED_COMPARISONS[number - 1] / GROUP_SIZE
            )


def test_demo_failure_reasons_name_the_injected_faults(
    demo_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    # AS-171 (CL-20: the four injected faults, M-3, M-5)
    rows = {
        (row["_ng_group_id"], row["_ng_rollout_index"]): row for row in json_rows(demo_runs["json"])
    }

    def reason(group: int, slot: int) -> str:
        text: str = rows[(f"demo-{group}-0", slot)]["failure_reason"]
        return text

    for slot in (0, 15):
        text = reason(2, slot)
        assert text.startswith(
            f"GenRM rollout_index={slot} lost a comparison to a judge failure "
            "(1 of 16 comparisons failed): GenRM judge http://fake-judge/v1/chat/completions "
        )
        assert "pair=(15, 0) judge=0 attempt=2/2 " in text
        assert "Judge returned no completed answer after 2 attempts (2 of them exhausted" in text
    for slot, pair in ((4, "(4, 5)"), (5, "(4, 5)"), (6, "(5, 6)")):
        text = reason(3, slot)
        assert text.startswith(
            f"GenRM rollout_index={slot} lost a comparison to a judge failure "
            "(2 of 16 comparisons failed): "
        )
        assert f"pair={pair} judge=0 attempt=2/2 " in text
        assert "HTTPStatusError: HTTP 500" in text
    for slot in range(GROUP_SIZE):
        text = reason(4, slot)
        assert text.startswith(
            "GenRM cohort 'group_id::demo-4-0::group_attempt::0' failed: every rollout was "
            "masked (16 of 16 comparisons failed); first failure: GenRM judge "
        )
        assert "pair=(0, 1) judge=0 attempt=2/2 " in text
        assert "HTTPStatusError: HTTP 503" in text


def test_demo_tables_show_the_json_rows(
    demo_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    # AS-170, AS-171 (CL-21: rewards to 4 decimals, reasons cut to 100 code points)
    rows = json_rows(demo_runs["json"])
    rollouts = [r for t in parse_tables(demo_runs["first"].stdout) for r in t.rollouts]
    assert len(rollouts) == len(rows) == 64
    for rollout, row in zip(rollouts, rows, strict=True):
        assert rollout.idx == row["_ng_rollout_index"]
        assert rollout.masked == row["mask_sample"]
        if row["mask_sample"]:
            assert rollout.reason == row["failure_reason"][:100].rstrip()
        else:
            assert rollout.reward == f"{row['reward']:.4f}"
