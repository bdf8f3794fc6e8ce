"""Which group and slot an OpenRLHF sample takes (core.prompt_groups)."""

from __future__ import annotations

from genrm_trio.core.prompt_groups import Placement, PromptGroups


def test_samples_fill_their_prompts_group_in_order_then_open_the_next() -> None:
    table = PromptGroups(2, "t", horizon_s=100.0)
    a0 = table.place("A", "x", 0.0)
    b0 = table.place("B", "x", 0.0)
    a1 = table.place("A", "y", 0.0)
    a2 = table.place("A", "z", 0.0)
    assert (a0.slot, a1.slot, b0.slot, a2.slot) == (0, 1, 0, 0)
    assert a0.group_id == a1.group_id != b0.group_id
    assert a2.group_id not in (a0.group_id, b0.group_id)


def test_equal_texts_take_two_slots_while_both_requests_wait() -> None:
    table = PromptGroups(2, "t", horizon_s=100.0)
    assert [table.place("A", "same", 0.0).slot for _ in range(2)] == [0, 1]


def test_a_resent_sample_takes_back_the_slot_its_request_left() -> None:
    table = PromptGroups(3, "t", horizon_s=100.0)
    first = table.place("A", "x", 0.0)
    table.release(first, answered=False)
    assert table.place("A", "y", 0.0) == Placement(first.group_id, 1)
    assert table.place("A", "x", 0.0) == first
    # An answered slot is not taken back: the same text is then another sample.
    table.release(first, answered=True)
    assert table.place("A", "x", 0.0) == Placement(first.group_id, 2)


def test_a_failed_group_is_closed_and_delivered_or_old_groups_are_forgotten() -> None:
    table = PromptGroups(2, "t", horizon_s=10.0)
    lonely = table.place("A", "x", 0.0)
    table.release(lonely, answered=True, failed=True)
    fresh = table.place("A", "x", 1.0)
    assert fresh.group_id != lonely.group_id and fresh.slot == 0
    other = table.place("A", "y", 1.0)
    table.release(fresh, answered=True)
    table.release(other, answered=True)
    assert table.open_groups() == 1  # only the closed group, until the horizon
    table.place("B", "x", 20.0)
    assert table.open_groups() == 1
