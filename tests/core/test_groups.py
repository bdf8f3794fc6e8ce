"""The group state machine without an event loop: arrivals, attempts, failures, retention."""

from __future__ import annotations

from typing import Any

import pytest

from genrm_trio.config import Config
from genrm_trio.core.groups import (
    Answer,
    Arrival,
    BeginEvaluation,
    CancelGroup,
    GroupInputs,
    GroupRegistry,
    Masked,
    MemberTexts,
    Phase,
    Rejected,
    Scored,
    StartComparisons,
    StartGroup,
    Wait,
    group_key,
)
from genrm_trio.core.verdicts import Verdict


def make_registry(**overrides: Any) -> GroupRegistry:
    values: dict[str, Any] = {
        "judge_base_url": "http://judge/v1",
        "judge_model": "m",
        "num_rollouts_per_prompt": 2,
        "cohort_result_ttl_s": 10.0,
    }
    values.update(overrides)
    return GroupRegistry(Config(**values))


def arrival(
    slot: int,
    g: str | None = "g",
    a: int = 0,
    *,
    fp: bytes | None = None,
    digest: str = "d",
    task: int | None = None,
    fail_prepare: bool = False,
) -> Arrival:
    def prepare(first: bool) -> tuple[MemberTexts, GroupInputs | None]:
        if fail_prepare:
            raise RuntimeError("bad request conversion")
        inputs = GroupInputs([{"role": "user", "content": "q"}], None, None, None)
        return MemberTexts("", f"answer-{slot}"), inputs if first else None

    return Arrival(
        group_id=g,
        attempt=a,
        slot=slot,
        task_index=task,
        prompt_id=None,
        digest=digest,
        fingerprint=fp if fp is not None else bytes([slot]) * 32,
        prepare=prepare,
    )


class Wakes:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def complete(registry: GroupRegistry, g: str = "g", a: int = 0, now: float = 0.0) -> list[Any]:
    """Fill every slot and publish a (4, 2, 1) verdict for every comparison."""
    replies = [registry.arrive(arrival(i, g, a), now, Wakes()) for i in range(registry.size)]
    record = replies[-1].reply.record
    verdicts = {c.index: Verdict(4, 2, 1) for c in record.plan}
    registry.finish_evaluation(record, verdicts, now)
    registry.check_invariants()
    return [r.reply.waiter.outcome for r in replies]


def test_group_key_forms() -> None:
    assert group_key("g", 1, 7, "p", "D") == "group_id::g::group_attempt::1"
    assert group_key(None, 0, 7, "p", "D") == "task_idx::7::D::group_attempt::0"
    assert group_key(None, 2, None, "p", "D") == "prompt_id::p::D::group_attempt::2"
    assert group_key(None, 0, None, None, "D") == "D::group_attempt::0"


def test_members_wait_until_the_group_is_full_then_evaluation_starts() -> None:
    registry = make_registry()
    first = registry.arrive(arrival(0), 0.0, Wakes())
    assert isinstance(first.reply, Wait)
    assert [type(e) for e in first.effects] == [StartGroup]
    second = registry.arrive(arrival(1), 0.0, Wakes())
    assert [type(e) for e in second.effects] == [StartComparisons, BeginEvaluation]
    assert second.effects[0].comparisons == second.reply.record.plan
    record = second.reply.record
    assert record.phase is Phase.EVALUATING
    assert [(c.first, c.second) for c in record.plan] == [(0, 1), (1, 0)]
    registry.check_invariants()


def test_early_judging_starts_each_comparison_once_both_slots_are_filled() -> None:
    registry = make_registry(num_rollouts_per_prompt=4, early_judging=True)
    started: list[tuple[int, int]] = []
    for slot in (0, 2, 1, 3):
        decision = registry.arrive(arrival(slot), 0.0, Wakes())
        for effect in decision.effects:
            if isinstance(effect, StartComparisons):
                started.extend((c.first, c.second) for c in effect.comparisons)
        if slot == 1:
            # (0, 1) and (1, 2) became judgeable; the group is still collecting.
            assert started == [(0, 1), (1, 2)]
            assert decision.reply.record.phase is Phase.COLLECTING
    assert started == [(0, 1), (1, 2), (2, 3), (3, 0)]
    registry.check_invariants()


def test_publication_resolves_every_waiter_at_once_with_slot_rewards() -> None:
    registry = make_registry()
    wakes = Wakes()
    replies = [registry.arrive(arrival(i), 0.0, wakes) for i in range(2)]
    duplicate = registry.arrive(arrival(0), 0.0, wakes)
    assert isinstance(duplicate.reply, Wait) and duplicate.effects == []
    record = replies[0].reply.record
    registry.finish_evaluation(record, {0: Verdict(4, 2, 1), 1: Verdict(4, 2, 1)}, 1.0)
    assert wakes.count == 3
    outcomes = [r.reply.waiter.outcome for r in [*replies, duplicate]]
    assert [o.reward for o in outcomes] == [3.0, 3.0, 3.0]
    assert record.phase is Phase.COMPLETED
    assert all(m.texts is None and not m.waiters for m in record.members.values())
    registry.check_invariants()


def test_replay_after_completion_answers_the_cached_reward_without_work() -> None:
    registry = make_registry()
    complete(registry)
    replay = registry.arrive(arrival(1), 1.0, Wakes())
    assert isinstance(replay.reply, Answer) and replay.effects == []
    assert replay.reply.outcome == Scored(3.0, replay.reply.outcome.metrics)


def test_different_response_for_an_occupied_slot_is_a_conflict_that_changes_nothing() -> None:
    registry = make_registry()
    registry.arrive(arrival(0), 0.0, Wakes())
    conflict = registry.arrive(arrival(0, fp=b"x" * 32), 0.0, Wakes())
    assert conflict.reply.outcome == Rejected(
        409,
        "GenRM cohort 'group_id::g::group_attempt::0' already has a different response for "
        "rollout_index=0",
    )
    assert registry.statistics().waiters == 1
    registry.check_invariants()


def test_inconsistent_prompt_is_rejected_for_the_same_and_a_higher_attempt() -> None:
    registry = make_registry()
    registry.arrive(arrival(0), 0.0, Wakes())
    same = registry.arrive(arrival(1, digest="other"), 0.0, Wakes())
    higher = registry.arrive(arrival(0, a=1, digest="other"), 0.0, Wakes())
    text = "GenRM group 'g' received inconsistent prompt or principle content"
    assert same.reply.outcome == Rejected(409, text)
    assert higher.reply.outcome == Rejected(409, text)
    assert registry.explicit["g"].attempt == 0  # nothing was superseded
    registry.check_invariants()


def test_a_higher_attempt_supersedes_the_active_record_and_fences_the_old_one() -> None:
    registry = make_registry()
    old = registry.arrive(arrival(0), 0.0, Wakes())
    new = registry.arrive(arrival(0, a=1, fp=b"n" * 32), 1.0, Wakes())
    text = "GenRM group 'g' attempt 0 was superseded by attempt 1"
    assert old.reply.waiter.outcome == Rejected(503, text)
    assert any(isinstance(e, CancelGroup) for e in new.effects)
    late = registry.arrive(arrival(1), 2.0, Wakes())
    assert late.reply.outcome == Rejected(409, text)
    assert registry.statistics().retained_records == 0
    registry.check_invariants()


def test_late_result_of_a_superseded_record_never_publishes() -> None:
    registry = make_registry()
    replies = [registry.arrive(arrival(i), 0.0, Wakes()) for i in range(2)]
    record = replies[0].reply.record
    registry.arrive(arrival(0, a=1), 1.0, Wakes())
    assert registry.finish_evaluation(record, {0: Verdict(4, 2, 1), 1: Verdict(4, 2, 1)}, 2) is None
    assert all(m.outcome is None for m in record.members.values())
    registry.check_invariants()


def test_collection_deadline_fails_collecting_group_only() -> None:
    registry = make_registry(cohort_collection_timeout_s=0.05)
    first = registry.arrive(arrival(0), 0.0, Wakes())
    record = first.reply.record
    registry.collection_expired(record, 0.05)
    text = (
        "GenRM cohort 'group_id::g::group_attempt::0' did not collect 2 unique rollout indices"
        " within 0.05s"
    )
    assert first.reply.waiter.outcome == Rejected(503, text)
    later = registry.arrive(arrival(1, fp=b"z" * 32), 0.1, Wakes())
    assert later.reply.outcome == Rejected(503, text)
    registry.check_invariants()


def test_full_group_ignores_a_late_collection_deadline() -> None:
    registry = make_registry()
    replies = [registry.arrive(arrival(i), 0.0, Wakes()) for i in range(2)]
    record = replies[0].reply.record
    registry.collection_expired(record, 5.0)
    assert record.phase is Phase.EVALUATING


def test_conversion_failure_fails_the_group_for_every_waiter() -> None:
    registry = make_registry()
    first = registry.arrive(arrival(0), 0.0, Wakes())
    bad = registry.arrive(arrival(1, fail_prepare=True), 0.0, Wakes())
    text = "GenRM cohort input conversion failed: RuntimeError: bad request conversion"
    assert bad.reply.outcome == Rejected(503, text)
    assert first.reply.waiter.outcome == Rejected(503, text)
    registry.check_invariants()


def test_partial_masking_masks_only_the_failed_pair() -> None:
    registry = make_registry(num_rollouts_per_prompt=4)
    replies = [registry.arrive(arrival(i), 0.0, Wakes()) for i in range(4)]
    record = replies[0].reply.record
    failed = record.plan[1]  # pair (1, 2)
    registry.comparison_failed(record, failed, "GenRM judge X pair=(1, 2): boom")
    verdicts = {c.index: Verdict(3, 3, 3.5) for c in record.plan if c.index != failed.index}
    registry.finish_evaluation(record, verdicts, 1.0)
    outcomes = [r.reply.waiter.outcome for r in replies]
    assert isinstance(outcomes[1], Masked) and isinstance(outcomes[2], Masked)
    assert outcomes[1].text == (
        "GenRM rollout_index=1 lost a comparison to a judge failure (1 of 4 comparisons failed): "
        "GenRM judge X pair=(1, 2): boom"
    )
    assert outcomes[0].reward == 3.0 and outcomes[3].reward == 3.0
    assert outcomes[0].metrics["genrm_failed_comparison_rate_per_group"] == 0.25
    assert outcomes[0].metrics["genrm_masked_rollout_rate_per_group"] == 0.5
    # A masked member answers its masked row even for a regenerated answer.
    late = registry.arrive(arrival(2, fp=b"r" * 32), 2.0, Wakes())
    assert late.reply.outcome == outcomes[2]
    registry.check_invariants()


def test_every_rollout_masked_fails_the_group_with_the_first_failure() -> None:
    registry = make_registry()
    replies = [registry.arrive(arrival(i), 0.0, Wakes()) for i in range(2)]
    record = replies[0].reply.record
    registry.comparison_failed(record, record.plan[1], "second")
    registry.comparison_failed(record, record.plan[0], "first")
    registry.finish_evaluation(record, {}, 1.0)
    expected = Masked(
        "GenRM cohort 'group_id::g::group_attempt::0' failed: every rollout was masked "
        "(2 of 2 comparisons failed); first failure: first"
    )
    assert [r.reply.waiter.outcome for r in replies] == [expected, expected]
    assert record.phase is Phase.FAILED
    registry.check_invariants()


def test_non_finite_rewards_are_refused_before_anything_is_published() -> None:
    registry = make_registry()
    replies = [registry.arrive(arrival(i), 0.0, Wakes()) for i in range(2)]
    record = replies[0].reply.record
    huge = {c.index: Verdict(1e308, 1e308, 3.5) for c in record.plan}
    with pytest.raises(RuntimeError, match="non-finite cohort rewards"):
        registry.finish_evaluation(record, huge, 1.0)
    assert record.phase is Phase.EVALUATING
    assert all(r.reply.waiter.outcome is None for r in replies)


def test_legacy_completed_group_retires_and_failed_one_answers_with_suffix() -> None:
    registry = make_registry(cohort_collection_timeout_s=0.05)
    complete_legacy = [registry.arrive(arrival(i, g=None, task=7), 0.0, Wakes()) for i in range(2)]
    record = complete_legacy[0].reply.record
    registry.finish_evaluation(record, {0: Verdict(4, 2, 1), 1: Verdict(4, 2, 1)}, 1.0)
    assert registry.statistics().retained_records == 0
    again = registry.arrive(arrival(0, g=None, task=7), 2.0, Wakes())
    assert isinstance(again.reply, Wait)  # a new group, never a replay
    registry.collection_expired(again.reply.record, 2.05)
    late = registry.arrive(arrival(1, g=None, task=7, fp=b"q" * 32), 3.0, Wakes())
    assert isinstance(late.reply.outcome, Rejected)
    assert late.reply.outcome.detail.endswith(
        "Reusing the task/prompt key could mix delayed answers into a replacement group."
    )
    registry.check_invariants()


def test_ttl_expires_results_and_watermarks_independently() -> None:
    # AS-133: complete(a) at 100, complete(b) at 101, a replays at 109.
    registry = make_registry()
    complete(registry, "a", now=100.0)
    complete(registry, "b", now=101.0)
    registry.arrive(arrival(0, "a"), 109.0, Wakes())
    registry.arrive(arrival(0, "z"), 110.5, Wakes())
    assert {r.group_id for r in registry.terminal_index.values()} == {"b"}
    assert {"a", "b"} <= set(registry.watermarks)
    gone = registry.arrive(arrival(0, "a"), 110.6, Wakes())
    assert gone.reply.outcome == Rejected(
        409,
        "GenRM group 'a' attempt 0 already finished and its result is no longer retained; "
        "retry with a higher _ng_group_attempt",
    )
    registry.arrive(arrival(1, "z2"), 111.5, Wakes())
    assert len(registry.terminal_index) == 0
    assert set(registry.watermarks) == {"a", "z", "z2"}
    registry.check_invariants()


def test_pruning_never_visits_active_groups() -> None:
    registry = make_registry(max_terminal_cohorts=4096, cohort_result_ttl_s=None)
    for n in range(300):
        registry.arrive(arrival(0, f"g{n}"), 0.0, Wakes())
    before = registry.prune_visits
    registry.arrive(arrival(0, "another"), 1.0, Wakes())
    assert registry.prune_visits - before <= 2
    registry.check_invariants()


def test_count_cap_evicts_results_in_completion_order() -> None:
    registry = make_registry(max_terminal_cohorts=1, cohort_result_ttl_s=None)
    complete(registry, "b", now=1.0)
    complete(registry, "c", now=2.0)
    replay = registry.arrive(arrival(0, "c"), 3.0, Wakes())
    assert isinstance(replay.reply.outcome, Scored)
    assert {r.group_id for r in registry.terminal_index.values()} == {"c"}
    registry.check_invariants()


def test_shutdown_fails_active_groups_and_clears_everything() -> None:
    registry = make_registry()
    waiting = registry.arrive(arrival(0, "x"), 0.0, Wakes())
    effects = registry.shut_down(1.0)
    assert waiting.reply.waiter.outcome == Rejected(503, "GenRM server is shutting down")
    assert any(isinstance(e, CancelGroup) for e in effects)
    after = registry.arrive(arrival(1, "x"), 2.0, Wakes())
    assert after.reply.outcome == Rejected(503, "GenRM server is shutting down")
    registry.clear()
    stats = registry.statistics()
    assert (stats.active_groups, stats.retained_records, stats.watermarks, stats.waiters) == (
        0,
        0,
        0,
        0,
    )
    registry.check_invariants()


def test_detach_removes_only_the_cancelled_waiter() -> None:
    registry = make_registry()
    one = registry.arrive(arrival(0), 0.0, Wakes())
    two = registry.arrive(arrival(0), 0.0, Wakes())
    registry.detach(one.reply.record, 0, one.reply.waiter)
    assert registry.statistics().waiters == 1
    assert two.reply.record.members[0].waiters == [two.reply.waiter]


# ---- §5.14: a row resent under a legacy key whose group already completed ----------------------


def logging_registry(**overrides: Any) -> tuple[GroupRegistry, list[tuple[int, str]]]:
    lines: list[tuple[int, str]] = []
    values: dict[str, Any] = {
        "judge_base_url": "http://judge/v1",
        "judge_model": "m",
        "num_rollouts_per_prompt": 4,
        "cohort_result_ttl_s": 10.0,
        "cohort_collection_timeout_s": 1800.0,
    }
    values.update(overrides)
    return GroupRegistry(
        Config(**values), log=lambda level, text, **_: lines.append((level, text))
    ), lines


def resend_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [(level, text) for level, text in lines if text.startswith("GenRM legacy group")]


def test_a_row_resent_after_its_legacy_group_completed_is_logged_at_arrival() -> None:
    registry, lines = logging_registry()
    complete(registry, g=None, now=100.0)
    assert registry.legacy_resends_collecting == 0
    resent = registry.arrive(arrival(2, g=None), 103.5, Wakes())
    assert isinstance(resent.reply, Wait)
    assert registry.legacy_resends_collecting == 1
    key = "d::group_attempt::0"
    assert resend_lines(lines) == [
        (
            30,
            f"GenRM legacy group '{key}' completed 3.5s ago; rollout_index=2 starts a new group "
            "under the same key, which completes only if all 4 members are sent again, and "
            "otherwise fails after 1800.0s (cohort_collection_timeout_s). A legacy group has no "
            "replay: to retry some rollouts of a finished group, send the whole group again "
            "under a fresh _ng_group_id shared by every member.",
        )
    ]
    # Its other members resent one at a time join the same group: one line, one count.
    registry.arrive(arrival(0, g=None), 104.0, Wakes())
    assert registry.legacy_resends_collecting == 1 and len(resend_lines(lines)) == 1
    registry.check_invariants()
    registry.collection_expired(resent.reply.record, 1903.5)
    assert registry.legacy_resends_collecting == 0
    outcome = resent.reply.waiter.outcome
    assert isinstance(outcome, Rejected) and outcome.status == 503
    registry.check_invariants()


def test_a_whole_group_sent_again_is_judged_and_stops_counting() -> None:
    # C-91 is unchanged: a later run of the same task on a live server gets judged.
    registry, lines = logging_registry(num_rollouts_per_prompt=2)
    complete(registry, g=None, now=0.0)
    outcomes = complete(registry, g=None, now=5.0)
    assert [type(o) for o in outcomes] == [Scored, Scored]
    assert registry.legacy_resends_collecting == 0 and len(resend_lines(lines)) == 1
    registry.check_invariants()


def test_rows_of_new_groups_and_of_expired_keys_are_not_flagged() -> None:
    registry, lines = logging_registry(num_rollouts_per_prompt=2)
    complete(registry, g=None, now=0.0)
    registry.arrive(arrival(0, g=None, digest="other prompt"), 1.0, Wakes())
    registry.arrive(arrival(0, g="explicit"), 1.0, Wakes())
    assert registry.legacy_resends_collecting == 0
    # Remembered as long as a result would be retained (cohort_result_ttl_s, 10 s here).
    registry.arrive(arrival(1, g=None), 10.5, Wakes())
    assert registry.legacy_resends_collecting == 0 and resend_lines(lines) == []
    registry.check_invariants()


def test_shutdown_and_clear_leave_no_resend_counted() -> None:
    registry, _ = logging_registry()
    complete(registry, g=None, now=0.0)
    registry.arrive(arrival(1, g=None), 1.0, Wakes())
    assert registry.legacy_resends_collecting == 1
    registry.shut_down(2.0)
    assert registry.legacy_resends_collecting == 0
    registry.check_invariants()
    registry.clear()
    assert len(registry.completed_legacy) == 0
