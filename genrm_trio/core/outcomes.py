"""What one /verify request is answered with, and what a finished group answers each slot.

An outcome is a scored row, a masked row (never a measurement, C-86) or a rejection (409 or
503). ``Ended`` is a finished record as every process sees it: the one answer of each slot,
the same whether the waiter sits in the process that ended the group or in another one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

__all__ = ["Ended", "Masked", "Outcome", "Rejected", "Scored"]


class Scored(NamedTuple):
    reward: float
    metrics: Mapping[str, float] | None  # None outside group mode: no group metrics (W-35)


class Masked(NamedTuple):
    text: str
    suffix: str = ""  # the legacy migration suffix, never cut when the text is bounded
    # The row's `reward` (W-33): never a measurement. Decided once when the group's outcome
    # is computed and kept with it, so a replay answers the same bytes.
    placeholder: float = 0.0


class Rejected(NamedTuple):
    status: int  # 409 or 503
    detail: str


Outcome = Scored | Masked | Rejected


class Ended(NamedTuple):
    """A record that ended: the answer of every slot (C-86).

    A completed record answers each member's own outcome; a failed one answers ``failure`` to
    every slot. ``outcomes`` is empty for a failed record.
    """

    rid: str
    outcomes: Mapping[int, Scored | Masked]
    failure: Outcome | None

    def outcome(self, slot: int) -> Outcome:
        if self.failure is not None:
            return self.failure
        return self.outcomes[slot]
