"""`GET /metrics` (§9.3, X-6): after a known workload with judge faults, every series counts
exactly what the server did, with no group-id labels; each app has series of its own.

As one of `serve --workers N`'s workers (the parent's variables set, prometheus_client in its
multiprocess mode), the same series with the same values come from the workers' files, summed
over workers, and a dead worker's gauges leave the sum while its counts stay.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry, Gauge, generate_latest, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from genrm_trio.core.server_metrics import ATTEMPT_BUCKETS, Histogram
from genrm_trio.http._prometheus import metrics_registry, render_metrics
from genrm_trio.http._worker_metrics import (
    DERIVED_GAUGES,
    GAUGE_MODES,
    WORKERS_UP,
    Mirror,
    WorkerMetrics,
    WorkerSettings,
    worker_settings,
)
from genrm_trio.http.app import create_app
from genrm_trio.testing import FakeJudge
from genrm_trio.testing.harness import SCENARIO_DEFAULTS, member, running_server

REPLICA = "http://fake-judge/v1"


def rule(i: int, j: int, q: int, action: str, **fields: Any) -> dict[str, Any]:
    """A fake-judge rule for pair (i, j) of the group whose members all have quality q."""
    return {
        "match": {"response_1": f"answer-{i} [[q={q}]]", "response_2": f"answer-{j} [[q={q}]]"},
        "action": action,
        **fields,
    }


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(client: httpx.AsyncClient) -> Samples:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def parse(exposition: str) -> Samples:
    samples = {}
    for family in text_string_to_metric_families(exposition):
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


def judge_with_faults() -> FakeJudge:
    return FakeJudge(
        rules=[
            rule(0, 1, 2, "http_status", status=500),  # g-part: (0, 1) fails
            rule(2, 3, 4, "budget_exhausted", times=1),  # g-flaky: one retry, then fine
            rule(1, 2, 5, "text", text="no verdict here"),  # g-unparsed: default verdict
            {"match": {"response_1": "[[q=1]]"}, "action": "http_status", "status": 503},
        ]
    )


FAULTS_SETTINGS = {"num_rollouts_per_prompt": 4, "genrm_parse_retries": 1}


async def test_counters_match_a_workload_with_judge_faults() -> None:
    judge = judge_with_faults()
    async with running_server(FAULTS_SETTINGS, judge=judge) as server:
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
            await server.settle()
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


@pytest.mark.stores(
    "memory", why="the Redis store trims its retention sets by a script, without counting"
)
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


# Every counted series the contract lists, with the label values it names, on two replicas.
REPLICAS = ("http://judge-a:8000/v1", "http://judge-b:8000/v1")
COUNTED_FROM_THE_START = {
    "genrm_verify_requests_total": [
        {"outcome": o}
        for o in ("scored", "masked", "replayed", "conflict", "superseded", "not_retained",
                  "inconsistent", "unavailable", "invalid", "error")
    ],
    "genrm_compare_requests_total": [
        {"outcome": o} for o in ("scored", "unavailable", "invalid", "error")
    ],
    "genrm_judge_attempts_total": [
        {"api": "chat_completions", "outcome": o, "replica": r}
        for o in ("ok", "unusable", "budget_exhausted", "http_4xx", "http_408", "http_429",
                  "http_5xx", "transport", "timeout", "non_json", "cancelled")
        for r in REPLICAS
    ],
    "genrm_judge_retries_total": [
        {"reason": o, "replica": r}
        for o in ("unusable", "budget_exhausted", "http_408", "http_429", "http_5xx", "transport")
        for r in REPLICAS
    ],
    "genrm_comparisons_total": [
        {"outcome": o} for o in ("verdict", "default_fallback", "failed")
    ],
    "genrm_groups_finished_total": [
        {"disposition": d, "kind": k}
        for d, k in (("completed", "none"), ("partially_masked", "none"), ("failed", "judge"),
                     ("failed", "cohort"))
    ],
    "genrm_rollouts_masked_total": [{}],
    "genrm_pruned_total": [
        {"index": i, "reason": r} for i in ("results", "watermarks") for r in ("ttl", "count")
    ],
    "genrm_prune_visits_total": [{}],
    "genrm_judge_replica_ejections_total": [{"replica": r} for r in REPLICAS],
    "genrm_judge_attempt_duration_seconds_count": [{"replica": r} for r in REPLICAS],
    "genrm_judge_slot_wait_seconds_count": [{}],
    "genrm_group_collection_seconds_count": [{}],
    "genrm_group_evaluation_seconds_count": [{}],
    "genrm_fingerprint_seconds_count": [{}],
}  # fmt: skip


def missing_or_not_zero(samples: Samples) -> list[str]:
    """The series of COUNTED_FROM_THE_START that a scrape lacks or shows other than 0."""
    wrong = []
    for name, label_sets in COUNTED_FROM_THE_START.items():
        for labels in label_sets:
            found = samples.get((name, tuple(sorted(labels.items()))))
            if found != 0:
                wrong.append(f"{name}{labels} = {found}")
    return wrong


async def test_a_fresh_server_reports_every_counted_series_at_zero() -> None:
    # A rate() or an increase() over a series that appears only with its first event misses
    # that event; every series a panel or an alert divides by must exist from the first scrape.
    async with running_server(judge_base_url=REPLICAS[0], judge_base_urls=list(REPLICAS)) as server:
        samples = await scrape(server.client)
    assert missing_or_not_zero(samples) == []


# ---- as one of `serve --workers N`'s workers ---------------------------------------------------

OTHER_WORKER_PID = 999_999_001  # another worker's files, written from this test process


class WorkerFiles:
    """This test process as worker 0 of `serve --workers 2`: the parent's variables set, and
    prometheus_client keeping values in files as if PROMETHEUS_MULTIPROC_DIR had been set before
    it was first imported (as it is in a real worker)."""

    def __init__(self, directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.directory = directory
        self.monkeypatch = monkeypatch
        self.own = values.MultiProcessValue()
        self.others: dict[int, Any] = {}
        monkeypatch.setattr(values, "ValueClass", self.own)

    @contextmanager
    def acting_as(self, pid: int) -> Iterator[None]:
        """prometheus_client metric values made meanwhile live in worker `pid`'s files."""
        value_class = self.others.get(pid)
        if value_class is None:
            value_class = self.others[pid] = values.MultiProcessValue(lambda: pid)
        self.monkeypatch.setattr(values, "ValueClass", value_class)
        try:
            yield
        finally:
            self.monkeypatch.setattr(values, "ValueClass", self.own)

    def merged(self) -> Samples:
        """What a scrape of any worker renders: every worker's files, merged."""
        registry = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(registry, str(self.directory))
        return parse(generate_latest(registry).decode())


@pytest.fixture
def worker_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerFiles]:
    directory = tmp_path / "metrics"
    directory.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    monkeypatch.setenv("GENRM_WORKER_INDEX", "0")
    monkeypatch.setenv("GENRM_WORKERS", "2")
    try:
        yield WorkerFiles(directory, monkeypatch)
    finally:
        values.close_all_multiprocess_files()


async def single_process_samples(server: Any) -> Samples:
    """What the same server reports when it serves alone (EngineCollector at scrape time, after
    the group counts are brought up to date, as the route does)."""
    app = server.app
    await app.engine.refresh_counts()
    registry = metrics_registry(app.metrics_collector)
    return parse(render_metrics(registry).decode())


async def test_a_worker_reports_every_series_of_a_single_process_with_the_same_values(
    worker_files: WorkerFiles,
) -> None:
    async with running_server(FAULTS_SETTINGS, judge=judge_with_faults()) as server:
        for q, g in GROUPS[:4]:
            await server.verify_all(group(q, g))
        async with trio.open_nursery() as nursery:
            # A waiting member, so that the gauges are not all 0.
            pending = server.start_verify(nursery, member(0, 1, "g-dead", 0))
            await server.settle()
            alone = await single_process_samples(server)
            as_worker = await scrape(server.client)
            pending.disconnect()
        assert value(alone, "genrm_waiters") == 1
        assert value(alone, "genrm_judge_attempt_duration_seconds_count", replica=REPLICA) == 19
        # The collecting group's age is a clock reading: a little older at the later scrape.
        aged = "genrm_oldest_collecting_group_seconds"
        assert 0 < value(alone, aged) <= value(as_worker, aged)
        assert {k: v for k, v in as_worker.items() if k[0] not in (WORKERS_UP, aged)} == {
            k: v for k, v in alone.items() if k[0] != aged
        }
        assert value(as_worker, WORKERS_UP) == 1

        # Later scrapes add only what happened since: nothing is counted twice.
        await server.verify_all(group(*GROUPS[4]))
        await scrape(server.client)
        alone = await single_process_samples(server)
        as_worker = await scrape(server.client)
        assert value(alone, "genrm_verify_requests_total", outcome="masked") == 6
        assert {k: v for k, v in as_worker.items() if k[0] != WORKERS_UP} == alone


async def test_a_fresh_worker_reports_every_counted_series_at_zero(
    worker_files: WorkerFiles,
) -> None:
    async with running_server(judge_base_url=REPLICAS[0], judge_base_urls=list(REPLICAS)) as server:
        samples = await scrape(server.client)
    assert missing_or_not_zero(samples) == []


async def test_healthz_of_a_worker_names_it_and_counts_the_live_workers(
    worker_files: WorkerFiles,
) -> None:
    with worker_files.acting_as(OTHER_WORKER_PID):
        Gauge(WORKERS_UP, "other worker", registry=None, multiprocess_mode="livesum").set(1)
    async with running_server() as server:
        await server.complete("g", 0)
        health = (await server.get("/healthz")).body
        assert health["worker"] == 0 and health["workers"] == 2
        assert health["workers_up"] == 2
        assert health["judge_attempts_total"] == 2  # this worker's own, as before
        mark_process_dead(OTHER_WORKER_PID, str(worker_files.directory))
        assert (await server.get("/healthz")).body["workers_up"] == 1
        assert value(await scrape(server.client), WORKERS_UP) == 1


async def test_a_server_alone_has_no_worker_fields_or_series() -> None:
    async with running_server() as server:
        await server.complete("g", 0)
        health = (await server.get("/healthz")).body
        samples = await scrape(server.client)
    assert not {"worker", "workers_up", "workers"} & set(health)
    assert not any(name == WORKERS_UP for name, _ in samples)
    assert value(samples, "genrm_verify_requests_total", outcome="scored") == 2


class Numbers(Collector):
    """One worker's engine reduced to a few plain numbers a test changes, in the families
    EngineCollector yields for them."""

    def __init__(self) -> None:
        self.verify = {"scored": 0, "masked": 0}
        self.in_flight = 0
        self.replica_up = 1
        self.slot_wait = Histogram(ATTEMPT_BUCKETS)

    def collect(self) -> Iterator[Metric]:
        verify = CounterMetricFamily("genrm_verify_requests", "by outcome", labels=["outcome"])
        for outcome, count in self.verify.items():
            verify.add_metric([outcome], count)
        yield verify
        yield GaugeMetricFamily("genrm_judge_in_flight", "in flight", value=self.in_flight)
        up = GaugeMetricFamily("genrm_judge_replica_up", "in service", labels=["replica"])
        up.add_metric([REPLICA], self.replica_up)
        yield up
        buckets = [
            ("+Inf" if bound == float("inf") else repr(bound), count)
            for bound, count in self.slot_wait.cumulative()
        ]
        yield HistogramMetricFamily(
            "genrm_judge_slot_wait_seconds", "waits", buckets=buckets, sum_value=self.slot_wait.sum
        )


def test_workers_files_add_up_counts_and_histograms_and_drop_a_dead_workers_gauges(
    worker_files: WorkerFiles,
) -> None:
    first, second = Numbers(), Numbers()
    mirrors = {1: Mirror(first, GAUGE_MODES), 2: Mirror(second, GAUGE_MODES)}

    def publish(pid: int) -> None:
        with worker_files.acting_as(pid):
            mirrors[pid].publish()

    first.verify["scored"] = 3
    first.in_flight = 2
    for seconds in (0.003, 0.02):
        first.slot_wait.observe(seconds)
    second.verify.update(scored=5, masked=1)
    second.in_flight = 1
    second.replica_up = 0  # the second worker has ejected the replica
    second.slot_wait.observe(7.0)
    for pid in (1, 2, 1, 2):  # publishing again adds nothing
        publish(pid)
    merged = worker_files.merged()
    scored = "genrm_verify_requests_total"
    assert value(merged, scored, outcome="scored") == 8
    assert value(merged, scored, outcome="masked") == 1
    assert value(merged, "genrm_judge_in_flight") == 3
    assert value(merged, "genrm_judge_replica_up", replica=REPLICA) == 0
    wait = "genrm_judge_slot_wait_seconds"
    bucket = wait + "_bucket"
    assert [value(merged, bucket, le=le) for le in ("0.005", "0.025", "10.0", "+Inf")] == [
        1, 2, 3, 3,
    ]  # fmt: skip
    assert value(merged, wait + "_count") == 3
    assert value(merged, wait + "_sum") == pytest.approx(7.023)

    first.verify["scored"] = 5
    first.in_flight = 0
    first.slot_wait.observe(0.02)
    publish(1)
    merged = worker_files.merged()
    assert value(merged, scored, outcome="scored") == 10
    assert value(merged, "genrm_judge_in_flight") == 1
    assert value(merged, bucket, le="0.025") == 3
    assert value(merged, wait + "_count") == 4

    # The second worker dies: its gauges leave the merge, its counts stay in the totals.
    mark_process_dead(2, str(worker_files.directory))
    merged = worker_files.merged()
    assert value(merged, "genrm_judge_in_flight") == 0
    assert value(merged, "genrm_judge_replica_up", replica=REPLICA) == 1
    assert value(merged, scored, outcome="scored") == 10
    assert value(merged, scored, outcome="masked") == 1
    assert value(merged, wait + "_count") == 4
    assert value(merged, wait + "_sum") == pytest.approx(7.043)


def test_a_gauge_without_a_merge_mode_stops_the_worker(worker_files: WorkerFiles) -> None:
    with pytest.raises(ValueError, match="gauge genrm_judge_in_flight has no multiprocess mode"):
        Mirror(Numbers(), {"genrm_judge_replica_up": "livemin"}).publish()


async def test_every_gauge_the_server_reports_has_a_merge_mode() -> None:
    app = create_app({**SCENARIO_DEFAULTS})
    registry = metrics_registry(app.metrics_collector)
    gauges = {family.name for family in registry.collect() if family.type == "gauge"}
    assert gauges == set(GAUGE_MODES) | DERIVED_GAUGES
    assert not DERIVED_GAUGES & set(GAUGE_MODES)


class MaskWindowNumbers(Collector):
    """One worker's masked-rollout window, in the families EngineCollector yields for it."""

    def __init__(self, scored: int, masked: int) -> None:
        self.scored = scored
        self.masked = masked

    def collect(self) -> Iterator[Metric]:
        answered = self.scored + self.masked
        yield GaugeMetricFamily(
            "genrm_masked_rollout_ratio", "share", value=self.masked / answered if answered else 0
        )
        rollouts = GaugeMetricFamily("genrm_mask_window_rollouts", "by outcome", labels=["outcome"])
        rollouts.add_metric(["scored"], self.scored)
        rollouts.add_metric(["masked"], self.masked)
        yield rollouts


def test_workers_masked_share_is_the_server_s_masked_rollouts_over_its_rollouts(
    worker_files: WorkerFiles,
) -> None:
    settings = WorkerSettings(index=0, workers=2, directory=worker_files.directory)
    busy = MaskWindowNumbers(scored=10, masked=90)  # this worker: 90%
    idle = MaskWindowNumbers(scored=0, masked=0)
    with worker_files.acting_as(OTHER_WORKER_PID):
        other = Mirror(idle, GAUGE_MODES)
        other.publish()
    worker = WorkerMetrics(settings, busy)
    worker.publish()

    def scraped() -> Samples:
        return parse(generate_latest(worker.registry).decode())

    # An idle worker does not halve the share, as a mean of shares would.
    assert value(scraped(), "genrm_masked_rollout_ratio") == 0.9
    idle.scored, idle.masked = 300, 10
    with worker_files.acting_as(OTHER_WORKER_PID):
        other.publish()
    assert value(scraped(), "genrm_masked_rollout_ratio") == 100 / 410
    assert value(scraped(), "genrm_mask_window_rollouts", outcome="masked") == 100
    # The other worker dies: its window leaves the share.
    mark_process_dead(OTHER_WORKER_PID, str(worker_files.directory))
    assert value(scraped(), "genrm_masked_rollout_ratio") == 0.9


def environment(**variables: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), **variables}


def test_worker_mode_is_read_from_the_parents_variables(tmp_path: Path) -> None:
    directory = str(tmp_path)
    assert worker_settings(environment()) is None
    # prometheus_client's own variable alone may come from the deployment: a server alone.
    assert worker_settings(environment(PROMETHEUS_MULTIPROC_DIR=directory)) is None
    assert worker_settings(
        environment(PROMETHEUS_MULTIPROC_DIR=directory, GENRM_WORKER_INDEX="3", GENRM_WORKERS="4")
    ) == WorkerSettings(index=3, workers=4, directory=tmp_path)
    refused: list[tuple[dict[str, str], str]] = [
        (environment(GENRM_WORKERS="2"), "GENRM_WORKER_INDEX, PROMETHEUS_MULTIPROC_DIR"),
        (
            environment(
                PROMETHEUS_MULTIPROC_DIR=directory, GENRM_WORKER_INDEX="2", GENRM_WORKERS="2"
            ),
            "GENRM_WORKER_INDEX=2 must be one of 0..GENRM_WORKERS-1",
        ),
        (
            environment(
                PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "gone"),
                GENRM_WORKER_INDEX="0",
                GENRM_WORKERS="2",
            ),
            "is not a directory",
        ),
        (
            environment(
                PROMETHEUS_MULTIPROC_DIR=directory, GENRM_WORKER_INDEX="a", GENRM_WORKERS="2"
            ),
            "must be integers",
        ),
    ]
    for env, message in refused:
        with pytest.raises(ValueError, match=message):
            worker_settings(env)


def test_a_worker_whose_prometheus_client_keeps_values_in_memory_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Variables set after prometheus_client was imported: its values would never reach the files.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setenv("GENRM_WORKER_INDEX", "0")
    monkeypatch.setenv("GENRM_WORKERS", "2")
    with pytest.raises(RuntimeError, match="must be set before prometheus_client"):
        create_app({**SCENARIO_DEFAULTS})
