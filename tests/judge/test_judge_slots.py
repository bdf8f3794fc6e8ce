"""Judge slots by priority (J-33): complete groups first, then older groups, within the cap.

The order is plain bookkeeping, tested without an event loop; the cap, cancellation and the
hand-over of slots run under Trio with the autojump clock.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from genrm_trio.judge.slots import JudgeSlots, Lane, SlotQueue, Ticket


def drain(queue: SlotQueue) -> list[Ticket]:
    """Release every slot in turn and return the tickets in the order they were granted."""
    granted = []
    while queue.in_use:
        ticket = queue.release()
        if ticket is not None:
            granted.append(ticket)
    return granted


def full_queue(capacity: int = 1) -> SlotQueue:
    queue = SlotQueue(capacity)
    for _ in range(capacity):
        assert queue.try_acquire()
    assert not queue.try_acquire()
    return queue


def test_a_free_slot_is_taken_at_once_only_while_nobody_waits() -> None:
    queue = SlotQueue(2)
    assert queue.try_acquire() and queue.try_acquire()
    ticket = queue.enqueue(queue.lane(complete=True))
    assert queue.release() is ticket and ticket.granted
    # A slot given back with a ticket waiting goes to that ticket, never to a newcomer.
    waiting = queue.enqueue(queue.lane(complete=True))
    assert not queue.try_acquire()
    assert queue.release() is waiting
    assert queue.in_use == 2 and queue.waiting == 0


def test_complete_groups_go_before_groups_still_collecting() -> None:
    queue = full_queue()
    collecting = queue.lane(complete=False)
    complete = queue.lane(complete=True)
    early = [queue.enqueue(collecting) for _ in range(3)]
    late = [queue.enqueue(complete) for _ in range(2)]
    assert drain(queue) == late + early


def test_older_groups_go_before_newer_ones_within_a_class() -> None:
    queue = full_queue()
    older, newer = queue.lane(complete=False), queue.lane(complete=False)
    a = queue.enqueue(newer)
    b = queue.enqueue(older)
    c = queue.enqueue(newer)
    d = queue.enqueue(older)
    assert drain(queue) == [b, d, a, c]


def test_a_group_that_completes_moves_ahead_of_collecting_groups_and_behind_complete_ones() -> None:
    queue = full_queue()
    first, second, third = (queue.lane(complete=False) for _ in range(3))
    done_before = queue.lane(complete=True)
    t1 = queue.enqueue(first)
    t2 = queue.enqueue(second)
    t3 = queue.enqueue(third)
    t_done = queue.enqueue(done_before)
    # The third group fills up: its waiting comparison passes the two still collecting, but
    # not the group that was complete before it.
    queue.promote(third)
    assert third.complete
    later = queue.enqueue(third)
    assert drain(queue) == [t_done, t3, later, t1, t2]


def test_promoting_twice_changes_nothing() -> None:
    queue = full_queue()
    lane = queue.lane(complete=False)
    other = queue.lane(complete=True)
    mine = queue.enqueue(lane)
    queue.promote(lane)
    theirs = queue.enqueue(other)
    queue.promote(lane)
    assert drain(queue) == [theirs, mine]


def test_promotion_after_a_complete_lane_keeps_completion_order() -> None:
    queue = full_queue()
    a = queue.lane(complete=False)
    b = queue.lane(complete=False)
    ta = queue.enqueue(a)
    tb = queue.enqueue(b)
    queue.promote(b)
    queue.promote(a)
    # b became complete first, so it is served first although a started earlier.
    assert drain(queue) == [tb, ta]


def test_first_come_first_served_within_one_lane() -> None:
    queue = full_queue()
    lane = queue.lane(complete=True)
    tickets = [queue.enqueue(lane) for _ in range(50)]
    assert drain(queue) == tickets


def test_cancelled_tickets_are_skipped_and_a_granted_one_passes_its_slot_on() -> None:
    queue = full_queue()
    lane = queue.lane(complete=True)
    a, b, c = (queue.enqueue(lane) for _ in range(3))
    assert queue.cancel(a) is None
    assert queue.waiting == 2
    assert queue.release() is b
    # b was granted but its holder was cancelled before it ran: the slot goes on to c.
    assert queue.cancel(b) is c
    assert queue.in_use == 1 and queue.waiting == 0
    assert queue.release() is None and queue.in_use == 0


def test_a_cancelled_ticket_of_a_promoted_lane_is_skipped() -> None:
    queue = full_queue()
    lane = queue.lane(complete=False)
    gone = queue.enqueue(lane)
    kept = queue.enqueue(lane)
    queue.promote(lane)
    queue.cancel(gone)
    assert drain(queue) == [kept]
    assert lane.waiting == set()


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        SlotQueue(0)


async def test_the_cap_holds_and_complete_groups_are_served_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cap = 3
    slots = JudgeSlots(cap)
    started: list[str] = []
    peak = 0

    async def attempt(name: str, lane: Lane, hold_s: float) -> None:
        nonlocal peak
        await slots.acquire(lane)
        try:
            started.append(name)
            peak = max(peak, slots.in_use)
            await trio.sleep(hold_s)
        finally:
            slots.release()

    collecting = slots.lane(complete=False)
    complete = slots.lane(complete=True)
    async with trio.open_nursery() as nursery:
        for k in range(cap):
            # Staggered, so that no two slots come free in the same instant.
            nursery.start_soon(attempt, f"busy{k}", complete, 10.0 + k / 10)
        await trio.testing.wait_all_tasks_blocked()
        # One at a time: tasks started together begin in no fixed order.
        for k in range(4):
            nursery.start_soon(attempt, f"early{k}", collecting, 1.0)
            await trio.testing.wait_all_tasks_blocked()
        for k in range(2):
            nursery.start_soon(attempt, f"late{k}", complete, 1.0)
            await trio.testing.wait_all_tasks_blocked()
        # The collecting group fills up last: it goes ahead of nobody complete, so its
        # comparisons wait behind the complete lane's although they asked first.
        slots.promote(collecting)
    assert peak == cap
    assert sorted(started[:cap]) == [f"busy{k}" for k in range(cap)]
    assert started[cap:] == ["late0", "late1", "early0", "early1", "early2", "early3"]
    assert slots.in_use == 0 and slots.queue.waiting == 0


async def test_a_waiter_cancelled_after_its_grant_gives_the_slot_to_the_next(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slots = JudgeSlots(1)
    lane = slots.lane(complete=True)
    got: list[str] = []

    async def holder(cancel_first: trio.CancelScope) -> None:
        await slots.acquire(lane)
        await trio.sleep(1.0)
        # "first" is cancelled and then granted the slot in the same instant, before it runs.
        cancel_first.cancel()
        slots.release()

    async def waiter(name: str, scope: trio.CancelScope) -> None:
        with scope:
            await slots.acquire(lane)
            try:
                got.append(name)
                await trio.sleep(1.0)
            finally:
                slots.release()

    first_scope, second_scope = trio.CancelScope(), trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(holder, first_scope)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter, "first", first_scope)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter, "second", second_scope)
    assert got == ["second"]
    assert not second_scope.cancelled_caught
    assert slots.in_use == 0 and slots.queue.waiting == 0


# ---- a queue drawing on a budget shared by several processes ---------------------------------


def test_a_shared_queue_grants_only_the_slots_it_holds() -> None:
    queue = SlotQueue(4, shared=True)
    assert not queue.exchange_due and not queue.try_acquire()
    lane = queue.lane(complete=True)
    tickets = [queue.enqueue(lane) for _ in range(6)]
    assert queue.exchange_due
    # It asks for what waits here, up to its own cap; the budget gives 3 of the 4.
    assert queue.begin_exchange() == (0, 4)
    assert queue.end_exchange(4, 3, others_waiting=False) == tickets[:3]
    assert (queue.in_use, queue.waiting) == (3, 3)
    assert queue.starved and not queue.exchange_due  # no asking again until told


def test_a_shared_queue_passes_a_freed_slot_on_here_unless_others_wait_for_the_budget() -> None:
    queue = SlotQueue(2, shared=True)
    lane = queue.lane(complete=True)
    first = [queue.enqueue(lane) for _ in range(2)]
    queue.begin_exchange()
    assert queue.end_exchange(2, 2, others_waiting=False) == first
    nxt = queue.enqueue(lane)
    assert queue.release() is nxt  # nobody waits elsewhere: no round trip to the store
    assert not queue.exchange_due
    queue.begin_exchange()
    queue.end_exchange(1, 0, others_waiting=True)
    later = queue.enqueue(lane)
    assert queue.release() is None  # others wait: the slot goes back to the budget
    assert queue.exchange_due and queue.begin_exchange() == (1, 1)
    assert not queue.try_acquire()  # nor does a newcomer take it meanwhile
    assert queue.end_exchange(1, 1, others_waiting=False) == [later]


def test_a_shared_queue_gives_back_idle_slots_and_withdraws_a_request_nobody_needs() -> None:
    queue = SlotQueue(4, shared=True)
    lane = queue.lane(complete=True)
    tickets = [queue.enqueue(lane) for _ in range(3)]
    queue.begin_exchange()
    queue.end_exchange(3, 2, others_waiting=False)
    assert queue.starved and not queue.exchange_due
    queue.cancel(tickets[2])  # the one still waiting leaves: the budget's line must hear it
    assert queue.exchange_due and queue.begin_exchange() == (2, 0)
    queue.end_exchange(0, 0, others_waiting=False)
    # An idle slot stays until the next exchange: a newcomer takes it at once, without asking.
    assert queue.release() is None and not queue.exchange_due
    assert queue.held == 2 and queue.try_acquire()
    queue.release()
    assert queue.begin_exchange() == (1, 0) and queue.held == 1  # then it goes back
    # While others wait for the budget, an idle slot goes back at once.
    queue.end_exchange(0, 0, others_waiting=True)
    assert queue.release() is None and queue.exchange_due


def test_slots_freed_during_an_exchange_go_back_when_others_wait_for_the_budget() -> None:
    queue = SlotQueue(4, shared=True)
    lane = queue.lane(complete=True)
    running = [queue.enqueue(lane) for _ in range(4)]
    queue.begin_exchange()
    assert queue.end_exchange(4, 4, others_waiting=False) == running
    waiting = [queue.enqueue(lane) for _ in range(4)]
    assert queue.begin_exchange() == (4, 0)
    assert queue.end_exchange(0, 0, others_waiting=True) == []
    # The next renewal is under way when every attempt in flight ends.
    assert queue.begin_exchange() == (4, 0)
    for _ in running:
        assert queue.release() is None
    assert queue.end_exchange(0, 0, others_waiting=True) == []
    assert queue.waiting == 4 and queue.exchange_due
    assert queue.begin_exchange() == (0, 4)  # all four go back; the next ones are asked for
    # The budget gives this process its share of what it gave back: only that share runs.
    assert queue.end_exchange(4, 2, others_waiting=True) == waiting[:2]


def test_a_shared_queue_keeps_the_priority_order_of_its_tickets() -> None:
    queue = SlotQueue(8, shared=True)
    collecting = queue.lane(complete=False)
    complete = queue.lane(complete=True)
    early = [queue.enqueue(collecting) for _ in range(2)]
    late = [queue.enqueue(complete) for _ in range(2)]
    queue.begin_exchange()
    assert queue.end_exchange(4, 3, others_waiting=False) == [*late, early[0]]


def test_a_failed_exchange_asks_again_only_at_the_next_wake_up() -> None:
    queue = SlotQueue(2, shared=True)
    queue.enqueue(queue.lane(complete=True))
    asked = queue.begin_exchange()[1]
    queue.exchange_failed(asked)
    assert not queue.exchange_due
    queue.starved = False  # what the keeper does on its timer or a notification
    assert queue.exchange_due


def test_an_unshared_queue_never_asks_anyone() -> None:
    queue = full_queue(2)
    queue.enqueue(queue.lane(complete=True))
    assert queue.held is None and not queue.exchange_due
