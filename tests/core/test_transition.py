"""The group state machine without an event loop: one group, one event, one decision."""

from __future__ import annotations

import pytest
from one_group import Groups, arrival

from genrm_trio.core.outcomes import Masked, Rejected, Scored
from genrm_trio.core.records import Phase, group_key
from genrm_trio.core.transition import (
    Answer,
    CollectionDue,
    Fail,
    Finish,
    ShutDown,
    Wait,
)
from genrm_trio.core.verdicts import Verdict

SUPERSEDED = "GenRM group 'g' attempt 0 was superseded by attempt 1"


def finish(groups: Groups, ref: str = "e:g", now: float = 1.0, **failed: str) -> object:
    """Every comparison of the group's record ends with a (4, 2, 1) verdict, but those named
    in ``failed`` (by comparison index, as ``c<index>``)."""
    record = groups.record(ref)
    lost = {int(name[1:]): text for name, text in failed.items()}
    verdicts = {c.index: Verdict(4, 2, 1) for c in record.plan if c.index not in lost}
    event = Finish(record.rid, record.fence, verdicts, lost, len(record.plan), False)
    return groups.send(ref, event, now)


def complete(groups: Groups, g: str | None = "g", now: float = 0.0, **kw: object) -> list[object]:
    """Every slot filled, then every comparison judged: the answers in slot order."""
    decisions = [groups.arrive(arrival(i, g, **kw), now=now) for i in range(groups.size)]
    ref = f"e:{g}" if g is not None else "l:" + group_key(None, 0, kw.get("task"), None, "d")
    finish(groups, ref, now)
    return [groups.answer(d) for d in decisions]


def test_group_key_forms() -> None:
    assert group_key("g", 1, 7, "p", "D") == "group_id::g::group_attempt::1"
    assert group_key(None, 0, 7, "p", "D") == "task_idx::7::D::group_attempt::0"
    assert group_key(None, 2, None, "p", "D") == "prompt_id::p::D::group_attempt::2"
    assert group_key(None, 0, None, None, "D") == "D::group_attempt::0"


def test_members_wait_until_the_group_is_full_then_its_evaluation_is_claimed() -> None:
    groups = Groups()
    first = groups.arrive(arrival(0))
    assert isinstance(first.replies[0], Wait) and first.replies[0].kept
    # Without a lease, the group is this process's from its first member.
    assert first.collecting is not None and first.claim is None
    assert first.collecting.collection_due == groups.rules.config.cohort_collection_timeout_s
    second = groups.arrive(arrival(1))
    claim = second.claim
    assert claim is not None and claim.work.rid == first.collecting.work.rid
    assert [(j.comparison.first, j.comparison.second) for j in claim.jobs] == [(0, 1), (1, 0)]
    assert [(j.text_1, j.text_2) for j in claim.jobs] == [
        ("answer-0", "answer-1"),
        ("answer-1", "answer-0"),
    ]
    assert groups.record().phase is Phase.EVALUATING


def test_early_judging_hands_out_each_comparison_once_both_slots_are_filled() -> None:
    groups = Groups(num_rollouts_per_prompt=4, early_judging=True)
    started: list[tuple[int, int]] = []
    for slot in (0, 2, 1, 3):
        decision = groups.arrive(arrival(slot))
        started += [(j.comparison.first, j.comparison.second) for j in decision.jobs]
        if decision.claim is not None:
            started += [(j.comparison.first, j.comparison.second) for j in decision.claim.jobs]
        if slot == 1:
            # (0, 1) and (1, 2) became judgeable; the group is still collecting.
            assert started == [(0, 1), (1, 2)]
            assert groups.record().phase is Phase.COLLECTING
    assert started == [(0, 1), (1, 2), (2, 3), (3, 0)]


def test_publication_answers_every_slot_at_once_with_its_reward() -> None:
    groups = Groups()
    decisions = [groups.arrive(arrival(i)) for i in range(2)]
    duplicate = groups.arrive(arrival(0))
    assert duplicate.replies == [Wait(groups.record().rid, 0, kept=False)]
    assert duplicate.claim is None and duplicate.collecting is None
    assert all(groups.answer(d) is None for d in [*decisions, duplicate])
    ended = finish(groups)
    assert [groups.answer(d).reward for d in [*decisions, duplicate]] == [3.0, 3.0, 3.0]
    assert [f.disposition for f in ended.finished] == ["completed"]
    record = groups.record()
    assert record.phase is Phase.COMPLETED
    assert all(m.texts is None for m in record.members.values())


def test_a_replay_after_completion_answers_the_kept_reward_without_work() -> None:
    groups = Groups()
    complete(groups)
    replay = groups.arrive(arrival(1), now=1.0)
    assert isinstance(replay.replies[0], Answer)
    assert replay.replies[0].outcome == Scored(3.0, replay.replies[0].outcome.metrics)
    assert replay.claim is None and replay.finished == [] and replay.jobs == []


def test_a_different_response_for_a_filled_slot_is_a_conflict_that_changes_nothing() -> None:
    groups = Groups()
    groups.arrive(arrival(0))
    conflict = groups.arrive(arrival(0, fp=b"x" * 32))
    assert conflict.replies == [
        Answer(
            Rejected(
                409,
                "GenRM cohort 'group_id::g::group_attempt::0' already has a different response "
                "for rollout_index=0",
            )
        )
    ]
    assert list(groups.record().members) == [0]


def test_an_inconsistent_prompt_is_rejected_for_the_same_and_a_higher_attempt() -> None:
    groups = Groups()
    groups.arrive(arrival(0))
    same = groups.arrive(arrival(1, digest="other"))
    higher = groups.arrive(arrival(0, a=1, digest="other"))
    text = "GenRM group 'g' received inconsistent prompt or principle content"
    assert same.replies == higher.replies == [Answer(Rejected(409, text))]
    assert groups.record().attempt == 0  # nothing was superseded


def test_a_higher_attempt_supersedes_the_active_record_which_ends_for_its_waiters() -> None:
    groups = Groups()
    old = groups.arrive(arrival(0))
    new = groups.arrive(arrival(0, a=1, fp=b"n" * 32), now=1.0)
    assert groups.answer(old) == Rejected(503, SUPERSEDED)
    assert [f.ended.rid for f in new.finished] == [old.replies[0].rid]
    assert new.collecting is not None and new.collecting.work.attempt == 1
    late = groups.arrive(arrival(1), now=2.0)
    assert late.replies == [Answer(Rejected(409, SUPERSEDED))]


def test_one_batch_that_fills_and_then_supersedes_a_group_hands_out_no_work_for_it() -> None:
    groups = Groups()
    decision = groups.arrive(arrival(0), arrival(1), arrival(0, a=1, fp=b"n" * 32))
    assert groups.answer(decision, 0) == groups.answer(decision, 1) == Rejected(503, SUPERSEDED)
    assert decision.claim is None  # the claimed record did not survive the transition
    assert decision.collecting is not None and decision.collecting.work.attempt == 1
    assert decision.collecting.work.rid != decision.replies[0].rid


def test_a_late_result_of_a_superseded_record_never_publishes() -> None:
    groups = Groups()
    groups.arrive(arrival(0))
    groups.arrive(arrival(1))
    old = groups.record()
    groups.arrive(arrival(0, a=1), now=1.0)
    late = groups.send("e:g", Finish(old.rid, old.fence, {}, {}, 2, False), now=2.0)
    assert not late.held and late.finished == []
    assert all(m.outcome is None for m in old.members.values())


def test_the_collection_deadline_fails_a_collecting_group_only() -> None:
    groups = Groups(cohort_collection_timeout_s=0.05)
    first = groups.arrive(arrival(0))
    early = groups.send("e:g", CollectionDue(), now=0.04)
    assert early.finished == []
    groups.send("e:g", CollectionDue(), now=0.05)
    text = (
        "GenRM cohort 'group_id::g::group_attempt::0' did not collect 2 unique rollout indices"
        " within 0.05s"
    )
    assert groups.answer(first) == Rejected(503, text)
    later = groups.arrive(arrival(1, fp=b"z" * 32), now=0.1)
    assert later.replies == [Answer(Rejected(503, text))]


def test_a_full_group_ignores_a_late_collection_deadline() -> None:
    groups = Groups()
    groups.arrive(arrival(0))
    groups.arrive(arrival(1))
    assert groups.send("e:g", CollectionDue(), now=5000.0).finished == []
    assert groups.record().phase is Phase.EVALUATING


def test_a_conversion_failure_fails_the_group_for_every_member() -> None:
    groups = Groups()
    first = groups.arrive(arrival(0))
    bad = groups.arrive(arrival(1, fail=True))
    text = "GenRM cohort input conversion failed: RuntimeError: bad request conversion"
    assert bad.replies == [Answer(Rejected(503, text))]
    assert groups.answer(first) == Rejected(503, text)


def test_partial_masking_masks_only_the_rollouts_of_the_failed_comparison() -> None:
    groups = Groups(num_rollouts_per_prompt=4)
    decisions = [groups.arrive(arrival(i)) for i in range(4)]
    assert (groups.record().plan[1].first, groups.record().plan[1].second) == (1, 2)
    finish(groups, c1="GenRM judge X pair=(1, 2): boom")
    outcomes = [groups.answer(d) for d in decisions]
    assert isinstance(outcomes[1], Masked) and isinstance(outcomes[2], Masked)
    assert outcomes[1].text == (
        "GenRM rollout_index=1 lost a comparison to a judge failure (1 of 4 comparisons failed): "
        "GenRM judge X pair=(1, 2): boom"
    )
    assert isinstance(outcomes[0], Scored) and isinstance(outcomes[3], Scored)
    assert outcomes[0].reward == 3.0 and outcomes[3].reward == 3.0
    assert outcomes[0].metrics is not None
    assert outcomes[0].metrics["genrm_failed_comparison_rate_per_group"] == 0.25
    assert outcomes[0].metrics["genrm_masked_rollout_rate_per_group"] == 0.5
    # A masked member answers its masked row even for a regenerated answer.
    late = groups.arrive(arrival(2, fp=b"r" * 32), now=2.0)
    assert late.replies == [Answer(outcomes[2])]


def test_every_rollout_masked_fails_the_group_with_the_first_failure() -> None:
    groups = Groups()
    decisions = [groups.arrive(arrival(i)) for i in range(2)]
    finish(groups, c1="second", c0="first")
    expected = Masked(
        "GenRM cohort 'group_id::g::group_attempt::0' failed: every rollout was masked "
        "(2 of 2 comparisons failed); first failure: first"
    )
    assert [groups.answer(d) for d in decisions] == [expected, expected]
    assert groups.record().phase is Phase.FAILED


def test_non_finite_rewards_are_refused_before_anything_is_published() -> None:
    groups = Groups()
    decisions = [groups.arrive(arrival(i)) for i in range(2)]
    record = groups.record()
    huge = {c.index: Verdict(1e308, 1e308, 3.5) for c in record.plan}
    with pytest.raises(RuntimeError, match="non-finite cohort rewards"):
        groups.send("e:g", Finish(record.rid, record.fence, huge, {}, 2, False), now=1.0)
    assert record.phase is Phase.EVALUATING
    assert all(groups.answer(d) is None for d in decisions)
    assert all(m.outcome is None for m in record.members.values())


def test_a_non_judge_error_fails_the_group_of_the_evaluation_that_owns_it() -> None:
    groups = Groups()
    decisions = [groups.arrive(arrival(i)) for i in range(2)]
    record = groups.record()
    stale = groups.send("e:g", Fail(record.rid, record.fence + 1, "x"), now=1.0)
    assert not stale.held and record.phase is Phase.EVALUATING
    groups.send("e:g", Fail(record.rid, record.fence, "GenRM cohort evaluation failed: x"))
    assert groups.answer(decisions[0]) == Rejected(503, "GenRM cohort evaluation failed: x")


def test_a_legacy_group_retires_once_completed_and_a_failed_one_answers_with_the_suffix() -> None:
    groups = Groups(cohort_collection_timeout_s=0.05)
    complete(groups, g=None, task=7)
    ref = "l:" + group_key(None, 0, 7, None, "d")
    assert groups.groups[ref].record is None and groups.groups[ref].completed_at == 0.0
    again = groups.arrive(arrival(0, g=None, task=7), now=2.0)
    assert isinstance(again.replies[0], Wait)  # a new group, never a replay
    groups.send(ref, CollectionDue(), now=2.05)
    late = groups.arrive(arrival(1, g=None, task=7, fp=b"q" * 32), now=3.0)
    outcome = groups.answer(late)
    assert isinstance(outcome, Rejected)
    assert outcome.detail.endswith(
        "Reusing the task/prompt key could mix delayed answers into a replacement group."
    )


def test_results_and_watermarks_expire_by_the_ttl_as_the_group_sees_them() -> None:
    # AS-133, for one group: its result and its watermark age separately.
    groups = Groups()
    complete(groups, "a", now=100.0)
    replay = groups.arrive(arrival(0, "a"), now=109.0)
    assert isinstance(replay.replies[0], Answer)
    assert groups.groups["e:a"].idle_since == 109.0  # the replay renewed the watermark only
    gone = groups.arrive(arrival(0, "a"), now=110.6)
    assert gone.replies == [
        Answer(
            Rejected(
                409,
                "GenRM group 'a' attempt 0 already finished and its result is no longer "
                "retained; retry with a higher _ng_group_attempt",
            )
        )
    ]
    fresh = groups.arrive(arrival(0, "a"), now=119.1)  # both gone: a fresh group
    assert isinstance(fresh.replies[0], Wait) and fresh.collecting is not None


def test_shutdown_fails_an_active_group_that_dies_with_the_process() -> None:
    groups = Groups()
    waiting = groups.arrive(arrival(0, "x"))
    groups.send("e:x", ShutDown(), now=1.0)
    assert groups.answer(waiting) == Rejected(503, "GenRM server is shutting down")


# ---- §5.14: a row resent under a legacy key whose group already completed ----------------------


def legacy_groups(**overrides: object) -> Groups:
    settings = {"num_rollouts_per_prompt": 4, "cohort_collection_timeout_s": 1800.0}
    return Groups(**{**settings, **overrides})


def resend_lines(decision: object) -> list[tuple[int, str]]:
    logs = decision.logs
    return [(level, text) for level, text, _ in logs if text.startswith("GenRM legacy group")]


def test_a_row_resent_after_its_legacy_group_completed_is_logged_at_arrival() -> None:
    groups = legacy_groups()
    complete(groups, g=None, now=100.0)
    resent = groups.arrive(arrival(2, g=None), now=103.5)
    assert isinstance(resent.replies[0], Wait)
    key = "d::group_attempt::0"
    assert groups.record(f"l:{key}").legacy_resend
    assert resend_lines(resent) == [
        (
            30,
            f"GenRM legacy group '{key}' completed 3.5s ago; rollout_index=2 starts a new group "
            "under the same key, which completes only if all 4 members are sent again, and "
            "otherwise fails after 1800.0s (cohort_collection_timeout_s). A legacy group has no "
            "replay: to retry some rollouts of a finished group, send the whole group again "
            "under a fresh _ng_group_id shared by every member.",
        )
    ]
    # Its other members resent one at a time join the same group: one line.
    assert resend_lines(groups.arrive(arrival(0, g=None), now=104.0)) == []
    groups.send(f"l:{key}", CollectionDue(), now=1903.5)
    assert not groups.record(f"l:{key}").legacy_resend
    outcome = groups.answer(resent)
    assert isinstance(outcome, Rejected) and outcome.status == 503


def test_a_whole_legacy_group_sent_again_is_judged() -> None:
    # C-91 is unchanged: a later run of the same task on a live server gets judged.
    groups = legacy_groups(num_rollouts_per_prompt=2)
    complete(groups, g=None, now=0.0)
    outcomes = complete(groups, g=None, now=5.0)
    assert [type(o) for o in outcomes] == [Scored, Scored]


def test_rows_of_new_groups_and_of_expired_keys_are_not_flagged() -> None:
    groups = legacy_groups(num_rollouts_per_prompt=2, cohort_result_ttl_s=10.0)
    complete(groups, g=None, now=0.0)
    other = groups.arrive(arrival(0, g=None, digest="other prompt"), now=1.0)
    explicit = groups.arrive(arrival(0, g="explicit"), now=1.0)
    # Remembered as long as a result would be retained (cohort_result_ttl_s, 10 s here).
    expired = groups.arrive(arrival(1, g=None), now=10.5)
    assert resend_lines(other) == resend_lines(explicit) == resend_lines(expired) == []
    assert not groups.record("l:d::group_attempt::0").legacy_resend


def test_a_row_resent_on_its_own_under_a_legacy_key_is_answered_masked_at_once() -> None:
    groups = legacy_groups(num_rollouts_per_prompt=2)
    complete(groups, g=None, now=0.0)
    resent = groups.arrive(arrival(1, g=None, resend="a retry of one rollout"), now=2.0)
    outcome = groups.answer(resent)
    assert isinstance(outcome, Masked)
    assert "was sent again on its own (a retry of one rollout)" in outcome.text
    assert "its group completed 2.0s ago" in outcome.text
    assert "l:d::group_attempt::0" not in groups.groups or (
        groups.groups["l:d::group_attempt::0"].record is None
    )
