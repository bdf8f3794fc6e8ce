"""Legacy groups: rows with no ``_ng_group_id``, grouped by their task index or prompt (C-1).

A legacy group has no attempt watermark and no replay: a completed one retires at once and
leaves only its key's completion time behind (C-91), so that a row opening a group under that
key again is flagged (§5.14), and a row sent again on its own is answered at once, masked, with
what the server knows of its key (C-99). The state machine (core/transition.py) calls these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.core.arrivals import Arrival
from genrm_trio.core.outcomes import Masked
from genrm_trio.core.records import Phase, Record, group_key, record_fields

if TYPE_CHECKING:
    from genrm_trio.core.transition import Group

__all__ = ["answer_legacy_resend", "legacy_resend_log"]

# (level, text, the structured log record's fields)
LogLine = tuple[int, str, dict[str, Any]]


def legacy_resend_log(record: Record, slot: int, ago: float, config: Config) -> LogLine:
    """The warning for a row that opens a group under a legacy key that completed ``ago``
    seconds before: that group completes only if every member comes again."""
    text = messages.legacy_resend(
        record.key, slot, record.size, ago, config.cohort_collection_timeout_s
    )
    return (30, text, {**record_fields(record), "slot": slot})


def answer_legacy_resend(
    group: Group, arrival: Arrival, now: float, size: int
) -> tuple[Masked, LogLine | None]:
    """C-99: the masked answer of a resent row, and the line logged for it (none when the
    group failed: the failure keeps its text)."""
    key = group_key(None, arrival.attempt, arrival.task_index, arrival.prompt_id, arrival.digest)
    record = group.record
    resend = arrival.resend
    assert resend is not None
    if record is not None and record.phase is Phase.FAILED:
        assert record.failure is not None
        # As a resend is never judged, it is a masked row even when a request of the group
        # itself got a 503 (kind cohort).
        return Masked(record.failure.text, messages.MIGRATION_SUFFIX), None
    if record is not None:
        state = messages.legacy_resend_active(record.phase.value)
    elif group.completed_at is None:
        state = messages.LEGACY_RESEND_UNKNOWN
    else:
        state = messages.legacy_resend_completed(now - group.completed_at)
    text = messages.legacy_resend_answer(key, arrival.slot, size, resend, state)
    fields = {**messages.log_fields(key, arrival.attempt), "slot": arrival.slot}
    return Masked(text), (20, text, fields)
