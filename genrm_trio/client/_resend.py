"""When the client sends a group again, and how long it waits first: pure decisions from one
reply (or lost connection) and the resend count, no I/O.

A group is sent again, unchanged, exactly when the server did not answer it:

- the connection failed or broke before a reply was read;
- a 502 or 504, or a 503 that is not genrm-trio's own (a gateway or balancer in front);
- one of genrm-trio's 503s that say the request was not taken and may be resent: the server is
  shutting down (it restarts with nothing to replay, or, with a shared store, with the group
  intact), the shared group store is unavailable or contended, the connection limit, or a body
  the server could not hold while it waits.

Resending the identical request is safe: the server attaches it to the same group or replays the
group's rows, with no new judge call. Every other answer is final: rows, a 409, a group failure
(503) or a server defect become results, and a request the server refuses as malformed (400,
404, 405, 413, 422) raises, since sending it again cannot help.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from dataclasses import dataclass
from typing import Final

import msgspec

from genrm_trio.client._results import GroupReply, RolloutResult, results_from_rows
from genrm_trio.core.messages import SHUTTING_DOWN

# genrm-trio's 503 texts for a request it did not take (docs/failures.md, docs/group-store.md,
# docs/running.md); `genrm-trio collect` resends on the same ones.
RESENDABLE_503_PREFIXES: Final = (
    SHUTTING_DOWN,
    "GenRM group store ",
    "server at its connection limit",
    "GenRM cannot hold this request body",
)
# genrm-trio never answers 502 or 504 itself: these come from a balancer or proxy in front.
GATEWAY_STATUSES: Final = frozenset({502, 503, 504})
REFUSED_STATUSES: Final = frozenset({400, 404, 405, 413, 422})
_REPLY: Final = msgspec.json.Decoder(GroupReply)
_DETAIL: Final = msgspec.json.Decoder(dict[str, object])


@dataclass(frozen=True, slots=True)
class ResendPolicy:
    """How many times a group is sent again at most, and the backoff before each resend: a
    draw from [0, min(max_sleep_s, first_sleep_s x 2^(k-1))] before the k-th (full jitter),
    or longer if the server asked for it with Retry-After."""

    max_resends: int = 8
    first_sleep_s: float = 0.25
    max_sleep_s: float = 8.0

    def __post_init__(self) -> None:
        if self.max_resends < 0:
            raise ValueError(f"max_resends {self.max_resends}: expected >= 0")
        for name in ("first_sleep_s", "max_sleep_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} {value!r}: expected a finite number >= 0")

    def sleep_s(self, resend: int, rng: random.Random, retry_after_s: float | None) -> float:
        """The pause before resend number ``resend`` (1 for the first)."""
        cap = min(self.max_sleep_s, self.first_sleep_s * 2 ** (resend - 1))
        drawn = rng.uniform(0.0, cap)
        return drawn if retry_after_s is None else max(drawn, retry_after_s)


@dataclass(frozen=True, slots=True)
class Rows:
    """The server answered the group: one result per rollout."""

    results: list[RolloutResult]


@dataclass(frozen=True, slots=True)
class Resend:
    """Not answered; send the identical request again after the backoff."""

    reason: str
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """Answered without rows: every rollout of the group fails with this reason."""

    reason: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The server refused the request as malformed; resending cannot help."""

    status: int
    detail: str


Decision = Rows | Resend | Failed | Refused


def connection_lost(error: BaseException) -> Resend:
    return Resend(f"{type(error).__name__}: {error}")


def decide(
    status: int, body: bytes, retry_after: str | None, size: int, now: float | None = None
) -> Decision:
    """What one HTTP reply to a group request means for a group of ``size`` rollouts."""
    if status == 200:
        try:
            rows = _REPLY.decode(body).rows
        except msgspec.MsgspecError as exc:
            return Failed(f"POST /verify_group answered 200 with an unreadable body: {exc}")
        results = results_from_rows(rows, size)
        if results is None:
            slots = sorted(row.rollout_index for row in rows)
            return Failed(f"POST /verify_group answered rows for slots {slots}, not 0..{size - 1}")
        return Rows(results)
    detail = _detail(body)
    text = detail if detail is not None else body[:200].decode("utf-8", "replace")
    described = f"POST /verify_group answered {status}: {text}"
    if status in GATEWAY_STATUSES:
        if status != 503 or detail is None or detail.startswith(RESENDABLE_503_PREFIXES):
            return Resend(described, parse_retry_after(retry_after, now))
        return Failed(described)
    if status in REFUSED_STATUSES:
        return Refused(status, text)
    return Failed(described)


def _detail(body: bytes) -> str | None:
    """genrm-trio's `detail`, or None for a body that is not genrm-trio's error shape."""
    try:
        value = _DETAIL.decode(body)
    except msgspec.MsgspecError:
        return None
    detail = value.get("detail")
    return detail if isinstance(detail, str) and list(value) == ["detail"] else None


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds from now (delta-seconds or an HTTP date); None if absent or
    unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)
