"""Judge readiness as plain data (judge/_readiness.py): the replicas' probe state, the log lines
each change calls for, and the /readyz verdict; no event loop."""

from __future__ import annotations

import logging

from genrm_trio.judge import JudgeReadiness, ReplicaState, readiness_verdict

A = "http://judge-a:8000/v1"
B = "http://judge-b:8000/v1"
REFUSED = "ConnectError: cannot connect to judge-a:8000: Connection refused"
MEMORY = ("memory", True)


def levels(lines: list[tuple[int, str]]) -> list[int]:
    return [level for level, _ in lines]


def test_replicas_are_unknown_until_their_first_probe_ends() -> None:
    readiness = JudgeReadiness([A, B], probe_path="/models")
    assert [r.reachable for r in readiness.replicas] == [None, None]
    assert not readiness.answering()
    verdict = readiness_verdict(readiness.replicas, probing=True, store=MEMORY, shutting_down=False)
    assert verdict.status == "not_ready" and verdict.http_status == 503
    assert verdict.reasons == [
        f"judge replica {A} not probed yet",
        f"judge replica {B} not probed yet",
    ]


def test_a_probe_records_reachable_time_and_error() -> None:
    readiness = JudgeReadiness([A], probe_path="/models")
    assert readiness.record(0, at=100.0, error=REFUSED) == []  # the first round speaks at its end
    assert readiness.replicas[0] == ReplicaState(A, False, 100.0, REFUSED)
    readiness.finish_round()
    readiness.record(0, at=110.0, error=None)
    assert readiness.replicas[0] == ReplicaState(A, True, 110.0, None)
    assert readiness.answering()


def test_a_first_round_with_no_replica_answering_logs_one_error_naming_each() -> None:
    readiness = JudgeReadiness([A, B], probe_path="/models")
    readiness.record(0, at=1.0, error=REFUSED)
    readiness.record(1, at=1.0, error="HTTP 404")
    lines = readiness.finish_round()
    assert levels(lines) == [logging.ERROR]
    text = lines[0].text
    assert f"GET {A}/models ({REFUSED})" in text
    assert f"GET {B}/models (HTTP 404)" in text
    # Later rounds that find the same say nothing more: one line, not one per interval.
    for at in (11.0, 21.0):
        assert readiness.record(0, at=at, error=REFUSED) == []
        assert readiness.record(1, at=at, error="Timeout: no reply within 5 s") == []
        assert readiness.finish_round() == []


def test_a_first_round_with_some_replica_answering_warns_for_the_others() -> None:
    readiness = JudgeReadiness([A, B], probe_path="/models")
    readiness.record(0, at=1.0, error=REFUSED)
    readiness.record(1, at=1.0, error=None)
    lines = readiness.finish_round()
    assert lines == [(logging.WARNING, f"GenRM judge replica {A} unreachable: {REFUSED}")]


def test_a_first_round_where_every_replica_answers_is_silent() -> None:
    readiness = JudgeReadiness([A], probe_path="/models")
    assert readiness.record(0, at=1.0, error=None) == []
    assert readiness.finish_round() == []


def test_each_change_after_the_first_round_is_logged_once() -> None:
    readiness = JudgeReadiness([A], probe_path="/models")
    readiness.record(0, at=1.0, error=None)
    readiness.finish_round()
    went = readiness.record(0, at=11.0, error=REFUSED)
    assert went == [(logging.WARNING, f"GenRM judge replica {A} unreachable: {REFUSED}")]
    readiness.finish_round()
    assert readiness.record(0, at=21.0, error="Timeout: no reply within 5 s") == []
    readiness.finish_round()
    back = readiness.record(0, at=31.0, error=None)
    assert back == [(logging.INFO, f"GenRM judge replica {A} answers again")]
    assert readiness.record(0, at=41.0, error=None) == []


def test_ready_when_one_replica_answers_and_the_store_is_available() -> None:
    replicas = [ReplicaState(A, False, 5.0, REFUSED), ReplicaState(B, True, 5.0, None)]
    verdict = readiness_verdict(replicas, probing=True, store=MEMORY, shutting_down=False)
    assert verdict == ("ready", [])
    assert verdict.http_status == 200


def test_not_ready_names_every_failing_replica_and_its_error() -> None:
    replicas = [ReplicaState(A, False, 5.0, REFUSED), ReplicaState(B, False, 5.0, "HTTP 503")]
    verdict = readiness_verdict(replicas, probing=True, store=MEMORY, shutting_down=False)
    assert verdict.status == "not_ready"
    assert verdict.reasons == [
        f"judge replica {A} unreachable: {REFUSED}",
        f"judge replica {B} unreachable: HTTP 503",
    ]


def test_an_unavailable_group_store_is_not_ready_even_with_a_judge() -> None:
    replicas = [ReplicaState(A, True, 5.0, None)]
    store = ("redis://10.0.0.2:6379/0", False)
    verdict = readiness_verdict(replicas, probing=True, store=store, shutting_down=False)
    assert verdict == ("not_ready", ["group store redis://10.0.0.2:6379/0 unavailable"])


def test_probing_off_leaves_readiness_to_the_store() -> None:
    readiness = JudgeReadiness([A], probe_path=None)
    assert not readiness.probing
    verdict = readiness_verdict(
        readiness.replicas, probing=False, store=MEMORY, shutting_down=False
    )
    assert verdict == ("ready", [])
    assert readiness.replicas == [ReplicaState(A, None, None, None)]


def test_shutting_down_is_never_ready() -> None:
    replicas = [ReplicaState(A, True, 5.0, None)]
    verdict = readiness_verdict(replicas, probing=True, store=MEMORY, shutting_down=True)
    assert verdict == ("shutting_down", ["GenRM server is shutting down"])
    assert verdict.http_status == 503
