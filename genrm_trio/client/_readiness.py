"""What one answer to `GET /readyz` says about a genrm-trio server, and the errors a client
raises when a run cannot be scored: pure decisions, no I/O.

`/readyz` answers 200 when at least one judge replica answered its last probe and the group
store is available; otherwise 503 with `status` and `reasons`. A server without the route
(404) predates readiness checks: the client cannot tell, says so in a WARNING and goes on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import msgspec

READY_ROUTE: Final = "/readyz"


class _ReadyzBody(msgspec.Struct, kw_only=True):
    status: str = ""
    reasons: list[str] = msgspec.field(default_factory=list)


_BODY: Final = msgspec.json.Decoder(_ReadyzBody)


@dataclass(frozen=True, slots=True)
class Ready:
    """The server can score groups now."""


@dataclass(frozen=True, slots=True)
class NotReady:
    """Not ready yet, or not reachable; asked again until the wait ends. ``reasons`` are the
    server's own, or one sentence of ours."""

    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NoReadiness:
    """The server has no `/readyz`: readiness cannot be checked."""

    problem: str


Readiness = Ready | NotReady | NoReadiness


def readiness(status: int, body: bytes) -> Readiness:
    """What one reply of `GET /readyz` means."""
    if status == 200:
        return Ready()
    if status == 404:
        return NoReadiness(
            f"GET {READY_ROUTE} answered 404: the server predates readiness checks (or is not"
            " genrm-trio)"
        )
    try:
        parsed = _BODY.decode(body)
    except msgspec.MsgspecError:
        parsed = None
    if parsed is not None and parsed.reasons:
        return NotReady(tuple(parsed.reasons))
    if parsed is not None and parsed.status == "shutting_down":
        return NotReady(("the server is shutting down",))
    text = body[:200].decode("utf-8", "replace")
    return NotReady((f"GET {READY_ROUTE} answered {status}: {text}",))


def check_ready_wait(ready_wait_s: float | None) -> None:
    if ready_wait_s is not None and not (math.isfinite(ready_wait_s) and ready_wait_s >= 0):
        raise ValueError(f"ready_wait_s {ready_wait_s!r}: expected a finite number >= 0 or None")


def unreachable(error: BaseException) -> NotReady:
    """A `GET /readyz` that got no answer."""
    return NotReady((f"no answer: {type(error).__name__}: {str(error)[:1000]}",))


class ServerNotReady(RuntimeError):
    """The genrm-trio server at ``url`` was not ready to score groups within ``waited_s``
    seconds; ``reasons`` say why (its `/readyz` reasons, or the connection error)."""

    def __init__(self, url: str, waited_s: float, reasons: tuple[str, ...]) -> None:
        super().__init__(
            f"genrm-trio server {url} is not ready (waited {waited_s:g}s): {'; '.join(reasons)}"
        )
        self.url = url
        self.waited_s = waited_s
        self.reasons = reasons


class RewardsUnavailable(RuntimeError):
    """Every rollout of a batch was masked because the judge or the genrm-trio server could not
    be reached: training on it would train on nothing. ``first_reason`` is the first rollout's
    failure reason."""

    def __init__(self, url: str, masked: int, first_reason: str) -> None:
        super().__init__(
            f"genrm-trio server {url}: all {masked} rollouts of the batch were masked because the"
            f" judge or the server could not be reached; first reason: {first_reason}"
        )
        self.url = url
        self.masked = masked
        self.first_reason = first_reason
