"""NeMo Gym's /seed_session and /aggregate_metrics: Gym's shapes, the run-metric definitions of
core.run_metrics, and 4xx texts that name the field."""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio

from genrm_trio.core.run_metrics import summarize_rows
from genrm_trio.testing import FakeJudge, pair_rule
from genrm_trio.testing.harness import member, running_server
from genrm_trio.wire.gym_bodies import aggregate_metrics, counts

GYM_REPLY_KEYS = {
    "group_level_metrics",
    "agent_metrics",
    "key_metrics",
    "perf_summary",
    "repeat_level_metrics",
}


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
    assert overall["rows"] == overall["rollouts"] == 6
    assert overall["scored"] == 3 and overall["failed"] == 3
    assert overall["mask_rate"] == 0.5 and overall["masked_by_server"] == 0
    assert overall["failures/judge_failed"] == 3
    # Gym's keys, with Gym's definitions: a masked row's placeholder 0.0 never drags the mean
    # down, and the spread is the sample standard deviation.
    assert overall["mean/reward"] == 3.0
    assert overall["min/reward"] == 2.0 and overall["max/reward"] == 4.0
    assert math.isclose(overall["std/reward"], 1.0)
    assert overall["coverage/masked_rollouts"] == 3 and overall["coverage/measured_rollouts"] == 3
    assert reply.key_metrics == {
        "mean/reward": 3.0,
        "coverage/measured_rollouts": 3,
        "coverage/masked_rollouts": 3,
        "coverage/measured_tasks": 2,
        "coverage/fully_masked_tasks": 0,
        "mask_rate": 0.5,
        "scored": 3,
        "failed": 3,
    }
    tasks = {group["_ng_task_index"]: group for group in reply.group_level_metrics}
    assert list(tasks) == [0, 1]
    assert tasks[0]["mean/reward"] == 3.0 and tasks[0]["mask_rate"] == 1 / 3
    assert tasks[0]["num_rollouts"] == tasks[0]["expected_num_rollouts"] == 2
    assert tasks[1]["mean/reward"] == 3.0 and tasks[1]["failures/judge_failed"] == 2


def test_a_group_mean_placeholder_never_enters_the_reward_statistics() -> None:
    rows = [scored(0, 4.0), scored(0, 2.0), masked(0, 3.0), masked(0, 3.0)]
    overall = aggregate_metrics(rows).agent_metrics
    assert (overall["scored"], overall["failed"]) == (2, 2)
    # Counted, the two 3.0 placeholders would shrink the spread (Gym's sample deviation).
    assert math.isclose(overall["std/reward"], math.sqrt(2)) and overall["mean/reward"] == 3.0


def test_the_counts_carry_the_shared_failure_classes() -> None:
    rows = [scored(0, 1.0), {"reward": float("nan")}, {"_ng_failure_class": "timeout"}]
    flat = counts(summarize_rows(rows), 0, 0)
    assert flat["failures/no_reward"] == 1 and flat["failures/timeout"] == 1
    assert flat["mask_rate"] == summarize_rows(rows).mask_rate
    with_unseen = counts(summarize_rows(rows), 2, 2)
    assert with_unseen["failures/judge_failed"] == 2 and with_unseen["rollouts"] == 5
    assert with_unseen["mask_rate"] == 4 / 5


def test_a_task_with_no_scored_row_has_only_the_counts() -> None:
    reply = aggregate_metrics([masked(7), {"reward": 2.0}])
    by_task = {group["_ng_task_index"]: group for group in reply.group_level_metrics}
    assert list(by_task) == [0, 7]  # as in Gym, a row without a task index is task 0
    assert "mean/reward" not in by_task[7] and by_task[7]["failed"] == 1
    assert by_task[0]["mean/reward"] == 2.0


def test_no_rows_give_gyms_empty_metrics() -> None:
    reply = aggregate_metrics([])
    assert (reply.group_level_metrics, reply.agent_metrics, reply.key_metrics) == ([], {}, {})
    assert (reply.repeat_level_metrics, reply.perf_summary) == ([], None)


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
    assert agent["failures/judge_failed"] == 2 and agent["masked_by_server"] == 2
    assert agent["mean/reward"] == (rows[0].reward + rows[3].reward) / 2
    assert agent["num_repeats"] == 4
    assert reply.body["group_level_metrics"][0]["_ng_task_index"] == 0
    repeats = reply.body["repeat_level_metrics"]
    assert [entry["_ng_rollout_index"] for entry in repeats] == [0, 3]


async def test_masked_rollouts_left_out_of_the_rows_still_count() -> None:
    # Gym's collector moves masked rows to its failures sidecar and aggregates the rest: the
    # server remembers which rollouts of those groups it answered masked.
    judge = FakeJudge(rules=[pair_rule(1, 2, "http_status", status=400)])
    async with running_server(judge=judge, num_rollouts_per_prompt=4) as server:
        legacy = await server.complete(None, None, qualities=[5, 4, 3, 2], _ng_task_index=3)
        explicit = await server.complete("g9", 1, qualities=[5, 4, 3, 2], _ng_task_index=4)
        given = [r.body for r in legacy + explicit if not r.masked]
        reply = await server.post("/aggregate_metrics", {"verify_responses": given})
    agent = reply.body["agent_metrics"]
    assert (agent["rows"], agent["scored"], agent["rollouts"]) == (4, 4, 8)
    assert (agent["failed"], agent["masked_by_server"], agent["mask_rate"]) == (4, 4, 0.5)
    assert agent["failures/judge_failed"] == 4
    assert "coverage/masked_rollouts" not in agent  # Gym's own keys see only the rows given
    assert reply.body["key_metrics"]["mask_rate"] == 0.5
    tasks = {group["_ng_task_index"]: group for group in reply.body["group_level_metrics"]}
    assert tasks[3]["mask_rate"] == tasks[4]["mask_rate"] == 0.5
    assert tasks[3]["num_rollouts"] == 2 and tasks[3]["rollouts"] == 4


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


async def test_every_route_answers_under_gyms_rollout_prefix() -> None:
    # With observability on, Gym's clients call every route of a server under
    # /ng-rollout/<rollout id>/..., starting with /seed_session.
    async with running_server(num_rollouts_per_prompt=2) as server:
        seeded = await server.post("/ng-rollout/0-0/seed_session", {})
        replies: list[Any] = [None, None]

        async def rollout(slot: int) -> None:
            path = f"/ng-rollout/3-{slot}-a1/verify"
            replies[slot] = await server.post(path, member(slot, 2 + slot, "g", 0))

        async with trio.open_nursery() as nursery:
            for slot in range(2):
                nursery.start_soon(rollout, slot)
        metrics = await server.post(
            "/ng-rollout/3-0/aggregate_metrics", {"verify_responses": [r.body for r in replies]}
        )
        closed = await server.post(
            "/ng-rollout/0-0/close_session",
            {"resources_session_id": "s", "episode_id": {"rollout_id": "0-0", "attempt": 0}},
        )
        mode = await server.get("/ng-rollout/0-0/reverify_mode")
        health = await server.get("/ng-rollout/0-0/healthz")
        malformed = await server.post("/ng-rollout/.hidden/seed_session", {})
    assert (seeded.status, seeded.body) == (200, {})
    assert [r.status for r in replies] == [200, 200]
    assert [r.reward for r in replies] == [2.0, 3.0]
    assert metrics.status == 200 and metrics.body["agent_metrics"]["scored"] == 2
    assert (closed.status, closed.body) == (200, {"resources_session_id": "s"})
    assert (mode.status, mode.body) == (200, "unsupported")
    assert health.status == 200
    assert malformed.status == 404  # not a rollout id Gym would send: not stripped


async def test_reverify_mode_is_unsupported() -> None:
    # A group judge cannot re-verify one stored row on its own; Gym's `eval reverify` refuses
    # such a server (and with --force names its output unsafe_).
    async with running_server(num_rollouts_per_prompt=2) as server:
        reply = await server.get("/reverify_mode")
    assert (reply.status, reply.body) == (200, "unsupported")


async def test_close_session_confirms_the_session_and_keeps_nothing() -> None:
    body = {"resources_session_id": "env-7", "episode_id": {"rollout_id": "7-1", "attempt": 2}}
    async with running_server(num_rollouts_per_prompt=2) as server:
        before = server.engine.statistics()
        reply = await server.post("/close_session", body)
        assert server.engine.statistics() == before
    assert (reply.status, reply.body) == (200, {"resources_session_id": "env-7"})


async def test_an_environment_servers_seed_gets_its_session_id_back() -> None:
    body = {
        "resources_session_id": "env-7",
        "episode_id": {"rollout_id": "7-1", "attempt": 0},
        "task_id": {"task_index": 7},
        "task_data": {},
    }
    async with running_server(num_rollouts_per_prompt=2) as server:
        reply = await server.post("/seed_session", body)
    assert (reply.status, reply.body) == (200, {"resources_session_id": "env-7"})


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b"{}", "resources_session_id: required field missing (expected a non-empty string)"),
        (
            b'{"resources_session_id": 3}',
            "resources_session_id: expected a non-empty string, got a number",
        ),
        (b'{"resources_session_id": ""}', "resources_session_id: expected a non-empty string"),
        (b"[]", "invalid JSON body: "),
    ],
)
async def test_a_bad_close_session_body_gets_422_naming_the_field(body: bytes, detail: str) -> None:
    async with running_server(num_rollouts_per_prompt=2) as server:
        reply = await server.post("/close_session", body)
    assert reply.status in (400, 422) and reply.detail.startswith(detail)
