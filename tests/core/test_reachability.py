"""Which failure texts say the judge could not be reached (core.reachability), read from the texts
the judge client and the group engine really write, without I/O."""

from __future__ import annotations

import pytest

from genrm_trio.core import messages
from genrm_trio.core.reachability import (
    UNREACHABLE_TRANSPORT_ERRORS,
    group_unreachable,
    judge_unreachable,
    unreachable_refusal,
)
from genrm_trio.judge import transport
from genrm_trio.judge._attempts import (
    ParseFailure,
    judge_error_text,
    no_completed_answer,
    non_json_outcome,
    status_outcome,
    timeout_outcome,
    transport_outcome,
)

URL = "http://127.0.0.1:9/v1/chat/completions"


def judge_error(cause: str) -> str:
    return judge_error_text(
        url=URL, pair=(0, 1), judge_pass=0, attempt=3, max_attempts=3, timeout_s=120.0, cause=cause
    )


UNREACHABLE = {
    "refused": transport_outcome(
        transport.ConnectError(transport.cannot_connect("127.0.0.1:9", ConnectionRefusedError()))
    ).cause,
    "connect timeout": transport_outcome(
        transport.ConnectTimedOut(transport.connect_timed_out("10.0.0.1:8000", 120.0))
    ).cause,
    "broken": transport_outcome(
        transport.ReadError(transport.connection_broken(ConnectionResetError()))
    ).cause,
    "closed": transport_outcome(transport.RemoteProtocolError(transport.CLOSED_BEFORE_REPLY)).cause,
    "no reply in time": timeout_outcome(120.0).cause,
    "gateway 502": status_outcome(502, b"Bad Gateway", None).cause,
    "gateway 504": status_outcome(504, b"", None).cause,
}
ANSWERED = {
    "bad request": status_outcome(400, b'{"error": "unknown model"}', None).cause,
    "server error": status_outcome(500, b"oops", None).cause,
    "not JSON": non_json_outcome(b"<html>").cause,
    "no verdict": no_completed_answer(
        3, [ParseFailure("no verdict found", usable=False, exhausted=False)], "unset"
    ),
}


@pytest.mark.parametrize("cause", UNREACHABLE.values(), ids=UNREACHABLE.keys())
def test_a_judge_that_could_not_be_reached_is_told_apart(cause: str) -> None:
    error = judge_error(cause)
    assert judge_unreachable(error)
    # Inside a rollout's own mask and a whole group's failure, as the rows carry it.
    assert judge_unreachable(messages.rollout_masked(1, 1, 4, error))
    every = messages.every_rollout_masked("group_id::g::0", 4, 4, error)
    assert judge_unreachable(every) and group_unreachable(every)


@pytest.mark.parametrize("cause", ANSWERED.values(), ids=ANSWERED.keys())
def test_a_judge_that_answered_without_a_verdict_is_not_unreachable(cause: str) -> None:
    error = judge_error(cause)
    assert not judge_unreachable(error)
    every = messages.every_rollout_masked("group_id::g::0", 4, 4, error)
    assert not judge_unreachable(every) and not group_unreachable(every)


def test_a_rollout_masked_on_its_own_is_not_a_group_failure() -> None:
    error = judge_error(UNREACHABLE["refused"])
    assert not group_unreachable(messages.rollout_masked(1, 1, 4, error))
    assert not group_unreachable(error)


def test_an_evaluation_deadline_counts_only_when_no_comparison_finished() -> None:
    nothing = messages.evaluation_deadline(100.0, 0, 4, 0)
    some = messages.evaluation_deadline(100.0, 1, 4, 0)
    assert judge_unreachable(nothing) and group_unreachable(nothing)
    assert not judge_unreachable(some) and not group_unreachable(some)


def test_no_text_is_not_unreachable() -> None:
    assert not judge_unreachable(None) and not judge_unreachable("")
    assert not group_unreachable(None)


def test_the_names_are_the_judge_transports_own_error_classes() -> None:
    for name in UNREACHABLE_TRANSPORT_ERRORS:
        assert issubclass(getattr(transport, name), transport.JudgeTransportError)


def test_the_refusal_names_the_count_and_the_first_failure_and_is_not_a_resendable_503() -> None:
    from genrm_trio.client import RESENDABLE_503_PREFIXES

    text = unreachable_refusal(1, judge_error(UNREACHABLE["refused"]))
    assert text.startswith("GenRM judge unreachable: all 1 sample(s) of this request were masked")
    assert "ConnectError: cannot connect to 127.0.0.1:9" in text
    assert not text.startswith(RESENDABLE_503_PREFIXES)
