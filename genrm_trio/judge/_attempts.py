"""The judge attempt loop as pure decisions: classify one attempt, decide retry or conclusion.

Also the backoff draw, Retry-After parsing, judge error texts and log texts (§3.3…§3.6).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from genrm_trio.config import JudgeApi
from genrm_trio.core.messages import format_seconds
from genrm_trio.core.verdicts import Verdict
from genrm_trio.judge._replies import ReplyNotJson, ReplyReading, decode_reply, read_reply
from genrm_trio.judge.transport import JudgeTransportError

# Only 1000 code points of an error body are shown, and no code point is longer than 4 bytes.
ERROR_BODY_BYTES = 4096
ERROR_BODY_CHARS = 1000
NON_JSON_CHARS = 200
NO_TIME_LEFT = " (no time left to retry before the deadline)"

_TRANSIENT_STATUSES = frozenset({408, 429})
_RETRY_AFTER_STATUSES = frozenset({429, 503})
_DELTA_SECONDS = re.compile(r"\d+(\.\d+)?")
_EXHAUSTED_DETAIL: dict[JudgeApi, str] = {
    "chat_completions": "reply finished with finish_reason=length and contains no verdict",
    "responses": "response is incomplete (reason=max_output_tokens) and contains no verdict",
}


# --- attempt outcomes (J-21) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Success:
    """A usable reply with a verdict."""

    verdict: Verdict


@dataclass(frozen=True, slots=True)
class TransientFailure:
    """Connection trouble, or HTTP 408, 429 or 5xx: worth another attempt."""

    cause: str  # the J-40 cause text
    short_cause: str  # for the O-2 retry log line
    retry_after_s: float | None = None  # J-31, only from a 429 or 503


@dataclass(frozen=True, slots=True)
class FatalFailure:
    """Another non-2xx status, the per-request deadline, or a 2xx body that is not JSON."""

    cause: str


@dataclass(frozen=True, slots=True)
class ParseFailure:
    """A JSON reply without a verdict: unusable (maybe budget-exhausted) or unparseable."""

    problem: str
    usable: bool
    exhausted: bool


AttemptOutcome = Success | TransientFailure | FatalFailure | ParseFailure


def status_outcome(status: int, body: bytes, retry_after: float | None) -> AttemptOutcome:
    """A non-2xx reply; ``body`` may be only its first ERROR_BODY_BYTES bytes."""
    text = body[:ERROR_BODY_BYTES].decode("utf-8", errors="replace")[:ERROR_BODY_CHARS]
    cause = f"HTTPStatusError: HTTP {status}; response={text}"
    if status in _TRANSIENT_STATUSES or 500 <= status <= 599:
        kept = retry_after if status in _RETRY_AFTER_STATUSES else None
        return TransientFailure(cause=cause, short_cause=f"HTTP {status}", retry_after_s=kept)
    return FatalFailure(cause=cause)


def transport_outcome(error: JudgeTransportError) -> TransientFailure:
    """A connection that could not be made, failed, or delivered a reply cut short or broken:
    the cause is the transport error's class and message (judge/transport.py words both)."""
    name = type(error).__name__
    return TransientFailure(cause=f"{name}: {str(error)[:1000]}", short_cause=name)


def timeout_outcome(timeout_s: float) -> FatalFailure:
    """J-27: no complete reply within the per-request deadline."""
    return FatalFailure(
        cause=f"TimeoutError: no complete reply within {format_seconds(timeout_s)}s"
    )


def non_json_outcome(body: bytes) -> FatalFailure:
    shown = body.decode("utf-8", errors="replace")[:NON_JSON_CHARS]
    return FatalFailure(cause=f"JSONDecodeError: judge reply is not valid JSON: {shown}")


def reading_outcome(reading: ReplyReading) -> Success | ParseFailure:
    if reading.verdict is not None:
        return Success(verdict=reading.verdict)
    return ParseFailure(
        problem=reading.problem or "", usable=reading.usable, exhausted=reading.exhausted
    )


def reply_outcome(
    api: JudgeApi, body: bytes, *, default_score: float, default_ranking: float
) -> AttemptOutcome:
    """A complete 2xx body: non-JSON is fatal, otherwise J-11…J-17 decide."""
    try:
        reply = decode_reply(body)
    except ReplyNotJson:
        return non_json_outcome(body)
    reading = read_reply(api, reply, default_score=default_score, default_ranking=default_ranking)
    return reading_outcome(reading)


def status_label(status: int) -> str:
    """The metrics label of an attempt answered with a non-2xx status (§9.3)."""
    if status in (408, 429):
        return f"http_{status}"
    if 500 <= status <= 599:
        return "http_5xx"
    return "http_4xx"  # every other non-2xx status is fatal alike


def reply_label(outcome: AttemptOutcome) -> str:
    """The metrics label of an attempt answered with a complete 2xx body (§9.3)."""
    if isinstance(outcome, Success):
        return "ok"
    if isinstance(outcome, ParseFailure):
        return "budget_exhausted" if outcome.exhausted else "unusable"
    return "non_json"


def short_cause(outcome: TransientFailure | ParseFailure) -> str:
    """What the O-2 retry line names as the reason for retrying."""
    if isinstance(outcome, TransientFailure):
        return outcome.short_cause
    if outcome.exhausted:
        return f"output budget exhausted ({outcome.problem})"
    if outcome.usable:
        return f"unparseable reply ({outcome.problem})"
    return f"unusable reply ({outcome.problem})"


# --- backoff (J-30, J-31) -------------------------------------------------------------------


def backoff_bound(retry: int, *, base_s: float, max_s: float) -> float:
    """Upper end of the sleep before attempt ``retry + 1`` (``retry`` >= 1)."""
    # 2**1000 is finite while 2.0**1100 raises; the cap has long been reached by then.
    growth = base_s * 2.0 ** min(retry - 1, 1000)
    return min(max_s, growth)


def draw_backoff(rng: random.Random, retry: int, *, base_s: float, max_s: float) -> float:
    """J-30: exponential growth with full jitter; zero without drawing when the bound is zero."""
    bound = backoff_bound(retry, base_s=base_s, max_s=max_s)
    if bound <= 0:
        return 0.0
    return rng.uniform(0.0, bound)


def parse_retry_after(value: str | None, *, now_epoch_s: float) -> float | None:
    """J-31: delta-seconds or an HTTP-date, as a delay in seconds; None when unparseable."""
    if value is None:
        return None
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        delay = float(value)
        return delay if math.isfinite(delay) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now_epoch_s)


def retry_sleep(outcome: TransientFailure | ParseFailure, drawn_s: float) -> float:
    """J-31: the larger of the drawn backoff and a Retry-After delay."""
    if isinstance(outcome, TransientFailure) and outcome.retry_after_s is not None:
        return max(drawn_s, outcome.retry_after_s)
    return drawn_s


# --- conclusions (J-22…J-25, J-32) ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdicted:
    """The comparison has a verdict; ``fallback`` marks J-24's default verdict."""

    verdict: Verdict
    fallback: bool


@dataclass(frozen=True, slots=True)
class Failed:
    """The comparison failed; ``cause`` is the J-40 cause (J-32 suffix included)."""

    cause: str


Conclusion = Verdicted | Failed


def max_output_tokens_text(sampling: Mapping[str, Any]) -> str:
    """J-26 ``<M>``: the configured max_output_tokens, or ``unset``."""
    value = sampling.get("max_output_tokens")
    return "unset" if value is None else str(value)


def no_completed_answer(
    attempts: int, parse_failures: Sequence[ParseFailure], max_output_tokens: str
) -> str:
    """J-24's cause when no attempt produced a usable reply; the last parse failure is shown."""
    cause = f"Judge returned no completed answer after {attempts} attempts"
    exhausted = sum(1 for failure in parse_failures if failure.exhausted)
    if exhausted:
        cause += (
            f" ({exhausted} of them exhausted max_output_tokens={max_output_tokens} without"
            " emitting a verdict; raise the budget or constrain the judge's reasoning)"
        )
    return f"{cause}; last reply: {parse_failures[-1].problem}"


def _end_of_loop(
    outcomes: Sequence[AttemptOutcome], default: Verdict, max_output_tokens: str
) -> Conclusion:
    last = outcomes[-1]
    if isinstance(last, Success):
        return Verdicted(verdict=last.verdict, fallback=False)
    if isinstance(last, TransientFailure | FatalFailure):
        # J-23, J-25: a transport or HTTP failure never becomes a default score.
        return Failed(cause=last.cause)
    # J-24 looks at every parse failure, wherever it fell, so the order of attempts is irrelevant;
    # transient attempts in between produced no answer either.
    parse_failures = [outcome for outcome in outcomes if isinstance(outcome, ParseFailure)]
    if any(outcome.usable for outcome in parse_failures):
        return Verdicted(verdict=default, fallback=True)
    return Failed(cause=no_completed_answer(len(outcomes), parse_failures, max_output_tokens))


def conclude(
    outcomes: Sequence[AttemptOutcome],
    *,
    max_attempts: int,
    default: Verdict,
    max_output_tokens: str,
) -> Conclusion | None:
    """J-22…J-25: the comparison's result after these attempts, or None to try again."""
    last = outcomes[-1]
    retryable = isinstance(last, TransientFailure | ParseFailure)
    if retryable and len(outcomes) < max_attempts:
        return None
    return _end_of_loop(outcomes, default, max_output_tokens)


def conclude_without_time(
    outcomes: Sequence[AttemptOutcome], *, default: Verdict, max_output_tokens: str
) -> Conclusion:
    """J-32: the retry sleep would outlast the enclosing deadline, so stop after these attempts.

    A failure gets the no-time-left suffix. When the attempts so far already meet J-24's
    condition for the default verdict (a usable but unparseable reply, ending in a parse
    failure), that verdict is used, as it would be after the last attempt.
    """
    conclusion = _end_of_loop(outcomes, default, max_output_tokens)
    if isinstance(conclusion, Failed):
        return Failed(cause=conclusion.cause + NO_TIME_LEFT)
    return conclusion


# --- texts (J-40, O-2, O-3, O-4) --------------------------------------------------------------


def pair_text(pair: tuple[int, int]) -> str:
    return f"({pair[0]}, {pair[1]})"


def judge_error_text(
    *,
    url: str,
    pair: tuple[int, int],
    judge_pass: int,
    attempt: int,
    max_attempts: int,
    timeout_s: float,
    cause: str,
) -> str:
    """J-40: the full judge error text of a failed comparison."""
    return (
        f"GenRM judge {url} pair={pair_text(pair)} judge={judge_pass}"
        f" attempt={attempt}/{max_attempts} deadline={format_seconds(timeout_s)}s: {cause}"
    )


def retry_log_text(
    *,
    pair: tuple[int, int],
    judge_pass: int,
    attempt: int,
    max_attempts: int,
    cause: str,
    sleep_s: float,
) -> str:
    """O-2, logged at INFO before sleeping; the sleep is shown to the millisecond."""
    return (
        f"GenRM judge retry pair {pair_text(pair)} judge {judge_pass}"
        f" attempt {attempt}/{max_attempts} after {cause};"
        f" sleeping {format_seconds(round(sleep_s, 3))}s"
    )


def budget_exhausted_log_text(
    *, api: JudgeApi, pair: tuple[int, int], attempt: int, max_attempts: int, max_output_tokens: str
) -> str:
    """O-3, logged at WARNING once per exhausted attempt."""
    return (
        f"GenRM output budget exhausted for pair {pair_text(pair)}"
        f" (attempt {attempt}/{max_attempts}, max_output_tokens={max_output_tokens}):"
        f" {_EXHAUSTED_DETAIL[api]}"
    )


def fallback_log_text(*, pair: tuple[int, int], judge_pass: int, attempts: int) -> str:
    """O-4, logged at WARNING when J-24's default verdict is used."""
    return (
        f"GenRM judge reply unparseable for pair {pair_text(pair)} judge {judge_pass}"
        f" after {attempts} attempts; using default scores"
    )
