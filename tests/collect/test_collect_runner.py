"""The group runner in process: the fake policy and a server over ASGI, the fake judge behind it.
What each kind of failure writes, and that a group is only ever sent whole."""

from __future__ import annotations

import io
import json
import math
import statistics
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from genrm_trio.collect._policy import PolicyClient
from genrm_trio.collect._resume import GroupPlan, final_rows
from genrm_trio.collect._rows import (
    GROUP_INCOMPLETE,
    POLICY_FAILED,
    VERIFY_FAILED,
    Task,
    read_rows,
)
from genrm_trio.collect._runner import Clients, GroupRunner, Sinks, prometheus_total
from genrm_trio.core.run_metrics import summarize_rows
from genrm_trio.core.texts import extract_scoring_text
from genrm_trio.fakes.policy import FakePolicy, FakePolicyApp
from genrm_trio.testing import FakeJudge
from genrm_trio.testing.harness import Server, running_server

N = 4
TASK = Task(7, 8, {"responses_create_params": {"input": "Name a prime. [[qualities=5,4,2,1]]"}})


class Files:
    def __init__(self) -> None:
        self.output = io.BytesIO()
        self.failures = io.BytesIO()
        self.journal = io.BytesIO()

    def sinks(self) -> Sinks:
        return Sinks(self.output, self.failures, self.journal)

    @staticmethod
    def rows(sink: io.BytesIO) -> list[dict[str, Any]]:
        return [json.loads(line) for line in sink.getvalue().splitlines()]


def _runner(
    server: Server, policy: FakePolicy, files: Files, *, model: str | None = None
) -> GroupRunner:
    @asynccontextmanager
    async def connect() -> AsyncIterator[Clients]:
        transport = httpx.ASGITransport(app=FakePolicyApp(policy))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://policy") as http:
            client = PolicyClient(http, "http://policy/v1", model=model, retries=0)
            yield Clients(client, server.client)

    return GroupRunner(connect=connect, size=N, sinks=files.sinks(), verify_timeout_s=10)


async def test_a_whole_group_is_scored_and_journaled_before_it_is_sent() -> None:
    files = Files()
    async with running_server(num_rollouts_per_prompt=N) as server:
        runner = _runner(server, FakePolicy(seed=1), files)
        await runner.run_all([GroupPlan(TASK, "run-7", 0)], concurrency=2)
        calls = server.calls()
    rows = Files.rows(files.output)
    assert Files.rows(files.journal) == [
        {"_ng_task_index": 7, "_ng_group_id": "run-7", "_ng_group_attempt": 0}
    ]
    assert [r["_ng_rollout_index"] for r in rows] == list(range(N))
    assert {r["_ng_group_id"] for r in rows} == {"run-7"}
    # The qualities 5, 4, 2, 1 in arrival order: the best answer has the highest reward.
    best = max(rows, key=lambda r: r["reward"])
    assert extract_scoring_text(best["response"])[1].endswith("[[q=5]]")
    assert files.failures.getvalue() == b""
    assert calls == N
    assert runner.counts.groups_complete == 1


async def test_a_policy_failure_writes_the_group_as_failed_and_sends_nothing() -> None:
    files = Files()
    async with running_server(num_rollouts_per_prompt=N) as server:
        runner = _runner(server, FakePolicy(model="served"), files, model="other")
        await runner.run_all([GroupPlan(TASK, "run-7", 0)], concurrency=1)
        health = (await server.get("/healthz")).body
        calls = server.calls()
    failures = Files.rows(files.failures)
    assert [r["_ng_failure_class"] for r in failures] == [POLICY_FAILED] * N
    assert all(r["mask_sample"] is True for r in failures)
    assert any("policy answered 404" in r["failure_reason"] for r in failures)
    assert files.output.getvalue() == b""
    # Never journaled, never sent: the server saw no member and the judge no call.
    assert files.journal.getvalue() == b""
    assert health["watermarks"] == 0
    assert calls == 0
    assert runner.counts.groups_failed == 1


async def test_a_rejected_member_makes_the_whole_attempt_a_failure_row_each() -> None:
    files = Files()
    policy = FakePolicy(seed=2)
    async with running_server(num_rollouts_per_prompt=N) as server:
        runner = _runner(server, policy, files)
        await runner.run_all([GroupPlan(TASK, "run-7", 0)], concurrency=1)
        # The same attempt regenerated: new answers for occupied slots are refused (409).
        await runner.run_all([GroupPlan(TASK, "run-7", 0)], concurrency=1)
    failures = Files.rows(files.failures)
    assert len(failures) == N
    assert {r["_ng_failure_class"] for r in failures} == {VERIFY_FAILED}
    assert all("POST /verify answered 409" in r["failure_reason"] for r in failures)
    assert len(Files.rows(files.output)) == N


async def test_saved_responses_are_resent_as_they_were() -> None:
    files = Files()
    saved = [
        {"id": f"saved-{slot}", "output": [{"type": "message", "content": [
            {"type": "output_text", "text": f"answer-{slot} [[q={slot + 1}]]"}]}]}
        for slot in range(N)
    ]  # fmt: skip
    policy = FakePolicy()
    async with running_server(num_rollouts_per_prompt=N) as server:
        runner = _runner(server, policy, files)
        await runner.run_all([GroupPlan(TASK, "run-7", 3, saved)], concurrency=1)
    rows = Files.rows(files.output)
    assert [r["response"] for r in rows] == saved
    assert {r["_ng_group_attempt"] for r in rows} == {3}
    assert policy.requests_total == 0
    assert [r["reward"] for r in rows] == sorted(r["reward"] for r in rows)


async def test_a_member_answered_while_another_was_not_is_marked_incomplete() -> None:
    files = Files()
    judge = FakeJudge()
    async with running_server(num_rollouts_per_prompt=N, judge=judge) as server:
        runner = _runner(server, FakePolicy(seed=3), files)
        # Slot 4 is out of range for a server of N and refused (422); slots 0..3 are scored.
        small = GroupRunner(
            connect=runner.connect, size=N + 1, sinks=files.sinks(), verify_timeout_s=0.5
        )
        await small.run_all([GroupPlan(TASK, "run-7", 0)], concurrency=1)
    failures = Files.rows(files.failures)
    classes = [r["_ng_failure_class"] for r in failures]
    assert classes[N] == VERIFY_FAILED
    assert "_ng_rollout_index must be in [0, 4); got 4" in failures[N]["failure_reason"]
    assert set(classes[:N]) == {GROUP_INCOMPLETE}
    assert all("rollout_index=4 was not" in r["failure_reason"] for r in failures[:N])
    assert files.output.getvalue() == b""


async def test_group_mean_placeholders_never_enter_the_reward_statistics() -> None:
    files = Files()
    # The comparison that shows the policy's second answer first fails: two rows are masked.
    rule = {"match": {"response_1": "answer-1 "}, "action": "http_status", "status": 400}
    judge = FakeJudge(rules=[rule])
    async with running_server(
        num_rollouts_per_prompt=N, judge=judge, masked_reward_placeholder="group_mean"
    ) as server:
        runner = _runner(server, FakePolicy(seed=1), files)
        await runner.run_all([GroupPlan(TASK, "run-7", 0)], concurrency=1)
    scored = [row["reward"] for row in Files.rows(files.output)]
    masked = Files.rows(files.failures)
    assert len(scored) == len(masked) == 2 and len(set(scored)) == 2
    placeholder = statistics.fmean(scored)
    assert [row["reward"] for row in masked] == [placeholder, placeholder]
    assert all(row["mask_sample"] is True for row in masked)
    # The metrics file's rows and figures, as `collect` computes them.
    stored = [
        *read_rows(files.output.getvalue(), "out.jsonl")[0],
        *read_rows(files.failures.getvalue(), "out_failures.jsonl")[0],
    ]
    final, _, complete = final_rows([TASK], N, stored)
    assert complete == 1 and len(final) == N
    metrics = summarize_rows(final)
    assert (metrics.scored, metrics.failed) == (2, 2)
    assert metrics.failures_by_class == {"judge_failed": 2}
    # With the placeholders counted the spread would shrink by sqrt(2); it is the scored rows'.
    assert metrics.reward_std == statistics.pstdev(scored)
    assert metrics.reward_mean == placeholder
    # Counted as zero, a masked row enters as 0.0, never as its placeholder.
    counted = summarize_rows(final, ["judge_failed"])
    assert math.isclose(counted.reward_mean or 0.0, sum(scored) / N)
    assert counted.reward_min == 0.0


def test_judge_attempts_are_read_from_prometheus_text() -> None:
    text = "\n".join(
        [
            "# HELP genrm_judge_attempts_total Judge attempts.",
            "# TYPE genrm_judge_attempts_total counter",
            'genrm_judge_attempts_total{api="chat_completions",outcome="ok"} 12',
            'genrm_judge_attempts_total{api="chat_completions",outcome="http_5xx"} 3',
            # A timestamp after the value, and a label value with a space, brace and quote.
            'genrm_judge_attempts_total{api="responses",outcome="x } \\"y\\""} 4 1700000000000',
            "genrm_judge_attempts_total_created 1.7e9",
            "genrm_judge_retries_total 2",
        ]
    )
    assert prometheus_total(text, "genrm_judge_attempts_total") == 19
    assert prometheus_total("genrm_other 1", "genrm_judge_attempts_total") is None
