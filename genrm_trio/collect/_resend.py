"""Which failed `POST /verify` the collector sends again, and how long it pauses before each resend.

A resend is the identical request: the same group id, attempt and slot with the same response.
The server attaches it to the member it already holds or answers it from the group's finished
result (C-52), so sending again is safe whenever the failure says nothing about the group
itself. That is the case for a connection that failed or closed without a reply, for 502, 503
and 504 from a gateway in front of the server, and for the server's own 503s that say nothing
was stored (the shared store unreachable, the server at its connection limit or shutting down).
Every other reply, a group's failure among them, is final: a resend would only repeat it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import httpx

from genrm_trio.client import GATEWAY_STATUSES, RESENDABLE_503_PREFIXES
from genrm_trio.core.messages import exception_text

SHOWN_BODY_CHARS = 300


@dataclass(frozen=True, slots=True)
class Resend:
    """The failure is worth the identical request again; ``problem`` says what happened and
    ``retry_after_s`` is the pause the reply asked for, if any."""

    problem: str
    retry_after_s: float | None = None


def reply_resend(status: int, headers: httpx.Headers, body: bytes) -> Resend | None:
    """A Resend for a reply that changed nothing at the server, else None (the reply stands).
    ``problem`` reads after "POST /verify"."""
    if status not in GATEWAY_STATUSES:
        return None
    detail = _detail(body)
    if status == 503 and detail is not None:
        # The server's own 503: only those that stored nothing are worth sending again.
        if not detail.startswith(RESENDABLE_503_PREFIXES):
            return None
        return Resend(f"answered 503: {detail}", _retry_after(headers))
    shown = " ".join(body[:SHOWN_BODY_CHARS].decode("utf-8", errors="replace").split())
    return Resend(f"answered {status} from a gateway: {shown}", _retry_after(headers))


def error_resend(error: httpx.HTTPError) -> Resend | None:
    """A Resend for a connection refused, reset, closed without a reply, or timed out at the
    transport; None for a request that can never go out as it is (a bad URL or protocol)."""
    if isinstance(error, httpx.NetworkError | httpx.TimeoutException | httpx.RemoteProtocolError):
        return Resend(f"failed: {exception_text(error)}")
    return None


@dataclass(frozen=True, slots=True)
class Backoff:
    """Pauses between resends of one member: doubling from ``first_s`` up to ``max_s``, each
    drawn between half and all of its step so that the members a failure cut off together do not
    come back together; never shorter than a Retry-After the reply asked for (up to ``max_s``).
    """

    resends: int = 8
    first_s: float = 0.25
    max_s: float = 8.0

    def pause(self, resend: int, rng: random.Random, retry_after_s: float | None = None) -> float:
        """The pause before resend number ``resend`` (1 for the first)."""
        step = min(self.max_s, self.first_s * 2 ** (resend - 1))
        drawn = step * (0.5 + rng.random() / 2)
        if retry_after_s is not None:
            drawn = max(drawn, min(retry_after_s, self.max_s))
        return drawn


def _detail(body: bytes) -> str | None:
    """The ``detail`` of a genrm-trio error body, or None for any other body."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    detail = value.get("detail") if isinstance(value, dict) else None
    return detail if isinstance(detail, str) else None


def _retry_after(headers: httpx.Headers) -> float | None:
    """A Retry-After in delta-seconds; a date or anything else is ignored."""
    value = headers.get("retry-after", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds < float("inf") else None
