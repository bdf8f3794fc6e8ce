"""OpenRLHF's remote reward protocol on a real `genrm-trio serve` with the fake judge, over
loopback HTTP, with the payloads OpenRLHF 0.11.0 sends.

`SingleTurnAgentExecutor.execute` scores each sample on its own as soon as it is generated, the
`n_samples_per_prompt` samples of a prompt concurrently (`generate_responses` gathers them), by
posting `{"query": [query], "prompts": [prompt], "labels": [label]}` and reading `rewards`,
`scores` and `extra_logs` (openrlhf/utils/agent.py:280-299, 323-356; vllm_engine.py:185-208).
The query is the prompt followed by the response, decoded.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import trio

from genrm_trio.testing import pair_rule

N = 4
ROUTE = "/openrlhf/get_reward"


def start_stack(cli: Any, *settings: str, rules: list[dict[str, Any]] | None = None) -> str:
    rules_file = cli.write("rules.json", json.dumps(rules or []))
    _, judge_url = cli.start_fake_judge("--rules", str(rules_file))
    base = [
        f"judge_base_url={judge_url}",
        "judge_model=fake-judge",
        f"num_rollouts_per_prompt={N}",
        "genrm_parse_retries=0",
        "log_level=WARNING",
        *settings,
    ]
    _, url, _ = cli.start_serve(*[arg for s in base for arg in ("--set", s)])
    return url


def sample(prompt: str, text: str, label: Any = None) -> dict[str, Any]:
    """The payload of one sample, as OpenRLHF posts it."""
    return {"query": [prompt + text], "prompts": [prompt], "labels": [label]}


async def post_all(url: str, payloads: list[dict[str, Any]]) -> list[httpx.Response]:
    replies: list[httpx.Response | None] = [None] * len(payloads)

    async def one(index: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            replies[index] = await http.post(ROUTE, json=payloads[index])

    async with trio.open_nursery() as nursery:
        for index in range(len(payloads)):
            nursery.start_soon(one, index)
    return [reply for reply in replies if reply is not None]


def judge_texts(prompt_tag: str, qualities: list[int]) -> list[str]:
    return [f"answer-{k} {prompt_tag} [[q={q}]]" for k, q in enumerate(qualities)]


def test_one_sample_per_request_is_grouped_by_prompt_and_masked_samples_are_flagged(
    cli: Any,
) -> None:
    # Prompt B's answers 0 and 1 are compared by a judge that fails.
    rule = pair_rule(0, 1, "http_status", status=500)
    rule["match"] = {"response_1": "answer-0 B ", "response_2": "answer-1 B "}
    url = start_stack(cli, "masked_reward_placeholder=group_mean", rules=[rule])
    prompt_a = "<|user|>Name a colour.<|assistant|>"
    prompt_b = "<|user|>Name a fruit.<|assistant|>"
    texts_a = judge_texts("A", [1, 3, 5, 2])
    texts_b = judge_texts("B", [2, 2, 4, 5])
    # Slots are taken in arrival order, so the answers of each prompt are posted in turn.
    replies: dict[str, dict[str, Any]] = {}

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            for a, b in zip(texts_a, texts_b, strict=True):
                for prompt, text in ((prompt_a, a), (prompt_b, b)):

                    async def one(prompt: str = prompt, text: str = text) -> None:
                        [reply] = await post_all(url, [sample(prompt, text, label="gold")])
                        assert reply.status_code == 200, reply.text
                        replies[text] = reply.json()

                    nursery.start_soon(one)
                    await trio.sleep(0.05)

    trio.run(run)
    for text, q in zip(texts_a, [1, 3, 5, 2], strict=True):
        assert replies[text] == {
            "rewards": [q],
            "scores": [q],
            "extra_logs": {"genrm_masked": [0.0]},
        }
    # The masked samples carry the placeholder (the mean of the scored 4 and 5) and say so.
    for text in texts_b[:2]:
        assert replies[text] == {
            "rewards": [4.5],
            "scores": [4.5],
            "extra_logs": {"genrm_masked": [1.0]},
        }
    assert [replies[t]["rewards"] for t in texts_b[2:]] == [[4], [5]]


def test_a_whole_batch_in_one_request_is_answered_in_its_own_order(cli: Any) -> None:
    url = start_stack(cli)
    prompts = ["P1: ", "P2: "] * N
    qualities = [5, 1, 4, 2, 3, 3, 2, 4]
    pairs = enumerate(zip(prompts, qualities, strict=True))
    queries = [f"{p}answer-{i // 2} [[q={q}]]" for i, (p, q) in pairs]
    with cli.http_client(url) as http:
        reply = http.post(ROUTE, json={"query": queries, "prompts": prompts, "labels": [0] * 8})
        empty = http.post(ROUTE, json={"query": [], "prompts": [], "labels": []})
        bad = http.post(ROUTE, json={"query": ["x"], "prompts": [3]})
        short = http.post(ROUTE, json={"query": ["x", "y"], "prompts": ["x"]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["rewards"] == qualities
    # OpenRLHF with several reward URLs posts an empty batch to all but the first.
    assert empty.json() == {"rewards": [], "scores": [], "extra_logs": {"genrm_masked": []}}
    assert (bad.status_code, bad.json()) == (
        422,
        {"detail": "prompts[0]: expected a string, got a number"},
    )
    assert short.json() == {"detail": "prompts: expected one prompt per query (2), got 1"}


def test_a_sample_sent_again_after_its_request_went_away_takes_its_old_slot(cli: Any) -> None:
    url = start_stack(cli)
    prompt = "Q: "
    texts = judge_texts("R", [2, 5, 1, 4])

    async def run() -> list[httpx.Response]:
        # OpenRLHF gives up on a request after 180 s and posts the sample again.
        with trio.move_on_after(0.5):
            await post_all(url, [sample(prompt, texts[0])])
        return await post_all(url, [sample(prompt, text) for text in texts])

    replies = trio.run(run)
    assert [r.json()["rewards"] for r in replies] == [[2], [5], [1], [4]]
    with cli.http_client(url) as http:
        health = http.get("/healthz").json()
    # One group of four was judged, and nothing is left collecting.
    assert health["judge_attempts_total"] == N
    assert health["active_groups"] == 0


def test_a_batch_without_a_whole_group_fails_at_the_collection_deadline(cli: Any) -> None:
    url = start_stack(cli, "cohort_collection_timeout_s=1.0")
    prompt = "Lonely: "
    texts = judge_texts("L", [1, 2, 3, 4])
    partial = trio.run(post_all, url, [sample(prompt, text) for text in texts[:3]])
    assert [r.status_code for r in partial] == [503] * 3
    assert "did not collect 4 unique rollout indices within 1.0s" in partial[0].json()["detail"]
    # The failed group is closed: the prompt's next samples form a new group.
    whole = trio.run(post_all, url, [sample(prompt, text) for text in texts])
    assert [r.json()["rewards"] for r in whole] == [[1], [2], [3], [4]]


# A dead judge: nothing listens on the discard port.
DEAD_JUDGE = "http://127.0.0.1:9/v1"


def start_dead_judge_stack(cli: Any, *settings: str) -> str:
    base = [
        f"judge_base_url={DEAD_JUDGE}",
        "judge_model=fake-judge",
        f"num_rollouts_per_prompt={N}",
        "genrm_parse_retries=0",
        "log_level=ERROR",
        *settings,
    ]
    _, url, _ = cli.start_serve(*[arg for s in base for arg in ("--set", s)])
    return url


def test_samples_whose_group_cannot_reach_the_judge_are_answered_503(cli: Any) -> None:
    url = start_dead_judge_stack(cli, "masked_reward_placeholder=group_mean")
    texts = judge_texts("D", [1, 2, 3, 4])
    replies = trio.run(post_all, url, [sample("Dead: ", text) for text in texts])
    # OpenRLHF's raise_for_status turns each 503 into a retry, and after its tries the sample
    # has no reward and the step fails: no placeholder is trained on.
    assert [r.status_code for r in replies] == [503] * N
    for reply in replies:
        detail = reply.json()["detail"]
        assert detail.startswith(
            "GenRM judge unreachable: all 1 sample(s) of this request were masked because the"
            " judge could not be reached; first failure: GenRM cohort "
        )
        assert f"GenRM judge {DEAD_JUDGE}/chat/completions pair=" in detail
        assert "ConnectError: cannot connect to 127.0.0.1:9" in detail


def test_with_fail_on_transport_mask_off_the_placeholders_are_answered(cli: Any) -> None:
    url = start_dead_judge_stack(cli, "openrlhf_fail_on_transport_mask=false")
    texts = judge_texts("D", [1, 2, 3, 4])
    replies = trio.run(post_all, url, [sample("Dead: ", text) for text in texts])
    assert [r.status_code for r in replies] == [200] * N
    assert [r.json() for r in replies] == [
        {"rewards": [0.0], "scores": [0.0], "extra_logs": {"genrm_masked": [1.0]}}
    ] * N


def test_samples_masked_on_their_own_by_a_broken_connection_keep_their_placeholder(
    cli: Any,
) -> None:
    # The judge closes the connection of one comparison: its two samples are masked, the
    # group's other samples are scored, and nothing is answered 503. Slots follow the order
    # the posts arrive in, so every pair is compared (all_pairs) and the rule matches the two
    # answers in either order.
    rules = []
    for first, second in ((0, 1), (1, 0)):
        rule = pair_rule(first, second, "close")
        rule["match"] = {"response_1": f"answer-{first} C ", "response_2": f"answer-{second} C "}
        rules.append(rule)
    url = start_stack(cli, "comparison_strategy=all_pairs", rules=rules)
    texts = judge_texts("C", [1, 2, 3, 4])
    replies = trio.run(post_all, url, [sample("Closed: ", text) for text in texts])
    assert [r.status_code for r in replies] == [200] * N
    assert [r.json()["extra_logs"]["genrm_masked"] for r in replies] == [[1.0], [1.0], [0.0], [0.0]]
    with cli.http_client(url) as http:
        metrics = http.get("/metrics").text
    # The masks came from a transport failure (the closed connection), judged once.
    assert re.search(r'genrm_judge_attempts_total\{[^}]*outcome="transport"[^}]*\} 1\.0', metrics)


MARKUP = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "\n")


def test_the_judge_reads_a_chatml_sample_without_its_template_markup(cli: Any) -> None:
    _, judge_url = cli.start_fake_judge()
    settings = [f"judge_base_url={judge_url}", "judge_model=fake-judge"]
    settings += [f"num_rollouts_per_prompt={N}", "genrm_parse_retries=0", "log_level=WARNING"]
    _, url, _ = cli.start_serve(*[arg for s in settings for arg in ("--set", s)])
    # The prompt as OpenRLHF decodes it from a Qwen-style ChatML template, and answers that end
    # with the policy's end-of-text token.
    prompt = (
        "<|im_start|>system\nYou are a careful tutor.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    answers = [f"It is 4, answer {k}. [[q={q}]]" for k, q in enumerate([3, 5, 1, 4])]
    replies = trio.run(post_all, url, [sample(prompt, a + "<|endoftext|>") for a in answers])
    assert sorted(r.json()["rewards"][0] for r in replies) == [1, 3, 4, 5]

    with cli.http_client(judge_url.removesuffix("/v1")) as http:
        calls = http.get("/_fake/requests").json()
    assert len(calls) == N  # one group of four, circular pairing
    seen_answers = set()
    for call in calls:
        messages = call["body"]["messages"]
        # The conversation reaches the judge as its turns, the answers as they were written.
        assert messages[:2] == [
            {"role": "system", "content": "You are a careful tutor."},
            {"role": "user", "content": "What is 2+2?"},
        ]
        assert [m["role"] for m in messages[2:]] == ["response_1", "response_2"]
        seen_answers.update(m["content"] for m in messages[2:])
        for message in messages:
            assert not any(mark in message["content"] for mark in MARKUP), message
    assert seen_answers == set(answers)
