"""Snapshots of a server's groups for its verification hooks (I-21) and its gauges (§9.3)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["GroupCounts", "Statistics"]


class Statistics(NamedTuple):
    collecting: int
    evaluating: int
    retained_records: int
    watermarks: int
    idle_entries: int
    waiters: int
    owned_tasks: int
    judge_in_flight: int
    prune_visits: int

    @property
    def active_groups(self) -> int:
        return self.collecting + self.evaluating


class GroupCounts(NamedTuple):
    """The groups of a group store as the server's gauges report them: this process's with the
    memory store, the whole deployment's with a shared one."""

    collecting: int
    evaluating: int
    retained_records: int
    watermarks: int
    # Age of the oldest group still collecting, in seconds; 0.0 when none collects.
    oldest_collecting_s: float
