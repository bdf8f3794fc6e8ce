"""The memory store without an event loop: its retention indexes, pruning and counts (R-1…R-4),
on a clock the test moves."""

from __future__ import annotations

from typing import Any

from one_group import BASE, arrival, ref_of

from genrm_trio.config import config_from_mapping
from genrm_trio.core.outcomes import Rejected
from genrm_trio.core.statistics import Statistics
from genrm_trio.core.transition import Arrive, Decision, Finish, Wait
from genrm_trio.core.verdicts import Verdict
from genrm_trio.store.memory_store import MemoryGroupStore

NOTHING = Statistics(0, 0, 0, 0, 0, 0, 0, 0, 0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_store(**overrides: Any) -> tuple[MemoryGroupStore, Clock]:
    values = {**BASE, "num_rollouts_per_prompt": 2, "cohort_result_ttl_s": 10.0, **overrides}
    clock = Clock()
    return MemoryGroupStore(config_from_mapping(values), clock=clock), clock


def arrive(store: MemoryGroupStore, *items: Any) -> Decision:
    decision = store.apply(ref_of(items[0]), Arrive(items))
    store.check_invariants()
    return decision


def complete(store: MemoryGroupStore, g: str | None = "g", **kw: Any) -> None:
    for slot in range(2):
        arrive(store, arrival(slot, g, **kw))
    ref = ref_of(arrival(0, g, **kw))
    group = store.group(ref)
    assert group is not None and group.record is not None
    record = group.record
    verdicts = {c.index: Verdict(4, 2, 1) for c in record.plan}
    store.apply(ref, Finish(record.rid, record.fence, verdicts, {}, len(verdicts), False))
    store.check_invariants()


def explicit_watermarks(store: MemoryGroupStore) -> set[str]:
    return {g.ref[2:] for g in store.groups() if g.watermark is not None}


def retained(store: MemoryGroupStore) -> list[str]:
    return [record.key for record in store.terminal_order()]


def test_results_and_watermarks_expire_independently() -> None:
    # AS-133: complete(a) at 100, complete(b) at 101, a replays at 109.
    store, clock = make_store()
    clock.now = 100.0
    complete(store, "a")
    clock.now = 101.0
    complete(store, "b")
    clock.now = 109.0
    arrive(store, arrival(0, "a"))
    assert store.idle_order() == ["b", "a"]  # the replay moved a to the end
    clock.now = 110.5
    arrive(store, arrival(0, "z"))
    assert retained(store) == ["group_id::b::group_attempt::0"]
    assert {"a", "b"} <= explicit_watermarks(store)
    clock.now = 110.6
    gone = arrive(store, arrival(0, "a"))
    assert gone.replies[0].outcome == Rejected(
        409,
        "GenRM group 'a' attempt 0 already finished and its result is no longer retained; "
        "retry with a higher _ng_group_attempt",
    )
    clock.now = 111.5
    arrive(store, arrival(1, "z2"))
    assert retained(store) == []
    assert explicit_watermarks(store) == {"a", "z", "z2"}


def test_pruning_never_visits_active_groups() -> None:
    store, _ = make_store(max_terminal_cohorts=4096, cohort_result_ttl_s=None)
    for n in range(300):
        arrive(store, arrival(0, f"g{n}"))
    before = store.prune_visits
    arrive(store, arrival(0, "another"))
    assert store.prune_visits - before <= 2


def test_the_count_cap_evicts_results_in_completion_order() -> None:
    store, clock = make_store(max_terminal_cohorts=1, cohort_result_ttl_s=None)
    clock.now = 1.0
    complete(store, "b")
    clock.now = 2.0
    complete(store, "c")
    clock.now = 3.0
    replay = arrive(store, arrival(0, "c"))
    assert not isinstance(replay.replies[0], Wait)
    assert retained(store) == ["group_id::c::group_attempt::0"]
    evicted = store.evictions()
    assert evicted[("results", "count")] == 1 and evicted[("results", "ttl")] == 0


def test_statistics_count_groups_by_phase_and_index() -> None:
    store, _ = make_store()
    complete(store, "done")
    arrive(store, arrival(0, "collecting"))
    arrive(store, arrival(0, "full"), arrival(1, "full"))
    stats = store.statistics(NOTHING)
    assert (stats.collecting, stats.evaluating, stats.retained_records) == (1, 1, 1)
    assert (stats.watermarks, stats.idle_entries) == (3, 1)


def test_shutdown_fails_every_active_group_and_then_nothing_may_be_active() -> None:
    store, _ = make_store()
    waiting = arrive(store, arrival(0, "x"))
    decisions = store.shut_down(1.0)
    ended = [f.ended for d in decisions for f in d.finished]
    rid = waiting.replies[0].rid
    assert [(e.rid, e.outcome(0)) for e in ended] == [
        (rid, Rejected(503, "GenRM server is shutting down"))
    ]
    store.check_invariants()
    assert store.statistics(NOTHING).active_groups == 0


def test_legacy_resends_are_counted_while_they_collect() -> None:
    store, clock = make_store(num_rollouts_per_prompt=2)
    complete(store, g=None)
    assert store.legacy_resends_collecting == 0
    clock.now = 1.0
    arrive(store, arrival(1, g=None))
    assert store.legacy_resends_collecting == 1
    assert store.health(0)["legacy_resends_collecting"] == 1
    arrive(store, arrival(0, g=None))  # the whole group came again: it is judged
    assert store.legacy_resends_collecting == 0
