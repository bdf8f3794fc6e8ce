"""This process's waiting requests, by the record they wait on.

A request that must wait for its group gets a ``Waiter``: a one-shot slot for its outcome. It
is listed under its record's id, whichever store holds the record, and answered when this
process learns that the record ended: from a transition it made, or from the store's watcher
(a record ended by another process). Everything here is plain bookkeeping: no method awaits
but ``Waiter.wait``.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from genrm_trio.core.outcomes import Ended, Outcome

__all__ = ["Waiter", "Waiters"]


class Waiter:
    """A one-shot result slot for one waiting request."""

    __slots__ = ("_answered", "outcome")

    def __init__(self) -> None:
        self._answered = trio.Event()
        self.outcome: Outcome | None = None

    def resolve(self, outcome: Outcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self._answered.set()

    async def wait(self) -> Outcome:
        await self._answered.wait()
        assert self.outcome is not None
        return self.outcome


class Waiters:
    """Waiters by record id, each with the slot it waits for."""

    def __init__(self) -> None:
        self._by_record: dict[str, list[tuple[int, Waiter]]] = {}

    def __len__(self) -> int:
        return sum(len(waiters) for waiters in self._by_record.values())

    def records(self) -> list[str]:
        return list(self._by_record)

    def add(self, rid: str, slot: int, waiter: Waiter) -> Callable[[], None]:
        """List ``waiter``; returns what takes it off again."""
        self._by_record.setdefault(rid, []).append((slot, waiter))
        return lambda: self.remove(rid, waiter)

    def remove(self, rid: str, waiter: Waiter) -> None:
        waiters = self._by_record.get(rid)
        if waiters is None:
            return
        waiters[:] = [entry for entry in waiters if entry[1] is not waiter]
        if not waiters:
            del self._by_record[rid]

    def deliver(self, ended: Ended) -> None:
        """Answer every waiter of a record that ended with its slot's answer (C-86)."""
        for slot, waiter in self._by_record.pop(ended.rid, ()):
            waiter.resolve(ended.outcome(slot))

    def resolve_all(self, outcome: Outcome) -> None:
        """Answer every waiter the same (shutdown)."""
        by_record, self._by_record = self._by_record, {}
        for waiters in by_record.values():
            for _, waiter in waiters:
                waiter.resolve(outcome)
