"""Judge concurrency slots granted by priority: complete groups first, then older groups (J-33).

``SlotQueue`` is plain bookkeeping (a heap of waiting tickets) that never awaits; ``JudgeSlots``
is the thin Trio wait on top of it, used by the judge client for every attempt.

Every comparison waits for a slot in its group's *lane*. A lane ranks as ``(class, order)``:
class 0 for a group whose every member has arrived (and for a ``/compare`` batch, which is
complete by nature), class 1 for a group still collecting (early judging); ``order`` numbers
lanes as they enter their class, so a collecting group ranks by when it started and a complete
group by when it became complete. Waiting tickets are granted in rank order, and first come,
first served within one lane. A lane that becomes complete moves its waiting tickets ahead of
every collecting group's at once. Without early judging every lane is complete before its first
comparison starts, so groups are served in the order they became complete, as by one first-in
first-out queue.

With a shared group store the budget belongs to every process of the deployment
(store/_judge_budget.py keeps it in the store): a queue made ``shared`` grants only the slots
this process holds from it (``held``), and says when the store should hear from it
(``exchange_due``): attempts waiting ask for more, and a slot held but idle goes back at the next
exchange. While other processes wait for the budget (``yielding``), a slot freed here goes back
at once rather than to the next local ticket, so the processes take turns.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Final

import trio

COMPLETE: Final = 0
COLLECTING: Final = 1

_WAITING: Final = 0
_GRANTED: Final = 1
_CANCELLED: Final = 2


class Lane:
    """One group's (or one ``/compare`` call's) place in the judge queue."""

    __slots__ = ("rank", "waiting")

    def __init__(self, rank: tuple[int, int]) -> None:
        self.rank = rank
        self.waiting: set[Ticket] = set()

    @property
    def complete(self) -> bool:
        return self.rank[0] == COMPLETE


class Ticket:
    """One attempt waiting for a slot; ``wake`` is set by the Trio shell."""

    __slots__ = ("lane", "number", "state", "wake")

    def __init__(self, lane: Lane, number: int) -> None:
        self.lane = lane
        self.number = number
        self.state = _WAITING
        self.wake: trio.Event | None = None

    @property
    def granted(self) -> bool:
        return self.state == _GRANTED


class SlotQueue:
    """At most ``capacity`` slots in use; waiting tickets granted in (lane rank, arrival) order.

    Heap entries are ``(class, order, ticket number, ticket)``. Promoting a lane pushes fresh
    entries for its waiting tickets; the entries left behind no longer match the lane's rank and
    are dropped when they reach the top, as are the entries of cancelled tickets.
    """

    def __init__(self, capacity: int, *, shared: bool = False) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.in_use = 0
        self.waiting = 0
        # Slots held from the deployment's shared budget; None: the capacity is all there is.
        self.held: int | None = 0 if shared else None
        self.yielding = False  # other processes wait for the shared budget
        self.starved = False  # the shared budget had no slot for the last request
        self._heap: list[tuple[int, int, int, Ticket]] = []
        self._numbers = itertools.count()
        self._orders = itertools.count()

    @property
    def limit(self) -> int:
        """How many slots may be in use now."""
        held = self.held
        return self.capacity if held is None else min(self.capacity, held)

    def lane(self, *, complete: bool) -> Lane:
        """A new lane, ranked after every lane that entered the same class before it."""
        return Lane((COMPLETE if complete else COLLECTING, next(self._orders)))

    def promote(self, lane: Lane) -> None:
        """The lane's group is complete: rank it after the groups that completed before it."""
        if lane.complete:
            return
        lane.rank = (COMPLETE, next(self._orders))
        for ticket in lane.waiting:
            heapq.heappush(self._heap, (*lane.rank, ticket.number, ticket))

    def try_acquire(self) -> bool:
        """Take a free slot at once; only when nobody waits, so nothing is overtaken (here, or
        in another process waiting for the shared budget)."""
        if self.in_use < self.limit and not self.waiting and not self.yielding:
            self.in_use += 1
            return True
        return False

    def enqueue(self, lane: Lane) -> Ticket:
        ticket = Ticket(lane, next(self._numbers))
        lane.waiting.add(ticket)
        self.waiting += 1
        heapq.heappush(self._heap, (*lane.rank, ticket.number, ticket))
        return ticket

    def release(self) -> Ticket | None:
        """Give a slot back; the ticket it now goes to, if any, must be woken. While other
        processes wait for the shared budget it goes to none here: it goes back to the budget."""
        self.in_use -= 1
        if self.yielding:
            return None
        return self._grant()

    def cancel(self, ticket: Ticket) -> Ticket | None:
        """The ticket's holder stopped waiting; a slot granted meanwhile passes on."""
        if ticket.state == _GRANTED:
            ticket.state = _CANCELLED
            return self.release()
        if ticket.state == _WAITING:
            ticket.state = _CANCELLED
            ticket.lane.waiting.discard(ticket)
            self.waiting -= 1
        return None

    # ---- the shared budget (a shared queue only) ---------------------------------------

    @property
    def exchange_due(self) -> bool:
        """Whether the shared budget should hear from this process now: a slot held but idle
        while others wait there, attempts waiting that it has not been asked for, or a request
        of the last exchange that nobody here needs any more. An idle slot nobody else waits
        for stays until the next exchange, so the next attempt here takes it without asking."""
        held = self.held
        if held is None:
            return False
        if held > self.in_use:
            return self.yielding
        if self.waiting:
            return held < self.capacity and not self.starved
        return self.starved

    def begin_exchange(self) -> tuple[int, int]:
        """(slots to keep, slots to ask for): the idle ones go back. They count as given back
        from now on, whatever becomes of the exchange: the store then counts more slots for
        this process than it uses, never fewer."""
        self.held = self.in_use
        self.starved = False
        return self.in_use, min(self.capacity - self.in_use, self.waiting)

    def end_exchange(self, asked: int, granted: int, others_waiting: bool) -> list[Ticket]:
        """The budget's answer: the tickets the granted slots go to, which must be woken.

        While others wait, only the slots just granted go to tickets here. A slot freed while
        the exchange was under way is held but idle, and goes back at the next exchange: passed
        on here, it would keep a process that judges steadily ahead of the others for good."""
        assert self.held is not None
        self.held += granted
        self.yielding = others_waiting
        self.starved = granted < asked
        tickets: list[Ticket] = []
        while (not others_waiting or len(tickets) < granted) and (
            ticket := self._grant()
        ) is not None:
            tickets.append(ticket)
        return tickets

    def exchange_failed(self, asked: int) -> None:
        """The store did not answer: ask again at the next wake-up, not at once."""
        self.starved = asked > 0

    def _grant(self) -> Ticket | None:
        heap = self._heap
        while heap and self.in_use < self.limit:
            group_class, order, _, ticket = heapq.heappop(heap)
            if ticket.state != _WAITING or ticket.lane.rank != (group_class, order):
                continue  # cancelled, or left behind by a promotion
            ticket.state = _GRANTED
            ticket.lane.waiting.discard(ticket)
            self.waiting -= 1
            self.in_use += 1
            return ticket
        return None


class JudgeSlots:
    """The Trio side of ``SlotQueue``: wait for a slot in a lane, give it back."""

    def __init__(self, capacity: int, *, shared: bool = False) -> None:
        self.queue = SlotQueue(capacity, shared=shared)
        # Called when the shared budget should hear from this process (set by its keeper).
        self.exchange_due: Callable[[], None] | None = None

    @property
    def in_use(self) -> int:
        return self.queue.in_use

    def lane(self, *, complete: bool) -> Lane:
        return self.queue.lane(complete=complete)

    def promote(self, lane: Lane) -> None:
        self.queue.promote(lane)

    async def acquire(self, lane: Lane) -> bool:
        """Hold a slot on return; a free slot with nobody waiting is taken without a checkpoint,
        so the request goes out in this scheduling round rather than the next. True when the
        caller had to wait (and time may have passed)."""
        queue = self.queue
        if queue.try_acquire():
            return False
        ticket = queue.enqueue(lane)
        ticket.wake = trio.Event()
        self._tell_budget()
        try:
            await ticket.wake.wait()
        except BaseException:
            # Cancelled while waiting, or after the grant but before running again.
            _wake(queue.cancel(ticket))
            self._tell_budget()
            raise
        return True

    def release(self) -> None:
        _wake(self.queue.release())
        self._tell_budget()

    def granted(self, tickets: list[Ticket]) -> None:
        """Wake the tickets that slots from the shared budget went to."""
        for ticket in tickets:
            _wake(ticket)

    def _tell_budget(self) -> None:
        if self.exchange_due is not None and self.queue.exchange_due:
            self.exchange_due()


def _wake(ticket: Ticket | None) -> None:
    if ticket is not None and ticket.wake is not None:
        ticket.wake.set()
