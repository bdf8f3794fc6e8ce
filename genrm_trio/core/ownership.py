"""Who evaluates a group: claims, fencing tokens, leases, offers and take-over, in one place.

Rules
-----
- A store has a *tenure* (``Tenure``): how long a claim of an evaluation lasts unless its owner
  renews it (``lease_s``), or ``None`` when one process serves every group of the store (the
  memory store), so that a claim lasts for good.
- Without a lease, the process a group starts in owns its evaluation from the group's first
  member: fencing token 1 from the start, its collection deadline armed in that process, its
  comparisons judged there as their slots fill (early judging).
- With a lease, nobody owns a group that collects. The transition that fills it claims it
  (token + 1, lease from now), or, when the filling process judges more than its share, offers
  it: the token stays 0 and the lease has run out already, so that any process may claim it
  as it would take over an expired one.
- An evaluation's owner renews, publishes and fails only the record it claimed: the same
  record (``rid``), still evaluating, under the same token. A result whose token has moved on
  is refused, so a group is published once however many processes judged it.
- An evaluating group whose lease has run out is taken over by whichever process finds it
  first: claimed again (a new token) while its evaluation deadline is ahead, failed by that
  deadline otherwise.
- When a process stops, or its evaluation is cancelled for no reason the record holds, a group
  without a lease dies with it (it fails, C-96); a group with one stays for the other processes,
  which take it over once its lease has run out.

Everything here is plain synchronous code on a ``Record``; the transitions (core/transition.py)
call it, and the stores only keep what it decides.
"""

from __future__ import annotations

from typing import NamedTuple

from genrm_trio.core.records import Phase, Record

__all__ = ["Tenure", "claim", "fill", "owned_by", "renew", "start", "take_over"]


class Tenure(NamedTuple):
    """How long a claim lasts in a store: ``lease_s`` unless renewed, or for good (None)."""

    lease_s: float | None

    @property
    def exclusive(self) -> bool:
        """One process serves every group: it owns a group from its first member, and the
        group dies with it."""
        return self.lease_s is None


def start(record: Record, tenure: Tenure) -> bool:
    """A record is born: True if its evaluation is the starting process's from now on."""
    if tenure.exclusive:
        record.fence = 1
        return True
    return False


def fill(
    record: Record, now: float, tenure: Tenure, evaluation_s: float, hand_over: int | None
) -> bool:
    """The record's last slot is filled and its evaluation deadline runs from now: True if
    the filling process claims the evaluation, False if it offers it to the others."""
    record.evaluation_due = now + evaluation_s
    if tenure.exclusive:
        return True  # owned since its first member
    if hand_over is None:
        claim(record, now, tenure)
        return True
    record.lease_until = now  # run out already: anyone may claim it
    return False


def claim(record: Record, now: float, tenure: Tenure) -> None:
    """Take the evaluation: a new fencing token, and a lease from now when leases run."""
    record.fence += 1
    if tenure.lease_s is not None:
        record.lease_until = now + tenure.lease_s


def renew(record: Record, now: float, tenure: Tenure) -> None:
    if tenure.lease_s is not None:
        record.lease_until = now + tenure.lease_s


def owned_by(record: Record | None, rid: str, fence: int) -> bool:
    """Whether the evaluation that claimed record ``rid`` under ``fence`` still owns it."""
    return (
        record is not None
        and record.rid == rid
        and record.phase is Phase.EVALUATING
        and record.fence == fence
    )


class TakeOver(NamedTuple):
    claim: bool  # claim it again (else: its evaluation deadline has passed, fail it)
    offered: bool  # it was offered, not owned: nobody judged it yet


def take_over(record: Record | None, now: float) -> TakeOver | None:
    """What finding ``record`` with its lease run out means, or None if it is not (anymore):
    not evaluating, or its owner's lease still runs."""
    if record is None or record.phase is not Phase.EVALUATING:
        return None
    if record.lease_until is None or record.lease_until > now:
        return None
    assert record.evaluation_due is not None
    if record.evaluation_due <= now:
        return TakeOver(claim=False, offered=record.fence == 0)
    return TakeOver(claim=True, offered=record.fence == 0)
