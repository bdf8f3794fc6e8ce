"""`POST /compare` end to end on the fake judge: rewards, fail-fast, deadlines (§10.4-§10.7)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import trio

from genrm_trio.core.canonical import canonical_json
from genrm_trio.testing import FakeJudge, pair_rule
from genrm_trio.testing.harness import running_server

HISTORY = [{"role": "user", "content": "2+2?"}]


def answer(
    i: int, q: float = 3, *, reasoning: str | None = None, text: str | None = None
) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if reasoning is not None:
        output.append(
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": reasoning}]}
        )
    body = text if text is not None else f"answer-{i} [[q={q}]]"
    output.append(
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": body}]}
    )
    return {"id": f"c-{i}", "output": output}


def body(answers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"conversation_history": HISTORY, "response_objs": answers, **extra}


def verdict_text(s1: float, s2: float, ranking: float) -> str:
    return "```json\n" + json.dumps({"score_1": s1, "score_2": s2, "ranking": ranking}) + "\n```"


async def test_zero_and_one_answer_need_no_judge() -> None:
    # AS-31
    async with running_server() as server:
        empty = await server.compare(body([]))
        one = await server.compare(body([answer(0)]))
        assert empty.body == {"rewards": [], "comparison_results": None, "metrics": None}
        assert one.body == {"rewards": [3.0], "comparison_results": None, "metrics": None}
        assert server.calls() == 0


async def test_position_swap_under_circular() -> None:
    # AS-32 (E4)
    judge = FakeJudge(rules=[{"action": "verdict", "score_1": 4, "score_2": 2, "ranking": 1}])
    async with running_server(judge=judge) as server:
        reply = await server.compare(body([answer(0), answer(1)]))
        assert server.calls() == 2
    assert reply.body["rewards"] == [3.0, 3.0]
    assert [tuple(r.values()) for r in reply.body["comparison_results"]] == [
        (0, 1, 0, 4, 2, 1),
        (1, 0, 0, 4, 2, 1),
    ]
    assert reply.body["metrics"] == {
        "mean_individual_score": 3.0,
        "std_individual_score": 1.0,
        "tiebreak_usage_rate": 0.0,
    }


@pytest.mark.parametrize("strategy", ["circular", "all_pairs"])
@pytest.mark.parametrize("passes", [1, 2])
async def test_verify_and_compare_give_the_same_rewards(strategy: str, passes: int) -> None:
    # AS-33
    settings = {
        "num_rollouts_per_prompt": 16,
        "use_principle": True,
        "reasoning_bonus": 0.4,
        "answer_bonus": 0.4,
        "group_reasoning_length_penalty_coeff": 0.4,
        "group_answer_length_penalty_coeff": 0.4,
        "group_style_penalty_coeff": 0.4,
        "comparison_strategy": strategy,
        "num_judges_per_comparison": passes,
    }
    answers = [
        answer(
            i,
            1 + (i % 5),
            reasoning="think " * (i % 3),
            text=f"answer-{i} [[q={1 + i % 5}]]" + "- x\n" * (i % 4),
        )
        for i in range(16)
    ]
    expected_calls = (16 if strategy == "circular" else 120) * passes
    async with running_server(settings, judge=FakeJudge(position_bias=1)) as server:
        compared = await server.compare(body(answers))
        assert server.calls() == expected_calls
        compare_texts = sorted(
            json.dumps(r["body"]["messages"]) for r in server.judge.requests(1000)
        )
        server.judge.reset()
        members = [
            {
                "responses_create_params": {"input": "2+2?"},
                "response": a,
                "_ng_group_id": "same",
                "_ng_rollout_index": i,
            }
            for i, a in enumerate(answers)
        ]
        rows = await server.verify_all(members)
        assert server.calls() == expected_calls
        verify_texts = sorted(
            json.dumps(r["body"]["messages"]) for r in server.judge.requests(1000)
        )
    assert [r.reward for r in rows] == pytest.approx(compared.body["rewards"], abs=1e-12)
    assert verify_texts == compare_texts
    assert all(json.loads(r.raw)["response"] == a for r, a in zip(rows, answers, strict=True))


async def test_fail_fast_answers_promptly_and_drains_the_hung_call() -> None:
    # AS-34
    judge = FakeJudge(rules=[pair_rule(0, 1, "http_status", status=400), pair_rule(1, 0, "hang")])
    async with running_server(judge=judge) as server:
        with trio.fail_after(1):
            reply = await server.compare(body([answer(0), answer(1)]))
        assert reply.status == 503
        assert "pair=(0, 1)" in reply.detail and "HTTP 400" in reply.detail
        stats = judge.stats()
        assert stats["in_flight"] == 0 and stats["cancelled"] >= 1


async def test_every_empty_reply_fails_after_four_attempts() -> None:
    # AS-35
    async with running_server(judge=FakeJudge(rules=[{"action": "empty"}])) as server:
        reply = await server.compare(body([answer(0), answer(1)]))
    assert reply.status == 503 and "no completed answer after 4 attempts" in reply.detail


async def test_compare_deadline(autojump_clock) -> None:
    # AS-36
    judge = FakeJudge(rules=[{"action": "hang"}])
    async with running_server(judge=judge, compare_timeout_s=0.5) as server:
        start = trio.current_time()
        reply = await server.compare(body([answer(0), answer(1)]))
        assert trio.current_time() - start == pytest.approx(0.5)
        assert (reply.status, reply.detail) == (503, "GenRM compare deadline exceeded after 0.5s")
        assert judge.stats()["in_flight"] == 0


async def test_client_disconnect_cancels_judge_calls() -> None:
    # AS-37
    judge = FakeJudge(rules=[{"action": "hang"}])
    async with running_server(judge=judge) as server:
        with trio.move_on_after(0.2):
            await server.compare(body([answer(0), answer(1)]))
        await server.settle()
        assert judge.stats()["in_flight"] == 0


async def test_compare_after_shutdown() -> None:
    # AS-38
    async with running_server() as server:
        await server.engine.shutdown()
        reply = await server.compare(body([answer(0), answer(1)]))
        assert (reply.status, reply.detail) == (503, "GenRM server is shutting down")


@pytest.mark.parametrize(
    ("text", "rewards"),
    [
        (verdict_text(4, 2, 1) + ' {"score_1": 1, "score_2": 5, "ranking": 6}', [4, 2]),  # AS-69
        (
            '{"score_1":1,"score_2":5,"ranking":6} {"score_1":4,"score_2":2,"ranking":1} {"a": 1}',
            [4, 2],
        ),
        ('```json\n{"a": 1} {"score_1": 5, "score_2": 1, "ranking": 1}\n```', [5, 1]),  # AS-71
        (
            '{"rubric_evaluations": [], "overall": {"score_1": 5, "score_2": 1, "ranking": 1}}',
            [5, 1],
        ),
        ('{"score_1": 4}', [4, 3]),  # AS-73
        ('{"score_1": "4", "score_2": " 2 ", "ranking": "1"}', [4, 2]),  # AS-74
        ('{"note": "}{", "score_1": 4, "score_2": 2, "ranking": 1}', [4, 2]),  # AS-75
        ('{"score_1": 9, "score_2": 0, "ranking": 7}', [9, 0]),  # AS-76
        ('<think>{"score_1":1,"score_2":5,"ranking":6}</think>' + verdict_text(4, 2, 1), [4, 2]),
    ],
)
async def test_verdict_parsing_through_compare(text: str, rewards: list[float]) -> None:
    judge = FakeJudge(rules=[{"action": "text", "text": text}])
    async with running_server(judge=judge, comparison_strategy="all_pairs") as server:
        reply = await server.compare(body([answer(0), answer(1)]))
    assert reply.body["rewards"] == rewards


async def test_unparseable_values_fall_back_to_default_scores_after_four_calls() -> None:
    # AS-74 (second half)
    judge = FakeJudge(rules=[{"action": "text", "text": '{"score_1": "not a number"}'}])
    async with running_server(judge=judge, comparison_strategy="all_pairs") as server:
        reply = await server.compare(body([answer(0), answer(1)]))
        assert server.calls() == 4
    assert reply.body["rewards"] == [3.0, 3.0]


async def test_passes_run_in_pass_major_order() -> None:
    # AS-78
    for strategy, calls in (("circular", 12), ("all_pairs", 18)):
        async with running_server(
            comparison_strategy=strategy, num_judges_per_comparison=3
        ) as server:
            reply = await server.compare(body([answer(i) for i in range(4)]))
            assert server.calls() == calls
        judges = [r["judge_idx"] for r in reply.body["comparison_results"]]
        per_pass = calls // 3
        assert judges == [0] * per_pass + [1] * per_pass + [2] * per_pass


async def test_fixed_baseline_counterbalances_and_maps_back() -> None:
    # AS-82, AS-83 (E7, S-51)
    judge = FakeJudge(
        rules=[
            {
                "match": {"response_1": "answer-0"},
                "action": "verdict",
                "score_1": 5,
                "score_2": 1,
                "ranking": 1,
            },
            {
                "match": {"response_1": "BASE"},
                "action": "verdict",
                "score_1": 1,
                "score_2": 4,
                "ranking": 6,
            },
        ]
    )
    settings = {
        "comparison_strategy": "fixed_baseline",
        "num_judges_per_comparison": 2,
        "num_rollouts_per_prompt": 1,
    }
    async with running_server(settings, judge=judge) as server:
        reply = await server.compare(body([answer(0)], baseline_response="BASE"))
        assert server.calls() == 2
        firsts = [r["body"]["messages"][-2]["content"] for r in judge.requests(2)]
        judge.reset()
        row = await server.verify(
            {
                "responses_create_params": {
                    "input": "2+2?",
                    "metadata": {"baseline_response": "BASE"},
                },
                "response": answer(0),
                "_ng_group_id": "fb",
                "_ng_rollout_index": 0,
            }
        )
        assert server.calls() == 2
    assert reply.body["rewards"] == [4.5]
    assert row.reward == 4.5
    assert all(r["response_j"] == 1 for r in reply.body["comparison_results"])
    digest = hashlib.sha256(
        canonical_json({"baseline": "BASE", "history": HISTORY, "principle": None})
    ).hexdigest()
    expected_first = [
        "answer-0 [[q=3]]"
        if (int(hashlib.sha256(f"{digest}:0".encode()).hexdigest(), 16) + p) % 2 == 0
        else "BASE"
        for p in range(2)
    ]
    assert sorted(firsts) == sorted(expected_first)
    mapped = {(r["score_1"], r["score_2"], r["ranking"]) for r in reply.body["comparison_results"]}
    assert mapped <= {(5, 1, 1), (4, 1, 1)}
