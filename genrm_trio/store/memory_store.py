"""The memory group store: every group of one server instance in its one ``GroupRegistry``.

A transition runs on the registry directly and synchronously, with no checkpoint, so it is atomic
by construction and never has to run again. Groups collect in this process: a record that
starts is reported so that the engine arms its collection deadline as a cancel scope, and
comparisons whose slots are filled are reported for early judging. Groups die with the process:
shutting the store down fails every active group (C-96). Instances share nothing (I-11).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import trio

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.core.groups import (
    BeginEvaluation,
    CancelGroup,
    GroupCounts,
    GroupRegistry,
    Record,
    StartComparisons,
    StartGroup,
    Statistics,
    StoreMeta,
)
from genrm_trio.store.group_store import BeforeCommit, Transaction, find_record

log = logging.getLogger("genrm_trio")

T = TypeVar("T")


class MemoryGroupStore:
    """Groups in this process's memory."""

    name = "memory"
    available = True
    shared = False
    holds_waiters = True
    batches_arrivals = False
    lease_s = None

    def __init__(self, config: Config) -> None:
        self.config = config
        self.registry = GroupRegistry(config, log=log.log)
        self._rids = itertools.count(1)

    async def transact(
        self,
        ref: str,
        step: Callable[[Transaction[Any]], T],
        *,
        before_commit: BeforeCommit | None = None,
    ) -> Transaction[T]:
        # Awaited, but it never checkpoints: the caller's task runs on to its next await.
        tx = self.apply(ref, step)
        if before_commit is not None:
            before_commit(tx)  # nothing can undo the commit here
        return tx

    def apply(self, ref: str, step: Callable[[Transaction[Any]], T]) -> Transaction[T]:
        """Run ``step`` on the registry and report what changed. Plain synchronous code: the
        core's entry points the step calls are critical sections of their own."""
        registry = self.registry
        loaded = find_record(registry, ref)
        was_active = loaded is not None and loaded.phase.active
        tx: Transaction[T] = Transaction(registry, trio.current_time(), loaded)
        tx.result = step(tx)
        for effect in tx.effects:
            record = effect.record
            if record.meta is None:
                # The evaluation is this process's from the start: fencing token 1 (the claim
                # of a group that fills), and no lease, as nobody else could take it.
                record.meta = StoreMeta(
                    str(next(self._rids)),
                    record.started_at + self.config.cohort_collection_timeout_s,
                    fence=1,
                )
            if isinstance(effect, StartGroup):
                tx.started = record
            elif isinstance(effect, StartComparisons):
                tx.comparisons.append((record, effect.comparisons))
            elif isinstance(effect, BeginEvaluation):
                meta = record.meta
                meta.evaluation_due = tx.now + self.config.cohort_evaluation_timeout_s
                tx.claimed = record
            elif isinstance(effect, CancelGroup):
                tx.finished = record
        if was_active and loaded is not None and not loaded.phase.active:
            tx.finished = loaded
        return tx

    def shut_down(self, now: float) -> list[Record]:
        return [effect.record for effect in self.registry.shut_down(now)]

    def evaluation_cancelled(self, record: Record, now: float) -> None:
        # Supersession and shutdown have already failed the record, so this only records
        # anything for an unexplained cancellation.
        self.registry.fail_evaluation(record, messages.EVALUATION_CANCELLED, now)

    def statistics(self, local: Statistics) -> Statistics:
        return self.registry.statistics(
            owned_tasks=local.owned_tasks, judge_in_flight=local.judge_in_flight
        )

    def group_counts(self, now: float) -> GroupCounts:
        return self.registry.group_counts(now)

    def health(self, evaluating_here: int) -> Mapping[str, int]:
        stats = self.registry.statistics()
        return {
            "active_groups": stats.active_groups,
            "retained_records": stats.retained_records,
            "watermarks": stats.watermarks,
            "legacy_resends_collecting": self.registry.legacy_resends_collecting,
        }

    async def refresh_counts(self) -> None:
        pass  # counted when asked

    def check_invariants(self) -> None:
        self.registry.check_invariants()

    async def aclose(self) -> None:
        self.registry.clear()
