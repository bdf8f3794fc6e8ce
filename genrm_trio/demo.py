"""`genrm-trio demo`: four 16-rollout groups judged through real HTTP on the built-in fake judge.

One group is clean, two lose comparisons to injected judge faults (partial masking) and one meets
a judge outage (every rollout masked). The demo checks its own results (CL-20..CL-22).
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
import msgspec
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from genrm_trio.config import config_from_mapping
from genrm_trio.fakes.judge import FakeJudge
from genrm_trio.fakes.judge_http import serve_fake_judge
from genrm_trio.http.app import create_app
from genrm_trio.judge.http11 import Http11Transport

GROUP_SIZE = 16
# The judge's name in failure texts; the demo routes it to the fake judge's free port, so the
# printed reasons do not change from run to run (CL-22).
JUDGE_URL = "http://fake-judge/v1"


@dataclass(frozen=True)
class DemoTask:
    prompt: str
    topic: str
    rules: list[dict[str, Any]]
    expected_masked: frozenset[int]


def _pair_fault(i: int, j: int, **action: Any) -> dict[str, Any]:
    return {"match": {"response_1": f"Draft {i}:", "response_2": f"Draft {j}:"}, **action}


TASKS = [
    DemoTask(
        "Explain why the sky is blue in two or three sentences.",
        "Rayleigh scattering",
        [],
        frozenset(),
    ),
    DemoTask(
        "Write a short haiku about autumn rain and explain its imagery.",
        "autumn rain",
        [_pair_fault(15, 0, action="budget_exhausted")],
        frozenset({0, 15}),
    ),
    DemoTask(
        "What is 17 x 23? Show your working.",
        "long multiplication",
        [
            _pair_fault(4, 5, action="http_status", status=500),
            _pair_fault(5, 6, action="http_status", status=500),
        ],
        frozenset({4, 5, 6}),
    ),
    DemoTask(
        "Give three tips for writing clear commit messages.",
        "commit messages",
        [{"action": "http_status", "status": 503}],
        frozenset(range(GROUP_SIZE)),
    ),
]

_OPENERS = [
    "Here is a concise answer.",
    "Short version:",
    "Let me walk through it.",
    "In brief,",
    "Good question.",
]


def synthesise_answer(task: DemoTask, slot: int, rng: random.Random) -> str:
    """A deterministic answer of varying length and markdown for one slot."""
    sentences = rng.randint(1, 4)
    body = " ".join(
        f"{rng.choice(_OPENERS)} This point about {task.topic} matters ({k + 1})."
        for k in range(sentences)
    )
    style = rng.randrange(4)
    if style == 1:
        body = f"## {task.topic.title()}\n{body}"
    elif style == 2:
        body = f"{body}\n- **key idea**: {task.topic}\n- detail {slot}"
    elif style == 3:
        body = f"**{task.topic}**. {body}"
    return f"Draft {slot}: {body}"


def _member(task: DemoTask, number: int, seed: int, slot: int, answer: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": task.prompt}]},
        "response": {
            "id": f"demo-{number}-{seed}-{slot}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": answer}],
                }
            ],
        },
        "_ng_group_id": f"demo-{number}-{seed}",
        "_ng_group_attempt": 0,
        "_ng_rollout_index": slot,
    }


@dataclass
class TaskResult:
    number: int
    task: DemoTask
    group_id: str
    calls: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    raw_rows: list[bytes] = field(default_factory=list)

    @property
    def masked(self) -> set[int]:
        return {row["_ng_rollout_index"] for row in self.rows if row["mask_sample"]}

    def failed_comparisons(self) -> int:
        for row in self.rows:
            if not row["mask_sample"]:
                return round(row["genrm_failed_comparison_rate_per_group"] * GROUP_SIZE)
        # Every rollout masked: the group's reason states the count.
        reason = self.rows[0]["failure_reason"]
        marker = reason.find(" of ")
        start = reason.rfind("(", 0, marker)
        return int(reason[start + 1 : marker])


async def _run_task(
    client: httpx.AsyncClient, judge: FakeJudge, number: int, task: DemoTask, seed: int
) -> TaskResult:
    rng = random.Random(f"{seed}:{number}")
    answers = [synthesise_answer(task, slot, rng) for slot in range(GROUP_SIZE)]
    judge.set_rules(task.rules)
    before = judge.stats()["requests_total"]
    rows: list[dict[str, Any] | None] = [None] * GROUP_SIZE
    raw_rows = [b""] * GROUP_SIZE

    async def post(slot: int) -> None:
        reply = await client.post(
            "/verify", content=msgspec.json.encode(_member(task, number, seed, slot, answers[slot]))
        )
        if reply.status_code != 200:
            raise RuntimeError(f"/verify answered {reply.status_code}: {reply.text}")
        rows[slot] = reply.json()
        raw_rows[slot] = reply.content

    async with trio.open_nursery() as nursery:
        for slot in range(GROUP_SIZE):
            nursery.start_soon(post, slot)
    calls = judge.stats()["requests_total"] - before
    result = TaskResult(number, task, f"demo-{number}-{seed}", calls)
    result.rows = [row for row in rows if row is not None]
    result.raw_rows = raw_rows
    return result


def _self_check(results: list[TaskResult]) -> str | None:
    for result in results:
        if result.masked != set(result.task.expected_masked):
            expected = sorted(result.task.expected_masked)
            return f"task {result.number}: masked {sorted(result.masked)}, expected {expected}"
        for row in result.rows:
            if row["mask_sample"]:
                if row["reward"] != 0.0 or not row["failure_reason"]:
                    return f"task {result.number}: masked row {row['_ng_rollout_index']} malformed"
                continue
            if not math.isfinite(row["reward"]):
                return f"task {result.number}: non-finite reward"
            rate = row["genrm_masked_rollout_rate_per_group"]
            if not math.isclose(rate, len(result.masked) / GROUP_SIZE):
                return f"task {result.number}: masked rate {rate} disagrees with the rows"
    return None


def _short(text: str | None) -> str:
    return "" if not text else text[:100]


def _print_tables(results: list[TaskResult]) -> None:
    for result in results:
        excerpt = result.task.prompt[:40]
        print(
            f"task {result.number}: {excerpt} group={result.group_id} judge calls={result.calls}"
            f" failed comparisons={result.failed_comparisons()}/{GROUP_SIZE}"
            f" masked={len(result.masked)}/{GROUP_SIZE}"
        )
        print(f"  {'idx':>3}  {'reward':>7}  {'masked':<6}  reason")
        for row in result.rows:
            reward = "-" if row["mask_sample"] else f"{row['reward']:.4f}"
            masked = "yes" if row["mask_sample"] else "no"
            print(
                f"  {row['_ng_rollout_index']:>3}  {reward:>7}  {masked:<6}  "
                f"{_short(row['failure_reason'])}".rstrip()
            )


async def _demo(seed: int, judge_api: str, as_json: bool) -> int:
    judge = FakeJudge(seed=seed)
    async with trio.open_nursery() as nursery:
        judge_port = await nursery.start(serve_fake_judge, judge, "127.0.0.1", 0)
        config = config_from_mapping(
            {
                "judge_base_url": JUDGE_URL,
                "judge_model": "fake-judge",
                "judge_api": judge_api,
                "num_rollouts_per_prompt": GROUP_SIZE,
                "comparison_strategy": "circular",
                "num_judges_per_comparison": 1,
                "genrm_parse_retries": 1,
                "genrm_parse_retry_sleep_s": 0.01,
                "judge_request_timeout_s": 5.0,
                "cohort_collection_timeout_s": 30.0,
                "cohort_evaluation_timeout_s": 30.0,
                "port": 0,
            }
        )
        # The server's own network transport, connecting to the fake judge's port on 127.0.0.1.
        to_fake_judge = partial(Http11Transport, connect_to=("127.0.0.1", judge_port))
        app = create_app(config, judge_transport=to_fake_judge)
        settings = HypercornConfig()
        settings.bind = ["127.0.0.1:0"]
        settings.accesslog = None
        settings.errorlog = None
        stop = trio.Event()
        async with trio.open_nursery() as server_nursery:
            binds = await server_nursery.start(
                lambda task_status: hypercorn_serve(
                    app,
                    settings,
                    shutdown_trigger=stop.wait,
                    task_status=task_status,
                )
            )
            async with httpx.AsyncClient(
                base_url=binds[0], timeout=60.0, trust_env=False
            ) as client:
                results = [
                    await _run_task(client, judge, number, task, seed)
                    for number, task in enumerate(TASKS, start=1)
                ]
            stop.set()
        nursery.cancel_scope.cancel()
    problem = _self_check(results)
    if as_json:
        for result in results:
            for raw in result.raw_rows:
                print(raw.decode())
    else:
        _print_tables(results)
    if problem is not None:
        print(f"demo self-check failed: {problem}", file=sys.stderr)
        return 1
    if not as_json:
        scored = sum(GROUP_SIZE - len(r.masked) for r in results)
        masked = sum(len(r.masked) for r in results)
        failed = sum(1 for r in results if len(r.masked) == GROUP_SIZE)
        calls = sum(r.calls for r in results)
        print(
            f"demo ok: {scored} scored, {masked} masked, {failed} group(s) failed,"
            f" {calls} judge calls"
        )
    return 0


def run_demo(*, seed: int = 0, judge_api: str = "chat_completions", as_json: bool = False) -> int:
    return trio.run(_demo, seed, judge_api, as_json)
