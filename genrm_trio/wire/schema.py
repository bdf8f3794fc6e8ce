"""The documented wire shapes (W-51) as msgspec types. Validation in ``parsing`` is written by
hand for the exact texts; these types share its limits and drive the OpenAPI document and the
encoding of the fixed-shape replies."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from genrm_trio.wire.bodies import (
    FAILURE_TEXT_MAX_CODE_POINTS,
    GROUP_ID_MAX_CODE_POINTS,
    INT64_MAX,
    INT64_MIN,
)

Int64 = Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)]
GroupId = Annotated[str, Meta(min_length=1, max_length=GROUP_ID_MAX_CODE_POINTS)]
FailureText = Annotated[str, Meta(max_length=FAILURE_TEXT_MAX_CODE_POINTS)]
FreeForm = Annotated[
    dict[str, Any], Meta(description="Free-form; echoed byte for byte (NaN/Infinity allowed).")
]


class ResponsesCreateParams(msgspec.Struct, frozen=True, kw_only=True):
    """The policy's Responses-API create params; only ``input`` is read."""

    input: Annotated[
        str | list[dict[str, Any]],
        Meta(description="The prompt: a string or message-like items."),
    ]
    metadata: Annotated[
        Any,
        Meta(
            description=(
                "Under fixed_baseline, required: an object whose `baseline_response` is a "
                "non-empty string. Under the other strategies it is echoed, not read."
            )
        ),
    ] = UNSET


class ResponseObject(msgspec.Struct, frozen=True, kw_only=True):
    """A Responses-API object; other keys are free-form, echoed and fingerprinted."""

    output: list[dict[str, Any]]


class VerifyRequestDoc(msgspec.Struct, frozen=True, kw_only=True):
    """A rollout to score. Other keys are extra fields, echoed verbatim."""

    responses_create_params: ResponsesCreateParams
    response: ResponseObject
    ng_group_id: GroupId | None = msgspec.field(default=None, name="_ng_group_id")
    ng_group_attempt: Annotated[int, Meta(ge=0, le=INT64_MAX)] = msgspec.field(
        default=0, name="_ng_group_attempt"
    )
    ng_rollout_index: Int64 | None = msgspec.field(default=None, name="_ng_rollout_index")
    ng_task_index: Int64 | None = msgspec.field(default=None, name="_ng_task_index")
    prompt_id: str | None = None
    principle: str | None = None
    instance_config: Any = UNSET
    ng_rollout_id: Any = msgspec.field(default=UNSET, name="_ng_rollout_id")


class VerifyRow(msgspec.Struct, frozen=True, kw_only=True):
    """A scored row: the request's keys in request order, then the reward and group metrics."""

    responses_create_params: FreeForm
    response: FreeForm
    ng_group_id: GroupId | None = msgspec.field(name="_ng_group_id")
    ng_group_attempt: Annotated[int, Meta(ge=0)] = msgspec.field(name="_ng_group_attempt")
    ng_rollout_index: Int64 | None = msgspec.field(name="_ng_rollout_index")
    ng_task_index: Int64 | None = msgspec.field(name="_ng_task_index")
    reward: Annotated[float, Meta(description="A finite number.")]
    mask_sample: Literal[False]
    failure_kind: None
    failure_reason: None
    genrm_failed_comparison_rate_per_group: float | UnsetType = UNSET
    genrm_masked_rollout_rate_per_group: float | UnsetType = UNSET
    mean_individual_score: float | UnsetType = UNSET
    std_individual_score: float | UnsetType = UNSET
    tiebreak_usage_rate: float | UnsetType = UNSET


class MaskedInstanceConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The request's instance_config (other keys kept) with ``mask_sample`` set."""

    mask_sample: Literal[True]


class MaskedRow(msgspec.Struct, frozen=True, kw_only=True):
    """A masked rollout: its reward is unknown; consumers key on ``mask_sample``."""

    responses_create_params: FreeForm
    response: FreeForm
    instance_config: MaskedInstanceConfig
    ng_group_id: GroupId | None = msgspec.field(name="_ng_group_id")
    ng_group_attempt: Annotated[int, Meta(ge=0)] = msgspec.field(name="_ng_group_attempt")
    ng_rollout_index: Int64 | None = msgspec.field(name="_ng_rollout_index")
    ng_task_index: Int64 | None = msgspec.field(name="_ng_task_index")
    principle: str | None
    prompt_id: str | None
    reward: Annotated[
        float,
        Meta(
            description=(
                "A placeholder, never a measurement: 0.0, or with masked_reward_placeholder "
                "group_mean the mean of the group's scored rewards (0.0 when none was scored)."
            )
        ),
    ]
    mask_sample: Literal[True]
    failure_kind: Literal["judge_failed"]
    failure_reason: FailureText
    ng_failure_class: Literal["judge_failed"] = msgspec.field(name="_ng_failure_class")
    ng_failure_judge_error: FailureText = msgspec.field(name="_ng_failure_judge_error")


class HistoryItem(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    content: str


class CompareRequestDoc(msgspec.Struct, frozen=True, kw_only=True):
    """Answers to judge against each other in one stateless call. Other keys are ignored."""

    conversation_history: list[HistoryItem]
    response_objs: Annotated[
        list[ResponseObject], Meta(description="At most max_compare_responses entries.")
    ]
    principle: str | None = None
    baseline_response: Annotated[
        Any,
        Meta(
            description=(
                "Under fixed_baseline, required: a non-empty string. Under the other strategies "
                "it is not read, whatever it holds."
            )
        ),
    ] = UNSET


class ComparisonResult(msgspec.Struct, frozen=True, kw_only=True):
    """One comparison's parsed verdict, before the tie-break."""

    response_i: int
    response_j: int
    judge_idx: int
    score_1: float
    score_2: float
    ranking: float


class CompareMetrics(msgspec.Struct, frozen=True, kw_only=True):
    mean_individual_score: float
    std_individual_score: float
    tiebreak_usage_rate: float


class CompareReply(msgspec.Struct, frozen=True, kw_only=True):
    """One reward per answer, in input order."""

    rewards: list[float]
    comparison_results: list[ComparisonResult] | None
    metrics: CompareMetrics | None


class Healthz(msgspec.Struct, frozen=True, kw_only=True):
    status: Literal["ok", "shutting_down"]
    active_groups: int
    retained_records: int
    watermarks: int
    judge_in_flight: int
    legacy_resends_collecting: Annotated[
        int,
        Meta(
            description=(
                "Legacy groups (no _ng_group_id) opened by a row resent under a key whose group "
                "had already completed, still collecting: each completes only if every member "
                "is sent again, else fails at its collection deadline."
            )
        ),
    ] = 0
    judge_attempts_total: Annotated[
        int,
        Meta(
            description=(
                "Judge HTTP requests this server has started since it started (every attempt "
                "of /verify and /compare comparisons); a collector reports its change over a run."
            )
        ),
    ] = 0
    group_store: Annotated[
        str,
        Meta(
            description=(
                "Where groups live: 'memory', or the shared store's URL without credentials."
            )
        ),
    ] = "memory"
    group_store_available: Annotated[
        bool,
        Meta(
            description=(
                "Whether the shared store answered this health check; while it does not, "
                "/verify answers 503 naming it and the group counts are this process's own."
            )
        ),
    ] = True
    body_bytes_receiving: Annotated[
        int,
        Meta(
            description=(
                "Bytes of /verify bodies this process has read and not yet validated (within "
                "the memory budget or beyond it, in a spool slot)."
            )
        ),
    ] = 0
    body_bytes_in_memory: Annotated[
        int,
        Meta(
            description=(
                "Bytes of whole /verify bodies this process holds in memory while their "
                "requests wait (within waiting_body_memory_bytes)."
            )
        ),
    ] = 0
    body_bytes_spooled: Annotated[
        int,
        Meta(description="Bytes of /verify bodies waiting in this process's spool files."),
    ] = 0
    num_rollouts_per_prompt: Annotated[
        int | None,
        Meta(description="The group size N the server waits for; null when group mode is off."),
    ] = None
    comparison_strategy: Annotated[
        str, Meta(description="How a group's rollouts are paired for the judge.")
    ] = "circular"
    judge_replicas: Annotated[
        list[JudgeReplicaState],
        Meta(description="Each judge replica as its readiness probes found it."),
    ] = msgspec.field(default_factory=list)


class JudgeReplicaState(msgspec.Struct, frozen=True, kw_only=True):
    """One judge replica as its last readiness probe (`GET <url><judge_probe_path>`) found it."""

    url: Annotated[str, Meta(description="The replica's base URL, without user-info.")]
    reachable: Annotated[
        bool | None,
        Meta(
            description=(
                "Whether its last probe got a 2xx reply; null when probing is off or no probe "
                "has finished yet."
            )
        ),
    ]
    last_probe_at: Annotated[
        float | None, Meta(description="When its last probe ended, in Unix seconds.")
    ]
    last_error: Annotated[
        str | None,
        Meta(description="Why its last probe failed (the failure and its message, or the status)."),
    ]


class Readyz(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /readyz`: whether the server can judge now."""

    status: Literal["ready", "not_ready", "shutting_down"]
    reasons: Annotated[
        list[str] | UnsetType,
        Meta(
            description=(
                "Why not ready (absent when ready): each failing judge replica's URL and last "
                "error, the group store, or the shutdown."
            )
        ),
    ] = UNSET
    judge_replicas: list[JudgeReplicaState]
    group_store_available: bool


class ErrorReply(msgspec.Struct, frozen=True, kw_only=True):
    """Every error reply; clients match on the key phrases of ``detail``."""

    detail: str
