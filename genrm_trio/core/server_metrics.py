"""The server's running counts and latency histograms, kept as plain numbers (§9.3, X-6).

Recording is a dictionary increment or one bisect, with no lock and no I/O, so the request and
judge paths stay cheap; ``http/_prometheus.py`` turns these numbers into the Prometheus exposition
when ``GET /metrics`` is scraped. Nothing here carries a group id: label values come from small
fixed sets (outcomes, kinds, replica URLs).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import TypeVar

from genrm_trio.core.outcomes import Masked, Outcome, Scored

__all__ = [
    "ATTEMPT_BUCKETS",
    "FAST_BUCKETS",
    "GROUP_BUCKETS",
    "Histogram",
    "ServerMetrics",
    "verify_label",
]

# Judge attempts last from milliseconds (a cached 2B judge) to many minutes (a long-reasoning 235B
# judge under load); slot waits cover the same range.
ATTEMPT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0,
)  # fmt: skip
# A group's collection and evaluation span a training step: seconds to half an hour.
GROUP_BUCKETS = (
    0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
)  # fmt: skip
# Fingerprints take microseconds for a short response and milliseconds for a megabyte.
FAST_BUCKETS = (0.00001, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0)


class Histogram:
    """Counts of observations per bucket (upper bounds inclusive) and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), ending with +Inf."""
        total = 0
        buckets = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            buckets.append((bound, total))
        return buckets


# Rejection texts by the words that set them apart (core/messages.py).
_CONFLICTS = (
    ("was superseded by attempt", "superseded"),
    ("is no longer retained", "not_retained"),
    ("received inconsistent prompt", "inconsistent"),
)


def verify_label(outcome: Outcome, *, replay: bool) -> str:
    """The ``genrm_verify_requests_total`` outcome of a /verify answered by the engine; a scored
    or masked row answered at once, without waiting for its group, is a replay."""
    if isinstance(outcome, Scored | Masked):
        if replay:
            return "replayed"
        return "scored" if isinstance(outcome, Scored) else "masked"
    for words, label in _CONFLICTS:
        if words in outcome.detail:
            return label  # a waiting member of a superseded group is answered 503 with it
    return "conflict" if outcome.status == 409 else "unavailable"


K = TypeVar("K")


def _bump(counts: dict[K, int], key: K) -> None:
    counts[key] = counts.get(key, 0) + 1


class ServerMetrics:
    """Everything ``/metrics`` reports that is counted as it happens (gauges are read at scrape
    time from the engine instead)."""

    def __init__(self) -> None:
        # outcome -> requests
        self.verify_requests: dict[str, int] = {}
        self.compare_requests: dict[str, int] = {}
        # (replica, outcome) -> attempts; (replica, reason) -> retries
        self.judge_attempts: dict[tuple[str, str], int] = {}
        self.judge_retries: dict[tuple[str, str], int] = {}
        # replica -> ejections
        self.replica_ejections: dict[str, int] = {}
        # outcome (verdict, default_fallback, failed) -> comparisons
        self.comparisons: dict[str, int] = {}
        self.attempt_seconds: dict[str, Histogram] = {}
        self.slot_wait_seconds = Histogram(ATTEMPT_BUCKETS)
        self.collection_seconds = Histogram(GROUP_BUCKETS)
        self.evaluation_seconds = Histogram(GROUP_BUCKETS)
        self.fingerprint_seconds = Histogram(FAST_BUCKETS)

    def verify(self, outcome: str) -> None:
        _bump(self.verify_requests, outcome)

    def compare(self, outcome: str) -> None:
        _bump(self.compare_requests, outcome)

    def comparison(self, outcome: str) -> None:
        _bump(self.comparisons, outcome)

    def judge_attempt(self, replica: str, outcome: str, seconds: float) -> None:
        _bump(self.judge_attempts, (replica, outcome))
        histogram = self.attempt_seconds.get(replica)
        if histogram is None:
            histogram = self.attempt_seconds[replica] = Histogram(ATTEMPT_BUCKETS)
        histogram.observe(seconds)

    def judge_retry(self, replica: str, reason: str) -> None:
        _bump(self.judge_retries, (replica, reason))

    def ejection(self, replica: str) -> None:
        _bump(self.replica_ejections, replica)
