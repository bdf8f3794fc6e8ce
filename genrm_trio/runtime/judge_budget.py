"""This process's share of the deployment's judge budget: the task that exchanges with the store.

With a shared group store, ``judge_max_concurrency`` bounds the judge attempts in flight across
every process of the deployment (store/judge_budget.py keeps the count). Attempts still wait in
this process's priority queue (judge/slots.py), which grants only the slots the process holds;
one task per process keeps that holding right: it asks the store for slots when attempts wait
here, gives back those nobody here needs, and renews the process's lease while it holds any.
Exchanges are batched: however many attempts start or end while one is under way, the next
carries them all, so a burst of comparisons costs a few round trips, not two per attempt. A slot
an attempt here has finished with stays with the process until its next exchange (at most
``poll_s``), unless another process waits for one, so a process judging steadily asks the store
for slots only when it needs more than it holds.

Wake-ups come from the queue (an exchange is due), from the budget's notifications (slots came
free elsewhere, or another process began to wait), and from a timer (every ``poll_s``, at most
a third of the lease): a lost notification delays a waiting attempt, never strands it. While the
store cannot be reached, attempts that have no slot wait for it, and those that hold one keep it.
"""

from __future__ import annotations

import logging
import uuid

import trio

from genrm_trio.judge.slots import JudgeSlots
from genrm_trio.store.judge_budget import BudgetReply, StoredJudgeBudget
from genrm_trio.store.redis_store import RedisGroupStore, StoreFailed

log = logging.getLogger("genrm_trio")


class SharedJudgeBudget:
    """Keeps ``slots`` (a shared queue) supplied from the deployment's budget in ``store``."""

    def __init__(
        self, store: RedisGroupStore, slots: JudgeSlots, capacity: int, *, poll_s: float
    ) -> None:
        self.stored = StoredJudgeBudget(store, capacity)
        self.slots = slots
        self.process = uuid.uuid4().hex  # this process's name in the budget
        self.interval = min(poll_s, store.lease_s / 3)
        self.exchanges = 0  # exchanges answered
        self.last: BudgetReply | None = None  # the store's last answer
        self._wake = trio.Event()
        self._notified = False
        self._closed = False
        slots.exchange_due = self.poke

    def poke(self) -> None:
        """The queue has something to tell the store."""
        self._wake.set()

    @property
    def channel(self) -> str:
        return self.stored.channel

    def notified(self) -> None:
        """A message on the budget's channel (or a fresh subscription, which may have missed
        some): slots may have come free, or another process may have begun to wait. The first
        matters to a process whose attempts wait for a slot, the second to one holding slots it
        does not use or passing them on among its own attempts."""
        queue = self.slots.queue
        held = queue.held or 0
        if queue.waiting or held > queue.in_use:
            self._notified = True
            self._wake.set()

    async def run(self) -> None:
        """Exchange whenever one is due; never returns (cancelled with the engine)."""
        queue = self.slots.queue
        while True:
            with trio.move_on_after(self.interval) as timer:
                await self._wake.wait()
            self._wake = trio.Event()
            if self._closed:
                return
            if timer.cancelled_caught or self._notified:
                self._notified = False
                if queue.waiting:
                    queue.starved = False  # ask again
                if not (queue.held or queue.waiting or queue.exchange_due):
                    continue  # idle: nothing to renew, ask for or give back
            elif not queue.exchange_due:
                continue
            await self.exchange()

    async def exchange(self) -> None:
        queue = self.slots.queue
        keep, want = queue.begin_exchange()
        try:
            reply = await self.stored.exchange(self.process, keep, want)
        except StoreFailed as exc:
            queue.exchange_failed(want)
            log.debug("GenRM judge budget exchange failed: %s", exc)
            return
        self.exchanges += 1
        self.last = reply
        self.slots.granted(queue.end_exchange(want, reply.granted, reply.others_waiting > 0))

    async def give_back(self) -> None:
        """At shutdown: keep only the slots still in use (none, once attempts are drained) and
        leave the line. The caller bounds it; a process that dies instead is forgotten when its
        lease expires."""
        self._closed = True
        self._wake.set()
        try:
            await self.stored.exchange(self.process, self.slots.queue.in_use, 0)
        except StoreFailed:
            pass
