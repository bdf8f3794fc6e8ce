"""Arrivals of one group go to the store together, one transition per batch.

The members of a group come within milliseconds of each other, and with a shared store each
transition costs round trips: one each would only make them retry on each other's WATCH. So a
request that arrives while its group's transition is under way joins the next batch, and one
task per group applies batch after batch until none is left. That task is the engine's, never
a request's: a transition carries other requests' arrivals, so a client that leaves must not
cancel it. With the memory store a transition never waits, so a batch is one arrival, applied
in the next step of the engine's task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from genrm_trio.core import messages
from genrm_trio.core.arrivals import Arrival
from genrm_trio.core.identity import ResponseIdentity
from genrm_trio.core.outcomes import Rejected
from genrm_trio.core.transition import Reply
from genrm_trio.runtime._waiters import Waiter

__all__ = ["Batches", "Pending"]


@dataclass(slots=True, eq=False)
class Pending:
    """One /verify on its way into a transition, and what that transition decided."""

    arrival: Arrival | None  # let go once applied: a waiting request keeps only its echo (I-10)
    identity: ResponseIdentity
    legacy: bool
    waiter: Waiter = field(default_factory=Waiter)
    applied: trio.Event = field(default_factory=trio.Event)
    reply: Reply | None = None
    failed: Rejected | None = None
    abandoned: bool = False  # the request left before its batch was applied


Apply = Callable[[str, list[Pending]], Awaitable[None]]
Spawn = Callable[..., None]


class Batches:
    """Per-group queues of arrivals waiting for their group's next transition."""

    def __init__(self, apply: Apply, spawn: Spawn) -> None:
        self._apply = apply
        self._spawn = spawn
        self._queued: dict[str, list[Pending]] = {}

    def __len__(self) -> int:
        """Arrivals queued, and groups whose transition is under way."""
        return sum(len(batch) for batch in self._queued.values()) + len(self._queued)

    def add(self, ref: str, pending: Pending) -> None:
        queue = self._queued.get(ref)
        if queue is not None:
            queue.append(pending)
            return
        self._queued[ref] = [pending]
        self._spawn(self._flush, ref)

    async def _flush(self, ref: str) -> None:
        batch: list[Pending] = []
        reason = messages.SHUTTING_DOWN
        try:
            while True:
                batch = self._queued[ref]
                if not batch:
                    del self._queued[ref]
                    return
                self._queued[ref] = []
                await self._apply(ref, batch)
        except Exception as exc:
            reason = f"GenRM group store transaction failed: {messages.exception_text(exc)}"
            raise
        finally:
            # Cancelled (shutdown) or a defect: whoever still waits for a transition is told so
            # at once, never left waiting.
            for pending in batch + self._queued.pop(ref, []):
                if not pending.applied.is_set():
                    pending.failed = Rejected(503, reason)
                    pending.applied.set()
