"""Where a server's groups live: the interface the engine runs every transition through.

A group store applies one of the core's transitions to one group atomically and reports what
changed for this process to act on (a group that started collecting here, comparisons ready to
judge, an evaluation this process now owns, a group that ended, one offered to another process).
The engine owns everything that waits (requests, evaluations, leases, sweeps); the store owns
where the state is and how a transition is made atomic. Two stores exist: this process's memory
(store/memory_store.py) and a Redis/Valkey database shared by several processes
(store/redis_store.py). What differs between them for the engine is said by the properties
below, never by the store's type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from genrm_trio.core.groups import Effect, GroupCounts, GroupRegistry, Record, Statistics
from genrm_trio.core.pairs import Comparison

T = TypeVar("T")


@dataclass(slots=True)
class Transaction(Generic[T]):
    """One attempt at a transition: the group's state filed in a registry, and what changed."""

    registry: GroupRegistry
    now: float  # the store's clock
    loaded: Record | None  # the group's record as the transition found it
    logs: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    claimed: Record | None = None  # a record whose evaluation this transaction claimed
    finished: Record | None = None  # a record this transaction ended
    result: T | None = None
    # Set by the step: a record this transaction fills is offered to the other processes
    # instead of claimed, and this is the offering process's load (its evaluations running).
    hand_over: int | None = None
    offered: Record | None = None  # the record this transaction offered
    # The core's effects of an arrival, handed in by the step: a store whose groups collect in
    # this process turns them into ``started`` and ``comparisons``.
    effects: list[Effect] = field(default_factory=list)
    started: Record | None = None  # a record that began collecting in this process
    comparisons: list[tuple[Record, list[Comparison]]] = field(default_factory=list)

    def claim(self, record: Record, lease_s: float) -> None:
        """Take the record's evaluation: a new fencing token and a lease from now."""
        meta = record.meta
        assert meta is not None
        meta.fence += 1
        meta.lease_until = self.now + lease_s
        self.claimed = record


def group_ref(group_id: str | None, legacy_key: str | None) -> str:
    """A store's name for one group: its explicit id, or its legacy key."""
    return f"e:{group_id}" if group_id is not None else f"l:{legacy_key}"


def record_ref(record: Record) -> str:
    return group_ref(record.group_id, record.legacy_key or record.key)


def split_ref(ref: str) -> tuple[str | None, str | None]:
    """(group id, legacy key) of a ``group_ref``: one of them is None."""
    return (ref[2:], None) if ref.startswith("e:") else (None, ref[2:])


def find_record(registry: GroupRegistry, ref: str) -> Record | None:
    """The record ``ref`` names in ``registry``, if it holds one."""
    name = ref[2:]
    return registry.explicit.get(name) if ref.startswith("e:") else registry.legacy.get(name)


# Runs once a transaction's step has run and before its result is stored; may return an undo
# for when the result is not stored after all.
BeforeCommit = Callable[[Transaction[Any]], Callable[[], None] | None]


class StoreFailed(Exception):
    """The store is unreachable or answered an error; nothing of the transition was applied."""

    def __init__(self, address: str, cause: BaseException | str) -> None:
        super().__init__(f"GenRM group store {address} is unavailable: {cause}")


class GroupStore(Protocol):
    """What the engine needs of a group store."""

    name: str  # for /healthz
    available: bool  # it answered its last use
    # The process's own tallies (groups it ended, rollouts it masked) and the transitions that
    # need no stored state (a failed comparison's note); with the memory store, every group.
    registry: GroupRegistry

    @property
    def shared(self) -> bool:
        """Other processes serve the same groups: they outlive this process (shutdown and an
        unexplained cancellation leave them to the others' sweeps), and their ends, deadlines
        and leases are found by notifications and sweeps."""
        ...

    @property
    def holds_waiters(self) -> bool:
        """A waiting request stays in its record, which the core answers; otherwise the engine
        keeps it by record id and answers it when the store reports the record's end."""
        ...

    @property
    def batches_arrivals(self) -> bool:
        """Arrivals of one group are applied together, one transaction per batch (each costs a
        round trip; members of a group arrive within milliseconds)."""
        ...

    @property
    def lease_s(self) -> float | None:
        """How long a claimed evaluation stays this process's unless renewed; None: for good."""
        ...

    async def transact(
        self,
        ref: str,
        step: Callable[[Transaction[Any]], T],
        *,
        before_commit: BeforeCommit | None = None,
    ) -> Transaction[T]:
        """Run ``step`` (a core transition, synchronous) on the group ``ref`` atomically.

        ``before_commit`` runs after the step and before the result is stored, and may return an
        undo for a commit that does not apply. Raises StoreFailed if nothing could be applied.
        """
        ...

    def shut_down(self, now: float) -> list[Record]:
        """This process stops serving groups: end those that die with it; returns them."""
        ...

    def evaluation_cancelled(self, record: Record, now: float) -> None:
        """This process's evaluation of ``record`` was cancelled for no reason the store
        recorded: end the group if nobody else can."""

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

    async def refresh_counts(self) -> None:
        """Count the store's groups again (a shared store's answer doubles as a reachability
        check)."""

    def check_invariants(self) -> None:
        """Raise on a breach of I-2..I-4 in what this process holds."""

    async def aclose(self) -> None:
        """Let go of what the store holds: connections, or the groups themselves."""
