"""`/metrics` and `/healthz` for the whole server when `serve --workers N` runs this process as one
of N workers (prometheus_client's multiprocess mode over the directory the parent gives them).

Each worker copies its own numbers, exactly as `EngineCollector` yields them, into
prometheus_client metric objects whose values live in per-process files: counters and histograms
by their increase since the last copy, gauges by their value, merged across workers by the mode in
`GAUGE_MODES` (docs/operations.md, "Metrics with several workers", says why each); the few in
`DERIVED_GAUGES` are computed at each scrape from merged ones instead. A worker
copies every `PUBLISH_PERIOD_S` and right before it answers a scrape, and a scrape renders the
files of every worker, so whichever worker takes it reports the whole server: its own numbers as
of now, the others' at most one period old.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, Final, Literal

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from genrm_trio.judge import ReplicaState

__all__ = [
    "DERIVED_GAUGES",
    "GAUGE_MODES",
    "MASKED_RATIO",
    "PUBLISH_PERIOD_S",
    "WORKERS_UP",
    "Mirror",
    "WorkerMetrics",
    "WorkerSettings",
    "worker_settings",
]

log = logging.getLogger("genrm_trio")

_REACHABLE: Final = "genrm_judge_replica_reachable"
_LAST_PROBE: Final = "genrm_judge_replica_last_probe_timestamp_seconds"

# What the parent of `serve --workers` sets in each worker's environment before it starts Python.
WORKER_INDEX_ENV: Final = "GENRM_WORKER_INDEX"
WORKERS_ENV: Final = "GENRM_WORKERS"
METRICS_DIR_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"

# How stale another worker's numbers may be in a scrape (the scraped worker's own are current).
PUBLISH_PERIOD_S: Final = 1.0

WORKERS_UP: Final = "genrm_workers_up"

GaugeMode = Literal["livesum", "livemin", "livemax", "livemostrecent"]

# How each gauge of EngineCollector merges over workers. "live" modes drop a worker's value once
# the parent marks it dead. docs/operations.md gives the reasons; a gauge missing here stops a
# worker at start-up rather than being merged in a way nobody chose.
GAUGE_MODES: Final[Mapping[str, GaugeMode]] = {
    "genrm_judge_in_flight": "livesum",
    "genrm_judge_slot_queue": "livesum",
    # judge_max_concurrency is one budget for every worker (they share the group store), so
    # every worker reports the same cap: the server's.
    "genrm_judge_concurrency_limit": "livemax",
    # Each worker ejects a replica on its own failures: 0 as soon as any worker has set it aside.
    "genrm_judge_replica_up": "livemin",
    "genrm_judge_replica_in_flight": "livesum",
    # Every worker probes every replica: it answers the deployment while any worker's last
    # probe of it answered, and its last probe is the latest of any worker's.
    "genrm_judge_replica_reachable": "livemax",
    "genrm_judge_replica_last_probe_timestamp_seconds": "livemax",
    # Every worker reports the group store's counts, the same numbers read at most one sweep
    # apart: the freshest is the largest while groups pile up, and a sum would count N times.
    "genrm_groups_active": "livemax",
    "genrm_oldest_collecting_group_seconds": "livemax",
    "genrm_retained_records": "livemax",
    "genrm_watermarks": "livemax",
    "genrm_group_evaluations_running": "livesum",
    "genrm_waiters": "livesum",
    "genrm_waiting_body_memory_bytes": "livesum",
    "genrm_waiting_bodies_spooled": "livesum",
    "genrm_body_receiving_bytes": "livesum",
    "genrm_body_budget_used_bytes": "livesum",
    "genrm_waiting_body_spooled_bytes": "livesum",
    # Each worker counts the rollouts it answered itself.
    "genrm_mask_window_rollouts": "livesum",
    "genrm_mask_window_masked_rollouts": "livesum",
}

MASKED_RATIO: Final = "genrm_masked_rollout_ratio"
MASK_WINDOW_ROLLOUTS: Final = "genrm_mask_window_rollouts"

# Gauges no merge mode gets right, computed at each scrape from merged ones instead. The whole
# server's masked share is its masked rollouts over its rollouts, both summed over the workers:
# the mean, minimum or maximum of the workers' shares would weigh an idle worker like a busy one.
DERIVED_GAUGES: Final = frozenset({MASKED_RATIO})


@dataclass(frozen=True)
class WorkerSettings:
    """Which worker this process is, of how many, and where the workers keep their metrics."""

    index: int
    workers: int
    directory: Path


def worker_settings(environ: Mapping[str, str]) -> WorkerSettings | None:
    """Worker mode from the environment the parent of `serve --workers` sets; None when this
    process serves alone (neither GENRM_WORKERS nor GENRM_WORKER_INDEX is set).

    PROMETHEUS_MULTIPROC_DIR alone does not select worker mode: it is prometheus_client's general
    variable, which a plain `serve` may inherit from a deployment's environment.
    """
    if WORKERS_ENV not in environ and WORKER_INDEX_ENV not in environ:
        return None
    missing = [
        name for name in (WORKERS_ENV, WORKER_INDEX_ENV, METRICS_DIR_ENV) if not environ.get(name)
    ]
    if missing:
        raise ValueError(f"a genrm-trio worker needs {', '.join(missing)} set as well")
    try:
        workers = int(environ[WORKERS_ENV])
        index = int(environ[WORKER_INDEX_ENV])
    except ValueError:
        raise ValueError(
            f"{WORKERS_ENV}={environ[WORKERS_ENV]!r} and {WORKER_INDEX_ENV}="
            f"{environ[WORKER_INDEX_ENV]!r} must be integers"
        ) from None
    if workers < 1 or not 0 <= index < workers:
        raise ValueError(
            f"{WORKER_INDEX_ENV}={index} must be one of 0..{WORKERS_ENV}-1 "
            f"({WORKERS_ENV}={workers})"
        )
    directory = Path(environ[METRICS_DIR_ENV])
    if not directory.is_dir():
        raise ValueError(f"{METRICS_DIR_ENV}={str(directory)!r} is not a directory")
    return WorkerSettings(index=index, workers=workers, directory=directory)


_Key = tuple[str, tuple[str, ...]]  # a family's name and one series' label values


class Mirror:
    """Copies what a collector yields into prometheus_client metric objects (registry=None, so
    in multiprocess mode they only write this process's files), as the numbers change.

    Counters get ``inc(increase)`` per series, gauges ``set(value)``, histograms the increase of
    each bucket and of the sum. The families, names, help texts, label names and buckets are
    whatever the collector yields, so nothing is listed twice; only the gauges' merge modes are
    chosen here, and a gauge without one is an error.
    """

    def __init__(self, source: Collector, gauge_modes: Mapping[str, GaugeMode]) -> None:
        self.source = source
        self.gauge_modes = gauge_modes
        self._labelnames: dict[str, tuple[str, ...]] = {}
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}
        self._histograms: dict[str, Histogram] = {}
        self._bounds: dict[str, list[float]] = {}
        self._counter_series: dict[_Key, Counter] = {}
        self._gauge_series: dict[_Key, Gauge] = {}
        self._histogram_series: dict[_Key, _HistogramSeries] = {}
        # What the files already hold, per series: a counter's total or a gauge's value.
        self._published: dict[_Key, float] = {}
        # The help texts of DERIVED_GAUGES, as the collector last wrote them.
        self.derived: dict[str, str] = {}

    def publish(self) -> None:
        for family in self.source.collect():
            if family.name in DERIVED_GAUGES:
                self.derived[family.name] = family.documentation  # computed at the scrape
            elif family.type == "counter":
                self._publish_counter(family)
            elif family.type == "gauge":
                self._publish_gauge(family)
            elif family.type == "histogram":
                self._publish_histogram(family)
            else:
                raise TypeError(f"{family.name}: no multiprocess form for a {family.type}")

    def _label_values(self, family: Metric, labels: Mapping[str, str]) -> tuple[str, ...]:
        names = self._labelnames.setdefault(family.name, tuple(labels))
        return tuple(labels[name] for name in names)

    def _publish_counter(self, family: Metric) -> None:
        total_name = family.name + "_total"
        for sample in family.samples:
            if sample.name != total_name:
                continue
            key = (family.name, self._label_values(family, sample.labels))
            series = self._counter_series.get(key)
            if series is None:
                series = self._counter_series[key] = self._counter(family, key[1])
                self._published[key] = 0.0
            increase = sample.value - self._published[key]
            if increase > 0:
                series.inc(increase)
            # A count never goes down; if one did, the files keep what they were given (a
            # Counter refuses a negative increase) and later increases count from the new value.
            self._published[key] = sample.value

    def _counter(self, family: Metric, label_values: tuple[str, ...]) -> Counter:
        parent = self._counters.get(family.name)
        if parent is None:
            names = self._labelnames[family.name]
            parent = Counter(family.name, family.documentation, names, registry=None)
            self._counters[family.name] = parent
        return parent.labels(*label_values) if label_values else parent

    def _publish_gauge(self, family: Metric) -> None:
        mode = self.gauge_modes.get(family.name)
        if mode is None:
            raise ValueError(
                f"gauge {family.name} has no multiprocess mode: choose one in GAUGE_MODES "
                "(genrm_trio/http/_worker_metrics.py) and say why in docs/operations.md"
            )
        for sample in family.samples:
            key = (family.name, self._label_values(family, sample.labels))
            series = self._gauge_series.get(key)
            if series is None:
                series = self._gauge_series[key] = self._gauge(family, mode, key[1])
                self._published[key] = 0.0
            if sample.value != self._published[key]:
                series.set(sample.value)
                self._published[key] = sample.value

    def _gauge(self, family: Metric, mode: GaugeMode, label_values: tuple[str, ...]) -> Gauge:
        parent = self._gauges.get(family.name)
        if parent is None:
            names = self._labelnames[family.name]
            parent = Gauge(
                family.name, family.documentation, names, registry=None, multiprocess_mode=mode
            )
            self._gauges[family.name] = parent
        return parent.labels(*label_values) if label_values else parent

    def _publish_histogram(self, family: Metric) -> None:
        buckets: dict[tuple[str, ...], list[tuple[float, float]]] = {}
        sums: dict[tuple[str, ...], float] = {}
        for sample in family.samples:
            labels = dict(sample.labels)
            if sample.name == family.name + "_bucket":
                bound = float(labels.pop("le"))
                label_values = self._label_values(family, labels)
                buckets.setdefault(label_values, []).append((bound, sample.value))
            elif sample.name == family.name + "_sum":
                sums[self._label_values(family, labels)] = sample.value
        for label_values, cumulative in buckets.items():
            key = (family.name, label_values)
            series = self._histogram_series.get(key)
            if series is None:
                bounds = [bound for bound, _ in cumulative]
                child = self._histogram(family, bounds, label_values)
                series = self._histogram_series[key] = _HistogramSeries(child, len(bounds))
            counts = [count - below for (_, count), (_, below) in _with_previous(cumulative)]
            series.publish(counts, sums.get(label_values, 0.0))

    def _histogram(
        self, family: Metric, bounds: list[float], label_values: tuple[str, ...]
    ) -> Histogram:
        known = self._bounds.setdefault(family.name, bounds)
        if bounds != known:
            raise ValueError(f"histogram {family.name}: one series has other buckets {bounds}")
        parent = self._histograms.get(family.name)
        if parent is None:
            names = self._labelnames[family.name]
            parent = Histogram(
                family.name, family.documentation, names, registry=None, buckets=bounds
            )
            self._histograms[family.name] = parent
        return parent.labels(*label_values) if label_values else parent


class _MaskedShare(Collector):
    """The whole server's ``genrm_masked_rollout_ratio``, from every live worker's window
    counts as their files hold them (read with the rest of a scrape, off the event loop)."""

    def __init__(self, directory: Path, mirror: Mirror) -> None:
        self.directory = directory
        self.mirror = mirror

    def collect(self) -> list[Metric]:
        documentation = self.mirror.derived.get(MASKED_RATIO)
        if documentation is None:
            return []  # nothing published yet
        # A livesum gauge lives in gauge_livesum_<pid>.db; a dead worker's file is removed.
        files = glob.glob(os.path.join(self.directory, "gauge_livesum_*.db"))
        answered = masked = 0.0
        for metric in MultiProcessCollector.merge(files, accumulate=False):
            if metric.name == MASK_WINDOW_ROLLOUTS:
                for sample in metric.samples:
                    answered += sample.value
                    if sample.labels.get("outcome") == "masked":
                        masked += sample.value
        ratio = masked / answered if answered else 0.0
        return [GaugeMetricFamily(MASKED_RATIO, documentation, value=ratio)]


def _with_previous(
    cumulative: list[tuple[float, float]],
) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Each (bound, cumulative count) with the one before it ((-inf, 0) for the first)."""
    return list(zip(cumulative, [(float("-inf"), 0.0), *cumulative[:-1]], strict=True))


class _HistogramSeries:
    """One histogram series: the per-bucket counts and the sum its files hold, and the values
    prometheus_client keeps them in.

    prometheus_client has no public way to add counts to a histogram in bulk (its maintainers
    point exporters to custom collectors, which multiprocess mode does not support). So this
    adds to the same two things ``Histogram.observe`` adds to: ``_buckets[i]``, the count of
    bucket i alone (cumulated when rendered), and ``_sum``. That is prometheus_client's own
    layout (metrics.py), checked here when a series is made and by tests/http/test_metrics.py,
    which compares the result with a single process's exposition.
    """

    def __init__(self, child: Histogram, buckets: int) -> None:
        counts: Any = getattr(child, "_buckets", None)
        total: Any = getattr(child, "_sum", None)
        if not isinstance(counts, list) or len(counts) != buckets or total is None:
            raise RuntimeError(
                f"prometheus_client {version('prometheus_client')} keeps a histogram's buckets "
                "differently from the 0.2x releases genrm-trio's worker metrics were written for"
            )
        self._counts: list[Any] = counts
        self._sum: Any = total
        self._published_counts = [0.0] * buckets
        self._published_sum = 0.0

    def publish(self, counts: list[float], total: float) -> None:
        for index, count in enumerate(counts):
            increase = count - self._published_counts[index]
            if increase > 0:
                self._counts[index].inc(increase)
            # As for a counter: a bucket never loses observations, and the files never do.
            self._published_counts[index] = count
        if total != self._published_sum:
            self._sum.inc(total - self._published_sum)
            self._published_sum = total


class WorkerMetrics:
    """This worker's share of the whole server's `/metrics` and `/healthz`."""

    def __init__(self, settings: WorkerSettings, source: Collector) -> None:
        if values.ValueClass is values.MutexValue:
            raise RuntimeError(
                f"{METRICS_DIR_ENV} must be set before prometheus_client is first imported: "
                "this worker's metrics would stay in its memory and no scrape would count them"
            )
        self.settings = settings
        self.mirror = Mirror(source, GAUGE_MODES)
        self.workers_up = Gauge(
            WORKERS_UP,
            "Worker processes serving (serve --workers): 1 per live worker.",
            registry=None,
            multiprocess_mode="livesum",
        )
        self.registry = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(self.registry, str(settings.directory))
        self.registry.register(_MaskedShare(settings.directory, self.mirror))
        self._publishing = trio.CancelScope()
        self._failing = False

    def publish(self) -> None:
        self.mirror.publish()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Publish, count this worker up, then publish every period until retired."""
        self.publish()
        self.workers_up.set(1)
        task_status.started()
        with self._publishing:
            while True:
                await trio.sleep(PUBLISH_PERIOD_S)
                try:
                    self.publish()
                except Exception:
                    # A defect here must not stop the worker serving; scrapes raise it again.
                    if not self._failing:
                        log.exception("GenRM could not publish this worker's metrics")
                    self._failing = True
                else:
                    self._failing = False

    def retire(self) -> None:
        """At the end of serving: publish the last counts, then take this worker's gauges out
        of the merge (as the parent does for a worker that dies)."""
        self._publishing.cancel()
        self.publish()
        self.workers_up.set(0)
        mark_process_dead(os.getpid(), str(self.settings.directory))

    async def render(self) -> bytes:
        """The whole server's exposition, with this worker's numbers as of now."""
        self.publish()
        # Reading every worker's files is disk work: off the event loop.
        return await trio.to_thread.run_sync(generate_latest, self.registry)

    def live_workers(self) -> int:
        """Workers counted up in the files and not marked dead (a worker killed a moment ago
        counts until the parent marks it)."""
        # genrm_workers_up is a livesum gauge: prometheus_client keeps those in
        # gauge_livesum_<pid>.db, the files mark_process_dead removes.
        files = glob.glob(os.path.join(self.settings.directory, "gauge_livesum_*.db"))
        for metric in MultiProcessCollector.merge(files, accumulate=False):
            if metric.name == WORKERS_UP:
                return round(sum(sample.value for sample in metric.samples))
        return 0

    def judge_replicas(self, local: Sequence[ReplicaState]) -> list[ReplicaState]:
        """The deployment's judge replicas: each answers while any live worker's last probe of
        it answered, last probed when any worker last did. This worker's own state stands in
        for a replica no worker has probed yet, and gives the error of one none reaches."""
        self.publish()
        reachable: dict[str, float] = {}
        probed_at: dict[str, float] = {}
        # livemax gauges: prometheus_client keeps them in gauge_livemax_<pid>.db.
        files = glob.glob(os.path.join(self.settings.directory, "gauge_livemax_*.db"))
        for metric in MultiProcessCollector.merge(files, accumulate=False):
            found = {_REACHABLE: reachable, _LAST_PROBE: probed_at}.get(metric.name)
            if found is not None:
                for sample in metric.samples:
                    found[sample.labels["replica"]] = sample.value
        merged: list[ReplicaState] = []
        for own in local:
            if own.url not in reachable:
                merged.append(own)
                continue
            answers = reachable[own.url] >= 1
            error = None
            if not answers:
                error = own.last_error or "no worker's last probe got an answer"
            merged.append(ReplicaState(own.url, answers, probed_at.get(own.url), error))
        return merged

    def health(self) -> dict[str, int]:
        """The `/healthz` fields of worker mode."""
        return {
            "worker": self.settings.index,
            "workers_up": self.live_workers(),
            "workers": self.settings.workers,
        }
