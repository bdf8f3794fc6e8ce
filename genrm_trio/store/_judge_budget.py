"""The deployment's judge budget in the shared store: how many judge slots each process holds.

``judge_max_concurrency`` is one budget for every process sharing the store. Each process tells
the store, in one script call (an *exchange*), how many slots it keeps (its attempts in flight)
and how many more it wants; the script answers how many it got. Counts are absolute, so an
exchange whose answer was lost, or one made after the store lost its state, corrects itself at
the next. A process holds its slots under a lease renewed by every exchange: the slots of a
process that died (or stalled past its lease) count for nothing once it has expired.

Processes that could not get what they asked for wait in line (a sorted set in the order they
began to wait). While others wait, a process gets no more than an equal share of the budget
(``judge_max_concurrency`` over the processes that want slots, rounded up) and a free slot is
left for each process ahead of it in line; a process served in part goes to the back. So
processes that all want more converge on equal shares and take turns at the slots that come
free. The script publishes on the budget's channel when slots come free while others wait
(given back, or no longer reserved for a process that left the line), and when a process begins
to wait (so that processes holding slots stop passing them on among their own attempts and give
each back as it comes free); a lost message only delays a process until its next exchange.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from genrm_trio.judge.slots import JudgeSlots
from genrm_trio.store._scripts import Script
from genrm_trio.store.group_store import StoreFailed
from genrm_trio.store.resp import Arg

if TYPE_CHECKING:
    from genrm_trio.store.redis_store import RedisGroupStore

__all__ = ["BudgetReply", "SharedJudgeBudget", "StoredJudgeBudget"]

log = logging.getLogger("genrm_trio")

_EXCHANGE = """
local held, processes, waiting = KEYS[1], KEYS[2], KEYS[3]
local me = ARGV[1]
local hold = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local capacity = tonumber(ARGV[4])
local lease = tonumber(ARGV[5])
local now
if ARGV[7] then
  now = tonumber(ARGV[7])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', processes, '-inf', now)) do
  redis.call('HDEL', held, gone)
  redis.call('ZREM', waiting, gone)
  redis.call('ZREM', processes, gone)
end
local function to_the_back()
  local last = redis.call('ZRANGE', waiting, -1, -1, 'WITHSCORES')
  local score = now
  if last[2] and tonumber(last[2]) >= score then score = tonumber(last[2]) + 0.000001 end
  redis.call('ZADD', waiting, score, me)
end
local before = tonumber(redis.call('HGET', held, me) or '0')
local used = 0
local all = redis.call('HGETALL', held)
for i = 1, #all, 2 do
  if all[i] ~= me then used = used + tonumber(all[i + 1]) end
end
used = used + hold
local rank = redis.call('ZRANK', waiting, me)
local others = redis.call('ZCARD', waiting)
if rank then others = others - 1 end
local granted = 0
if want > 0 then
  granted = math.min(want, capacity - used - (rank or others))
  if others > 0 then
    granted = math.min(granted, math.ceil(capacity / (others + 1)) - hold)
  end
  granted = math.max(0, granted)
  if granted == want then
    redis.call('ZREM', waiting, me)
  elseif granted > 0 or not rank then
    to_the_back()
  end
elseif rank then
  redis.call('ZREM', waiting, me)
end
local mine = hold + granted
local in_line = redis.call('ZSCORE', waiting, me)
if mine > 0 then
  redis.call('HSET', held, me, mine)
else
  redis.call('HDEL', held, me)
end
if mine > 0 or in_line then
  redis.call('ZADD', processes, now + lease, me)
else
  redis.call('ZREM', processes, me)
end
local free = capacity - used - granted
if others > 0 and (hold < before or (rank and not in_line and free > 0)) then
  redis.call('PUBLISH', ARGV[6], 'freed')
elseif in_line and not rank then
  redis.call('PUBLISH', ARGV[6], 'waiting')
end
return {granted, others, used + granted}
"""

_EXCHANGE_SCRIPT = Script(_EXCHANGE)


@dataclass(frozen=True, slots=True)
class BudgetReply:
    """The store's answer to one exchange."""

    granted: int  # slots added to what the process keeps
    others_waiting: int  # other processes waiting for a slot
    in_use: int  # slots held by the whole deployment now, the process's own included


class StoredJudgeBudget:
    """The keys and the exchange of one deployment's judge budget."""

    def __init__(self, store: RedisGroupStore, capacity: int) -> None:
        self.store = store
        self.capacity = capacity
        prefix = store.prefix
        self.keys: list[Arg] = [
            f"{prefix}judge-held",
            f"{prefix}judge-processes",
            f"{prefix}judge-waiting",
        ]
        self.channel = f"{prefix}judge-budget"

    async def exchange(self, process: str, hold: int, want: int) -> BudgetReply:
        """Keep ``hold`` slots, ask for ``want`` more, and renew the process's lease."""
        args: list[Arg] = [
            process,
            hold,
            want,
            self.capacity,
            repr(self.store.lease_s),
            self.channel,
        ]
        reply = await self.store.run_script(
            _EXCHANGE_SCRIPT, self.keys, [*args, *self.store.clock_args()]
        )
        granted, others, in_use = reply
        return BudgetReply(int(granted), int(others), int(in_use))


class SharedJudgeBudget:
    """This process's share of the deployment's budget: keeps ``slots`` (a shared queue) supplied.

    Attempts still wait in this process's priority queue (judge/slots.py), which grants only the
    slots the process holds; one task per process keeps that holding right: it asks the store
    for slots when attempts wait here, gives back those nobody here needs, and renews the
    process's lease while it holds any. Exchanges are batched: however many attempts start or
    end while one is under way, the next carries them all, so a burst of comparisons costs a few
    round trips, not two per attempt. A slot an attempt here has finished with stays with the
    process until its next exchange (at most ``poll_s``), unless another process waits for one,
    so a process judging steadily asks the store for slots only when it needs more than it holds.

    Wake-ups come from the queue (an exchange is due), from the budget's notifications (slots
    came free elsewhere, or another process began to wait), and from a timer (every ``poll_s``,
    at most a third of the lease): a lost notification delays a waiting attempt, never strands
    it. While the store cannot be reached, attempts that have no slot wait for it, and those
    that hold one keep it.
    """

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
