"""The trainer client and the TRL reward function against a real `genrm-trio serve` and the fake
judge over loopback HTTP: predicted rewards from Trio, asyncio and the blocking form, masked
comparisons that come back as None, and a server restarted mid-batch whose groups the client
sends again and gets the right rows for.

The fake judge scores a text by its `[[q=X]]` directive; under circular pairing with no position
bias every scored rollout's reward is its own quality (CL-13).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
from typing import Any

import pytest
import trio

from genrm_trio.client import (
    JUDGE_FAILED,
    VERIFY_FAILED,
    BlockingGenRMClient,
    GenRMClient,
    GroupRefused,
    ResendPolicy,
    RewardsUnavailable,
    RolloutResult,
    ServerNotReady,
)
from genrm_trio.client.trl import GenRMRewardFunction
from genrm_trio.testing import pair_rule

N = 4


def answers(group: int, qualities: list[int]) -> list[str]:
    """Texts whose fake-judge quality is given; `answer-<slot> ` lets rules pick pairs."""
    return [f"answer-{slot} of group {group} [[q={q}]]" for slot, q in enumerate(qualities)]


def start_stack(cli: Any, *rules: dict[str, Any], port: int | None = None) -> tuple[Any, str, str]:
    """A fake judge (with ``rules``) and a server for groups of N; returns the server process,
    its URL and the judge's URL."""
    rules_file = cli.write("rules.json", json.dumps(list(rules)))
    _, judge_url = cli.start_fake_judge("--rules", str(rules_file))
    server, url = start_server(cli, judge_url, port)
    return server, url, judge_url


def start_server(cli: Any, judge_url: str, port: int | None = None) -> tuple[Any, str]:
    settings = [
        f"judge_base_url={judge_url}",
        "judge_model=fake-judge",
        f"num_rollouts_per_prompt={N}",
        "genrm_parse_retries=0",
        "log_level=WARNING",
    ]
    args = [arg for setting in settings for arg in ("--set", setting)]
    if port is None:
        server, url, _ = cli.start_serve(*args)
        return server, url
    server = cli.start("serve", "--port", str(port), *args)
    line = server.read_line()
    assert line == f"genrm-trio listening on http://127.0.0.1:{port}", line
    return server, line.removeprefix("genrm-trio listening on ")


def judge_calls(cli: Any, judge_url: str) -> int:
    with cli.http_client(judge_url.removesuffix("/v1")) as http:
        return int(http.get("/_fake/stats").json()["requests_total"])


def scored(*rewards: float) -> list[RolloutResult]:
    return [RolloutResult(reward=r, mask_sample=False) for r in rewards]


def test_the_blocking_client_scores_groups_and_masks_what_the_judge_could_not_compare(
    cli: Any,
) -> None:
    # Group 1's answers 1 and 2 meet in comparison (1, 2), which the judge fails.
    failing = pair_rule(1, 2, "http_status", status=400)
    failing["match"] = {"response_1": "answer-1 of group 1 ", "response_2": "answer-2 of group 1 "}
    _, url, judge_url = start_stack(cli, failing)
    client = BlockingGenRMClient(url, deadline_s=20)
    results = client.score_groups(
        [("2+2?", answers(0, [1, 2, 3, 4])), ("3+3?", answers(1, [5, 4, 3, 2]))]
    )
    assert results[0] == scored(1, 2, 3, 4)
    assert [r.reward for r in results[1]] == [5, None, None, 2]
    for masked in (results[1][1], results[1][2]):
        assert masked.mask_sample is True
        assert masked.failure_kind == JUDGE_FAILED
        assert masked.failure_reason is not None
        assert "lost a comparison to a judge failure" in masked.failure_reason
        assert "HTTP 400" in masked.failure_reason
    assert judge_calls(cli, judge_url) == 8
    assert client.resends == 0


def test_the_async_client_runs_under_trio_and_under_asyncio(cli: Any) -> None:
    _, url, judge_url = start_stack(cli)
    group = answers(0, [2, 4, 1, 3])

    async def score() -> list[RolloutResult]:
        async with GenRMClient(url) as client:
            return await client.score_group("Name a prime.", group, group_id="same-group")

    assert trio.run(score) == scored(2, 4, 1, 3)
    # The same group id and attempt again is a replay: the same rows, no judge call.
    assert asyncio.run(score()) == scored(2, 4, 1, 3)
    assert judge_calls(cli, judge_url) == N

    async def conversation() -> list[list[RolloutResult]]:
        prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        texts = answers(1, [3, 3, 5, 1])
        completions = [[{"role": "assistant", "content": text}] for text in texts]
        async with GenRMClient(url) as client:
            return await client.score_groups([(prompt, completions)] * 2)

    assert asyncio.run(conversation()) == [scored(3, 3, 5, 1)] * 2


def test_a_group_of_the_wrong_size_is_refused_at_once_naming_the_field(cli: Any) -> None:
    _, url, judge_url = start_stack(cli)
    client = BlockingGenRMClient(url)
    try:
        client.score_group("2+2?", answers(0, [1, 2, 3]))
    except GroupRefused as refused:
        assert refused.status == 422
        assert refused.detail == (
            "responses: expected an array of 4 response objects (num_rollouts_per_prompt), "
            "got an array of 3"
        )
    else:
        raise AssertionError("a group of 3 on a server of groups of 4 was not refused")
    assert judge_calls(cli, judge_url) == 0


def test_a_group_that_got_no_rows_fails_every_rollout_without_a_number(cli: Any) -> None:
    _, url, _ = start_stack(cli)
    client = BlockingGenRMClient(url)
    assert client.score_group("2+2?", answers(0, [1, 2, 3, 4]), group_id="g") == scored(1, 2, 3, 4)
    # Other answers under the same group id and attempt: the server answers 409 for the group.
    conflict = client.score_group("2+2?", answers(0, [4, 3, 2, 1]), group_id="g")
    assert [r.reward for r in conflict] == [None] * N
    assert all(r.mask_sample and r.failure_kind == VERIFY_FAILED for r in conflict)
    reason = conflict[0].failure_reason or ""
    assert reason.startswith("POST /verify_group answered 409: GenRM cohort 'group_id::g::")
    # A higher attempt replaces the group.
    fresh = client.score_group("2+2?", answers(0, [4, 3, 2, 1]), group_id="g", attempt=1)
    assert fresh == scored(4, 3, 2, 1)
    assert client.resends == 0


def test_a_server_restarted_mid_batch_gets_every_group_again_and_the_rows_are_right(
    cli: Any,
) -> None:
    # Every judge call takes a second, so the batch is still being judged at the restart.
    _, judge_url = cli.start_fake_judge("--latency", "fixed:1.0")
    port = cli.free_port()
    server, url = start_server(cli, judge_url, port)
    qualities = [[1 + (g + s) % 5 for s in range(N)] for g in range(6)]
    groups = [(f"prompt {g}", answers(g, q)) for g, q in enumerate(qualities)]
    client = BlockingGenRMClient(
        url, policy=ResendPolicy(max_resends=40, first_sleep_s=0.05, max_sleep_s=0.5)
    )
    outcome: dict[str, Any] = {}

    def run() -> None:
        outcome["results"] = client.score_groups(groups)

    batch = threading.Thread(target=run)
    batch.start()
    cli.wait_until(lambda: judge_calls(cli, judge_url) >= 6 * N // 2)
    server.send_signal(signal.SIGTERM)
    assert server.wait() == 0
    # Down for a moment: the client's resends meet refused connections meanwhile.
    start_server(cli, judge_url, port)
    batch.join(60)
    assert not batch.is_alive()
    assert outcome["results"] == [scored(*q) for q in qualities]
    assert client.resends >= 6


# TRL 1.9.0 calls a reward function as `_calculate_rewards` does: keyword arguments `prompts`,
# `completions` and `completion_ids`, every other dataset column as a list, and `trainer_state`,
# `log_extra` and `log_metric` (trl/trainer/grpo_trainer.py:1617-1627, 1659-1661).


class LogSink:
    def __init__(self) -> None:
        self.extra: dict[str, list[Any]] = {}
        self.metrics: dict[str, list[float]] = {}

    def log_extra(self, column: str, values: list[Any]) -> None:
        self.extra.setdefault(column, []).extend(values)

    def log_metric(self, name: str, value: float) -> None:
        self.metrics.setdefault(name, []).append(value)


def test_the_trl_reward_function_returns_none_for_masked_completions(cli: Any) -> None:
    failing = pair_rule(3, 0, "budget_exhausted")
    failing["match"] = {"response_1": "answer-3 of group 0 ", "response_2": "answer-0 of group 0 "}
    _, url, _ = start_stack(cli, failing)
    reward = GenRMRewardFunction(url, num_generations=N, deadline_s=20)
    # Two prompts, num_generations completions each, consecutive: TRL's RepeatSampler layout.
    prompts = ["Explain tides."] * N + ["Explain rain."] * N
    completions = answers(0, [2, 5, 3, 4]) + answers(1, [1, 1, 4, 2])
    sink = LogSink()
    rewards = reward(
        prompts=prompts,
        completions=completions,
        completion_ids=[[7, 8, 9]] * len(completions),
        answer=["x"] * len(completions),
        trainer_state=object(),
        log_extra=sink.log_extra,
        log_metric=sink.log_metric,
    )
    assert rewards == [None, 5, 3, None, 1, 1, 4, 2]
    assert reward.__name__ == "genrm"
    assert sink.metrics == {"genrm/masked_fraction": [0.25]}
    failures = sink.extra["genrm_failure"]
    assert [bool(text) for text in failures] == [True, False, False, True] + [False] * N
    assert "exhausted max_output_tokens" in failures[0]


def judge_conversations(cli: Any, judge_url: str) -> list[tuple[str, set[str]]]:
    """Each judge call's user turn and the two answers it compared."""
    with cli.http_client(judge_url.removesuffix("/v1")) as http:
        calls = http.get("/_fake/requests").json()
    seen = []
    for call in calls:
        messages = {m["role"]: m["content"] for m in call["body"]["messages"]}
        seen.append((messages["user"], {messages["response_1"], messages["response_2"]}))
    return seen


def test_the_trl_reward_function_sends_each_group_with_its_own_prompt(cli: Any) -> None:
    _, url, judge_url = start_stack(cli)
    reward = GenRMRewardFunction(url, num_generations=N, deadline_s=20)
    prompts = ["Explain tides."] * N + ["Explain rain."] * N + ["Explain snow."] * N
    texts = [answers(g, [2, 5, 3, 4]) for g in range(3)]
    rewards = reward(
        prompts=prompts, completions=[t for g in texts for t in g], completion_ids=None
    )
    assert rewards == [2, 5, 3, 4] * 3
    # Every comparison of a group's answers was shown that group's prompt, N per group.
    seen = judge_conversations(cli, judge_url)
    assert len(seen) == 3 * N
    for group, prompt in enumerate(["Explain tides.", "Explain rain.", "Explain snow."]):
        calls = [answers_seen for user, answers_seen in seen if user == prompt]
        assert len(calls) == N, (prompt, seen)
        assert all(answers_seen <= set(texts[group]) for answers_seen in calls)


def test_the_trl_reward_function_takes_conversational_prompts_and_completions(cli: Any) -> None:
    _, url, _ = start_stack(cli)
    reward = GenRMRewardFunction(url, num_generations=N)
    prompt = [{"role": "user", "content": "Write a haiku."}]
    completions = [[{"role": "assistant", "content": t}] for t in answers(0, [4, 2, 5, 1])]
    rewards = reward(prompts=[prompt] * N, completions=completions, completion_ids=[[1]] * N)
    assert rewards == [4, 2, 5, 1]


def test_a_batch_without_whole_groups_is_refused_before_anything_is_sent(cli: Any) -> None:
    _, url, judge_url = start_stack(cli)
    reward = GenRMRewardFunction(url, num_generations=N)
    texts = answers(0, [1, 2, 3, 4, 5, 1])
    for prompts, completions, expected in (
        (["p"] * 6, texts, "does not hold whole groups of num_generations=4"),
        (["p", "p", "q", "q"] * 2, texts[:4] * 2, "do not share one prompt"),
    ):
        try:
            reward(prompts=prompts, completions=completions, completion_ids=None)
        except ValueError as error:
            assert expected in str(error)
        else:
            raise AssertionError(f"{prompts} was accepted")
    assert judge_calls(cli, judge_url) == 0


# A dead judge: nothing listens on the discard port.
DEAD_JUDGE = "http://127.0.0.1:9/v1"


def test_the_trl_reward_function_raises_when_the_judge_cannot_be_reached(cli: Any) -> None:
    _, url = start_server(cli, DEAD_JUDGE)
    # No readiness check: the judge could as well have died after the run began.
    reward = GenRMRewardFunction(url, num_generations=N, ready_wait_s=None, deadline_s=60)
    prompts = ["Explain tides."] * N + ["Explain rain."] * N
    completions = answers(0, [2, 5, 3, 4]) + answers(1, [1, 1, 4, 2])
    with pytest.raises(RewardsUnavailable) as raised:
        reward(prompts=prompts, completions=completions, completion_ids=None)
    error = raised.value
    assert error.url == url and error.masked == 2 * N
    assert str(error).startswith(
        f"genrm-trio server {url}: all {2 * N} rollouts of the batch were masked because the"
        " judge or the server could not be reached; first reason: GenRM cohort "
    )
    assert "every rollout was masked" in error.first_reason
    assert f"GenRM judge {DEAD_JUDGE}/chat/completions pair=" in error.first_reason
    assert "ConnectError: cannot connect to 127.0.0.1:9" in error.first_reason
    # What the batch came back as is still there to look at.
    assert [r.reward for r in reward.last_results] == [None] * 2 * N


def test_the_trl_reward_function_stops_before_the_first_batch_when_the_server_is_not_ready(
    cli: Any,
) -> None:
    _, url = start_server(cli, DEAD_JUDGE)
    reward = GenRMRewardFunction(url, num_generations=N, ready_wait_s=3)
    with pytest.raises(ServerNotReady) as raised:
        reward(prompts=["p"] * N, completions=answers(0, [1, 2, 3, 4]))
    error = raised.value
    assert error.url == url
    # The server's own /readyz names the judge replica that does not answer, and why.
    message = str(error)
    assert message.startswith(f"genrm-trio server {url} is not ready (waited 3s): ")
    assert f"judge replica {DEAD_JUDGE} unreachable: ConnectError" in message
    assert reward.last_results == []


def test_with_warn_the_trl_reward_function_logs_and_returns_nones(
    cli: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _, url = start_server(cli, DEAD_JUDGE)
    reward = GenRMRewardFunction(url, num_generations=N, ready_wait_s=None, on_unreachable="warn")
    with caplog.at_level(logging.WARNING, logger="genrm_trio.client"):
        rewards = reward(prompts=["p"] * N, completions=answers(0, [1, 2, 3, 4]))
    assert rewards == [None] * N
    [record] = [r for r in caplog.records if r.name == "genrm_trio.client"]
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(
        f"genrm: genrm-trio server {url}: all {N} rollouts of the batch were masked because the"
        " judge or the server could not be reached"
    )
    assert record.getMessage().endswith("; returning None for every completion")


def test_a_batch_the_judge_answered_without_verdicts_is_returned_not_raised(cli: Any) -> None:
    # Every comparison fails, but with the judge's own 400: an answer, not an unreachable judge.
    rules = [pair_rule(i, j, "http_status", status=400) for i in range(N) for j in range(N)]
    _, url, _ = start_stack(cli, *rules)
    reward = GenRMRewardFunction(url, num_generations=N, ready_wait_s=None)
    rewards = reward(prompts=["p"] * N, completions=answers(0, [1, 2, 3, 4]))
    assert rewards == [None] * N
    assert all("HTTP 400" in (r.failure_reason or "") for r in reward.last_results)
