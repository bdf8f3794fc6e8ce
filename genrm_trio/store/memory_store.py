"""The memory group store: every group of one server instance, and their retention indexes.

A transition runs on the group held here directly and synchronously, with no checkpoint, so it
is atomic by construction and never has to run again. The store's tenure has no lease: one
process serves every group, owns each from its first member, and the groups die with it
(core/ownership.py). Instances share nothing (I-11).

Besides the groups, the store keeps the indexes retention needs (R-1…R-4), each ordered by the
time its entries were last stamped, so that pruning looks only at the head: retained terminal
records, idle watermarks, and completion times of legacy keys. After every transition it files
the group again by what the transition left. Before each arrival it prunes: past the result TTL,
and beyond ``max_terminal_cohorts``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

import trio

from genrm_trio.config import Config
from genrm_trio.core.invariants import check_group, require
from genrm_trio.core.ownership import Tenure
from genrm_trio.core.records import Phase, Record
from genrm_trio.core.retention import AgedIndex
from genrm_trio.core.statistics import GroupCounts, Statistics
from genrm_trio.core.transition import (
    Abandon,
    Decision,
    Event,
    Group,
    Rules,
    ShutDown,
    transition,
)
from genrm_trio.store.group_store import BeforeCommit, NoWatcher, StoreView, Watched, Watcher

__all__ = ["MemoryGroupStore"]


class _Filed(NamedTuple):
    """What decides where a group is filed, as a transition found it."""

    record: Record | None
    terminal_time: float | None
    active: bool
    resend: bool
    idle_stamps: int
    idle: bool
    completed_at: float | None

    @classmethod
    def of(cls, group: Group) -> _Filed:
        record = group.record
        active = record is not None and record.phase.active
        return cls(
            record,
            record.terminal_time if record is not None else None,
            active,
            active and record is not None and record.legacy_resend,
            group.idle_stamps,
            group.idle_since is not None,
            group.completed_at,
        )


class MemoryGroupStore:
    """Groups in this process's memory."""

    name = "memory"
    available = True
    retry_s = 1.0  # never used: the memory store does not fail
    busy = False  # nothing is ever on its way

    def __init__(self, config: Config, *, clock: Callable[[], float] = trio.current_time) -> None:
        """``clock``: the store's time (Trio's; a test without an event loop gives its own)."""
        self.config = config
        self.clock = clock
        self.rules = Rules(config, Tenure(None))
        self._groups: dict[str, Group] = {}
        self._active: dict[str, Group] = {}
        self._terminal: AgedIndex[str, Group] = AgedIndex()
        self._idle: AgedIndex[str, Group] = AgedIndex()
        self._completed: AgedIndex[str, Group] = AgedIndex()
        self._rids = itertools.count(1)
        self.prune_visits = 0
        self.legacy_resends_collecting = 0
        self.closed = False  # shut down: no group may be active any more

    @property
    def tenure(self) -> Tenure:
        return self.rules.tenure

    async def transact(
        self, ref: str, event: Event, *, before_commit: BeforeCommit | None = None
    ) -> Decision:
        # Awaited, but it never checkpoints: the caller's task runs on to its next await.
        decision = self.apply(ref, event)
        if before_commit is not None:
            before_commit(decision)  # nothing can undo the commit here
        return decision

    def apply(self, ref: str, event: Event) -> Decision:
        """Run the transition on the group and file it again. Plain synchronous code."""
        now = self.clock()
        group = self._groups.get(ref)
        if group is None:
            group = Group(ref)
        filed = [_Filed.of(group)]

        def file_and_prune() -> None:
            # every arrival prunes first, even one in the same batch as another, with
            # what the arrivals before it changed already filed.
            self._file(group, filed[0])
            self.prune(now)
            filed[0] = _Filed.of(group)

        decision = transition(
            group,
            event,
            now=now,
            rules=self.rules,
            rid=str(next(self._rids)),
            before_each=file_and_prune,
        )
        self._file(group, filed[0])
        return decision

    def _file(self, group: Group, before: _Filed) -> None:
        ref = group.ref
        after = _Filed.of(group)
        if after.active:
            self._active[ref] = group
        else:
            self._active.pop(ref, None)
        self.legacy_resends_collecting += after.resend - before.resend
        record = group.record
        if record is None or after.active:
            self._terminal.discard(ref)
        elif record is not before.record or after.terminal_time != before.terminal_time:
            assert after.terminal_time is not None
            self._terminal.stamp(ref, group, after.terminal_time)
        if not after.idle:
            self._idle.discard(ref)
        elif after.idle_stamps != before.idle_stamps or not before.idle:
            assert group.idle_since is not None
            self._idle.stamp(ref, group, group.idle_since)
        if group.completed_at is None:
            self._completed.discard(ref)
        elif group.completed_at != before.completed_at or (
            before.record is not None and record is None
        ):
            self._completed.stamp(ref, group, group.completed_at)
        if group.empty:
            self._groups.pop(ref, None)
        else:
            self._groups[ref] = group

    # ---- retention (R-3, R-4) ------------------------------------------------------------------

    def prune(self, now: float) -> None:
        ttl = self.config.cohort_result_ttl_s
        cap = self.config.max_terminal_cohorts
        self.prune_visits += self._terminal.prune(now, ttl, cap, self._drop_record)
        self.prune_visits += self._idle.prune(now, ttl, cap, self._drop_watermark)
        # Kept as long as a result would be, and pruned from the head the same way; it is
        # no retention index of R-3, so its visits stay out of prune_visits.
        self._completed.prune(now, ttl, cap, self._drop_completion)

    def _drop_record(self, ref: str, group: Group) -> None:
        group.record = None
        self._forget_if_empty(group)

    def _drop_watermark(self, ref: str, group: Group) -> None:
        group.watermark = group.idle_since = None
        self._forget_if_empty(group)

    def _drop_completion(self, ref: str, group: Group) -> None:
        group.completed_at = None
        self._forget_if_empty(group)

    def _forget_if_empty(self, group: Group) -> None:
        if group.empty:
            self._groups.pop(group.ref, None)

    # ---- what the engine leaves to the store -----------------------------------------------

    def watcher(self, engine: Watched) -> Watcher:
        return NoWatcher()  # every group is this process's: nobody else ends or takes one

    def shut_down(self, now: float) -> list[Decision]:
        """Every active group dies with the process (C-96)."""
        self.closed = True
        return [self.apply(ref, ShutDown()) for ref in list(self._active)]

    def evaluation_cancelled(self, ref: str, rid: str) -> Decision | None:
        """An evaluation cancelled for no reason the record holds: its group fails."""
        return self.apply(ref, Abandon(rid))

    def statistics(self, local: Statistics) -> Statistics:
        collecting = sum(1 for g in self._active.values() if _phase(g) is Phase.COLLECTING)
        return local._replace(
            collecting=collecting,
            evaluating=len(self._active) - collecting,
            retained_records=len(self._terminal),
            watermarks=sum(1 for g in self._groups.values() if g.watermark is not None),
            idle_entries=len(self._idle),
            prune_visits=self.prune_visits,
        )

    def group_counts(self, now: float) -> GroupCounts:
        collecting = evaluating = 0
        oldest = now
        for group in self._active.values():
            record = group.record
            assert record is not None
            if record.phase is Phase.COLLECTING:
                collecting += 1
                oldest = min(oldest, record.started_at)
            else:
                evaluating += 1
        watermarks = sum(1 for g in self._groups.values() if g.watermark is not None)
        return GroupCounts(collecting, evaluating, len(self._terminal), watermarks, now - oldest)

    def health(self, evaluating_here: int) -> Mapping[str, int]:
        counts = self.group_counts(0.0)
        return {
            "active_groups": counts.collecting + counts.evaluating,
            "retained_records": counts.retained_records,
            "watermarks": counts.watermarks,
            "legacy_resends_collecting": self.legacy_resends_collecting,
        }

    def evictions(self) -> Mapping[tuple[str, str], int]:
        """Retained results and watermarks pruned so far, by what they were and why."""
        return {
            ("results", "ttl"): self._terminal.expired,
            ("results", "count"): self._terminal.evicted,
            ("watermarks", "ttl"): self._idle.expired,
            ("watermarks", "count"): self._idle.evicted,
        }

    async def refresh_counts(self) -> None:
        pass  # counted when asked

    # ---- reads for checks and tests ------------------------------------------------------------

    def group(self, ref: str) -> Group | None:
        return self._groups.get(ref)

    def groups(self) -> Iterator[Group]:
        return iter(list(self._groups.values()))

    def idle_order(self) -> list[str]:
        """Explicit group ids in idle order, oldest first."""
        return [ref[2:] for ref in self._idle.keys()]

    def terminal_order(self) -> list[Record]:
        """Retained terminal records, oldest first."""
        return [g.record for g in self._terminal.values() if g.record is not None]

    async def view(self) -> StoreView:
        """The groups as they are: pruned at arrivals only, so what has expired since the last
        arrival is still here (R-3)."""
        self.check_invariants()
        groups = {g.ref: g for g in self.groups()}
        return StoreView(groups, self.idle_order(), self._terminal.keys(), self.prune_visits)

    def check_invariants(self) -> None:
        """Raise on a breach of I-2..I-4 in any group or index held here."""
        groups = list(self._groups.values())
        for group in groups:
            require(not group.empty, "an empty group is kept")
            check_group(group)
        active = {g.ref for g in groups if g.record is not None and g.record.phase.active}
        require(set(self._active) == active, "active index != active records")
        retained = {g.ref for g in groups if g.record is not None and not g.record.phase.active}
        require(set(self._terminal.keys()) == retained, "terminal index != retained records")
        idle = {g.ref for g in groups if g.idle_since is not None}
        require(set(self._idle.keys()) == idle, "idle order != idle groups")
        resends = [g for g in self._active.values() if g.record and g.record.legacy_resend]
        require(len(resends) == self.legacy_resends_collecting, "resent legacy groups miscounted")
        if self.closed:
            require(not self._active, "active groups after shutdown")

    async def aclose(self) -> None:
        self._groups.clear()
        self._active.clear()
        self._terminal.clear()
        self._idle.clear()
        self._completed.clear()
        self.legacy_resends_collecting = 0


def _phase(group: Group) -> Phase | None:
    return group.record.phase if group.record is not None else None
