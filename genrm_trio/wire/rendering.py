"""Rendering replies (W-20…W-50): byte-exact scored and masked rows, the /compare, /healthz and
/readyz replies, and error bodies."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from genrm_trio.core.canonical import canonical_json
from genrm_trio.wire import _json_scan
from genrm_trio.wire.bodies import (
    FAILURE_TEXT_MAX_CODE_POINTS,
    METRIC_KEYS,
    EchoValue,
    FileSpan,
    VerifyRequest,
)
from genrm_trio.wire.schema import (
    CompareMetrics,
    CompareReply,
    ComparisonResult,
    Healthz,
    JudgeReplicaState,
    Readyz,
)

_MASK_MEMBER: Final = b'"mask_sample":true'
_MASKED_INSTANCE_CONFIG: Final = b'{"mask_sample":true}'
_INSTANCE_CONFIG_KEY: Final = b'"instance_config"'
_SCORED_TAIL: Final = b',"mask_sample":false,"failure_kind":null,"failure_reason":null'
_MASKED_FLAGS: Final = b',"mask_sample":true,"failure_kind":"judge_failed","failure_reason":'
_METRIC_KEY_JSON: Final = {key: b"," + canonical_json(key) + b":" for key in METRIC_KEYS}
_ENCODER: Final = msgspec.json.Encoder()


def scored_row_parts(
    req: VerifyRequest, reward: float, metrics: Mapping[str, float] | None
) -> list[EchoValue]:
    """W-20: the echo, then reward and the unmasked flags, then the five group metrics if
    given; in order, with the spans of a spooled body left to be read."""
    parts = _echo_parts(req.echo.members)
    parts.append(b'"reward":')
    parts.append(_number(reward))
    parts.append(_SCORED_TAIL)
    if metrics is not None:
        for key in METRIC_KEYS:
            parts.append(_METRIC_KEY_JSON[key])
            parts.append(_number(metrics[key]))
    parts.append(b"}")
    return parts


def masked_row_parts(
    req: VerifyRequest, failure_text: str, placeholder: float = 0.0
) -> list[EchoValue]:
    """W-30…W-33: the echo with ``instance_config`` masked and ``principle`` and ``prompt_id``
    named (null when the request left them out), then the reward placeholder, the masked flags
    and the text.

    An ``instance_config`` the request lacked goes after the echoed request keys and before the
    coordinates the request lacked. The text is cut to 2000 code points if longer; callers that
    add the legacy suffix bound it first with ``bound_failure_text``.
    """
    echo = req.echo
    members = list(echo.members)
    if echo.instance_config is None:
        members.insert(echo.request_members, (_INSTANCE_CONFIG_KEY, _MASKED_INSTANCE_CONFIG))
    else:
        key, value = members[echo.instance_config]
        assert not isinstance(value, FileSpan)  # spooling keeps it in memory
        members[echo.instance_config] = (key, _masked_instance_config(bytes(value)))
    members.extend(echo.masked_only)
    text = _json_string(failure_text[:FAILURE_TEXT_MAX_CODE_POINTS])
    parts = _echo_parts(members)
    parts.append(b'"reward":')
    parts.append(_number(placeholder))
    parts.append(_MASKED_FLAGS)
    parts.append(text)
    parts.append(b',"_ng_failure_class":"judge_failed","_ng_failure_judge_error":')
    parts.append(text)
    parts.append(b"}")
    return parts


def bound_failure_text(text: str, suffix: str = "") -> str:
    """W-31: ``text + suffix`` in at most 2000 code points, cutting ``text``, never ``suffix``."""
    room = max(FAILURE_TEXT_MAX_CODE_POINTS - len(suffix), 0)
    return text[:room] + suffix


def error_body(detail: str) -> bytes:
    """W-3: ``{"detail": "<message>"}``."""
    return b'{"detail":' + _json_string(detail) + b"}"


def render_compare_reply(
    rewards: list[float],
    comparison_results: list[dict[str, Any]] | None,
    metrics: Mapping[str, float] | None,
) -> bytes:
    """W-40: rewards in input order, the comparison results and the three group metrics."""
    for reward in rewards:
        _check_finite(reward)
    reply = CompareReply(
        rewards=[float(reward) for reward in rewards],
        comparison_results=None
        if comparison_results is None
        else [
            ComparisonResult(
                response_i=int(result["response_i"]),
                response_j=int(result["response_j"]),
                judge_idx=int(result["judge_idx"]),
                score_1=float(result["score_1"]),
                score_2=float(result["score_2"]),
                ranking=float(result["ranking"]),
            )
            for result in comparison_results
        ],
        metrics=None
        if metrics is None
        else CompareMetrics(
            mean_individual_score=float(metrics["mean_individual_score"]),
            std_individual_score=float(metrics["std_individual_score"]),
            tiebreak_usage_rate=float(metrics["tiebreak_usage_rate"]),
        ),
    )
    return _ENCODER.encode(reply)


def render_healthz(
    status: str,
    counts: Mapping[str, int],
    store: tuple[str, bool] = ("memory", True),
    workers: Mapping[str, int] | None = None,
    *,
    num_rollouts_per_prompt: int | None = None,
    comparison_strategy: str = "circular",
    judge_replicas: Sequence[JudgeReplicaState] = (),
) -> bytes:
    """W-50: the status, the four state counts, the count of resent legacy groups, the judge
    attempts started so far, the group store (X-4), the request-body bytes by where they
    are (receiving, in memory, spooled), the group size (None: group mode off), the comparison
    strategy and each judge replica's probe state; under `serve --workers N`, after them,
    `workers` (`worker`, `workers_up`, `workers`: this worker's index, the live workers, N)."""
    if status not in ("ok", "shutting_down"):
        raise ValueError(f"unknown health status {status!r}")
    body = _ENCODER.encode(
        Healthz(
            status=status,  # type: ignore[arg-type]
            active_groups=counts["active_groups"],
            retained_records=counts["retained_records"],
            watermarks=counts["watermarks"],
            judge_in_flight=counts["judge_in_flight"],
            legacy_resends_collecting=counts.get("legacy_resends_collecting", 0),
            judge_attempts_total=counts.get("judge_attempts_total", 0),
            group_store=store[0],
            group_store_available=store[1],
            body_bytes_receiving=counts.get("body_bytes_receiving", 0),
            body_bytes_in_memory=counts.get("body_bytes_in_memory", 0),
            body_bytes_spooled=counts.get("body_bytes_spooled", 0),
            num_rollouts_per_prompt=num_rollouts_per_prompt,
            comparison_strategy=comparison_strategy,
            judge_replicas=list(judge_replicas),
        )
    )
    if workers is None:
        return body
    extra = b"".join(
        b',"%s":%d' % (name.encode(), workers[name]) for name in ("worker", "workers_up", "workers")
    )
    return body[:-1] + extra + b"}"


def render_readyz(
    status: str,
    reasons: Sequence[str],
    judge_replicas: Sequence[JudgeReplicaState],
    group_store_available: bool,
) -> bytes:
    """`GET /readyz`: the status (ready, not_ready or shutting_down), the reasons when not
    ready, each judge replica's probe state and whether the group store is available."""
    if status not in ("ready", "not_ready", "shutting_down"):
        raise ValueError(f"unknown readiness status {status!r}")
    return _ENCODER.encode(
        Readyz(
            status=status,  # type: ignore[arg-type]
            reasons=msgspec.UNSET if status == "ready" else list(reasons),
            judge_replicas=list(judge_replicas),
            group_store_available=group_store_available,
        )
    )


def _echo_parts(members: list[tuple[bytes | memoryview, EchoValue]]) -> list[EchoValue]:
    parts: list[EchoValue] = [b"{"]
    for key, value in members:
        parts += (key, b":", value, b",")
    return parts


def _masked_instance_config(raw: bytes) -> bytes:
    """W-30: an object keeps its members as sent, with ``mask_sample`` set; else it is replaced."""
    if raw[:1] != b"{":
        return _MASKED_INSTANCE_CONFIG
    members: list[bytes] = []
    masked = False
    for member in _json_scan.split_object(raw, validate=False):
        if member.key == "mask_sample":
            # Later duplicates go, so that whichever occurrence a reader keeps says true.
            if not masked:
                members.append(_MASK_MEMBER)
                masked = True
            continue
        key = raw[member.key_start : member.key_end]
        members.append(key + b":" + raw[member.value_start : member.value_end])
    if not masked:
        members.append(_MASK_MEMBER)
    return b"{" + b",".join(members) + b"}"


def _check_finite(value: float) -> None:
    if isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"a reply number must be finite, got {value!r}")


def _number(value: float) -> bytes:
    _check_finite(value)
    return repr(float(value)).encode("ascii")


def _json_string(text: str) -> bytes:
    try:
        return _ENCODER.encode(text)
    except UnicodeEncodeError:
        # Lone surrogates (possible in texts built from client strings) have no UTF-8 form.
        return json.dumps(text).encode("ascii")
