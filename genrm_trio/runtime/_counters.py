"""How often the expensive per-request steps of /verify ran, for tests and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass, field

from genrm_trio.core.server_metrics import FAST_BUCKETS, Histogram

__all__ = ["Counters"]


@dataclass
class Counters:
    """How often the expensive per-request steps ran (C-23, C-31, C-32).

    ``fingerprints`` counts response identities, one per valid group-mode request; the work
    behind them is counted apart: SHA-256 digests of raw response bytes, and canonical
    fingerprints (only for bytes that differ from a member's, or for what a finished group
    keeps).
    """

    fingerprints: int = 0
    extractions: int = 0
    conversions: int = 0
    response_digests: int = 0
    canonical_fingerprints: int = 0
    fingerprint_seconds: Histogram = field(default_factory=lambda: Histogram(FAST_BUCKETS))

    def fingerprint_took(self, seconds: float) -> None:
        self.fingerprint_seconds.observe(seconds)
