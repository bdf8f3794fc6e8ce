"""Arrivals of one group go to the store together, one transition per batch.

The members of a group come within milliseconds of each other, and with a shared store each
transition costs round trips: one each would only make them retry on each other's WATCH. So the
arrival that finds its group with no transition under way opens a batch, lets the event loop run
one step (the group's members read in that step join it) and applies the batch from its own
request's task; arrivals that come while that transition is under way form the next batch,
applied by the engine's task, batch after batch until none is left.

The request that applies a batch runs shielded: the batch may hold other requests' arrivals, and
every arrival's fate (committed or not) must be known before its request may leave, or its member
would be in the group with nobody to answer for it. Applying the first batch from the request's
own task rather than from a task of the engine's spares a task and an event per batch; where
transitions never wait (the memory store), nearly every batch is a first one.
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
    applied: bool = False
    woken: trio.Event | None = None  # set once applied, for an arrival that joined a batch
    reply: Reply | None = None
    failed: Rejected | None = None
    abandoned: bool = False  # the request left before its batch was applied

    def done(self) -> None:
        """Its transition is over (``reply`` or ``failed`` says how)."""
        self.applied = True
        if self.woken is not None:
            self.woken.set()


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

    async def apply(self, ref: str, pending: Pending) -> None:
        """Returns once ``pending`` went through a transition of group ``ref``.

        Cancelled while it waits in a batch, it leaves ``pending.applied`` false: the batch
        still applies it, and its caller marks it ``abandoned`` for the batch to clean up.
        """
        queue = self._queued.get(ref)
        if queue is not None:
            pending.woken = trio.Event()
            queue.append(pending)
            await pending.woken.wait()
            return
        self._queued[ref] = batch = [pending]
        try:
            with trio.CancelScope(shield=True):
                # One step of the event loop: the group's members read in it join this batch.
                await trio.lowlevel.checkpoint()
                self._queued[ref] = []
                await self._apply(ref, batch)
        finally:
            if self._queued[ref]:
                self._spawn(self._flush, ref)
            else:
                del self._queued[ref]

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
                if not pending.applied:
                    pending.failed = Rejected(503, reason)
                    pending.done()
