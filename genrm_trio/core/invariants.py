"""The rules every group keeps between transitions (I-2, I-3, I-5), checked on one group.

Stores check them on every group they hold, together with their own indexes: the memory store
in ``check_invariants``, a Redis store in ``check_store_invariants``.
"""

from __future__ import annotations

from genrm_trio.core.records import Phase, Watermark
from genrm_trio.core.transition import Group

__all__ = ["InvariantViolation", "check_group"]


class InvariantViolation(AssertionError):
    pass


def require(ok: bool, what: str) -> None:
    if not ok:
        raise InvariantViolation(what)


def check_group(group: Group) -> None:
    """Raise InvariantViolation if ``group`` breaks a rule of core/transition.py."""
    record = group.record
    explicit = group.ref.startswith("e:")
    if record is not None:
        if explicit:
            require(group.ref == f"e:{record.group_id}", "record filed under another group id")
        else:
            require(record.legacy, "an explicit record filed under a legacy key")
            require(record.phase is not Phase.COMPLETED, "a completed legacy record is retained")
    if explicit:
        require(group.completed_at is None, "an explicit group has a legacy completion time")
        active = record is not None and record.phase.active
        if record is not None and record.phase.active:
            watermark = group.watermark
            require(
                watermark is not None and watermark.attempt == record.attempt,
                f"active group {record.group_id!r} has no matching watermark",
            )
            require(group.idle_since is None, "active group in the idle order")
        if record is not None and group.watermark is not None:
            require(
                group.watermark == Watermark(record.attempt, record.digest),
                f"group {record.group_id!r}: record and watermark disagree",
            )
        require(
            (group.idle_since is not None) == (group.watermark is not None and not active),
            "idle order != idle groups",
        )
    else:
        require(group.watermark is None and group.idle_since is None, "a legacy watermark")
    if record is None:
        return
    if not record.phase.active:
        for member in record.members.values():
            require(member.texts is None, "terminal record keeps scoring texts")
        require(
            record.inputs is None and not record.plan,
            "terminal record keeps its inputs or plan",
        )
        require(record.terminal_time is not None, "terminal record without its terminal time")
    if record.phase is Phase.FAILED:
        require(
            all(m.outcome is None for m in record.members.values()), "failed record has rewards"
        )
    if record.legacy_resend:
        require(
            record.legacy and record.phase is Phase.COLLECTING, "resent legacy groups miscounted"
        )
