"""The /verify requests the HTTP layer answers itself, by outcome (§9.3).

The engine counts every request it gives an outcome; a request that never reaches it (refused
while the server shuts down, invalid, a body that could not be spooled, a defect while reading
or answering) is counted here, by the layer that answered it. /metrics reports the sum under
``genrm_verify_requests_total``.
"""

from __future__ import annotations

__all__ = ["RequestCounts"]


class RequestCounts:
    """Counts kept by the routes; plain increments, no lock, no I/O."""

    def __init__(self) -> None:
        self.verify: dict[str, int] = {}  # outcome label -> /verify requests

    def verify_answered(self, label: str) -> None:
        """A /verify (or a whole group) answered without an outcome from the engine."""
        self.verify[label] = self.verify.get(label, 0) + 1
