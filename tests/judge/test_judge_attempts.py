"""Attempt classification, end-of-loop decisions, backoff, Retry-After and texts (J-20…J-41)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from genrm_trio.core.verdicts import Verdict
from genrm_trio.judge._attempts import (
    AttemptOutcome,
    Failed,
    FatalFailure,
    ParseFailure,
    Success,
    TransientFailure,
    Verdicted,
    backoff_bound,
    budget_exhausted_log_text,
    conclude,
    conclude_without_time,
    draw_backoff,
    fallback_log_text,
    judge_error_text,
    max_output_tokens_text,
    parse_retry_after,
    reply_outcome,
    retry_log_text,
    retry_sleep,
    short_cause,
    status_outcome,
    timeout_outcome,
    transport_outcome,
)
from genrm_trio.judge.transport import ReadError, RemoteProtocolError

DEFAULT = Verdict(3.0, 3.0, 3.5)
V421 = Verdict(4.0, 2.0, 1.0)
INJECTED = b'{"error":"injected"}'
EXHAUSTED = ParseFailure(problem="finish_reason=length", usable=False, exhausted=True)
EMPTY = ParseFailure(problem="empty verdict text", usable=False, exhausted=False)
MALFORMED = ParseFailure(problem="no verdict found", usable=True, exhausted=False)
HTTP_503 = TransientFailure(
    cause='HTTPStatusError: HTTP 503; response={"error":"injected"}', short_cause="HTTP 503"
)


def cause_of(outcome: AttemptOutcome) -> str:
    assert isinstance(outcome, TransientFailure | FatalFailure)
    return outcome.cause


def retry_after_of(outcome: AttemptOutcome) -> float | None:
    assert isinstance(outcome, TransientFailure)
    return outcome.retry_after_s


def decide(outcomes: Sequence[AttemptOutcome], max_attempts: int = 4) -> object:
    return conclude(outcomes, max_attempts=max_attempts, default=DEFAULT, max_output_tokens="1341")


# --- J-21 classification ---------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 599])
def test_408_429_and_5xx_are_transient(status: int) -> None:
    outcome = status_outcome(status, INJECTED, None)
    assert outcome == TransientFailure(
        cause=f'HTTPStatusError: HTTP {status}; response={{"error":"injected"}}',
        short_cause=f"HTTP {status}",
    )


@pytest.mark.parametrize("status", [300, 301, 302, 304, 307, 400, 401, 403, 404, 409, 422])
def test_other_statuses_are_fatal(status: int) -> None:
    assert status_outcome(status, INJECTED, None) == FatalFailure(
        cause=f'HTTPStatusError: HTTP {status}; response={{"error":"injected"}}'
    )


def test_error_body_is_cut_to_1000_code_points_and_decoded_with_replacement() -> None:
    outcome = status_outcome(500, "é".encode() * 3000, None)
    assert cause_of(outcome) == "HTTPStatusError: HTTP 500; response=" + "é" * 1000
    outcome = status_outcome(400, b"bad \xff byte", None)
    assert cause_of(outcome) == "HTTPStatusError: HTTP 400; response=bad \ufffd byte"


def test_retry_after_is_kept_only_for_429_and_503() -> None:
    assert status_outcome(429, b"", 1.0) == TransientFailure(
        cause="HTTPStatusError: HTTP 429; response=", short_cause="HTTP 429", retry_after_s=1.0
    )
    assert retry_after_of(status_outcome(503, b"", 2.0)) == 2.0
    assert retry_after_of(status_outcome(500, b"", 2.0)) is None


def test_transport_errors_are_transient_and_named_by_type() -> None:
    assert transport_outcome(ReadError("connection to the judge broken: reset")) == (
        TransientFailure(
            cause="ReadError: connection to the judge broken: reset", short_cause="ReadError"
        )
    )
    assert transport_outcome(RemoteProtocolError("x" * 5000)).cause == (
        "RemoteProtocolError: " + "x" * 1000
    )


def test_per_request_deadline_is_fatal_with_the_configured_duration() -> None:
    assert timeout_outcome(0.2) == FatalFailure(cause="TimeoutError: no complete reply within 0.2s")
    assert timeout_outcome(1800).cause == "TimeoutError: no complete reply within 1800.0s"


def test_2xx_non_json_is_fatal_and_shows_200_code_points() -> None:
    outcome = reply_outcome(
        "chat_completions", b"<html>not json</html>", default_score=3.0, default_ranking=3.5
    )
    assert outcome == FatalFailure(
        cause="JSONDecodeError: judge reply is not valid JSON: <html>not json</html>"
    )
    outcome = reply_outcome("responses", b"x" * 500, default_score=3.0, default_ranking=3.5)
    assert cause_of(outcome) == "JSONDecodeError: judge reply is not valid JSON: " + "x" * 200


def test_2xx_json_replies_are_successes_or_parse_failures() -> None:
    body = (
        b'{"choices":[{"message":{"content":"{\\"score_1\\":4,\\"score_2\\":2,\\"ranking\\":1}"}}]}'
    )
    assert reply_outcome(
        "chat_completions", body, default_score=3.0, default_ranking=3.5
    ) == Success(verdict=V421)
    assert reply_outcome(
        "chat_completions", b'{"choices": []}', default_score=3.0, default_ranking=3.5
    ) == ParseFailure(problem="no choices", usable=False, exhausted=False)


# --- J-22…J-25 end of loop ---------------------------------------------------------------


def test_retryable_outcomes_continue_while_attempts_remain() -> None:
    assert decide([HTTP_503]) is None
    assert decide([EMPTY, MALFORMED, transport_outcome(OSError("x"))]) is None


def test_success_ends_the_loop_with_its_verdict() -> None:
    assert decide([MALFORMED, Success(V421)]) == Verdicted(verdict=V421, fallback=False)


def test_fatal_outcome_ends_the_loop_at_once() -> None:
    fatal = status_outcome(401, INJECTED, None)
    assert decide([fatal]) == Failed(cause=cause_of(fatal))
    assert decide([MALFORMED, timeout_outcome(0.2)]) == Failed(
        cause="TimeoutError: no complete reply within 0.2s"
    )


def test_last_attempt_transient_fails_even_after_an_unparseable_reply() -> None:
    assert decide([MALFORMED, HTTP_503], max_attempts=2) == Failed(cause=HTTP_503.cause)


def test_persistent_transient_failure_never_becomes_a_default_score() -> None:
    assert decide([HTTP_503] * 3, max_attempts=3) == Failed(cause=HTTP_503.cause)


def test_no_usable_reply_fails_with_the_no_completed_answer_text() -> None:
    unfinished = ParseFailure(problem="unfinished reasoning", usable=False, exhausted=False)
    assert decide([unfinished] * 4) == Failed(
        cause=(
            "Judge returned no completed answer after 4 attempts; last reply: unfinished reasoning"
        )
    )


def test_budget_exhaustion_adds_the_count_and_configured_budget() -> None:
    assert decide([EXHAUSTED, EXHAUSTED], max_attempts=2) == Failed(
        cause=(
            "Judge returned no completed answer after 2 attempts (2 of them exhausted"
            " max_output_tokens=1341 without emitting a verdict; raise the budget or constrain"
            " the judge's reasoning); last reply: finish_reason=length"
        )
    )
    assert decide([EXHAUSTED, EMPTY], max_attempts=2) == Failed(
        cause=(
            "Judge returned no completed answer after 2 attempts (1 of them exhausted"
            " max_output_tokens=1341 without emitting a verdict; raise the budget or constrain"
            " the judge's reasoning); last reply: empty verdict text"
        )
    )


def test_usable_but_unparseable_reply_falls_back_to_the_default_verdict() -> None:
    assert decide([MALFORMED] * 4) == Verdicted(verdict=DEFAULT, fallback=True)
    assert decide([MALFORMED, EMPTY], max_attempts=2) == Verdicted(verdict=DEFAULT, fallback=True)
    assert decide([EMPTY, MALFORMED], max_attempts=2) == Verdicted(verdict=DEFAULT, fallback=True)
    assert decide([MALFORMED, HTTP_503, EXHAUSTED], max_attempts=3) == Verdicted(
        verdict=DEFAULT, fallback=True
    )


PARSE_FAILURES = st.sampled_from([EXHAUSTED, EMPTY, MALFORMED])


@given(st.lists(PARSE_FAILURES, min_size=1, max_size=6), st.randoms())
def test_outcome_after_parse_failures_does_not_depend_on_their_order(
    failures: list[ParseFailure], rng: random.Random
) -> None:
    shuffled = list(failures)
    rng.shuffle(shuffled)
    first = decide(failures, max_attempts=len(failures))
    second = decide(shuffled, max_attempts=len(failures))
    assert type(first) is type(second)
    if isinstance(first, Failed):
        assert isinstance(second, Failed)
        assert first.cause.split("; last reply:")[0] == second.cause.split("; last reply:")[0]
    else:
        assert first == second == Verdicted(verdict=DEFAULT, fallback=True)


def test_stopping_for_lack_of_time_appends_the_suffix() -> None:
    assert conclude_without_time(
        [status_outcome(429, INJECTED, 60.0)], default=DEFAULT, max_output_tokens="unset"
    ) == Failed(
        cause=(
            'HTTPStatusError: HTTP 429; response={"error":"injected"}'
            " (no time left to retry before the deadline)"
        )
    )
    assert conclude_without_time([EXHAUSTED], default=DEFAULT, max_output_tokens="unset") == Failed(
        cause=(
            "Judge returned no completed answer after 1 attempts (1 of them exhausted"
            " max_output_tokens=unset without emitting a verdict; raise the budget or constrain"
            " the judge's reasoning); last reply: finish_reason=length"
            " (no time left to retry before the deadline)"
        )
    )


def test_stopping_for_lack_of_time_after_an_unparseable_reply_uses_the_default() -> None:
    assert conclude_without_time(
        [MALFORMED], default=DEFAULT, max_output_tokens="unset"
    ) == Verdicted(verdict=DEFAULT, fallback=True)


def test_max_output_tokens_text() -> None:
    assert max_output_tokens_text({"max_output_tokens": 1341}) == "1341"
    assert max_output_tokens_text({"temperature": 0.6}) == "unset"


# --- J-30, J-31 backoff -------------------------------------------------------------------


def test_backoff_bound_doubles_up_to_the_cap() -> None:
    bounds = [backoff_bound(k, base_s=0.1, max_s=0.15) for k in (1, 2, 3)]
    assert bounds == [0.1, 0.15, 0.15]
    assert [backoff_bound(k, base_s=0.2, max_s=8.0) for k in (1, 2, 3, 4, 5, 6, 7)] == [
        0.2,
        0.4,
        0.8,
        1.6,
        3.2,
        6.4,
        8.0,
    ]
    assert backoff_bound(5000, base_s=0.2, max_s=8.0) == 8.0


def test_backoff_draw_is_uniform_from_the_injected_source() -> None:
    expected = random.Random(7)
    drawn = random.Random(7)
    for k in (1, 2, 3):
        bound = backoff_bound(k, base_s=0.1, max_s=0.15)
        assert draw_backoff(drawn, k, base_s=0.1, max_s=0.15) == expected.uniform(0, bound)


def test_zero_base_sleep_means_no_sleep_and_no_draw() -> None:
    rng = random.Random(1)
    assert draw_backoff(rng, 3, base_s=0.0, max_s=8.0) == 0.0
    assert rng.random() == random.Random(1).random()


def test_retry_after_accepts_delta_seconds_and_http_dates() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC).timestamp()
    assert parse_retry_after("1", now_epoch_s=now) == 1.0
    assert parse_retry_after(" 120 ", now_epoch_s=now) == 120.0
    later = format_datetime(datetime(2025, 1, 1, 12, 0, 30, tzinfo=UTC), usegmt=True)
    assert parse_retry_after(later, now_epoch_s=now) == 30.0
    earlier = format_datetime(datetime(2025, 1, 1, 11, 0, 0, tzinfo=UTC), usegmt=True)
    assert parse_retry_after(earlier, now_epoch_s=now) == 0.0


@pytest.mark.parametrize("value", [None, "", "soon", "-1", "1e3", "inf", "Mon, 99 Foo 2025"])
def test_unparseable_retry_after_is_ignored(value: str | None) -> None:
    assert parse_retry_after(value, now_epoch_s=0.0) is None


def test_sleep_is_the_larger_of_backoff_and_retry_after() -> None:
    told = TransientFailure(cause="c", short_cause="HTTP 429", retry_after_s=1.0)
    assert retry_sleep(told, 0.05) == 1.0
    assert retry_sleep(told, 2.5) == 2.5
    assert retry_sleep(HTTP_503, 0.05) == 0.05
    assert retry_sleep(EMPTY, 0.07) == 0.07


# --- texts ----------------------------------------------------------------------------------


def test_judge_error_text_matches_j40() -> None:
    text = judge_error_text(
        url="http://127.0.0.1:9/v1/chat/completions",
        pair=(0, 1),
        judge_pass=0,
        attempt=4,
        max_attempts=4,
        timeout_s=2,
        cause=HTTP_503.cause.replace("503", "500"),
    )
    assert text == (
        "GenRM judge http://127.0.0.1:9/v1/chat/completions pair=(0, 1) judge=0 attempt=4/4"
        ' deadline=2.0s: HTTPStatusError: HTTP 500; response={"error":"injected"}'
    )


def test_baseline_pair_is_written_in_presentation_order() -> None:
    text = judge_error_text(
        url="u", pair=(4, 2), judge_pass=1, attempt=1, max_attempts=2, timeout_s=0.2, cause="c"
    )
    assert text == "GenRM judge u pair=(4, 2) judge=1 attempt=1/2 deadline=0.2s: c"


def test_retry_log_text_matches_o2() -> None:
    assert retry_log_text(
        pair=(1, 2), judge_pass=0, attempt=1, max_attempts=4, cause="HTTP 503", sleep_s=0.07123
    ) == ("GenRM judge retry pair (1, 2) judge 0 attempt 1/4 after HTTP 503; sleeping 0.071s")


def test_short_causes_name_the_failure() -> None:
    assert short_cause(HTTP_503) == "HTTP 503"
    assert short_cause(EXHAUSTED) == "output budget exhausted (finish_reason=length)"
    assert short_cause(MALFORMED) == "unparseable reply (no verdict found)"
    assert short_cause(EMPTY) == "unusable reply (empty verdict text)"


def test_budget_exhausted_log_texts_match_o3() -> None:
    assert budget_exhausted_log_text(
        api="chat_completions", pair=(0, 1), attempt=1, max_attempts=2, max_output_tokens="1341"
    ) == (
        "GenRM output budget exhausted for pair (0, 1) (attempt 1/2, max_output_tokens=1341):"
        " reply finished with finish_reason=length and contains no verdict"
    )
    assert budget_exhausted_log_text(
        api="responses", pair=(0, 1), attempt=2, max_attempts=2, max_output_tokens="unset"
    ) == (
        "GenRM output budget exhausted for pair (0, 1) (attempt 2/2, max_output_tokens=unset):"
        " response is incomplete (reason=max_output_tokens) and contains no verdict"
    )


def test_fallback_log_text_matches_o4() -> None:
    assert fallback_log_text(pair=(0, 1), judge_pass=0, attempts=4) == (
        "GenRM judge reply unparseable for pair (0, 1) judge 0 after 4 attempts;"
        " using default scores"
    )
