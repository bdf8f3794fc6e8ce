"""Judge replica choice (X-3, J-36…J-38) as plain bookkeeping, without an event loop: bounded-load
affinity, ejection with a cool-down and a probe, retries elsewhere, per-replica caps; then the
judge client following those choices over in-memory judges."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from genrm_trio.config import config_from_mapping
from genrm_trio.fakes.memory_transport import MemoryTransport
from genrm_trio.judge.balancer import Balancer, Pick
from genrm_trio.judge.client import JudgeClient, JudgeFailure, JudgeTask, JudgeVerdict
from genrm_trio.judge.transport import JudgeEndpoint, JudgeTransport
from genrm_trio.testing import FakeJudge

URLS = ["http://a/v1", "http://b/v1", "http://c/v1", "http://d/v1"]


def test_every_comparison_of_a_group_prefers_the_same_replica_and_groups_spread() -> None:
    balancer = Balancer(URLS)
    homes: dict[str, set[int]] = {}
    for group in range(200):
        key = f"group_id::g{group}::group_attempt::0"
        for _ in range(3):
            pick = balancer.choose(key, 0.0)
            assert pick is not None and not pick.probe
            homes.setdefault(key, set()).add(pick.replica)
            balancer.finished(pick, failed=False, now=0.0)
    assert all(len(home) == 1 for home in homes.values())
    per_replica = [sum(1 for home in homes.values() if index in home) for index in range(4)]
    # Rendezvous hashing spreads 200 groups over four replicas, none left idle or swamped.
    assert all(25 <= count <= 80 for count in per_replica), per_replica


def test_a_preferred_replica_with_clearly_more_in_flight_is_passed_over() -> None:
    balancer = Balancer(URLS[:2], load_factor=1.25)
    key = "group_id::busy::group_attempt::0"
    home, other = balancer.ranking(key)
    picks = [balancer.choose(key, 0.0) for _ in range(8)]
    indexes = [pick.replica for pick in picks if pick is not None]
    # The home replica takes attempts until it holds more than 1.25x the mean, counting the
    # new one; then the next replica in the group's ranking takes them.
    assert indexes[:2] == [home, home]
    assert indexes.count(home) == 5 and indexes.count(other) == 3
    loads = [replica.in_flight for replica in balancer.replicas]
    assert max(loads) - min(loads) <= 2


def test_least_outstanding_ignores_the_group() -> None:
    balancer = Balancer(URLS[:3], policy="least_outstanding")
    picks = [balancer.choose("group_id::g::group_attempt::0", 0.0) for _ in range(6)]
    assert [pick.replica for pick in picks if pick is not None] == [0, 1, 2, 0, 1, 2]


def test_repeated_failures_eject_a_replica_until_a_probe_after_the_cool_down_succeeds() -> None:
    balancer = Balancer(URLS[:2], eject_after=3, cooldown_s=10.0, policy="least_outstanding")
    bad = Pick(0, False)
    for now in (1.0, 2.0):
        balancer.replicas[0].in_flight += 1
        assert not balancer.finished(bad, failed=True, now=now)
    balancer.replicas[0].in_flight += 1
    assert balancer.finished(bad, failed=True, now=3.0)
    assert balancer.replicas[0].ejected_until == 13.0 and balancer.replicas[0].ejections == 1
    # During the cool-down every attempt goes to the other replica.
    assert {balancer.choose(None, 12.9).replica for _ in range(5)} == {1}  # type: ignore[union-attr]
    # After it, exactly one attempt probes the ejected replica; others keep away until it answers.
    probe = balancer.choose(None, 13.0)
    assert probe == Pick(0, True)
    assert balancer.choose(None, 13.5) == Pick(1, False)
    assert not balancer.finished(probe, failed=False, now=14.0)
    assert balancer.replicas[0].in_service
    assert balancer.choose(None, 14.0) == Pick(0, False)


def test_a_failed_probe_ejects_again_and_a_success_in_between_resets_the_count() -> None:
    balancer = Balancer(URLS[:2], eject_after=2, cooldown_s=5.0, policy="least_outstanding")
    for failed in (True, False, True):  # never two in a row
        balancer.replicas[0].in_flight += 1
        assert not balancer.finished(Pick(0, False), failed=failed, now=0.0)
    balancer.replicas[0].in_flight += 1
    assert balancer.finished(Pick(0, False), failed=True, now=0.0)
    probe = balancer.choose(None, 5.0)
    assert probe == Pick(0, True)
    assert balancer.finished(probe, failed=True, now=6.0)
    assert balancer.replicas[0].ejected_until == 11.0 and balancer.replicas[0].ejections == 2
    # An attempt that cannot afford to fail (its comparison's last) never probes.
    assert balancer.choose(None, 11.0, may_probe=False) == Pick(1, False)


def test_a_cancelled_probe_leaves_the_replica_due_for_another() -> None:
    balancer = Balancer(URLS[:2], eject_after=1, cooldown_s=1.0)
    balancer.replicas[0].in_flight += 1
    balancer.finished(Pick(0, False), failed=True, now=0.0)
    probe = balancer.choose(None, 1.0)
    assert probe == Pick(0, True)
    assert not balancer.finished(probe, failed=None, now=1.5)
    assert balancer.choose(None, 1.5) == Pick(0, True)


def test_late_results_of_attempts_started_before_an_ejection_change_nothing() -> None:
    balancer = Balancer(URLS[:2], eject_after=1, cooldown_s=10.0)
    first = balancer.choose("k", 0.0)
    second = balancer.choose("k", 0.0)
    assert first is not None and second is not None and first.replica == second.replica
    assert balancer.finished(first, failed=True, now=1.0)
    assert not balancer.finished(second, failed=False, now=2.0)
    assert not balancer.replicas[first.replica].in_service


def test_a_retry_avoids_the_replica_of_its_previous_attempt_when_it_can() -> None:
    balancer = Balancer(URLS[:3])
    key = "group_id::r::group_attempt::0"
    home = balancer.ranking(key)[0]
    retry = balancer.choose(key, 0.0, avoid=home)
    assert retry is not None and retry.replica != home
    alone = Balancer(URLS[:1])
    assert alone.choose(key, 0.0, avoid=0) == Pick(0, False)


def test_per_replica_cap_sends_attempts_elsewhere_then_makes_the_caller_wait() -> None:
    balancer = Balancer(URLS[:2], per_replica_cap=2)
    picks = [balancer.choose("same-group", 0.0) for _ in range(4)]
    assert sorted(pick.replica for pick in picks if pick is not None) == [0, 0, 1, 1]
    assert balancer.choose("same-group", 0.0) is None
    assert picks[0] is not None
    balancer.finished(picks[0], failed=False, now=0.0)
    assert balancer.choose("same-group", 0.0) == Pick(picks[0].replica, False)


def test_with_every_replica_ejected_attempts_go_to_the_one_back_soonest() -> None:
    balancer = Balancer(URLS[:2], eject_after=1, cooldown_s=10.0)
    for index, now in ((0, 0.0), (1, 3.0)):
        balancer.replicas[index].in_flight += 1
        assert balancer.finished(Pick(index, False), failed=True, now=now)
    assert balancer.choose("k", 5.0) == Pick(0, False)


def test_a_single_replica_is_never_ejected() -> None:
    balancer = Balancer(URLS[:1], eject_after=1)
    for _ in range(5):
        pick = balancer.choose("k", 0.0)
        assert pick == Pick(0, False)
        assert not balancer.finished(pick, failed=True, now=0.0)
    assert balancer.replicas[0].in_service and balancer.replicas[0].ejections == 0


@pytest.mark.parametrize("bad", [{"urls": []}, {"eject_after": 0}, {"load_factor": 0.5}])
def test_settings_that_cannot_work_are_refused(bad: dict[str, object]) -> None:
    arguments: dict[str, object] = {"urls": URLS[:2], **bad}
    urls = arguments.pop("urls")
    with pytest.raises(ValueError):
        Balancer(urls, **arguments)  # type: ignore[arg-type]


# ---- through the judge client (in-memory judges, mock clock) ------------------------------------


def replica_client(judges: dict[str, FakeJudge], **overrides: Any) -> JudgeClient:
    def factory(endpoint: JudgeEndpoint) -> JudgeTransport:
        return MemoryTransport(judges[endpoint.url.rsplit("/chat/completions", 1)[0]], endpoint)

    config = config_from_mapping(
        {
            "judge_base_urls": list(judges),
            "judge_model": "judge",
            "genrm_parse_retry_sleep_s": 0.0,
            "judge_replica_eject_after": 1,
            "judge_replica_cooldown_s": 5.0,
            **overrides,
        }
    )
    return JudgeClient(config, transport=factory)


def task(group: str) -> JudgeTask:
    return JudgeTask(
        history=[{"role": "user", "content": group}],
        principle=None,
        text_1="answer-0 [[q=4]]",
        text_2="answer-1 [[q=2]]",
        pair=(0, 1),
        judge_pass=0,
        group_key=group,
    )


async def test_a_failed_attempt_is_retried_on_the_other_replica(autojump_clock: Any) -> None:
    judges = {url: FakeJudge() for url in URLS[:2]}
    client = replica_client(judges)
    home = client.balancer.ranking("g")[0]
    judges[URLS[home]].set_rules([{"action": "http_status", "status": 503, "times": 1}])
    result = await client.judge(task("g"))
    assert isinstance(result, JudgeVerdict) and result.attempts == 2
    assert [judge.stats()["requests_total"] for judge in judges.values()] == [1, 1]
    assert client.metrics.judge_attempts == {
        (URLS[home], "http_5xx"): 1,
        (URLS[1 - home], "ok"): 1,
    }
    assert client.metrics.replica_ejections == {URLS[home]: 1}


async def test_without_retries_any_attempt_probes_so_an_ejected_replica_comes_back(
    autojump_clock: Any,
) -> None:
    judges = {url: FakeJudge() for url in URLS[:2]}
    client = replica_client(judges, genrm_parse_retries=0)
    home = client.balancer.ranking("g")[0]
    judges[URLS[home]].set_rules([{"action": "http_status", "status": 503, "times": 1}])
    assert isinstance(await client.judge(task("g")), JudgeFailure)
    assert not client.balancer.replicas[home].in_service
    assert isinstance(await client.judge(task("g")), JudgeVerdict)  # on the other replica
    await trio.sleep(5.0)
    assert isinstance(await client.judge(task("g")), JudgeVerdict)  # the probe, on home
    assert client.balancer.replicas[home].in_service
    assert judges[URLS[home]].stats()["requests_total"] == 2
