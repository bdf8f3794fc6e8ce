"""Acceptance: what a client of the whole server sees for bad input, reply shapes and the echo.

Scenarios AS-12…AS-26, AS-28…AS-30 of §10.2-§10.4, driven through the app on the fake judge.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from genrm_trio.testing import FakeJudge
from genrm_trio.testing.harness import JUDGE_URL, Reply, Server, member, running_server

METRICS = (
    "genrm_failed_comparison_rate_per_group",
    "genrm_masked_rollout_rate_per_group",
    "mean_individual_score",
    "std_individual_score",
    "tiebreak_usage_rate",
)
MIGRATION_SUFFIX = (
    " This legacy group has failed; to retry, send the whole group again under a fresh"
    " _ng_group_id shared by every member. Reusing the task/prompt key could mix delayed"
    " answers into a replacement group."
)
W13 = (
    "responses_create_params.metadata.baseline_response: expected a non-empty string when "
    "comparison_strategy is fixed_baseline"
)


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def without(body: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in keys}


def with_literal(body: dict[str, Any], key: str, literal: str) -> bytes:
    """The body with `key` set to a raw JSON literal (NaN, 1.0, true…), appended last."""
    text = encode(without(body, key))
    return text[:-1] + f', "{key}": {literal}}}'.encode()


def ordered_keys(raw: bytes) -> list[str]:
    return [key for key, _ in json.loads(raw, object_pairs_hook=list)]


async def assert_no_state(server: Server) -> None:
    """Rejected input left nothing behind: no group, watermark, waiter, task or judge call."""
    stats = server.engine.statistics()
    assert (stats.collecting, stats.evaluating) == (0, 0)
    assert (stats.retained_records, stats.watermarks, stats.idle_entries) == (0, 0, 0)
    assert (stats.waiters, stats.owned_tasks, stats.judge_in_flight) == (0, 0, 0)
    assert server.calls() == 0
    config = server.config
    health = await server.get("/healthz")
    assert health.body == {
        "status": "ok",
        "active_groups": 0,
        "retained_records": 0,
        "watermarks": 0,
        "judge_in_flight": 0,
        "legacy_resends_collecting": 0,
        "judge_attempts_total": 0,
        "group_store": "memory",
        "group_store_available": True,
        "body_bytes_receiving": 0,
        "body_bytes_in_memory": 0,
        "body_bytes_spooled": 0,
        # null in single-rollout mode (no groups are gathered)
        "num_rollouts_per_prompt": config.num_rollouts_per_prompt if config.group_mode else None,
        "comparison_strategy": server.config.comparison_strategy,
        "judge_replicas": [
            {"url": JUDGE_URL, "reachable": None, "last_probe_at": None, "last_error": None}
        ],
    }


def assert_error(reply: Reply, status: int) -> str:
    """W-3: an error reply is exactly `{"detail": <string>}`; returns the detail."""
    assert reply.status == status, reply.raw
    assert list(reply.body) == ["detail"]
    assert isinstance(reply.body["detail"], str)
    return reply.detail


def assert_scored_row(reply: Reply, reward: float) -> None:
    assert reply.status == 200, reply.raw
    assert reply.body["reward"] == reward
    assert reply.body["mask_sample"] is False
    assert reply.body["failure_kind"] is None
    assert reply.body["failure_reason"] is None


# --- §10.2 input validation -------------------------------------------------------------------


async def test_unparseable_json_and_a_top_level_array_are_400_and_leave_no_trace() -> None:
    # AS-12
    async with running_server() as server:
        for data in (b"{not json", b'{"response": }', encode(member(0))[:-1], b""):
            reply = await server.verify(data)
            assert assert_error(reply, 400).startswith("invalid JSON body: ")
        array = await server.verify(b"[" + encode(member(0)) + b"]")
        assert assert_error(array, 400).startswith("invalid JSON body: ")
        assert array.raw.startswith(b"{")
        await assert_no_state(server)


async def test_a_repeated_top_level_slot_is_400_naming_the_key() -> None:
    # AS-13
    async with running_server() as server:
        twice = encode(member(0))[:-1] + b', "_ng_rollout_index": 1}'
        reply = await server.verify(twice)
        assert assert_error(reply, 400) == "duplicate key '_ng_rollout_index'"
        await assert_no_state(server)


async def test_an_oversized_body_is_413_and_the_next_request_succeeds() -> None:
    # AS-14
    async with running_server(max_body_bytes=4096) as server:
        base = len(encode(member(0, note="")))
        oversized = encode(member(0, note="x" * (5000 - base)))
        assert len(oversized) == 5000
        reply = await server.verify(oversized)
        assert assert_error(reply, 413) == "request body exceeds 4096 bytes"

        async def streamed() -> AsyncIterator[bytes]:
            for start in range(0, len(oversized), 1000):
                yield oversized[start : start + 1000]

        # Without a Content-Length the limit still applies to the bytes that arrive.
        chunked = await server.client.post("/verify", content=streamed())
        assert chunked.status_code == 413
        assert chunked.json() == {"detail": "request body exceeds 4096 bytes"}
        await assert_no_state(server)
        rows = await server.complete(qualities=[2, 4])
        assert [r.reward for r in rows] == [2.0, 4.0]
        assert server.calls() == 2


async def test_schema_violations_are_422_naming_the_path() -> None:
    # AS-15
    cases: list[tuple[dict[str, Any], str]] = [
        (without(member(0), "response"), "response"),
        (member(0, response={"id": "r-g-0-0"}), "response.output"),
        (member(0, response={"id": "r-g-0-0", "output": [1]}), "response.output[0]"),
        (without(member(0), "responses_create_params"), "responses_create_params"),
        (member(0, responses_create_params={"model": "policy"}), "responses_create_params.input"),
        (member(0, responses_create_params={"input": 5}), "responses_create_params.input"),
    ]
    async with running_server() as server:
        for body, path in cases:
            detail = assert_error(await server.verify(body), 422)
            assert detail.startswith(f"{path}: "), detail
            assert len(detail) > len(path) + 2
        await assert_no_state(server)


async def test_slot_required_and_in_range_in_group_mode() -> None:
    # AS-16
    async with running_server() as server:
        missing = await server.verify(without(member(0), "_ng_rollout_index"))
        assert assert_error(missing, 422) == "_ng_rollout_index is required for cohort comparison"
        null = await server.verify(member(0, _ng_rollout_index=None))
        assert assert_error(null, 422) == "_ng_rollout_index is required for cohort comparison"
        too_big = await server.verify(member(2))
        assert assert_error(too_big, 422) == "_ng_rollout_index must be in [0, 2); got 2"
        negative = await server.verify(member(-1))
        assert assert_error(negative, 422) == "_ng_rollout_index must be in [0, 2); got -1"
        await assert_no_state(server)


async def test_attempt_and_slot_are_strict_integers() -> None:
    # AS-17
    attempts = ["true", "1.5", "1.0", '"1"', "-1", str(2**70), "NaN"]
    slots = ["true", "1.5", '"1"']
    async with running_server() as server:
        for literal in attempts:
            reply = await server.verify(with_literal(member(0), "_ng_group_attempt", literal))
            detail = assert_error(reply, 422)
            assert detail.startswith("_ng_group_attempt: expected an integer"), detail
            assert f"got {literal}" in detail, detail
        for literal in slots:
            reply = await server.verify(with_literal(member(0), "_ng_rollout_index", literal))
            detail = assert_error(reply, 422)
            assert detail.startswith("_ng_rollout_index: expected an integer"), detail
            assert f"got {literal}" in detail, detail
        await assert_no_state(server)


async def test_group_id_must_be_1_to_1024_code_points() -> None:
    # AS-18
    async with running_server() as server:
        for group_id in ("", 5, "x" * 1025):
            reply = await server.verify(member(0, g=group_id))  # type: ignore[arg-type]
            assert assert_error(reply, 422).startswith("_ng_group_id: "), reply.detail
        await assert_no_state(server)
        longest = await server.verify_all([member(0, g="é" * 1024), member(1, g="é" * 1024)])
        assert [r.reward for r in longest] == [3.0, 3.0]


async def test_fixed_baseline_needs_a_baseline_response() -> None:
    # AS-19
    async with running_server(comparison_strategy="fixed_baseline") as server:
        for params in (
            {"input": "2+2?"},
            {"input": "2+2?", "metadata": {}},
            {"input": "2+2?", "metadata": {"baseline_response": ""}},
        ):
            reply = await server.verify(member(0, responses_create_params=params))
            assert assert_error(reply, 422) == W13
        await assert_no_state(server)


def bad_inputs() -> list[bytes]:
    """One request for each of AS-12…AS-18, some aimed at the live group `g`, some elsewhere."""
    return [
        b"{not json",
        b"[1, 2]",
        encode(member(0))[:-1] + b', "_ng_rollout_index": 1}',
        encode(member(1, g="other", note="x" * 5000)),
        encode(without(member(1), "response")),
        encode(member(1, g="other", response={"id": "r"})),
        encode(member(1, response={"output": [1]})),
        encode(without(member(1, g="other"), "responses_create_params")),
        encode(member(1, responses_create_params={"input": 5})),
        encode(without(member(1), "_ng_rollout_index")),
        encode(member(2)),
        encode(member(-1, g="other")),
        with_literal(member(1), "_ng_group_attempt", "true"),
        with_literal(member(1, g="other"), "_ng_group_attempt", "1.0"),
        with_literal(member(1, g="other"), "_ng_group_attempt", "-1"),
        with_literal(member(1), "_ng_group_attempt", str(2**70)),
        with_literal(member(1), "_ng_group_attempt", "NaN"),
        with_literal(member(1, g="other"), "_ng_rollout_index", '"1"'),
        encode(member(1, g="")),
        encode(member(1, g=5)),  # type: ignore[arg-type]
        encode(member(1, g="x" * 1025)),
    ]


async def test_bad_input_interleaved_with_a_live_group_changes_nothing() -> None:
    # AS-20
    async with running_server(max_body_bytes=4096) as server, trio.open_nursery() as nursery:
        pending = server.start_verify(nursery, member(0, q=2))
        await trio.testing.wait_all_tasks_blocked()
        for data in bad_inputs():
            reply = await server.verify(data)
            assert reply.status in (400, 413, 422), (reply.status, data[:80])
            stats = server.engine.statistics()
            assert (stats.collecting, stats.evaluating, stats.waiters) == (1, 0, 1)
            assert (stats.retained_records, stats.watermarks) == (0, 1)
        assert server.calls() == 0
        last = await server.verify(member(1, q=4))
        first = await pending.result()
        assert (first.reward, last.reward) == (2.0, 4.0)
        assert server.calls() == 2
        stats = server.engine.statistics()
        assert (stats.collecting, stats.evaluating, stats.waiters) == (0, 0, 0)
        assert (stats.retained_records, stats.watermarks, stats.idle_entries) == (1, 1, 1)
        server.engine.check_invariants()


async def test_bad_baseline_input_interleaved_with_a_baseline_group_changes_nothing() -> None:
    # AS-20 (the AS-19 inputs, under fixed_baseline)
    def with_baseline(i: int, q: float, baseline: Any) -> dict[str, Any]:
        metadata = {} if baseline is None else {"baseline_response": baseline}
        return member(i, q, responses_create_params={"input": "2+2?", "metadata": metadata})

    async with (
        running_server(comparison_strategy="fixed_baseline") as server,
        trio.open_nursery() as nursery,
    ):
        pending = server.start_verify(nursery, with_baseline(0, 5, "BASE [[q=3]]"))
        await trio.testing.wait_all_tasks_blocked()
        for baseline in (None, ""):
            for slot in (0, 1):
                reply = await server.verify(with_baseline(slot, 5, baseline))
                assert assert_error(reply, 422) == W13
        last = await server.verify(with_baseline(1, 1, "BASE [[q=3]]"))
        first = await pending.result()
        assert server.calls() == 2
        assert_scored_row(first, 5.0)
        assert_scored_row(last, 1.0)
        stats = server.engine.statistics()
        assert (stats.retained_records, stats.watermarks, stats.idle_entries) == (1, 1, 1)
        assert stats.active_groups == 0


async def test_compare_rejects_malformed_bodies_with_422() -> None:
    # AS-21
    def answer(i: int) -> dict[str, Any]:
        content = [{"type": "output_text", "text": f"answer-{i}"}]
        return {"id": f"c-{i}", "output": [{"type": "message", "content": content}]}

    history = [{"role": "user", "content": "2+2?"}]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"conversation_history": history, "response_objs": answer(0)}, "response_objs"),
        (
            {"conversation_history": history, "response_objs": [answer(0), {"id": "c-1"}]},
            "response_objs[1].output",
        ),
        (
            {
                "conversation_history": [{"role": "user", "content": ["2+2?"]}],
                "response_objs": [answer(0), answer(1)],
            },
            "conversation_history[0].content",
        ),
        (
            {"conversation_history": history, "response_objs": [answer(i) for i in range(4)]},
            "response_objs",
        ),
    ]
    async with running_server(max_compare_responses=3) as server:
        for body, path in cases:
            detail = assert_error(await server.compare(body), 422)
            assert detail.startswith(f"{path}: "), detail
        assert server.calls() == 0
        three = await server.compare(
            {"conversation_history": history, "response_objs": [answer(i) for i in range(3)]}
        )
        assert three.status == 200 and len(three.body["rewards"]) == 3


async def test_unknown_routes_and_methods_answer_json_errors_not_500() -> None:
    # AS-22
    async with running_server() as server:
        for path in ("/nope", "/metrics/extra", "/verify/extra"):
            reply = await server.get(path)
            assert_error(reply, 404)
            assert reply.body["detail"]
        get_verify = await server.get("/verify")
        assert_error(get_verify, 405)
        response = await server.client.get("/verify")
        assert response.headers["content-type"].startswith("application/json")
        assert response.headers["allow"] == "POST"
        post_health = await server.post("/healthz", b"{}")
        assert_error(post_health, 405)
        assert_error(await server.post("/metrics", b"{}"), 405)
        await assert_no_state(server)


async def test_verify_mounted_under_a_prefix_is_the_same_route() -> None:
    async with running_server() as server:
        transport = httpx.ASGITransport(app=server.app, root_path="/genrm")  # type: ignore[arg-type]
        replies: dict[str, Any] = {}

        async def post_mounted() -> None:
            replies["mounted"] = await client.post("/genrm/verify", content=encode(member(0)))

        async with (
            httpx.AsyncClient(transport=transport, base_url="http://genrm.test") as client,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(post_mounted)
            replies["direct"] = await server.verify(member(1))
        mounted, direct = replies["mounted"], replies["direct"]
        assert (mounted.status_code, direct.status) == (200, 200)
        assert json.loads(mounted.content)["reward"] == 3.0
        assert server.calls() == 2


async def test_non_standard_literals_are_echoed_and_fingerprinted() -> None:
    # AS-23
    literals = b"[NaN, Infinity, -Infinity, -0.5]"
    text = encode(member(0)).replace(
        b'"id": ', b'"generation_log_probs": ' + literals + b', "id": '
    )
    assert literals in text
    async with running_server() as server:
        replies = await server.verify_all([text, encode(member(1))])
        assert [r.status for r in replies] == [200, 200]
        assert [r.reward for r in replies] == [3.0, 3.0]
        assert re.search(rb'"generation_log_probs":\s*' + re.escape(literals), replies[0].raw)
        changed = text.replace(literals, b"[NaN, -Infinity, -Infinity, -0.5]")
        conflict = await server.verify(changed)
        assert assert_error(conflict, 409) == (
            "GenRM cohort 'group_id::g::group_attempt::0' already has a different response "
            "for rollout_index=0"
        )
        replay = await server.verify(text)
        assert replay.raw == replies[0].raw
        assert server.calls() == 2


@pytest.mark.usefixtures("default_digit_cap")
async def test_integers_of_any_length_are_echoed_and_fingerprinted_exactly() -> None:
    # W-21, C-20: JSON puts no bound on an integer's digits; the server reads them without
    # lifting Python's 4,300-digit cap for the process that embeds it.
    huge = b"7" * 5000
    text = encode(member(0)).replace(b'"id": ', b'"seed": ' + huge + b', "id": ')
    async with running_server() as server:
        assert sys.get_int_max_str_digits() == 4300
        replies = await server.verify_all([text, encode(member(1))])
        assert [r.status for r in replies] == [200, 200]
        assert re.search(rb'"seed":\s*' + huge + rb"\s*,", replies[0].raw)
        one_digit_off = text.replace(huge, huge[:-1] + b"8")
        assert (await server.verify(one_digit_off)).status == 409
        replay = await server.verify(text)
        assert replay.raw == replies[0].raw
        assert server.calls() == 2
    assert sys.get_int_max_str_digits() == 4300


# --- §10.3 reply shape and echo ---------------------------------------------------------------

TOKEN_IDS = "[" + ", ".join(str(k) for k in range(1024)) + "]"
PROMPT_IDS = "[" + ",".join(str(1024 - k) for k in range(1024)) + "]"
RICH_RESPONSE = (
    '{"id": "r-rich-0",  "object" :"response",\n'
    '  "output": [\n'
    '    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "add them"}]},\n'
    '    {"type": "message", "role": "assistant", "content": [\n'
    '       {"type": "output_text", "text": "answer-0 "},\n'
    '       {"type": "refusal", "refusal": "I would rather not"},\n'
    '       {"type": "output_text", "text": "[[q=4]]"}]},\n'
    '    {"type": "function_call", "name": "calc", "arguments": "{\\"x\\": 1}", "call_id": "c1"}\n'
    "  ],\n"
    f'  "generation_token_ids": {TOKEN_IDS},\n'
    f'  "prompt_token_ids":{PROMPT_IDS},\n'
    '  "generation_log_probs": [-0.5, -1.250e-3, 0.0, -0.0, 1.50, 1E2, -7],\n'
    f'  "big": {2**80}, "small": {-(2**80)},\n'
    '  "greeting": "h\u00e9llo", "lone": "\\ud800", "dup": {"k": 1, "k": 2}\n'
    "}"
)
RICH_PARAMS = (
    '{"input": "2+2?", "model": "policy-7b",  "temperature": 0.70, "metadata": {"x": [1, 2.50]}}'
)
TASK = '{"k": [1, 2]}'


def rich_request() -> bytes:
    return (
        f'{{"responses_create_params": {RICH_PARAMS}, "response": {RICH_RESPONSE}, '
        f'"_ng_rollout_id": "rid-0", "task": {TASK}, "_ng_group_id": "g", '
        f'"_ng_group_attempt": 0, "_ng_rollout_index": 0}}'
    ).encode()


def value_in_reply(raw: bytes, key: str, value: str) -> bool:
    pattern = rb'"' + key.encode() + rb'":\s*' + re.escape(value.encode()) + rb"\s*[,}]"
    return re.search(pattern, raw) is not None


async def test_a_rich_response_is_echoed_byte_for_byte() -> None:
    # AS-24
    async with running_server() as server:
        rich, plain = await server.verify_all([rich_request(), encode(member(1))])
    assert_scored_row(rich, 4.0)
    assert_scored_row(plain, 3.0)
    assert value_in_reply(rich.raw, "response", RICH_RESPONSE)
    assert value_in_reply(rich.raw, "responses_create_params", RICH_PARAMS)
    assert value_in_reply(rich.raw, "task", TASK)
    assert ordered_keys(rich.raw) == [
        "responses_create_params",
        "response",
        "task",
        "_ng_group_id",
        "_ng_group_attempt",
        "_ng_rollout_index",
        "_ng_task_index",
        "reward",
        "mask_sample",
        "failure_kind",
        "failure_reason",
        *METRICS,
    ]
    row = json.loads(rich.raw)
    assert (row["_ng_group_id"], row["_ng_group_attempt"], row["_ng_rollout_index"]) == ("g", 0, 0)
    assert row["_ng_task_index"] is None
    for absent in ("group_id", "group_attempt", "rollout_index", "task_index", "_ng_rollout_id"):
        assert absent not in row
    assert b"rid-0" not in rich.raw


async def test_scored_rows_posted_back_replay_without_judging() -> None:
    # AS-25
    async with running_server() as server:
        rows = await server.complete(qualities=[2, 5])
        assert [r.reward for r in rows] == [2.0, 5.0]
        assert server.calls() == 2
        for row in rows:
            replay = await server.verify(row.raw)
            assert replay.status == 200
            assert replay.reward == row.reward
            assert replay.raw == row.raw
        regenerated = await server.verify(member(0, q=2, regenerated=True))
        assert assert_error(regenerated, 409) == (
            "GenRM cohort 'group_id::g::group_attempt::0' already has a different response "
            "for rollout_index=0"
        )
        assert server.calls() == 2


async def test_server_owned_keys_in_a_request_are_replaced_not_echoed() -> None:
    # AS-26
    async with running_server() as server:
        owned = member(0, reward=7, mask_sample=True, failure_reason="x")
        rows = await server.verify_all([owned, member(1)])
    keys = ordered_keys(rows[0].raw)
    for key in ("reward", "mask_sample", "failure_reason", "failure_kind"):
        assert keys.count(key) == 1, key
    assert_scored_row(rows[0], 3.0)
    assert keys.index("reward") > keys.index("_ng_task_index")


async def test_masked_rows_rewrite_instance_config_and_carry_the_failure() -> None:
    # AS-28
    judge = FakeJudge(rules=[{"action": "http_status", "status": 500}])
    async with running_server(judge=judge) as server:
        rows = await server.verify_all(
            [
                encode(member(0, instance_config={"task": "keep"})),
                encode(member(1, instance_config="x")),
                encode(member(0, g="h")),
                encode(member(1, g="h", instance_config={"mask_sample": False, "task": "keep"})),
            ]
        )
        assert server.calls() == 16
    configs = [json.loads(r.raw, object_pairs_hook=dict)["instance_config"] for r in rows]
    assert configs[0] == {"task": "keep", "mask_sample": True}
    assert list(configs[0]) == ["task", "mask_sample"]
    assert configs[1] == {"mask_sample": True}
    assert configs[2] == {"mask_sample": True}
    assert list(configs[3].items()) == [("mask_sample", True), ("task", "keep")]
    for slot, row in enumerate(rows):
        body = row.body
        assert row.status == 200
        assert body["reward"] == 0.0
        assert body["mask_sample"] is True
        assert body["failure_kind"] == "judge_failed"
        assert body["_ng_failure_class"] == "judge_failed"
        assert body["failure_reason"] == body["_ng_failure_judge_error"]
        assert len(body["failure_reason"]) <= 2000
        assert "every rollout was masked" in body["failure_reason"]
        assert "HTTP 500" in body["failure_reason"]
        assert not any(metric in body for metric in METRICS)
        assert body["response"]["id"] == f"r-{'g' if slot < 2 else 'h'}-0-{slot % 2}"
    assert value_in_reply(rows[0].raw, "response", json.dumps(member(0)["response"]))
    keys = ordered_keys(rows[0].raw)
    assert keys[keys.index("reward") :] == [
        "reward",
        "mask_sample",
        "failure_kind",
        "failure_reason",
        "_ng_failure_class",
        "_ng_failure_judge_error",
    ]


async def test_a_long_legacy_failure_keeps_its_migration_suffix_whole() -> None:
    # AS-29
    judge = FakeJudge(rules=[{"action": "http_status", "status": 500}])
    prompt_id = "p" * 1500
    async with running_server(judge=judge) as server:
        bodies = [member(i, g=None, prompt_id=prompt_id) for i in range(2)]
        rows = await server.verify_all(bodies)
        late = await server.verify(member(0, g=None, prompt_id=prompt_id, regenerated=True))
        assert server.calls() == 8
    for row in [*rows, late]:
        reason = row.body["failure_reason"]
        assert row.masked
        assert len(reason) == 2000
        assert reason.endswith(MIGRATION_SUFFIX)
        assert reason.startswith(f"GenRM cohort 'prompt_id::{prompt_id}")
        assert reason == row.body["_ng_failure_judge_error"]
    assert late.body["failure_reason"] == rows[0].body["failure_reason"]


# --- §10.4 single-rollout mode ----------------------------------------------------------------


async def test_single_rollout_mode_answers_the_default_score_at_once() -> None:
    # AS-30
    async with running_server(num_rollouts_per_prompt=1) as server:
        reply = await server.verify(without(member(0), "_ng_rollout_index"))
        assert_scored_row(reply, 3.0)
        assert not any(metric in reply.body for metric in METRICS)
        assert reply.body["_ng_rollout_index"] is None
        assert reply.body["_ng_group_id"] == "g"
        assert reply.body["response"] == member(0)["response"]
        again = await server.verify(member(0, regenerated=True))
        assert_scored_row(again, 3.0)
        wrong_type = await server.verify(member(0, _ng_rollout_index="1"))
        assert assert_error(wrong_type, 422).startswith("_ng_rollout_index: ")
        await assert_no_state(server)
