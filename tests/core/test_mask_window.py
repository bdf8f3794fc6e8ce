"""The masked-rollout window (core/mask_window.py), without an event loop: the time is passed in.

The share over the window, the reasons read from the texts the server writes, and the rules of
the warning: one WARNING when masking comes to dominate, one more per window while it stays so,
one INFO when it stops; nothing below the minimum sample or with the warning off.
"""

from __future__ import annotations

import logging

import pytest

from genrm_trio.core import messages
from genrm_trio.core.mask_window import SLICES, MaskWindow, masked_reason
from genrm_trio.judge._attempts import ParseFailure, judge_error_text, no_completed_answer


def judge_error(cause: str) -> str:
    return judge_error_text(
        url="http://127.0.0.1:9/v1/chat/completions",
        pair=(0, 1),
        judge_pass=0,
        attempt=3,
        max_attempts=3,
        timeout_s=0.2,
        cause=cause,
    )


REFUSED = judge_error("ConnectError: [Errno 111] Connection refused")
MEMBER_REFUSED = messages.rollout_masked(3, 2, 4, REFUSED)


def test_a_judge_failure_is_known_by_its_error_class_and_shown_from_the_judge_s_text() -> None:
    reason, shown = masked_reason(MEMBER_REFUSED)
    assert reason == "judge ConnectError"
    assert shown == REFUSED  # the rollout index and counts before it are not the cause
    group = messages.every_rollout_masked("group_id::g::group_attempt::0", 4, 4, REFUSED)
    assert masked_reason(group) == ("judge ConnectError", REFUSED)


@pytest.mark.parametrize(
    ("cause", "reason"),
    [
        ("HTTPStatusError: HTTP 503; response=overloaded: HTTP 500 inside", "judge HTTP 503"),
        ("HTTPStatusError: HTTP 404; response=", "judge HTTP 404"),
        ("TimeoutError: no complete reply within 0.2s", "judge TimeoutError"),
        ("ReadError: peer closed", "judge ReadError"),
        ("JSONDecodeError: judge reply is not valid JSON: <html>", "judge JSONDecodeError"),
        ("something nobody wrote", "judge error"),
    ],
)
def test_judge_causes_reduce_to_a_short_fixed_reason(cause: str, reason: str) -> None:
    text = messages.rollout_masked(0, 1, 2, judge_error(cause))
    assert masked_reason(text)[0] == reason


def test_a_judge_that_never_gave_a_verdict_and_group_failures_have_their_own_reason() -> None:
    unparsed = no_completed_answer(3, [ParseFailure("no verdict", False, False)], "unset")
    assert masked_reason(judge_error(unparsed))[0] == "judge gave no verdict"
    deadline = messages.evaluation_deadline(100.0, 3, 4, 0)
    assert masked_reason(deadline) == ("evaluation deadline", deadline)
    resend = messages.legacy_resend_answer("k", 1, 4, "why", messages.LEGACY_RESEND_UNKNOWN)
    assert masked_reason(resend)[0] == "legacy resend"
    assert masked_reason("a text from elsewhere")[0] == "other"


def test_the_window_counts_answers_and_masked_rollouts_by_reason() -> None:
    window = MaskWindow(60.0)
    for second in range(4):
        window.answered(None, float(second))
    window.answered(MEMBER_REFUSED, 4.0)
    window.answered(
        messages.rollout_masked(1, 1, 2, judge_error("HTTPStatusError: HTTP 503; response=")), 5.0
    )
    window.answered(MEMBER_REFUSED, 5.5)
    reading = window.reading(6.0)
    assert (reading.answered, reading.masked) == (7, 3)
    assert reading.ratio == pytest.approx(3 / 7)
    assert reading.reasons == {"judge ConnectError": 2, "judge HTTP 503": 1}
    assert reading.dominant() == ("judge ConnectError", 2)


def test_answers_leave_the_window_once_it_has_passed_them() -> None:
    window = MaskWindow(60.0)
    window.answered(MEMBER_REFUSED, 0.5)
    window.answered(None, 30.0)
    assert window.reading(59.9).answered == 2
    # The window is counted in slices of window_s / SLICES: the far edge is exact to one slice.
    slice_s = 60.0 / SLICES
    reading = window.reading(60.0 + slice_s)
    assert (reading.answered, reading.masked, reading.reasons) == (1, 0, {})
    assert window.reading(90.0 + slice_s).answered == 0
    assert window.reading(1000.0).ratio == 0.0  # nothing answered: no share
    assert window.known_reasons == {"judge ConnectError"}  # its gauge still reads 0


def test_an_empty_window_has_no_share_and_no_reason() -> None:
    reading = MaskWindow(10.0).reading(0.0)
    assert (reading.answered, reading.ratio, reading.dominant()) == (0, 0.0, None)


def lines(
    window: MaskWindow, texts: list[str | None], start: float, step: float
) -> list[tuple[int, str]]:
    """Answer the texts one per step from ``start``; the log lines the window asked for."""
    found = []
    for index, text in enumerate(texts):
        line = window.answered(text, start + index * step)
        if line is not None:
            found.append(line)
    return found


def test_masking_that_comes_to_dominate_is_warned_once_with_its_most_common_reason() -> None:
    window = MaskWindow(60.0, warning_ratio=0.5, min_rollouts=16)
    timeout = messages.rollout_masked(
        0, 1, 2, judge_error("TimeoutError: no complete reply within 0.2s")
    )
    healthy = lines(window, [None] * 8, 0.0, 0.1)
    assert healthy == []
    found = lines(window, [MEMBER_REFUSED] * 7 + [timeout] + [MEMBER_REFUSED] * 40, 1.0, 0.1)
    [(level, text)] = found  # 16 answers, 8 masked: 50% reached; then no repeat
    assert level == logging.WARNING
    assert text.startswith("GenRM masked 8 of 16 rollouts in the last 60 s (50%, ")
    assert "mask_warning_ratio 0.5" in text
    assert f"most common reason (7): judge ConnectError; latest: {REFUSED}" in text


def test_a_small_sample_never_warns_however_much_of_it_is_masked() -> None:
    window = MaskWindow(60.0, warning_ratio=0.5, min_rollouts=16)
    assert lines(window, [MEMBER_REFUSED] * 15, 0.0, 1.0) == []
    [(level, text)] = lines(window, [MEMBER_REFUSED], 15.0, 1.0)
    assert level == logging.WARNING and "masked 16 of 16 rollouts" in text


def test_the_warning_off_never_warns() -> None:
    window = MaskWindow(60.0, warning_ratio=None, min_rollouts=1)
    assert lines(window, [MEMBER_REFUSED] * 100, 0.0, 0.01) == []
    assert window.reading(1.0).ratio == 1.0  # the share is still kept


def test_masking_that_stays_dominant_is_warned_again_once_per_window() -> None:
    window = MaskWindow(10.0, warning_ratio=0.5, min_rollouts=2)
    # One masked answer a second for 35 s: warnings at 1 s (the second answer), 11 s, 21 s, 31 s.
    found = lines(window, [MEMBER_REFUSED] * 36, 0.0, 1.0)
    assert [level for level, _ in found] == [logging.WARNING] * 4
    assert all("most common reason" in text for _, text in found)


def test_masking_that_falls_back_below_is_said_once_at_info_and_may_warn_again() -> None:
    window = MaskWindow(10.0, warning_ratio=0.5, min_rollouts=4)
    [(level, _)] = lines(window, [MEMBER_REFUSED] * 4, 0.0, 0.1)
    assert level == logging.WARNING
    # Scored answers bring the share under the threshold: 4 of 9.
    found = lines(window, [None] * 10, 1.0, 0.1)
    assert found == [
        (
            logging.INFO,
            "GenRM masked rollouts fell below mask_warning_ratio 0.5: 4 of 9 in the last 10 s"
            " (44%)",
        )
    ]
    # The masked answers leave the window; masking that comes back is warned afresh.
    later = lines(window, [None] * 2 + [MEMBER_REFUSED] * 3, 20.0, 0.1)
    assert [level for level, _ in later] == [logging.WARNING]
    assert "masked 2 of 4 rollouts" in later[0][1]


def test_a_window_must_last_some_time() -> None:
    with pytest.raises(ValueError, match="window_s must be > 0"):
        MaskWindow(0.0)
