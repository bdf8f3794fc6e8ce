"""The race harness's model of the judge side: each comparison's judge calls under the faults of
a scenario, their outcomes and retries (J-20…J-24), and the rewards of a group's verdicts
(S-30…S-33, with no adjustments), for the model (model.py) to predict answers with."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.fakes.judge import verdict_for_qualities
from genrm_trio.judge.transport import CLOSED_BEFORE_REPLY
from genrm_trio.testing._invariants import CallKey, Expected
from genrm_trio.testing.harness import JUDGE_URL
from genrm_trio.testing.scenarios.model_records import ModelComparison, ModelRecord
from genrm_trio.testing.scenarios.steps import Fault, comparison_pairs

__all__ = ["JudgeModel"]


class JudgeModel:
    """The judge calls a scenario makes, and what each comparison comes to."""

    def __init__(self, config: Config, faults: Iterable[Fault], counts: Counter[str]) -> None:
        self.size = config.num_rollouts_per_prompt
        self.request_timeout = config.judge_request_timeout_s
        self.max_attempts = config.genrm_parse_retries + 1
        self.default = (config.default_score, config.default_score, config.default_ranking)
        self.max_tokens = str(config.genrm_responses_create_params.get("max_output_tokens"))
        self.url = JUDGE_URL + "/chat/completions"
        pairs = comparison_pairs(config.comparison_strategy, self.size)
        passes = config.num_judges_per_comparison
        self.plan = [
            (p * len(pairs) + k, i, j, p) for p in range(passes) for k, (i, j) in enumerate(pairs)
        ]
        self.controls: dict[tuple[str, int, tuple[int, int]], list[Any]] = {}
        for fault in faults:
            uses = passes if fault.kind == "hold" else fault.times
            where = (fault.group, fault.attempt, fault.pair)
            if where in self.controls:
                raise ValueError(
                    f"two faults for group {fault.group!r} attempt {fault.attempt} "
                    f"pair {fault.pair}"
                )
            self.controls[where] = [fault.kind, uses]
        self.counts = counts
        self.calls: Counter[CallKey] = Counter()
        self.changed_calls: set[CallKey] = set()  # per step: emptied by the runner

    def comparisons(self) -> list[ModelComparison]:
        return [ModelComparison(*entry) for entry in self.plan]

    def _seconds(self) -> str:
        return messages.format_seconds(self.request_timeout)

    def next_attempt(self, record: ModelRecord, comparison: ModelComparison, now: float) -> None:
        """Make judge calls until the comparison concludes or waits on a held or hung call."""
        pair = (comparison.first, comparison.second)
        while comparison.state == "running":
            key: CallKey = (record.marker, record.attempt, pair)
            self.calls[key] += 1
            self.changed_calls.add(key)
            self.counts["judge calls"] += 1
            kind = self._take_control(record, pair)
            if kind in ("hold", "hang"):
                comparison.state = "held" if kind == "hold" else "hang"
                comparison.deadline = now + self.request_timeout
                return
            self.conclude(record, comparison, *self.attempt_outcome(kind), now)

    def _take_control(self, record: ModelRecord, pair: tuple[int, int]) -> str | None:
        control = self.controls.get((record.marker, record.attempt, pair))
        if control is None or control[1] == 0:
            return None
        if control[1] is not None:
            control[1] -= 1
        return str(control[0])

    def attempt_outcome(self, kind: str | None) -> tuple[str, str]:
        """(class, cause) of one judge attempt under a fault kind (J-21)."""
        injected = '{"error":"injected"}'
        if kind in ("transient", "rate_limited", "flaky"):
            status = {"transient": 500, "rate_limited": 429, "flaky": 503}[kind]
            return "transient", f"HTTPStatusError: HTTP {status}; response={injected}"
        if kind == "fatal":
            return "fatal", f"HTTPStatusError: HTTP 400; response={injected}"
        if kind == "non_json":
            return "fatal", "JSONDecodeError: judge reply is not valid JSON: <html>not json</html>"
        if kind == "close":
            return "transient", f"RemoteProtocolError: {CLOSED_BEFORE_REPLY}"
        if kind == "truncated":
            return "transient", "RemoteProtocolError: the judge closed the connection after"
        if kind == "budget":
            return "exhausted", ""
        if kind == "empty":
            return "unusable", ""
        if kind == "unparseable":
            return "unparseable", ""
        return "verdict", ""

    def conclude(
        self, record: ModelRecord, comparison: ModelComparison, outcome: str, cause: str, now: float
    ) -> None:
        """One attempt ended with `outcome`: retry, or settle the comparison (J-22 … J-24)."""
        comparison.outcomes.append(outcome)
        comparison.state = "running"
        attempt = len(comparison.outcomes)
        if outcome == "verdict":
            quality = {slot: m.quality for slot, m in record.members.items()}
            # The fake judge's rule, with no position bias and a tie ranking of 3.5.
            comparison.verdict = verdict_for_qualities(
                quality[comparison.first], quality[comparison.second]
            )
        elif outcome == "fatal":
            comparison.failure = self._judge_error(comparison, attempt, cause)
        elif attempt == self.max_attempts:
            if outcome == "transient":
                comparison.failure = self._judge_error(comparison, attempt, cause)
            elif "unparseable" in comparison.outcomes:
                comparison.verdict = self.default
            else:
                exhausted = comparison.outcomes.count("exhausted")
                cause = f"Judge returned no completed answer after {attempt} attempts"
                if exhausted:
                    cause += f" ({exhausted} of them exhausted max_output_tokens={self.max_tokens}"
                else:
                    cause += "; last reply: empty verdict text"
                comparison.failure = self._judge_error(comparison, attempt, cause)
        else:
            return  # retried at once: the backoff base is 0
        comparison.state = "done"

    def _judge_error(self, comparison: ModelComparison, attempt: int, cause: str) -> str:
        return (
            f"GenRM judge {self.url} pair=({comparison.first}, {comparison.second}) "
            f"judge={comparison.judge_pass} attempt={attempt}/{self.max_attempts} "
            f"deadline={self._seconds()}s: {cause}"
        )

    def outcomes(self, record: ModelRecord) -> dict[int, Expected] | str:
        """Every slot's answer once every comparison of ``record`` is done, or the failure text
        when every rollout is masked (M-1…M-6)."""
        failed = [c for c in record.comparisons if c.failure is not None]
        total = len(record.comparisons)
        masked: dict[int, str] = {}
        for comparison in failed:
            assert comparison.failure is not None
            for slot in (comparison.first, comparison.second):
                masked.setdefault(slot, comparison.failure)
        if len(masked) == self.size:
            assert failed[0].failure is not None
            return messages.every_rollout_masked(record.key, len(failed), total, failed[0].failure)
        rewards, metrics = self.score(record, set(masked))
        metrics["genrm_failed_comparison_rate_per_group"] = len(failed) / total
        metrics["genrm_masked_rollout_rate_per_group"] = len(masked) / self.size
        outcomes = {}
        for slot in record.members:
            if slot in masked:
                text = messages.rollout_masked(slot, len(failed), total, masked[slot])
                outcomes[slot] = Expected("masked", 200, text, prefix=True)
            else:
                outcomes[slot] = Expected("scored", reward=rewards[slot], metrics=metrics)
        return outcomes

    def score(
        self, record: ModelRecord, masked: set[int]
    ) -> tuple[dict[int, float], dict[str, float]]:
        """S-30 … S-33 with no length or style adjustments: a mean per slot, the metrics."""
        totals = dict.fromkeys(range(self.size), 0.0)
        counts = dict.fromkeys(range(self.size), 0)
        scores: list[float] = []
        ties = 0
        done = [c for c in record.comparisons if c.verdict is not None]
        for comparison in done:
            assert comparison.verdict is not None
            first, second, ranking = comparison.verdict
            scores += [first, second]
            if first == second:
                ties += 1
                first, second = first + (3.5 - ranking), second - (3.5 - ranking)
            totals[comparison.first] += first
            totals[comparison.second] += second
            counts[comparison.first] += 1
            counts[comparison.second] += 1
        rewards = {
            k: totals[k] / counts[k] if counts[k] else self.default[0]
            for k in range(self.size)
            if k not in masked
        }
        mean = sum(scores) / len(scores)
        std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
        return rewards, {
            "mean_individual_score": mean,
            "std_individual_score": std,
            "tiebreak_usage_rate": ties / len(done),
        }
