"""`POST /compare`: judge one batch inside the request, fail-fast, with no state kept.

The first failed comparison cancels the others; the nursery drains them before the 503 leaves.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.core.pairs import Comparison, baseline_order_digest, plan_comparisons
from genrm_trio.core.scoring import oriented_results, score_group
from genrm_trio.core.texts import (
    effective_principle,
    extract_scoring_text,
    judge_answer_text,
    normalize_compare_history,
)
from genrm_trio.core.verdicts import Verdict
from genrm_trio.judge.client import JudgeClient, JudgeFailure, JudgeTask

log = logging.getLogger("genrm_trio")


@dataclass(frozen=True, slots=True)
class CompareResult:
    rewards: list[float]
    comparison_results: list[dict[str, float | int]] | None
    metrics: dict[str, float] | None


class CompareUnavailable(Exception):
    """The batch could not be judged: answered as 503 with this detail."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


async def run_compare(
    config: Config,
    judge: JudgeClient,
    history_items: list[dict[str, Any]],
    responses: Sequence[Any],
    request_principle: str | None,
    baseline: str | None,
) -> CompareResult:
    """Judge every comparison of the batch; the first judge failure raises CompareUnavailable."""
    count = len(responses)
    baseline_mode = config.comparison_strategy == "fixed_baseline"
    if count == 0 or (count == 1 and not baseline_mode):
        rewards = [config.default_score] * count
        return CompareResult(rewards, None, None)
    texts = [extract_scoring_text(response) for response in responses]
    history = normalize_compare_history(history_items)
    principle = effective_principle(
        request_principle, config.default_principle, config.use_principle
    )
    answers = [judge_answer_text(answer) for _, answer in texts]
    order = None
    if baseline_mode:
        assert baseline is not None
        answers.append(judge_answer_text(baseline))
        order = baseline_order_digest(baseline, history, principle)
    plan = plan_comparisons(
        config.comparison_strategy, count, config.num_judges_per_comparison, baseline_digest=order
    )
    verdicts: dict[int, Verdict] = {}
    deadline = math.inf
    if config.compare_timeout_s is not None:
        deadline = trio.current_time() + config.compare_timeout_s
    failures: list[str] = []
    # One lane for the whole batch: it is complete, and ranks by when the call started.
    lane = judge.slots.lane(complete=True)
    # The batch shares one conversation, so its comparisons prefer one judge replica.
    batch_key = f"compare::{lane.rank[1]}"
    with trio.move_on_at(deadline) as scope:
        async with trio.open_nursery() as nursery:
            for comparison in plan:
                task = JudgeTask(
                    history=history,
                    principle=principle,
                    text_1=answers[comparison.first],
                    text_2=answers[comparison.second],
                    pair=(comparison.first, comparison.second),
                    judge_pass=comparison.judge_pass,
                    lane=lane,
                    group_key=batch_key,
                )
                nursery.start_soon(
                    _judge_one, judge, comparison, task, deadline, verdicts, failures, nursery
                )
    if failures:
        raise CompareUnavailable(failures[0])
    if scope.cancelled_caught:
        assert config.compare_timeout_s is not None
        detail = (
            "GenRM compare deadline exceeded after "
            f"{messages.format_seconds(config.compare_timeout_s)}s"
        )
        raise CompareUnavailable(detail)
    score = score_group(count, texts, plan, verdicts, (), config)
    rewards = [score.rewards[k] for k in range(count)]
    # Every comparison succeeded, so oriented_results pairs one-to-one with the plan.
    results = [
        {
            "response_i": i,
            "response_j": j,
            "judge_idx": comparison.judge_pass,
            "score_1": verdict.score_1,
            "score_2": verdict.score_2,
            "ranking": verdict.ranking,
        }
        for comparison, (i, j, verdict) in zip(plan, oriented_results(plan, verdicts), strict=True)
    ]
    metrics = {
        "mean_individual_score": score.metrics.mean_individual_score,
        "std_individual_score": score.metrics.std_individual_score,
        "tiebreak_usage_rate": score.metrics.tiebreak_usage_rate,
    }
    if config.debug_logging:
        log.debug("GenRM compare answers=%d comparisons=%d rewards=%s", count, len(plan), rewards)
    return CompareResult(rewards, results, metrics)


async def _judge_one(
    judge: JudgeClient,
    comparison: Comparison,
    task: JudgeTask,
    deadline: float,
    verdicts: dict[int, Verdict],
    failures: list[str],
    nursery: trio.Nursery,
) -> None:
    result = await judge.judge(task, deadline=deadline)
    if isinstance(result, JudgeFailure):
        if failures:
            return
        # Fail-fast: the first failure cancels every sibling; the nursery drains them
        # before the caller answers (W-43).
        failures.append(result.text)
        nursery.cancel_scope.cancel()
        log.warning(
            "GenRM compare failed at comparison (%d, %d) (judge %d): %s",
            comparison.first,
            comparison.second,
            comparison.judge_pass,
            result.text,
        )
        return
    verdicts[comparison.index] = result.verdict
