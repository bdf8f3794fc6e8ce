"""What a process sharing a Redis/Valkey group store does beside its own transitions.

Other processes serve the same groups, so a process must learn of their work:

- *ended records*: a request waiting here for a record another process ended is answered when
  the store's notification of that record arrives (``SUBSCRIBE`` to the outcomes channel), or
  by the sweep, which polls the outcome keys of every record this process waits on or judges:
  a lost notification delays an answer, never strands it. An evaluation this process still
  runs of a record that ended elsewhere is stopped at once;
- *deadlines and leases*: collection deadlines and expired evaluation leases are found in the
  store's sorted sets by any process's sweep (every ``poll_s``), which fails the group or takes
  its evaluation over (core/ownership.py);
- *offers*: a group this process fills while it judges more than its share is offered to the
  others on the offers channel; a process judging fewer claims it, the sooner the fewer it
  judges, and the offering process claims it back if nobody has;
- *the judge budget*: ``judge_max_concurrency`` holds for the whole deployment, its slots drawn
  from the store (store/_judge_budget.py).

Every transition it makes goes through the store like any other, and the engine acts on the
decision as on its own.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from genrm_trio.core import messages
from genrm_trio.core.transition import CollectionDue, Event, Fail, TakeOverDue
from genrm_trio.judge.slots import JudgeSlots
from genrm_trio.store._judge_budget import SharedJudgeBudget
from genrm_trio.store.group_store import StoreFailed, Watched
from genrm_trio.store.resp import StoreUnavailable

if TYPE_CHECKING:
    from genrm_trio.store.redis_store import RedisGroupStore

__all__ = ["OFFER_STEP_S", "OFFER_WAIT_S", "RedisWatcher"]

log = logging.getLogger("genrm_trio")

# An offered group: a process judging n groups claims it after n steps (at most half the wait),
# the offering process after the whole wait, if nobody has by then.
OFFER_STEP_S = 0.002
OFFER_WAIT_S = 0.05


class RedisWatcher:
    """Notifications, sweeps, offers and the judge budget of one engine on a Redis store."""

    def __init__(self, store: RedisGroupStore, engine: Watched) -> None:
        self.store = store
        self.engine = engine
        config = store.config
        self.poll_s = store.poll_s
        self.notifications = store.notifications
        # judge_max_concurrency holds for the whole deployment: slots come from the store.
        self.judge_slots: JudgeSlots | None = JudgeSlots(
            config.process_judge_concurrency, shared=True
        )
        self.budget = SharedJudgeBudget(
            store, self.judge_slots, config.judge_max_concurrency, poll_s=self.poll_s
        )
        self.subscribed = False  # the notification channel is followed right now
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.notifications:
                nursery.start_soon(self._listen)
            nursery.start_soon(self._sweep)
            nursery.start_soon(self.budget.run)
            task_status.started()

    async def close(self) -> None:
        await self.budget.give_back()

    # ---- ended records ---------------------------------------------------------------------

    async def _listen(self) -> None:
        """Follow the store's notifications; after every (re)subscription, poll once."""
        store, budget = self.store, self.budget
        while True:
            try:
                connection = await store.client.connect()
            except StoreUnavailable:
                await trio.sleep(self.poll_s)
                continue
            budget_channel = budget.channel.encode()
            offers = store.offers_channel.encode()
            try:
                await connection.pipeline(
                    [
                        ["SUBSCRIBE", store.channel],
                        ["SUBSCRIBE", budget_channel],
                        ["SUBSCRIBE", offers],
                    ]
                )
                self.subscribed = True
                budget.notified()
                await self._poll_ended()
                while True:
                    message = await connection.receive()
                    if not (isinstance(message, list) and message and message[0] == b"message"):
                        continue
                    if message[1] == budget_channel:
                        budget.notified()
                    elif message[1] == offers:
                        self._offer_received(message[2].decode())
                    else:
                        rid = message[2].decode()
                        for _ in range(self.engine.notification_copies(rid)):
                            if rid in self.engine.watched_records():
                                for ended in (await store.ended_records([rid])).values():
                                    self.engine.ended_elsewhere(ended)
            except (StoreUnavailable, StoreFailed):
                self.subscribed = False
                await trio.sleep(self.poll_s)
            except Exception as exc:
                # A defect must not end the engine: the sweep still answers every waiter.
                log.error("GenRM notification listener failed; subscribing again", exc_info=exc)
                self.subscribed = False
                await trio.sleep(self.poll_s)
            finally:
                self.subscribed = False
                await connection.aclose()

    async def undelivered(self) -> bool:
        return bool(await self.store.ended_records(self.engine.watched_records()))

    async def _poll_ended(self) -> None:
        ended = await self.store.ended_records(self.engine.watched_records())
        for record in ended.values():
            self.engine.ended_elsewhere(record)

    # ---- sweeps ------------------------------------------------------------------------------

    async def _sweep(self) -> None:
        """Every poll interval: waiters' outcomes, expired collections, expired leases, and the
        deployment's group counts for the gauges."""
        while True:
            await trio.sleep(self.poll_s)
            try:
                await self.sweep_once()
                await self.store.refresh_counts()
            except StoreFailed as exc:
                log.debug("GenRM group store sweep failed: %s", exc)
            except Exception as exc:
                # Never the end of the engine: the next sweep runs, and requests go on.
                log.error("GenRM group store sweep failed", exc_info=exc)

    async def sweep_once(self) -> None:
        """One sweep (a test harness on a mock clock runs them at the instants it chooses).

        A defect in one group's transition fails that group with its reason and the sweep goes
        on with the others; the store being unreachable ends the sweep until the next one.
        """
        store = self.store
        await self._poll_ended()
        for ref in await store.due(store.due_set):
            await self._sweep_group(ref, CollectionDue())
        for ref in await store.due(store.lease_set):
            await self._sweep_group(ref, TakeOverDue())

    async def _sweep_group(self, ref: str, event: Event) -> None:
        try:
            decision = await self.store.transact(ref, event)
        except StoreFailed:
            raise
        except Exception as exc:
            log.error("GenRM group store sweep failed for ref='%s'", ref, exc_info=exc)
            try:
                fail = Fail(None, None, messages.evaluation_failed(exc))
                decision = await self.store.transact(ref, fail)
            except StoreFailed:
                raise
            except Exception as again:
                log.error("GenRM could not fail group ref='%s'", ref, exc_info=again)
                return
        self.engine.act(decision)

    # ---- where groups are judged -------------------------------------------------------------

    def hand_over(self) -> int | None:
        """This process's evaluations running, when it judges more groups than its share of
        the deployment's (by the last count): a group it fills is then offered to a process
        judging fewer. None: it judges the group itself."""
        store = self.store
        counts = store.last_counts
        mine = self.engine.evaluations_running()
        if not self.notifications or counts is None or store.processes < 2 or mine < 1:
            return None
        return mine if mine > counts.evaluating / store.processes else None

    def offered(self, ref: str) -> None:
        """Claimed back if no less loaded process has taken it meanwhile."""
        self._claim_soon(ref, OFFER_WAIT_S)

    def _offer_received(self, message: str) -> None:
        """Another process offers a group it filled: claim it if this process judges fewer
        groups, the sooner the fewer it judges, so the least loaded one gets it."""
        load, _, ref = message.partition(" ")
        mine = self.engine.evaluations_running()
        if self.engine.closed or mine >= int(load):
            return
        self._claim_soon(ref, min(OFFER_STEP_S * mine, OFFER_WAIT_S / 2))

    def _claim_soon(self, ref: str, delay_s: float) -> None:
        if self._nursery is not None and not self.engine.closed:
            self._nursery.start_soon(self._claim_offer, ref, delay_s)

    async def _claim_offer(self, ref: str, delay_s: float) -> None:
        await trio.sleep(delay_s)
        try:
            await self._sweep_group(ref, TakeOverDue())
        except StoreFailed:
            pass  # a sweep claims it once the store answers again
