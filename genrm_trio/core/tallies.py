"""What the groups this process ended came to: counts by disposition, and the rollouts it
answered masked (§9.3).

Fed by the ``Finished`` entries of every decision this process stored, whichever store holds
the groups: each process counts the groups it ended. The masked slots are kept by the identity
the group's rows carry, as long as a result would be (R-4), so that /aggregate_metrics counts
them even when a collector left the masked rows out.
"""

from __future__ import annotations

from typing import NamedTuple

from genrm_trio.core.records import RowsGroup
from genrm_trio.core.retention import AgedIndex
from genrm_trio.core.transition import Finished

__all__ = ["Tallies", "TallyStatistics"]


class TallyStatistics(NamedTuple):
    finished: dict[tuple[str, str], int]  # groups ended, by (disposition, kind)
    rollouts_masked: int


class Tallies:
    """Groups ended by (disposition, kind), rollouts masked, and masked slots by rows group."""

    def __init__(self, ttl: float | None, cap: int) -> None:
        self.ttl = ttl
        self.cap = cap
        self.finished: dict[tuple[str, str], int] = {}
        self.rollouts_masked = 0
        self.masked_answers: AgedIndex[RowsGroup, frozenset[int]] = AgedIndex()

    def count(self, finished: Finished, now: float) -> None:
        key = (finished.disposition, finished.kind)
        self.finished[key] = self.finished.get(key, 0) + 1
        self.rollouts_masked += finished.masked
        if finished.masked_slots and finished.rows is not None:
            self.masked_answers.stamp(finished.rows, finished.masked_slots, now)
        self.prune(now)

    def prune(self, now: float) -> None:
        self.masked_answers.prune(now, self.ttl, self.cap, lambda group, slots: None)

    def statistics(self) -> TallyStatistics:
        return TallyStatistics(dict(self.finished), self.rollouts_masked)

    def masked_rollouts(self, group: RowsGroup) -> frozenset[int] | None:
        """The slots this process answered masked for the group rows name, if it knows."""
        return self.masked_answers.get(group)

    def clear(self) -> None:
        self.masked_answers.clear()
