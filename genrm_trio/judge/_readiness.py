"""Judge readiness as plain data: what each replica's last probe found, the log lines a change
calls for, and whether the server is ready to take work. No I/O, no clock of its own.

Theory of operation. The probe loop (judge/_probe.py) asks each replica ``GET <base><path>`` at
start and then every ``judge_probe_interval_s``, and reports every finished probe here with
:meth:`JudgeReadiness.record`: ``error`` None for a 2xx reply, else a short text (the failure's
type and message, or the status). A round is every replica's probe of one interval; the loop
calls :meth:`JudgeReadiness.finish_round` when one is done.

- *State.* A replica is ``reachable`` None until its first probe ends (and for ever with probing
  off), then True or False as its last probe found; ``last_probe_at`` is when that probe ended,
  in Unix seconds, and ``last_error`` its failure text (None after a success).
- *Logs.* The end of the first round speaks once: one ERROR line naming every replica and its
  error when none answered, else one WARNING line per replica that did not. After that, each
  replica's change is logged once: WARNING when it stops answering, INFO when it answers again;
  a replica that keeps failing (even with another error) logs nothing more.
- *Readiness* (:func:`readiness_verdict`): ready when at least one replica answered its last
  probe (or probing is off) and the group store is available; a server shutting down is never
  ready. Reasons name each failing replica's URL and last error, and the store.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from genrm_trio.core.messages import SHUTTING_DOWN

__all__ = [
    "JudgeReadiness",
    "LogLine",
    "ReadinessVerdict",
    "ReplicaState",
    "readiness_verdict",
    "replica_reason",
]

ReadinessStatus = Literal["ready", "not_ready", "shutting_down"]


@dataclass(slots=True)
class ReplicaState:
    """One replica as its probes found it (the /readyz and /healthz ``judge_replicas`` entry)."""

    url: str  # the replica's base URL, without user-info
    reachable: bool | None = None  # None: probing is off, or no probe has ended yet
    last_probe_at: float | None = None  # Unix seconds
    last_error: str | None = None


class LogLine(NamedTuple):
    level: int
    text: str


class ReadinessVerdict(NamedTuple):
    """What /readyz answers: its status (200 only for ``ready``) and, when not ready, why."""

    status: ReadinessStatus
    reasons: list[str]

    @property
    def http_status(self) -> int:
        return 200 if self.status == "ready" else 503


def replica_reason(replica: ReplicaState) -> str | None:
    """Why ``replica`` does not count as answering, or None when it does (or is not probed)."""
    if replica.reachable is False:
        return f"judge replica {replica.url} unreachable: {replica.last_error}"
    return None


class JudgeReadiness:
    """Every replica's probe state for one server (or for `serve --wait-for-judge`)."""

    def __init__(self, urls: Sequence[str], *, probe_path: str | None) -> None:
        self.replicas = [ReplicaState(url) for url in urls]
        self.probe_path = probe_path
        self.rounds = 0  # rounds finished

    @property
    def probing(self) -> bool:
        return self.probe_path is not None

    def record(self, index: int, *, at: float, error: str | None) -> list[LogLine]:
        """One replica's probe ended at ``at`` (Unix seconds): None for a 2xx reply, else why
        not. The log lines its change calls for (none during the first round)."""
        replica = self.replicas[index]
        was = replica.reachable
        replica.reachable = error is None
        replica.last_probe_at = at
        replica.last_error = error
        if self.rounds == 0 or was is None or was == replica.reachable:
            return []
        if error is None:
            return [LogLine(logging.INFO, f"GenRM judge replica {replica.url} answers again")]
        return [LogLine(logging.WARNING, f"GenRM {replica_reason(replica)}")]

    def finish_round(self) -> list[LogLine]:
        """Every replica's probe of one round has ended; the first round's log lines."""
        self.rounds += 1
        if self.rounds > 1:
            return []
        failing = [replica for replica in self.replicas if replica.reachable is False]
        if not failing:
            return []
        if len(failing) == len(self.replicas):
            named = ", ".join(
                f"GET {replica.url}{self.probe_path} ({replica.last_error})" for replica in failing
            )
            return [
                LogLine(
                    logging.ERROR,
                    f"GenRM judge unreachable: no judge replica answered its probe: {named}; "
                    "/readyz answers 503 until one does",
                )
            ]
        return [LogLine(logging.WARNING, f"GenRM {replica_reason(r)}") for r in failing]

    def answering(self) -> bool:
        """Whether some replica answered its last probe."""
        return any(replica.reachable for replica in self.replicas)


def readiness_verdict(
    replicas: Sequence[ReplicaState],
    *,
    probing: bool,
    store: tuple[str, bool],
    shutting_down: bool,
) -> ReadinessVerdict:
    """Ready when some replica answered its last probe (or probing is off) and the group store
    (its name, whether it answered its last use) is available."""
    if shutting_down:
        return ReadinessVerdict("shutting_down", [SHUTTING_DOWN])
    reasons: list[str] = []
    if probing and not any(replica.reachable for replica in replicas):
        for replica in replicas:
            reason = replica_reason(replica)
            if reason is None:
                reason = f"judge replica {replica.url} not probed yet"
            reasons.append(reason)
    name, available = store
    if not available:
        reasons.append(f"group store {name} unavailable")
    return ReadinessVerdict("not_ready" if reasons else "ready", reasons)
