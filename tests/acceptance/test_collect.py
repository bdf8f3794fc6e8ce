"""`genrm-trio collect` end to end over real loopback HTTP (X-5): the fake policy, a real
`genrm-trio serve` and the fake judge as processes, rewards predicted from the answers' texts,
judge faults, the failure sidecar, the metrics file, and a run killed with SIGKILL then resumed.
"""

from __future__ import annotations

import json
import math
import re
import signal
import time
from pathlib import Path
from typing import Any

from genrm_trio.collect._rows import read_rows
from genrm_trio.core._aggregation import aggregate
from genrm_trio.core.pairs import plan_comparisons
from genrm_trio.core.texts import extract_scoring_text
from genrm_trio.core.verdicts import Verdict
from genrm_trio.fakes.judge import quality, verdict_for_qualities

N = 8
OUTAGE_QUALITY = "2.5"  # every answer of the outage task carries [[q=2.5]]
RULES = [
    # A judge outage for one task: every comparison with its answer first fails.
    {"match": {"response_1": f"[[q={OUTAGE_QUALITY}]]"}, "action": "http_status", "status": 503},
    # A flaky pair: answer-3 shown before answer-4 fails wherever the two meet.
    {
        "match": {"response_1": "answer-3 ", "response_2": "answer-4 "},
        "action": "http_status",
        "status": 500,
    },
]


def _start_stack(cli: Any, *, policy_latency: str = "none") -> tuple[str, str, str, Any]:
    """Fake judge, fake policy and a server for groups of N; returns their URLs and the server."""
    rules = cli.write("rules.json", json.dumps(RULES))
    _, judge_url = cli.start_fake_judge("--rules", str(rules))
    policy = cli.start("fake-policy", "--port", "0", "--seed", "11", "--latency", policy_latency)
    line = policy.read_line()
    assert line.startswith("fake policy listening on http://127.0.0.1:"), line
    policy_url = line.removeprefix("fake policy listening on ")
    server, server_url, _ = cli.start_serve(
        "--set",
        f"judge_base_url={judge_url}",
        "--set",
        "judge_model=fake-judge",
        "--set",
        f"num_rollouts_per_prompt={N}",
        "--set",
        "genrm_parse_retries=0",
    )
    return judge_url, policy_url, server_url, server


def _tasks(count: int, outage: int | None = None) -> list[str]:
    lines = []
    for index in range(count):
        prompt = f"Explain item {index} briefly."
        if index == outage:
            prompt += f" [[qualities={OUTAGE_QUALITY}]]"
        lines.append(json.dumps({"responses_create_params": {"input": prompt}, "topic": index}))
    return lines


def _rows(path: Path) -> list[dict[str, Any]]:
    """The complete rows of a file that may be in the middle of a write."""
    if not path.exists():
        return []
    return [stored.row for stored in read_rows(path.read_bytes(), path.name)[0]]


def _answer(row: dict[str, Any]) -> str:
    return extract_scoring_text(row["response"])[1]


def _judge_calls(cli: Any, judge_url: str) -> int:
    with cli.http_client(judge_url.removesuffix("/v1")) as client:
        return int(client.get("/_fake/stats").json()["requests_total"])


def _predict(group: list[dict[str, Any]]) -> tuple[set[int], dict[int, float]]:
    """Masked slots and rewards of a group from its answers, by the fake judge's rules."""
    texts = [_answer(row) for row in sorted(group, key=lambda r: r["_ng_rollout_index"])]
    plan = plan_comparisons("circular", N, 1)
    failed = set()
    results: list[tuple[int, int, Verdict]] = []
    for comparison in plan:
        first, second = texts[comparison.first], texts[comparison.second]
        if f"[[q={OUTAGE_QUALITY}]]" in first or ("answer-3 " in first and "answer-4 " in second):
            failed.add(comparison.index)
            continue
        verdict = verdict_for_qualities(quality(first), quality(second))
        results.append((comparison.first, comparison.second, Verdict(*verdict)))
    masked = {slot for c in plan if c.index in failed for slot in c.pair}
    base, _ = aggregate(N, results, 3.0)
    return masked, {slot: base[slot] for slot in range(N) if slot not in masked}


def _collect(cli: Any, policy_url: str, server_url: str, *args: str) -> Any:
    return cli.run(
        "collect",
        "--policy-url",
        policy_url,
        "--server-url",
        server_url,
        "--repeats",
        str(N),
        *args,
        timeout=60,
    )


def test_collect_writes_predicted_rewards_failures_and_metrics(cli: Any, tmp_path: Path) -> None:
    judge_url, policy_url, server_url, _ = _start_stack(cli)
    lines = _tasks(64, outage=5)
    lines.insert(10, "{not json")  # line 11
    tasks = cli.write("tasks.jsonl", "\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    done = _collect(
        cli, policy_url, server_url, "--input", str(tasks), "--output", str(out),
        "--concurrency", "8",
    )  # fmt: skip
    # The bad line is named, skipped, and makes the exit status 1; every other task is run.
    assert "tasks.jsonl:11: invalid JSON" in done.stderr
    assert done.returncode == 1, done.stderr
    assert re.match(r"collected 64/64 groups: ", done.stdout), done.stdout

    scored = _rows(out)
    failures = _rows(tmp_path / "out_failures.jsonl")
    assert all(row["mask_sample"] is False for row in scored)
    assert all(row["mask_sample"] is True for row in failures)
    assert all(row["_ng_failure_class"] == "judge_failed" for row in failures)
    by_task: dict[int, list[dict[str, Any]]] = {}
    for row in scored + failures:
        by_task.setdefault(row["_ng_task_index"], []).append(row)
    # Line 11 was bad, so the tasks after it keep their line numbers as indexes.
    assert sorted(by_task) == [i for i in range(65) if i != 10]
    masked_total = 0
    for task_index, group in by_task.items():
        assert sorted(r["_ng_rollout_index"] for r in group) == list(range(N))
        assert {r["_ng_group_attempt"] for r in group} == {0}
        assert len({r["_ng_group_id"] for r in group}) == 1
        masked, rewards = _predict(group)
        assert {r["_ng_rollout_index"] for r in group if r["mask_sample"]} == masked
        for row in group:
            if not row["mask_sample"]:
                assert math.isclose(row["reward"], rewards[row["_ng_rollout_index"]])
                assert row["topic"] == task_index - (task_index > 10)
        masked_total += len(masked)
    outage = by_task[5]
    assert all(r["mask_sample"] for r in outage)
    assert "every rollout was masked" in outage[0]["failure_reason"]
    assert 0 < masked_total - N < 64 * N  # the flaky pair met in some groups, not all

    metrics = json.loads((tmp_path / "out_metrics.json").read_text())
    rewards = [row["reward"] for row in scored]
    assert metrics["rows"] == 64 * N
    assert metrics["scored"] == len(scored) == 64 * N - masked_total
    assert metrics["failures_by_class"] == {"judge_failed": masked_total}
    assert math.isclose(metrics["mask_rate"], masked_total / (64 * N))
    assert math.isclose(metrics["reward_mean"], sum(rewards) / len(rewards))
    assert metrics["groups_complete"] == 64
    assert metrics["bad_input_lines"] == 1
    assert metrics["this_run"]["group_attempts_sent"] == 64
    calls = _judge_calls(cli, judge_url)
    assert calls == 64 * N  # circular: N comparisons per group, no retries
    assert metrics["this_run"]["judge_calls"] == calls  # as the server counted them

    # Resuming a finished run sends nothing; the metrics can count judge failures as zero.
    again = _collect(
        cli, policy_url, server_url, "--input", str(tasks), "--output", str(out), "--resume",
        "--count-failure-classes-as-zero", "judge_failed",
    )  # fmt: skip
    assert again.returncode == 1, again.stderr
    assert _rows(out) == scored
    assert _judge_calls(cli, judge_url) == calls
    counted = json.loads((tmp_path / "out_metrics.json").read_text())
    assert counted["counted_as_zero"] == masked_total
    assert counted["this_run"]["judge_calls"] == 0
    assert math.isclose(counted["reward_mean"], sum(rewards) / (64 * N))
    assert counted["scored"] == metrics["scored"]
    assert counted["this_run"]["group_attempts_sent"] == 0

    # The same tasks through chat completions give rows of the same shape.
    chat_out = tmp_path / "chat.jsonl"
    chat_tasks = cli.write("chat_tasks.jsonl", "\n".join(_tasks(3)) + "\n")
    chat = _collect(
        cli, policy_url, server_url, "--input", str(chat_tasks), "--output", str(chat_out),
        "--policy-api", "chat_completions",
    )  # fmt: skip
    assert chat.returncode == 0, chat.stderr
    chat_rows = _rows(chat_out) + _rows(tmp_path / "chat_failures.jsonl")
    assert len(chat_rows) == 3 * N
    assert all(_answer(row).startswith("answer-") for row in chat_rows)


def test_a_run_killed_mid_way_and_resumed_has_each_group_exactly_once(
    cli: Any, tmp_path: Path
) -> None:
    judge_url, policy_url, server_url, server = _start_stack(
        cli, policy_latency="lognormal:0.15:0.8"
    )
    count = 24
    tasks = cli.write("tasks.jsonl", "\n".join(_tasks(count)) + "\n")
    out = tmp_path / "out.jsonl"
    journal = tmp_path / "out_attempts.jsonl"
    args = [
        "collect", "--policy-url", policy_url, "--server-url", server_url, "--repeats", str(N),
        "--input", str(tasks), "--output", str(out), "--concurrency", "4",
    ]  # fmt: skip
    first = cli.start(*args)
    cli.wait_until(lambda: len(_rows(out)) >= 2 * N)
    assert first.popen.poll() is None, "the run finished before it could be killed"
    first.send_signal(signal.SIGKILL)
    first.wait()
    begun = _rows(journal)[1:]
    written = {(r["_ng_task_index"], r["_ng_group_attempt"]) for r in _rows(out)}
    assert 2 <= len({task for task, _ in written}) < count

    resumed = cli.run(*args, "--resume", timeout=60)
    assert resumed.returncode == 0, resumed.stderr

    rows = _rows(out) + _rows(tmp_path / "out_failures.jsonl")
    by_task: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_task.setdefault(row["_ng_task_index"], []).append(row)
    assert sorted(by_task) == list(range(count))
    journaled_before = {}
    for entry in begun:
        task = entry["_ng_task_index"]
        journaled_before[task] = max(journaled_before.get(task, -1), entry["_ng_group_attempt"])
    for task, group in by_task.items():
        # Exactly one whole group per task, all from one attempt.
        assert sorted(r["_ng_rollout_index"] for r in group) == list(range(N)), task
        attempts = {r["_ng_group_attempt"] for r in group}
        assert len(attempts) == 1, (task, attempts)
        [attempt] = attempts
        if (task, 0) in written:
            assert attempt == 0
        elif task in journaled_before:
            # Begun before the kill but never written: resent whole as the next attempt.
            assert attempt == journaled_before[task] + 1, (task, attempt)
        else:
            assert attempt == 0

    # The server judged only whole groups, and dropped the killed run's partial ones when their
    # next attempt arrived; the fake judge made N calls per judged group.
    server.send_signal(signal.SIGTERM)
    server.wait()
    log = server.stderr()
    completed = re.findall(r"disposition=completed key='[^']*' attempt=\d+ members=(\d+)", log)
    assert completed and set(completed) == {str(N)}
    assert len(completed) >= count
    failed = re.findall(r"disposition=failed key='[^']*' attempt=\d+ members=\d+ kind=\w+ "
                        r"reason=\"([^\"]*)\"", log)  # fmt: skip
    assert all("was superseded by attempt" in reason for reason in failed), failed
    assert "did not collect" not in log
    assert _judge_calls(cli, judge_url) == N * len(completed)


def test_sigterm_stops_a_run_with_its_summary_line_and_resume_finishes_it(
    cli: Any, tmp_path: Path
) -> None:
    _, policy_url, server_url, _ = _start_stack(cli, policy_latency="uniform:0.2:0.4")
    count = 12
    tasks = cli.write("tasks.jsonl", "\n".join(_tasks(count)) + "\n")
    out = tmp_path / "out.jsonl"
    args = [
        "collect", "--policy-url", policy_url, "--server-url", server_url, "--repeats", str(N),
        "--input", str(tasks), "--output", str(out), "--concurrency", "2",
    ]  # fmt: skip
    first = cli.start(*args)
    cli.wait_until(lambda: len(_rows(out)) + len(_rows(tmp_path / "out_failures.jsonl")) >= N)
    assert first.popen.poll() is None, "the run finished before it could be stopped"
    # A supervisor stops the run: it still says what it collected, and where.
    first.send_signal(signal.SIGTERM)
    assert first.wait() == 128 + signal.SIGTERM, first.stderr()
    [summary] = first.stdout().splitlines()
    match = re.match(rf"collected (\d+)/{count} groups: ", summary)
    assert match is not None, summary
    assert 1 <= int(match.group(1)) < count
    assert f"metrics in {tmp_path / 'out_metrics.json'}" in summary
    metrics = json.loads((tmp_path / "out_metrics.json").read_text())
    assert metrics["groups_complete"] == int(match.group(1))
    assert "interrupted (SIGTERM); rerun with --resume to finish" in first.stderr()

    resumed = cli.run(*args, "--resume", timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith(f"collected {count}/{count} groups: ")
    rows = _rows(out) + _rows(tmp_path / "out_failures.jsonl")
    assert sorted({row["_ng_task_index"] for row in rows}) == list(range(count))


def test_fake_policy_serves_until_sigterm(cli: Any) -> None:
    process = cli.start("fake-policy", "--port", "0", "--latency", "none")
    line = process.read_line()
    url = line.removeprefix("fake policy listening on ")
    with cli.http_client(url.removesuffix("/v1")) as client:
        reply = client.post("/v1/responses", json={"input": "hello"})
    assert reply.status_code == 200
    assert extract_scoring_text(reply.json())[1].startswith("answer-0 ")
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait() == 0
    assert time.monotonic() - start < 5


def test_policy_failures_are_regenerated_whole_on_resume(cli: Any, tmp_path: Path) -> None:
    rules = cli.write("rules.json", "[]")
    _, judge_url = cli.start_fake_judge("--rules", str(rules))
    policy = cli.start(
        "fake-policy", "--port", "0", "--seed", "5", "--error-rate", "0.05",
        "--latency", "uniform:0.2:0.4",
    )  # fmt: skip
    policy_url = policy.read_line().removeprefix("fake policy listening on ")
    _, server_url, _ = cli.start_serve(
        "--set", f"judge_base_url={judge_url}", "--set", "judge_model=fake-judge",
        "--set", f"num_rollouts_per_prompt={N}",
    )  # fmt: skip
    count = 12
    tasks = cli.write("tasks.jsonl", "\n".join(_tasks(count)) + "\n")
    out = tmp_path / "out.jsonl"
    args = [
        "collect", "--policy-url", policy_url, "--server-url", server_url, "--repeats", str(N),
        "--input", str(tasks), "--output", str(out), "--concurrency", "2",
        "--policy-retries", "0",
    ]  # fmt: skip
    # Ctrl-C: the run stops, says how to finish, and leaves whole groups behind.
    first = cli.start(*args)
    cli.wait_until(lambda: len(_rows(out)) + len(_rows(tmp_path / "out_failures.jsonl")) >= N)
    assert first.popen.poll() is None, "the run finished before it could be interrupted"
    first.send_signal(signal.SIGINT)
    assert first.wait() == 130, first.stderr()
    assert "interrupted (SIGINT); rerun with --resume to finish" in first.stderr()

    statuses = []
    for _ in range(10):
        statuses.append(cli.run(*args, "--resume", timeout=60).returncode)
        if statuses[-1] == 0:
            break
    assert statuses[-1] == 0, statuses

    failures = _rows(tmp_path / "out_failures.jsonl")
    policy_failed = [r for r in failures if r["_ng_failure_class"] == "policy_failed"]
    assert policy_failed, "the error rate never failed a group; the test proves nothing"
    scored = _rows(out)
    final = {r["_ng_task_index"]: r["_ng_group_attempt"] for r in scored}
    assert sorted(final) == list(range(count))
    for task in range(count):
        group = [r for r in scored if r["_ng_task_index"] == task]
        assert sorted(r["_ng_rollout_index"] for r in group) == list(range(N))
        assert {r["_ng_group_attempt"] for r in group} == {final[task]}
        # Each failed attempt left one row per member and came before the final attempt.
        failed_attempts: dict[int, list[int]] = {}
        for row in policy_failed:
            if row["_ng_task_index"] == task:
                failed_attempts.setdefault(row["_ng_group_attempt"], []).append(
                    row["_ng_rollout_index"]
                )
        for attempt, slots in failed_attempts.items():
            assert sorted(slots) == list(range(N))
            assert attempt < final[task]
    # A group the policy failed was never sent: the journal has no line for its attempt.
    journaled = {(e["_ng_task_index"], e["_ng_group_attempt"]) for e in _rows(
        tmp_path / "out_attempts.jsonl")[1:]}  # fmt: skip
    assert not {(r["_ng_task_index"], r["_ng_group_attempt"]) for r in policy_failed} & journaled
    metrics = json.loads((tmp_path / "out_metrics.json").read_text())
    assert metrics["groups_complete"] == count
    assert metrics["rows"] == count * N
    assert metrics["earlier_attempt_failures_by_class"] == {"policy_failed": len(policy_failed)}


def test_collect_against_a_real_server_stops_at_once_on_a_wrong_group_size(
    cli: Any, tmp_path: Path
) -> None:
    judge_url, policy_url, server_url, _ = _start_stack(cli)
    tasks = cli.write("tasks.jsonl", "\n".join(_tasks(4)) + "\n")
    out = tmp_path / "out.jsonl"
    done = cli.run(
        "collect", "--policy-url", policy_url, "--server-url", server_url, "--repeats", "4",
        "--input", str(tasks), "--output", str(out), timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--repeats 4 does not match" in done.stderr
    assert f"(num_rollouts_per_prompt: {N} at {server_url})" in done.stderr
    assert not out.exists()
    assert _judge_calls(cli, judge_url) == 0


def test_collect_against_a_server_whose_judge_is_dead_exits_2_naming_the_replica(
    cli: Any, tmp_path: Path
) -> None:
    dead = "http://127.0.0.1:9/v1"
    policy = cli.start("fake-policy", "--port", "0", "--seed", "11")
    policy_url = policy.read_line().removeprefix("fake policy listening on ")
    _, server_url, _ = cli.start_serve(
        "--set", f"judge_base_url={dead}", "--set", "judge_model=fake-judge",
        "--set", f"num_rollouts_per_prompt={N}",
    )  # fmt: skip
    tasks = cli.write("tasks.jsonl", "\n".join(_tasks(4)) + "\n")
    out = tmp_path / "out.jsonl"
    done = cli.run(
        "collect", "--policy-url", policy_url, "--server-url", server_url, "--repeats", str(N),
        "--input", str(tasks), "--output", str(out), "--wait-ready", "3", timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"judge replica {dead} unreachable: ConnectError" in done.stderr
    assert not out.exists()
