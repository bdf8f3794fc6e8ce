"""NeMo Gym's /seed_session and /aggregate_metrics: Gym's shapes, the run-metric definitions of
core.run_metrics, and 4xx texts that name the field."""

from __future__ import annotations

import math

import pytest

from genrm_trio.core.run_metrics import summarize_rows
from genrm_trio.http.gym_endpoints import aggregate_metrics, flat_metrics
from genrm_trio.testing.fake_judge import FakeJudge, pair_rule
from genrm_trio.testing.harness import running_server

GYM_REPLY_KEYS = {"group_level_metrics", "agent_metrics", "key_metrics"}


def scored(task: int, reward: float) -> dict[str, object]:
    return {"_ng_task_index": task, "reward": reward, "mask_sample": False, "failure_kind": None}


def masked(task: int, placeholder: float = 0.0) -> dict[str, object]:
    return {
        "_ng_task_index": task,
        "reward": placeholder,
        "mask_sample": True,
        "failure_kind": "judge_failed",
        "_ng_failure_class": "judge_failed",
    }


def test_metrics_cover_scored_rows_only_and_count_failures_by_class() -> None:
    rows = [scored(0, 4.0), scored(0, 2.0), masked(0), scored(1, 3.0), masked(1), masked(1)]
    reply = aggregate_metrics(rows)
    overall = reply.agent_metrics
    assert overall["rows"] == 6 and overall["scored"] == 3 and overall["failed"] == 3
    assert overall["mask_rate"] == 0.5
    assert overall["failures/judge_failed"] == 3
    # A masked row's placeholder 0.0 never drags the mean down.
    assert overall["mean/reward"] == 3.0
    assert overall["min/reward"] == 2.0 and overall["max/reward"] == 4.0
    assert math.isclose(overall["std/reward"], math.sqrt(2 / 3))
    assert reply.key_metrics == {"mean/reward": 3.0, "mask_rate": 0.5, "scored": 3, "failed": 3}
    tasks = {group["_ng_task_index"]: group for group in reply.group_level_metrics}
    assert list(tasks) == [0, 1]
    assert tasks[0]["mean/reward"] == 3.0 and tasks[0]["mask_rate"] == 1 / 3
    assert tasks[1]["mean/reward"] == 3.0 and tasks[1]["failures/judge_failed"] == 2


def test_a_group_mean_placeholder_never_enters_the_reward_statistics() -> None:
    rows = [scored(0, 4.0), scored(0, 2.0), masked(0, 3.0), masked(0, 3.0)]
    overall = aggregate_metrics(rows).agent_metrics
    assert (overall["scored"], overall["failed"]) == (2, 2)
    # Counted, the two 3.0 placeholders would halve the spread's square.
    assert overall["std/reward"] == 1.0 and overall["mean/reward"] == 3.0


def test_the_flat_names_carry_exactly_the_shared_definitions() -> None:
    rows = [scored(0, 1.0), {"reward": float("nan")}, {"_ng_failure_class": "timeout"}]
    metrics = summarize_rows(rows)
    flat = flat_metrics(metrics)
    assert flat["failures/no_reward"] == 1 and flat["failures/timeout"] == 1
    assert flat["mask_rate"] == metrics.mask_rate
    assert flat["median/reward"] == metrics.reward_median == 1.0


def test_a_task_with_no_scored_row_has_no_reward_statistics() -> None:
    reply = aggregate_metrics([masked(7), {"reward": 2.0}])
    by_task = {group["_ng_task_index"]: group for group in reply.group_level_metrics}
    assert list(by_task) == [7, None]  # rows without a task index come last, together
    assert "mean/reward" not in by_task[7] and by_task[7]["failed"] == 1
    assert by_task[None]["mean/reward"] == 2.0


def test_no_rows_give_gyms_empty_metrics() -> None:
    reply = aggregate_metrics([])
    assert (reply.group_level_metrics, reply.agent_metrics, reply.key_metrics) == ([], {}, {})


async def test_a_run_with_a_masked_pair_aggregates_over_the_server_rows() -> None:
    judge = FakeJudge(rules=[pair_rule(1, 2, "http_status", status=400)])
    async with running_server(judge=judge, num_rollouts_per_prompt=4) as server:
        rows = await server.complete("t0", qualities=[5, 4, 3, 2], _ng_task_index=0)
        assert [r.masked for r in rows] == [False, True, True, False]
        reply = await server.post(
            "/aggregate_metrics", {"verify_responses": [r.body for r in rows]}
        )
    assert reply.status == 200 and set(reply.body) == GYM_REPLY_KEYS
    agent = reply.body["agent_metrics"]
    assert agent["scored"] == 2 and agent["mask_rate"] == 0.5
    assert agent["failures/judge_failed"] == 2
    assert agent["mean/reward"] == (rows[0].reward + rows[3].reward) / 2
    assert reply.body["group_level_metrics"][0]["_ng_task_index"] == 0


async def test_seed_session_answers_an_empty_object_and_keeps_nothing() -> None:
    async with running_server(num_rollouts_per_prompt=2) as server:
        before = server.engine.statistics()
        reply = await server.post("/seed_session", {"responses_create_params": {"input": "hi"}})
        empty = await server.post("/seed_session", {})
        assert server.engine.statistics() == before
    assert (reply.status, reply.body) == (200, {})
    assert (empty.status, empty.body) == (200, {})


@pytest.mark.parametrize(
    ("path", "body", "status", "detail"),
    [
        ("/aggregate_metrics", b"{", 400, "invalid JSON body: "),
        ("/aggregate_metrics", b"[]", 400, "invalid JSON body: "),
        (
            "/aggregate_metrics",
            b'{"verify_responses": [], "verify_responses": []}',
            400,
            "duplicate key 'verify_responses'",
        ),
        (
            "/aggregate_metrics",
            b"{}",
            422,
            "verify_responses: required field missing (expected an array of objects)",
        ),
        (
            "/aggregate_metrics",
            b'{"verify_responses": {}}',
            422,
            "verify_responses: expected an array of objects, got an object",
        ),
        (
            "/aggregate_metrics",
            b'{"verify_responses": [{}, 3]}',
            422,
            "verify_responses[1]: expected an object, got a number",
        ),
        ("/seed_session", b"not json", 400, "invalid JSON body: "),
        ("/seed_session", b"null", 400, "invalid JSON body: "),
    ],
)
async def test_bad_bodies_get_a_4xx_naming_the_problem(
    path: str, body: bytes, status: int, detail: str
) -> None:
    async with running_server(num_rollouts_per_prompt=2) as server:
        reply = await server.post(path, body)
    assert reply.status == status
    assert reply.detail.startswith(detail)


async def test_bodies_over_the_limit_get_413() -> None:
    async with running_server(num_rollouts_per_prompt=2, max_body_bytes=1024) as server:
        reply = await server.post("/aggregate_metrics", {"verify_responses": [{"x": "y" * 2000}]})
    assert reply.status == 413
    assert reply.detail == "request body exceeds 1024 bytes"
