"""`POST /verify_group` on the in-process server: rows per slot, a masked row's null reward,
replay, field errors, the memory budget for waiting bodies, and its place in the OpenAPI
document."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from genrm_trio.http._openapi import openapi_document
from genrm_trio.testing import FakeJudge, pair_rule
from genrm_trio.testing.harness import member, running_server

N = 4


def group(qualities: list[int], group_id: str | None = "g", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "responses_create_params": {"input": "2+2?"},
        "responses": [member(i, q)["response"] for i, q in enumerate(qualities)],
        **extra,
    }
    if group_id is not None:
        body["_ng_group_id"] = group_id
    return body


async def test_rows_per_slot_with_a_masked_slot_null_and_a_replay_without_judging() -> None:
    async with running_server(num_rollouts_per_prompt=N) as server:
        server.judge.set_rules([pair_rule(2, 3, "http_status", status=400)])
        reply = await server.post("/verify_group", json.dumps(group([4, 1, 2, 5])).encode())
        assert reply.status == 200
        rows = reply.body["rows"]
        assert [row["_ng_rollout_index"] for row in rows] == [0, 1, 2, 3]
        assert [row["reward"] for row in rows] == [4, 1, None, None]
        assert [row["mask_sample"] for row in rows] == [False, False, True, True]
        assert rows[2]["failure_kind"] == "judge_failed"
        assert "genrm_masked_rollout_rate_per_group" not in rows[2]
        assert rows[0]["genrm_masked_rollout_rate_per_group"] == 0.5
        calls = server.calls()
        again = await server.post("/verify_group", json.dumps(group([4, 1, 2, 5])).encode())
        assert again.body == reply.body
        assert server.calls() == calls
        # Its members are /verify members: a single /verify of slot 0 replays too.
        single = await server.verify(member(0, 4))
        assert single.body["reward"] == 4
        assert server.calls() == calls


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (group([1, 2, 3, 4], group_id=None), "_ng_group_id: required field missing"),
        (group([1, 2, 3, 4], group_id=""), "_ng_group_id: expected a string"),
        ({**group([1]), "responses": "x"}, "responses: expected an array of 4 response objects"),
        (group([1, 2]), "responses: expected an array of 4 response objects"),
        (
            {**group([1, 2, 3]), "responses": [*group([1, 2, 3])["responses"], {"id": 1}]},
            "responses[3].output: required field missing",
        ),
        ({**group([1, 2, 3, 4]), "_ng_group_attempt": -1}, "_ng_group_attempt: expected"),
    ],
)
async def test_bad_input_is_422_naming_the_field_and_judges_nothing(
    body: dict[str, Any], detail: str
) -> None:
    async with running_server(num_rollouts_per_prompt=N) as server:
        reply = await server.post("/verify_group", json.dumps(body).encode())
        assert reply.status == 422, reply.body
        assert reply.body["detail"].startswith(detail)
        assert server.calls() == 0
        assert server.engine.statistics().collecting == 0


async def test_a_conflict_in_one_slot_answers_the_whole_request_at_once() -> None:
    async with running_server(num_rollouts_per_prompt=N) as server:
        await server.post("/verify_group", json.dumps(group([1, 2, 3, 4])).encode())
        other = group([1, 2, 3, 4])
        other["responses"][1] = member(1, 5, regenerated=True)["response"]
        reply = await server.post("/verify_group", json.dumps(other).encode())
        assert reply.status == 409
        assert "already has a different response for rollout_index=1" in reply.body["detail"]


async def test_a_group_body_waits_unread_for_room_in_the_memory_budget() -> None:
    first = json.dumps(group([1, 2, 3, 4], group_id="first")).encode()
    second = json.dumps(group([4, 3, 2, 1], group_id="second")).encode()
    # Room for one group's body: a trainer's whole step must not hold every body at once.
    limit = len(first) + 16
    judge = FakeJudge(latency="fixed:0.3")
    async with running_server(
        num_rollouts_per_prompt=N, judge=judge, waiting_body_memory_bytes=limit
    ) as server:
        budget = server.app.spool_budget
        replies: dict[str, Any] = {}

        async def post(name: str, body: bytes) -> None:
            replies[name] = await server.post("/verify_group", body)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, "first", first)
            await server.settle()
            # The first group is being judged, its body counted.
            assert budget.in_memory == len(first)
            nursery.start_soon(post, "second", second)
            await server.settle()
            # The second waits, unread, until the first's body has gone.
            assert budget.in_memory == len(first)
            assert "second" not in replies
        assert [row["reward"] for row in replies["first"].body["rows"]] == [1, 2, 3, 4]
        assert [row["reward"] for row in replies["second"].body["rows"]] == [4, 3, 2, 1]
        assert budget.in_memory == 0


async def test_a_group_larger_than_the_whole_budget_is_served_alone() -> None:
    async with running_server(num_rollouts_per_prompt=N, waiting_body_memory_bytes=10) as server:
        reply = await server.post("/verify_group", json.dumps(group([1, 2, 3, 4])).encode())
        assert [row["reward"] for row in reply.body["rows"]] == [1, 2, 3, 4]
        assert server.app.spool_budget.in_memory == 0


async def test_only_post_is_allowed() -> None:
    async with running_server(num_rollouts_per_prompt=N) as server:
        reply = await server.get("/verify_group")
        assert reply.status == 405


def test_the_openapi_document_describes_both_new_routes() -> None:
    paths = openapi_document("test")["paths"]
    assert set(paths["/verify_group"]["post"]["responses"]) == {
        "200", "400", "409", "413", "422", "503"
    }  # fmt: skip
    assert set(paths["/openrlhf/get_reward"]["post"]["responses"]) == {
        "200", "400", "409", "413", "422", "503"
    }  # fmt: skip
