"""Every client-visible text the group engine produces, built in one place.

Clients match on these phrases (§2.6), so each lives here exactly once.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

MIGRATION_SUFFIX = (
    " This legacy group has failed; to retry, send the whole group again under a fresh"
    " _ng_group_id shared by every member. Reusing the task/prompt key could mix delayed"
    " answers into a replacement group."
)
SHUTTING_DOWN = "GenRM server is shutting down"
EVALUATION_CANCELLED = "GenRM cohort evaluation was cancelled"
NON_FINITE_REWARDS = "GenRM returned non-finite cohort rewards"
ATTEMPT_OMITTED = "GenRM group attempt omitted; treating requests as group attempt zero"


def format_seconds(value: float) -> str:
    """A duration as the shortest decimal that reads back to the same float, e.g. 0.2 or 1800.0.

    Always positional with a fractional part: 1e-05 is written 0.00001 and 1e+16 as
    10000000000000000.0.
    """
    text = format(Decimal(repr(float(value))), "f")
    return text if "." in text else text + ".0"


def exception_text(exc: BaseException) -> str:
    """`<Type>: <message>` with the message cut to 1000 code points."""
    return f"{type(exc).__name__}: {str(exc)[:1000]}"


def different_response(key: str, slot: int) -> str:
    return f"GenRM cohort '{key}' already has a different response for rollout_index={slot}"


def inconsistent_prompt(group_id: str) -> str:
    return f"GenRM group '{group_id}' received inconsistent prompt or principle content"


def superseded(group_id: str, attempt: int, newer: int) -> str:
    return f"GenRM group '{group_id}' attempt {attempt} was superseded by attempt {newer}"


def not_retained(group_id: str, attempt: int) -> str:
    return (
        f"GenRM group '{group_id}' attempt {attempt} already finished and its result is no"
        " longer retained; retry with a higher _ng_group_attempt"
    )


def phase_closed(key: str, phase: str, slot: int) -> str:
    return f"GenRM cohort '{key}' is already {phase}; rollout_index={slot} cannot be added"


def not_collected(key: str, size: int, timeout: float) -> str:
    return (
        f"GenRM cohort '{key}' did not collect {size} unique rollout indices within"
        f" {format_seconds(timeout)}s"
    )


def conversion_failed(exc: BaseException) -> str:
    return f"GenRM cohort input conversion failed: {exception_text(exc)}"


def evaluation_failed(exc: BaseException) -> str:
    return f"GenRM cohort evaluation failed: {exception_text(exc)}"


def evaluation_deadline(timeout: float, finished: int, total: int, failed: int) -> str:
    return (
        f"GenRM cohort evaluation deadline exceeded after {format_seconds(timeout)}s"
        f" ({finished} of {total} comparisons finished, {failed} failed)"
    )


def every_rollout_masked(key: str, failed: int, total: int, first_failure: str) -> str:
    return (
        f"GenRM cohort '{key}' failed: every rollout was masked ({failed} of {total}"
        f" comparisons failed); first failure: {first_failure}"
    )


def rollout_masked(slot: int, failed: int, total: int, judge_error: str) -> str:
    return (
        f"GenRM rollout_index={slot} lost a comparison to a judge failure ({failed} of {total}"
        f" comparisons failed): {judge_error}"
    )


def legacy_resend(key: str, slot: int, size: int, ago: float, timeout: float) -> str:
    return (
        f"GenRM legacy group '{log_key(key)}' completed {format_seconds(round(ago, 3))}s ago;"
        f" rollout_index={slot} starts a new group under the same key, which completes only if"
        f" all {size} members are sent again, and otherwise fails after"
        f" {format_seconds(timeout)}s (cohort_collection_timeout_s). A legacy group has no"
        " replay: to retry some rollouts of a finished group, send the whole group again under a"
        " fresh _ng_group_id shared by every member."
    )


def legacy_resend_answer(key: str, slot: int, size: int, why: str, state: str) -> str:
    """The masked row of a row sent again on its own under a legacy key (C-99)."""
    return (
        f"GenRM legacy group '{log_key(key)}': rollout_index={slot} was sent again on its own"
        f" ({why}) and is not judged: a legacy group is judged only when all {size} members"
        f" arrive together, and {state}. To have it judged, send the whole group again under a"
        " fresh _ng_group_id shared by every member."
    )


def legacy_resend_completed(ago: float) -> str:
    return f"its group completed {format_seconds(round(ago, 3))}s ago"


def legacy_resend_active(phase: str) -> str:
    return f"a group under this key is {phase} and a resent row never joins one"


LEGACY_RESEND_UNKNOWN = (
    "this server holds no group under this key (never sent here, expired, or before a restart)"
)


def reward_count(count: int, size: int) -> str:
    return f"GenRM returned {count} rewards for {size} cohort members"


def log_key(key: str) -> str:
    """Keys are cut to 160 code points in logs (§9.1)."""
    return key[:160]


def log_fields(key: str, attempt: int) -> dict[str, Any]:
    """The fields every log record about one group attempt carries (O-12)."""
    return {"group_key": log_key(key), "group_attempt": attempt}
