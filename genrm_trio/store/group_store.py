"""Where a server's groups live: the interface the engine runs every transition through.

A group store holds groups and applies the one transition of the core (core/transition.py) to
one group atomically, returning its ``Decision``. The engine owns everything that waits
(requests, evaluations, their deadlines) and acts on decisions alike whatever the store. What
only a store shared by several processes needs (notifications of groups ended elsewhere,
sweeps for deadlines and expired leases, take-over, offers, the deployment's judge budget)
sits behind the ``Watcher`` the store supplies; the memory store's does nothing.

Two stores exist: this process's memory (store/memory_store.py) and a Redis/Valkey database
shared by several processes (store/redis_store.py, store/_redis_watcher.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

import trio

from genrm_trio.core.outcomes import Ended
from genrm_trio.core.ownership import Tenure
from genrm_trio.core.statistics import GroupCounts, Statistics
from genrm_trio.core.transition import Decision, Event, Group
from genrm_trio.judge.slots import JudgeSlots

__all__ = [
    "BeforeCommit",
    "GroupStore",
    "NoWatcher",
    "StoreFailed",
    "StoreView",
    "Watched",
    "Watcher",
    "group_ref",
    "split_ref",
]


def group_ref(group_id: str | None, legacy_key: str | None) -> str:
    """A store's name for one group: its explicit id, or its legacy key."""
    return f"e:{group_id}" if group_id is not None else f"l:{legacy_key}"


def split_ref(ref: str) -> tuple[str | None, str | None]:
    """(group id, legacy key) of a ``group_ref``: one of them is None."""
    return (ref[2:], None) if ref.startswith("e:") else (None, ref[2:])


# Runs once a transition has been made and before it is stored; may return an undo for when it
# is not stored after all.
BeforeCommit = Callable[[Decision], Callable[[], None] | None]


class StoreFailed(Exception):
    """The store is unreachable or answered an error; nothing of the transition was applied."""

    def __init__(self, address: str, cause: BaseException | str) -> None:
        super().__init__(f"GenRM group store {address} is unavailable: {cause}")


class StoreView(NamedTuple):
    """Every group of a store as one read found them, for checks: what has outlived the result
    TTL is left out, as every reader leaves it out (core/transition.py)."""

    groups: dict[str, Group]  # by ref
    idle: list[str]  # explicit group ids in idle order, oldest first
    terminal: list[str]  # refs of retained terminal records, oldest first
    # Entries the store's pruning has looked at so far; None: its pruning is a script.
    prune_visits: int | None


class Watched(Protocol):
    """What a store's watcher may ask of the engine it serves."""

    @property
    def closed(self) -> bool: ...

    def watched_records(self) -> list[str]:
        """The records this process waits on or evaluates: their end concerns it."""
        ...

    def evaluations_running(self) -> int: ...

    def act(self, decision: Decision) -> None:
        """Run what a stored transition asks of this process."""

    def ended_elsewhere(self, ended: Ended) -> None:
        """A record ended in a transition this process did not make (or whose reply it
        missed): answer its waiters here, stop its evaluation here."""

    def notification_copies(self, rid: str) -> int:
        """How many times to handle a notification of the end of ``rid`` (1; a test hook may
        lose or duplicate it)."""
        ...


class Watcher(Protocol):
    """What a store does beside transitions, for one engine."""

    # Where judge attempts wait for a slot, when the store shares one judge budget among its
    # processes; None: this process's own slots.
    judge_slots: JudgeSlots | None

    @property
    def subscribed(self) -> bool:
        """Notifications of groups ended elsewhere reach this process right now."""
        ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the other processes until cancelled (with the engine)."""

    def hand_over(self) -> int | None:
        """The load at which a group this process fills is offered to a process judging fewer
        groups; None: the process claims it."""
        ...

    def offered(self, ref: str) -> None:
        """This process offered ``ref``: claim it back if nobody else does in time."""

    async def sweep_once(self) -> None:
        """Look once for ended records, collection deadlines and expired leases."""

    async def undelivered(self) -> bool:
        """Whether a record this process waits on or judges has ended elsewhere and this
        process has not heard of it yet (its notification is on its way, or lost)."""
        ...

    async def close(self) -> None:
        """The process stops: give back what it holds of the deployment (bounded by the
        caller)."""


class NoWatcher:
    """The watcher of a store that no other process shares: nothing to follow."""

    judge_slots: JudgeSlots | None = None
    subscribed = True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    def hand_over(self) -> int | None:
        return None

    def offered(self, ref: str) -> None:
        raise AssertionError("a store no other process shares offers no group")

    async def sweep_once(self) -> None:
        pass

    async def undelivered(self) -> bool:
        return False  # every end is this process's own, and acted on at once

    async def close(self) -> None:
        pass


class GroupStore(Protocol):
    """What the engine needs of a group store."""

    name: str  # for /healthz
    available: bool  # it answered its last use
    retry_s: float  # how long a transition that found the store unreachable waits to retry

    @property
    def busy(self) -> bool:
        """A command is on its way to the store (a test waits for its I/O to be done)."""
        ...

    @property
    def tenure(self) -> Tenure:
        """How long a claim of an evaluation lasts here (core/ownership.py)."""
        ...

    async def transact(
        self, ref: str, event: Event, *, before_commit: BeforeCommit | None = None
    ) -> Decision:
        """Apply ``event`` to the group ``ref`` atomically and return the stored decision.

        ``before_commit`` runs after the transition and before it is stored, and may return an
        undo for a commit that does not apply. Raises StoreFailed if nothing could be applied;
        an exception the transition raises propagates, with nothing applied.
        """
        ...

    def watcher(self, engine: Watched) -> Watcher: ...

    def shut_down(self, now: float) -> list[Decision]:
        """This process stops serving groups: end those that die with it."""
        ...

    def evaluation_cancelled(self, ref: str, rid: str) -> Decision | None:
        """This process's evaluation of ``rid`` was cancelled for no reason the record holds;
        synchronous (it runs as the evaluation unwinds). A decision to act on, if any."""
        ...

    def statistics(self, local: Statistics) -> Statistics:
        """The statistics of I-21: ``local`` is this process's own share (waiters and
        evaluations it holds, its tasks and judge calls)."""
        ...

    def group_counts(self, now: float) -> GroupCounts:
        """The groups of the store, for the gauges (as last counted, for a shared store)."""
        ...

    def health(self, evaluating_here: int) -> Mapping[str, int]:
        """The group fields of /healthz."""
        ...

    def evictions(self) -> Mapping[tuple[str, str], int]:
        """Retained results and watermarks this process pruned, by (what, why)."""
        ...

    async def refresh_counts(self) -> None:
        """Count the store's groups again (a shared store's answer doubles as a reachability
        check)."""

    def check_invariants(self) -> None:
        """Raise on a breach of I-2..I-4 in what this process holds."""

    async def view(self) -> StoreView:
        """Every group the store holds, in retention order, after checking I-2…I-4 on each
        and the store's indexes against them (AssertionError if one is broken). For tests and
        operators: it reads every group."""
        ...

    async def aclose(self) -> None:
        """Let go of what the store holds: connections, or the groups themselves."""
