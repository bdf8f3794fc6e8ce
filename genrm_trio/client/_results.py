"""What the client hands back for each rollout, and the wire shape of `/verify_group`'s reply
it reads that from."""

from __future__ import annotations

from typing import Final

import msgspec

from genrm_trio.core.reachability import judge_unreachable

# failure_kind of a rollout the server masked: its judge could not compare it.
JUDGE_FAILED: Final = "judge_failed"
# failure_kind of every rollout of a group that got no rows: the server answered an error, or
# no answer came after the last resend.
VERIFY_FAILED: Final = "verify_failed"
# The start of a `verify_failed` reason when the server gave no answer at all: nothing came back
# after the last resend, or nothing before the blocking client's deadline.
NO_ANSWER: Final = "no answer after "
NO_RESULTS_BY_DEADLINE: Final = "no results within the deadline of "


class RolloutResult(msgspec.Struct, frozen=True, kw_only=True):
    """One rollout's result. ``reward`` is None exactly when ``mask_sample`` is true: a rollout
    without a measured reward never carries a number."""

    reward: float | None
    mask_sample: bool
    failure_kind: str | None = None
    failure_reason: str | None = None


class GroupReplyRow(msgspec.Struct, frozen=True, kw_only=True):
    """The part of one `/verify_group` row the client reads."""

    rollout_index: int = msgspec.field(name="_ng_rollout_index")
    reward: float | None
    mask_sample: bool
    failure_kind: str | None = None
    failure_reason: str | None = None


class GroupReply(msgspec.Struct, frozen=True, kw_only=True):
    rows: list[GroupReplyRow]


def failed_group(size: int, reason: str) -> list[RolloutResult]:
    """Every rollout of a group that got no rows: masked, none with a number."""
    result = RolloutResult(
        reward=None, mask_sample=True, failure_kind=VERIFY_FAILED, failure_reason=reason
    )
    return [result] * size


def results_from_rows(rows: list[GroupReplyRow], size: int) -> list[RolloutResult] | None:
    """The results in slot order, or None if the rows are not exactly slots 0..size-1."""
    if sorted(row.rollout_index for row in rows) != list(range(size)):
        return None
    by_slot = {row.rollout_index: row for row in rows}
    results = []
    for slot in range(size):
        row = by_slot[slot]
        if row.mask_sample or row.reward is None:
            # Whatever the row holds in `reward`, a masked rollout has none.
            results.append(
                RolloutResult(
                    reward=None,
                    mask_sample=True,
                    failure_kind=row.failure_kind or JUDGE_FAILED,
                    failure_reason=row.failure_reason,
                )
            )
        else:
            results.append(RolloutResult(reward=row.reward, mask_sample=False))
    return results


def unreachable(result: RolloutResult) -> bool:
    """True when the rollout is masked because the judge or the server could not be reached,
    not because the judge answered without a verdict: a transport failure, no reply in time, or
    no answer from the server (core.reachability says which judge failures count)."""
    if not result.mask_sample:
        return False
    reason = result.failure_reason or ""
    if result.failure_kind == VERIFY_FAILED:
        return reason.startswith((NO_ANSWER, NO_RESULTS_BY_DEADLINE))
    return judge_unreachable(reason)
