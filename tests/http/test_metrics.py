"""`GET /metrics` (§9.3, X-6): after a known workload with judge faults, every series counts
exactly what the server did, with no group-id labels; each app has series of its own."""

from __future__ import annotations

from typing import Any

import httpx
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from genrm_trio.testing.fake_judge import FakeJudge
from genrm_trio.testing.harness import member, running_server

REPLICA = "http://fake-judge/v1"


def rule(i: int, j: int, q: int, action: str, **fields: Any) -> dict[str, Any]:
    """A fake-judge rule for pair (i, j) of the group whose members all have quality q."""
    return {
        "match": {"response_1": f"answer-{i} [[q={q}]]", "response_2": f"answer-{j} [[q={q}]]"},
        "action": action,
        **fields,
    }


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def total(samples: dict[Any, float], name: str, **labels: str) -> float:
    """Sum over every series of ``name`` whose labels include ``labels``."""
    return sum(
        v
        for (sample, sample_labels), v in samples.items()
        if sample == name and set(labels.items()) <= set(sample_labels)
    )


# (quality of every member, group id): the rules above pick groups by their members' quality.
GROUPS = ((3, "g-fine"), (2, "g-part"), (4, "g-flaky"), (5, "g-unparsed"), (1, "g-dead"))


def group(q: int, g: str) -> list[dict[str, Any]]:
    return [member(i, q, g, 0) for i in range(4)]


async def test_counters_match_a_workload_with_judge_faults() -> None:
    judge = FakeJudge(
        rules=[
            rule(0, 1, 2, "http_status", status=500),  # g-part: (0, 1) fails
            rule(2, 3, 4, "budget_exhausted", times=1),  # g-flaky: one retry, then fine
            rule(1, 2, 5, "text", text="no verdict here"),  # g-unparsed: default verdict
            {"match": {"response_1": "[[q=1]]"}, "action": "http_status", "status": 503},
        ]
    )
    settings = {"num_rollouts_per_prompt": 4, "genrm_parse_retries": 1}
    async with running_server(settings, judge=judge) as server:
        replies = []
        for q, g in GROUPS:
            replies += await server.verify_all(group(q, g))
        assert sum(1 for r in replies if r.status == 200 and not r.masked) == 14
        assert sum(1 for r in replies if r.masked) == 6
        assert (await server.verify(member(0, 3, "g-fine", 0))).status == 200  # a replay
        regenerated = member(0, 3, "g-fine", 0, regenerated=True)
        assert (await server.verify(regenerated)).status == 409  # a different response
        assert (await server.verify({"response": 1})).status == 422
        async with trio.open_nursery() as nursery:
            pending = server.start_verify(nursery, member(0, 3, "g-fine", 1))
            await trio.testing.wait_all_tasks_blocked()
            superseded = await server.verify(member(1, 3, "g-fine", 0))
            assert superseded.status == 409 and "superseded by attempt 1" in superseded.detail
            samples = await scrape(server.client)
            health = (await server.get("/healthz")).body
            pending.disconnect()

    verify = "genrm_verify_requests_total"
    expected_verify = {
        "scored": 14, "masked": 6, "replayed": 1, "conflict": 1, "superseded": 1, "invalid": 1,
        "not_retained": 0, "inconsistent": 0, "unavailable": 0, "error": 0,
    }  # fmt: skip
    assert {k: value(samples, verify, outcome=k) for k in expected_verify} == expected_verify

    attempts = "genrm_judge_attempts_total"
    labels = {"api": "chat_completions", "replica": REPLICA}
    observed = {
        outcome: value(samples, attempts, outcome=outcome, **labels)
        for outcome in ("ok", "http_5xx", "budget_exhausted", "unusable", "transport", "timeout")
    }
    assert observed == {
        "ok": 14, "http_5xx": 10, "budget_exhausted": 1, "unusable": 2, "transport": 0,
        "timeout": 0,
    }  # fmt: skip
    assert total(samples, attempts) == 27 == judge.stats()["requests_total"]
    assert health["judge_attempts_total"] == 27
    retries = "genrm_judge_retries_total"
    assert value(samples, retries, reason="http_5xx", replica=REPLICA) == 5
    assert value(samples, retries, reason="budget_exhausted", replica=REPLICA) == 1
    assert value(samples, retries, reason="unusable", replica=REPLICA) == 1
    assert total(samples, retries) == 7

    comparisons = "genrm_comparisons_total"
    assert value(samples, comparisons, outcome="verdict") == 14
    assert value(samples, comparisons, outcome="default_fallback") == 1
    assert value(samples, comparisons, outcome="failed") == 5

    finished = "genrm_groups_finished_total"
    assert value(samples, finished, disposition="completed", kind="none") == 3
    assert value(samples, finished, disposition="partially_masked", kind="none") == 1
    assert value(samples, finished, disposition="failed", kind="judge") == 1
    assert value(samples, finished, disposition="failed", kind="cohort") == 0
    assert value(samples, "genrm_rollouts_masked_total") == 6
    assert value(samples, "genrm_groups_active", phase="collecting") == 1
    assert value(samples, "genrm_groups_active", phase="evaluating") == 0
    assert value(samples, "genrm_waiters") == 1
    assert value(samples, "genrm_retained_records") == 4  # attempt 1 of g-fine retired attempt 0
    assert value(samples, "genrm_judge_in_flight") == 0
    assert value(samples, "genrm_judge_concurrency_limit") == 256
    assert value(samples, "genrm_judge_replica_up", replica=REPLICA) == 1
    assert value(samples, "genrm_judge_replica_ejections_total", replica=REPLICA) == 0

    # Histograms count every attempt, slot wait and group once.
    duration = "genrm_judge_attempt_duration_seconds_count"
    assert value(samples, duration, replica=REPLICA) == 27
    assert value(samples, "genrm_judge_slot_wait_seconds_count") == 27
    assert value(samples, "genrm_group_collection_seconds_count") == 5
    assert value(samples, "genrm_group_evaluation_seconds_count") == 5
    # The replay and the conflicting response were told apart by their canonical fingerprints.
    assert value(samples, "genrm_fingerprint_seconds_count") >= 1

    # No series is labelled by group: label names come from a fixed set, values never hold keys.
    names = {name for _, sample_labels in samples for name, _ in sample_labels}
    assert names <= {"outcome", "api", "replica", "reason", "phase", "disposition", "kind",
                     "index", "le"}  # fmt: skip
    ids = {g for _, g in GROUPS}
    assert not any("group_id::" in v or v in ids for _, ls in samples for _, v in ls)


async def test_each_app_counts_only_its_own_requests() -> None:
    async with running_server() as first, running_server() as second:
        await first.complete("g", 0)
        first_samples = await scrape(first.client)
        second_samples = await scrape(second.client)
    assert value(first_samples, "genrm_verify_requests_total", outcome="scored") == 2
    assert value(second_samples, "genrm_verify_requests_total", outcome="scored") == 0
    assert total(second_samples, "genrm_judge_attempts_total") == 0


async def test_pruned_entries_are_counted_by_index_and_reason(autojump_clock: Any) -> None:
    async with running_server(cohort_result_ttl_s=10.0, max_terminal_cohorts=1) as server:
        await server.complete("a", 0)
        await server.complete("b", 0)
        await server.complete("c", 0)  # its arrival prunes "a": two retained, cap 1
        await trio.sleep(11)
        await server.complete("d", 0)  # its arrival prunes "b" and "c": past the TTL
        samples = await scrape(server.client)
    pruned = "genrm_pruned_total"
    for index in ("results", "watermarks"):
        assert value(samples, pruned, index=index, reason="count") == 1
        assert value(samples, pruned, index=index, reason="ttl") == 2
    assert value(samples, "genrm_prune_visits_total") >= 3
