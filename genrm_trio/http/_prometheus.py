"""`GET /metrics`: the server's counts, gauges and histograms in Prometheus text format (§9.3, X-6).

One ``CollectorRegistry`` per app, so several servers in one process never share a series. When
scraped, the collector reads the counts kept as they happen (core/server_metrics.py, the routes'
own) and one snapshot of each component's state (``statistics()`` of the engine, the judge
client, the tallies, the body budget and the spool; the store's group counts); prometheus_client
writes the exposition. No
series has a group-id label. Under `serve --workers N` each worker copies this collector's output
into prometheus_client's multiprocess files instead (http/_worker_metrics.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from genrm_trio.core.server_metrics import ATTEMPT_BUCKETS, Histogram, ServerMetrics
from genrm_trio.http._request_counts import RequestCounts
from genrm_trio.http._spool import Spool, SpoolBudget
from genrm_trio.http._worker_metrics import MASKED_RATIO
from genrm_trio.judge import JudgeReadiness
from genrm_trio.judge.client import JudgeStatistics
from genrm_trio.runtime.engine import Engine

__all__ = [
    "CONTENT_TYPE",
    "VERIFY_OUTCOMES",
    "EngineCollector",
    "metrics_registry",
    "render_metrics",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST

VERIFY_OUTCOMES = (
    "scored", "masked", "replayed", "conflict", "superseded", "not_retained", "inconsistent",
    "unavailable", "invalid", "error",
)  # fmt: skip
COMPARE_OUTCOMES = ("scored", "unavailable", "invalid", "error")
ATTEMPT_OUTCOMES = (
    "ok", "unusable", "budget_exhausted", "http_4xx", "http_408", "http_429", "http_5xx",
    "transport", "timeout", "non_json", "cancelled",
)  # fmt: skip
# The attempt outcomes a comparison may follow with another attempt (judge/_attempts.py): the
# reasons of genrm_judge_retries_total.
RETRY_REASONS = ("unusable", "budget_exhausted", "http_408", "http_429", "http_5xx", "transport")
COMPARISON_OUTCOMES = ("verdict", "default_fallback", "failed")
DISPOSITIONS = (
    ("completed", "none"),
    ("partially_masked", "none"),
    ("failed", "judge"),
    ("failed", "cohort"),
)


def _counter(
    name: str, doc: str, labels: tuple[str, ...], counts: Mapping[Any, int]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for values, count in counts.items():
        family.add_metric(list(values), count)
    return family


def _by_one(counts: Mapping[str, int], known: Iterable[str]) -> dict[tuple[str], int]:
    """Counts by one label, every known value present from the start (so rates exist at 0)."""
    merged: dict[tuple[str], int] = {(label,): 0 for label in known}
    for label, count in counts.items():
        merged[(label,)] = count
    return merged


def _histogram(family: HistogramMetricFamily, labels: list[str], histogram: Histogram) -> None:
    buckets = [
        ("+Inf" if bound == float("inf") else repr(bound), count)
        for bound, count in histogram.cumulative()
    ]
    family.add_metric(labels, buckets, histogram.sum)


def _plain_histogram(name: str, doc: str, histogram: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc)
    _histogram(family, [], histogram)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class EngineCollector(Collector):
    """Reads one server instance's numbers at scrape time."""

    def __init__(
        self,
        engine: Engine,
        spool: Spool,
        budget: SpoolBudget,
        requests: RequestCounts,
        readiness: JudgeReadiness | None = None,
    ) -> None:
        self.engine = engine
        self.spool = spool
        self.budget = budget
        self.requests = requests
        self.readiness = readiness

    def collect(self) -> Iterator[Metric]:
        # Counts kept as they happen, and a snapshot of every component's state, each taken
        # once: the series of one scrape agree with each other.
        engine = self.engine
        metrics = engine.metrics
        config = engine.config
        judge = engine.judge.statistics()
        tallies = engine.tallies.statistics()
        stats = engine.statistics()
        # With a shared store, the deployment's groups (the same at every process).
        counts = engine.group_counts()
        budget = self.budget.statistics()
        spool = self.spool.statistics()
        yield _counter(
            "genrm_verify_requests",
            "POST /verify requests answered, by outcome.",
            ("outcome",),
            _by_one(_summed(metrics.verify_requests, self.requests.verify), VERIFY_OUTCOMES),
        )
        yield _counter(
            "genrm_compare_requests",
            "POST /compare requests answered, by outcome.",
            ("outcome",),
            _by_one(metrics.compare_requests, COMPARE_OUTCOMES),
        )
        replicas = [replica.name for replica in judge.replicas]
        attempts = {
            (config.judge_api, outcome, replica): 0
            for replica in replicas
            for outcome in ATTEMPT_OUTCOMES
        }
        for (replica, outcome), count in metrics.judge_attempts.items():
            attempts[(config.judge_api, outcome, replica)] = count
        yield _counter(
            "genrm_judge_attempts",
            "Judge HTTP attempts, by API, outcome and judge replica.",
            ("api", "outcome", "replica"),
            attempts,
        )
        retries = {(replica, reason): 0 for replica in replicas for reason in RETRY_REASONS}
        retries.update(metrics.judge_retries)
        yield _counter(
            "genrm_judge_retries",
            "Judge attempts retried, by the failed attempt's outcome and replica.",
            ("replica", "reason"),
            retries,
        )
        duration = HistogramMetricFamily(
            "genrm_judge_attempt_duration_seconds",
            "Duration of one judge attempt, from holding its slot to its outcome, by replica.",
            labels=("replica",),
        )
        for replica in replicas:
            seen = metrics.attempt_seconds.get(replica)
            _histogram(duration, [replica], seen or Histogram(ATTEMPT_BUCKETS))
        yield duration
        yield _plain_histogram(
            "genrm_judge_slot_wait_seconds",
            "Wait of one judge attempt for a concurrency slot (and a replica under its cap).",
            metrics.slot_wait_seconds,
        )
        yield _gauge("genrm_judge_in_flight", "Judge attempts holding a slot now.", judge.in_flight)
        yield _gauge(
            "genrm_judge_slot_queue",
            "Judge attempts waiting for a concurrency slot now.",
            judge.waiting_for_slot,
        )
        yield _gauge(
            "genrm_judge_concurrency_limit",
            "judge_max_concurrency: judge attempts allowed in flight at once (with a shared "
            "group store, across every process of the deployment).",
            config.judge_max_concurrency,
        )
        yield from _replicas(judge, metrics)
        if self.readiness is not None:
            yield from _probes(self.readiness)
        yield _counter(
            "genrm_comparisons",
            "Comparisons ended, by outcome (a verdict, J-24's default verdict, or a failure).",
            ("outcome",),
            _by_one(metrics.comparisons, COMPARISON_OUTCOMES),
        )
        active = GaugeMetricFamily(
            "genrm_groups_active",
            "Groups not yet finished, in the group store (a shared store: the deployment's).",
            labels=["phase"],
        )
        active.add_metric(["collecting"], counts.collecting)
        active.add_metric(["evaluating"], counts.evaluating)
        yield active
        yield _gauge(
            "genrm_oldest_collecting_group_seconds",
            "Age of the oldest group still collecting in the group store (0 when none).",
            counts.oldest_collecting_s,
        )
        yield _gauge(
            "genrm_group_evaluations_running",
            "Groups this process is judging now.",
            engine.evaluations_running(),
        )
        finished = dict.fromkeys(DISPOSITIONS, 0)
        finished.update(tallies.finished)
        yield _counter(
            "genrm_groups_finished",
            "Groups that reached a terminal state, by disposition and failure kind.",
            ("disposition", "kind"),
            finished,
        )
        yield CounterMetricFamily(
            "genrm_rollouts_masked",
            "Rollouts answered masked at their group's end (partial masking or a judge failure).",
            value=tallies.rollouts_masked,
        )
        yield from _masking(engine)
        yield _plain_histogram(
            "genrm_group_collection_seconds",
            "From a group's first member to its last.",
            metrics.collection_seconds,
        )
        yield _plain_histogram(
            "genrm_group_evaluation_seconds",
            "From a group's last member to its end of judging.",
            metrics.evaluation_seconds,
        )
        yield _gauge(
            "genrm_retained_records",
            "Finished groups retained in the group store.",
            counts.retained_records,
        )
        yield _gauge(
            "genrm_watermarks",
            "Group ids with an attempt watermark in the group store.",
            counts.watermarks,
        )
        yield _gauge("genrm_waiters", "/verify requests waiting for their group.", stats.waiters)
        yield _gauge(
            "genrm_waiting_body_memory_bytes",
            "Bytes of whole request bodies held in memory while their requests wait.",
            budget.waiting,
        )
        yield _gauge(
            "genrm_body_receiving_bytes",
            "Bytes of request bodies read and not yet validated.",
            budget.receiving,
        )
        yield _gauge(
            "genrm_body_budget_used_bytes",
            "Bytes the memory budget for request bodies has given out (bodies being read "
            "within it and bodies waiting in memory), against waiting_body_memory_bytes.",
            budget.in_memory,
        )
        yield _gauge(
            "genrm_waiting_body_spooled_bytes",
            "Bytes of request bodies waiting in spool files.",
            spool.bytes_on_disk,
        )
        yield _gauge(
            "genrm_waiting_bodies_spooled",
            "Waiting request bodies held in spool files.",
            spool.files,
        )
        yield _counter(
            "genrm_pruned",
            "Retained entries pruned, by index and reason.",
            ("index", "reason"),
            {
                **{
                    (index, reason): 0
                    for index in ("results", "watermarks")
                    for reason in ("ttl", "count")
                },
                **engine.store.evictions(),
            },
        )
        yield CounterMetricFamily(
            "genrm_prune_visits",
            "Retention index entries looked at while pruning (R-3).",
            value=stats.prune_visits,
        )
        yield _plain_histogram(
            "genrm_fingerprint_seconds",
            "Time to compute one canonical response fingerprint.",
            metrics.fingerprint_seconds,
        )


def _replicas(judge: JudgeStatistics, metrics: ServerMetrics) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "genrm_judge_replica_up",
        "1 while the judge replica is in service, 0 while it is ejected.",
        labels=["replica"],
    )
    in_flight = GaugeMetricFamily(
        "genrm_judge_replica_in_flight",
        "Judge attempts in flight on the replica now.",
        labels=["replica"],
    )
    ejections = CounterMetricFamily(
        "genrm_judge_replica_ejections",
        "Times the replica was ejected after repeated failures (or a failed probe).",
        labels=["replica"],
    )
    for replica in judge.replicas:
        up.add_metric([replica.name], 1 if replica.in_service else 0)
        in_flight.add_metric([replica.name], replica.in_flight)
        ejections.add_metric([replica.name], metrics.replica_ejections.get(replica.name, 0))
    yield up
    yield in_flight
    yield ejections


def _masking(engine: Engine) -> Iterator[Metric]:
    """The masked-rollout window (core/mask_window.py): the share the alert watches, and the
    counts it comes from, which add up over processes."""
    masking = engine.masking
    reading = masking.reading(trio.current_time())
    window = f"the last {masking.window_s:g} s (mask_window_s)"
    yield _gauge(
        MASKED_RATIO,
        f"Share of /verify rollouts answered masked in {window}; 0 when none were answered.",
        reading.ratio,
    )
    rollouts = GaugeMetricFamily(
        "genrm_mask_window_rollouts",
        f"/verify rollouts answered in {window}, scored or masked (replays and rejections "
        "are not counted).",
        labels=["outcome"],
    )
    rollouts.add_metric(["scored"], reading.answered - reading.masked)
    rollouts.add_metric(["masked"], reading.masked)
    yield rollouts
    reasons = GaugeMetricFamily(
        "genrm_mask_window_masked_rollouts",
        f"/verify rollouts answered masked in {window}, by reason (the judge's error class, "
        "or what ended the group).",
        labels=["reason"],
    )
    for reason in sorted(masking.known_reasons):
        reasons.add_metric([reason], reading.reasons.get(reason, 0))
    yield reasons


def _probes(readiness: JudgeReadiness) -> Iterator[Metric]:
    """Each replica's last readiness probe; a replica appears once a probe of it has ended."""
    reachable = GaugeMetricFamily(
        "genrm_judge_replica_reachable",
        "1 while the judge replica's last readiness probe got a 2xx reply, else 0.",
        labels=["replica"],
    )
    probed_at = GaugeMetricFamily(
        "genrm_judge_replica_last_probe_timestamp_seconds",
        "When the judge replica's last readiness probe ended, in Unix seconds.",
        labels=["replica"],
    )
    for replica in readiness.replicas:
        if replica.reachable is None or replica.last_probe_at is None:
            continue
        reachable.add_metric([replica.url], 1 if replica.reachable else 0)
        probed_at.add_metric([replica.url], replica.last_probe_at)
    yield reachable
    yield probed_at


def metrics_registry(collector: EngineCollector) -> CollectorRegistry:
    """A registry of its own for one app (the library's global one is shared by the process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def _summed(*counts: dict[str, int]) -> dict[str, int]:
    total: dict[str, int] = {}
    for each in counts:
        for key, value in each.items():
            total[key] = total.get(key, 0) + value
    return total


def render_metrics(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
