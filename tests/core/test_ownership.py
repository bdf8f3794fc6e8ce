"""Who evaluates a group, on a store with leases (several processes) and without one: claims,
fencing tokens, offers, renewals and take-over, without an event loop."""

from __future__ import annotations

from one_group import Groups, arrival

from genrm_trio.core.outcomes import Masked, Rejected
from genrm_trio.core.records import Phase
from genrm_trio.core.transition import Abandon, Finish, Renew, ShutDown, TakeOverDue
from genrm_trio.core.verdicts import Verdict

LEASE_S = 6.0


def filled(groups: Groups, now: float = 0.0, hand_over: int | None = None) -> object:
    groups.arrive(arrival(0), now=now)
    return groups.arrive(arrival(1), now=now, hand_over=hand_over)


def test_without_a_lease_the_first_member_makes_the_group_this_processs() -> None:
    groups = Groups()
    first = groups.arrive(arrival(0))
    assert first.collecting is not None and first.collecting.work.fence == 1
    claim = groups.arrive(arrival(1), now=2.0).claim
    assert claim is not None and claim.work.fence == 1 and claim.renew_every is None
    record = groups.record()
    assert (record.fence, record.lease_until) == (1, None)
    assert record.evaluation_due == 2.0 + groups.rules.config.cohort_evaluation_timeout_s


def test_with_a_lease_the_transition_that_fills_the_group_claims_it() -> None:
    groups = Groups(lease_s=LEASE_S, early_judging=True)
    first = groups.arrive(arrival(0))
    # Nobody owns a group that collects: no deadline armed here, nothing judged early.
    assert first.collecting is None and first.jobs == []
    claim = filled(groups, now=1.0).claim
    assert claim is not None and claim.work.fence == 1 and claim.renew_every == LEASE_S / 3
    assert len(claim.jobs) == 2
    assert groups.record().lease_until == 1.0 + LEASE_S


def test_a_group_filled_by_a_busy_process_is_offered_not_claimed() -> None:
    groups = Groups(lease_s=LEASE_S)
    decision = filled(groups, now=1.0, hand_over=5)
    assert decision.claim is None and decision.offered == 5
    record = groups.record()
    # Token 0 and a lease already run out: any process may claim it as it takes one over.
    assert (record.fence, record.lease_until) == (0, 1.0)
    taken = groups.send("e:g", TakeOverDue(), now=1.01)
    assert taken.claim is not None and taken.claim.work.fence == 1
    assert taken.logs == []  # an offered group is claimed, not taken over


def test_an_expired_lease_is_taken_over_with_a_new_token_and_the_old_owner_is_fenced() -> None:
    groups = Groups(lease_s=LEASE_S)
    old = filled(groups).claim
    assert groups.send("e:g", TakeOverDue(), now=LEASE_S - 0.1).claim is None  # still held
    taken = groups.send("e:g", TakeOverDue(), now=LEASE_S)
    assert taken.claim is not None and taken.claim.work.fence == 2
    assert [text for _, text, _ in taken.logs] == [
        "GenRM took over the evaluation of key='group_id::g::group_attempt::0' after its "
        "owner's lease expired"
    ]
    # The old owner can neither renew nor publish.
    assert not groups.send("e:g", Renew(old.work.rid, 1), now=LEASE_S + 1).held
    verdicts = {0: Verdict(4, 2, 1), 1: Verdict(4, 2, 1)}
    stale = Finish(old.work.rid, 1, verdicts, {}, 2, False)
    assert not groups.send("e:g", stale, now=LEASE_S + 1).held
    assert groups.record().phase is Phase.EVALUATING
    fresh = Finish(old.work.rid, 2, verdicts, {}, 2, False)
    assert groups.send("e:g", fresh, now=LEASE_S + 2).held
    assert groups.record().phase is Phase.COMPLETED


def test_a_renewal_keeps_the_lease_from_now() -> None:
    groups = Groups(lease_s=LEASE_S)
    claim = filled(groups).claim
    assert groups.send("e:g", Renew(claim.work.rid, 1), now=4.0).held
    assert groups.record().lease_until == 4.0 + LEASE_S
    assert groups.send("e:g", TakeOverDue(), now=LEASE_S + 1).claim is None


def test_a_lease_that_runs_out_after_the_evaluation_deadline_fails_the_group() -> None:
    groups = Groups(lease_s=LEASE_S, cohort_evaluation_timeout_s=5.0)
    decisions = [groups.arrive(arrival(i)) for i in range(2)]
    expired = groups.send("e:g", TakeOverDue(), now=LEASE_S)
    assert expired.claim is None
    outcome = groups.answer(decisions[0])
    assert isinstance(outcome, Masked)
    assert outcome.text.startswith("GenRM cohort evaluation deadline exceeded")


def test_a_group_with_a_lease_outlives_this_processs_shutdown_and_cancellation() -> None:
    groups = Groups(lease_s=LEASE_S)
    claim = filled(groups).claim
    assert groups.send("e:g", ShutDown()).finished == []
    assert groups.send("e:g", Abandon(claim.work.rid)).finished == []
    assert groups.record().phase is Phase.EVALUATING


def test_a_group_without_a_lease_dies_with_its_evaluation() -> None:
    groups = Groups()
    decisions = [groups.arrive(arrival(i)) for i in range(2)]
    rid = groups.record().rid
    assert groups.send("e:g", Abandon("another record")).finished == []
    groups.send("e:g", Abandon(rid))
    assert groups.answer(decisions[1]) == Rejected(503, "GenRM cohort evaluation was cancelled")
