"""The wire layer, with no I/O: what /verify and /compare bodies become, their validation with the
exact error texts, the byte-exact rows and replies, and the documented shapes as msgspec types;
the same for /verify_group (``group_bodies``), NeMo Gym's session and metrics routes
(``gym_bodies``) and OpenRLHF's reward route (``openrlhf_bodies``).

Everything here is plain synchronous code over bytes, unit-tested without an event loop or a
server; ``genrm_trio.http`` serves it. The documented shapes (the types behind
``/openapi.json``) are exported here; ``_json_scan`` is the parsers' own.
"""

from genrm_trio.wire.group_bodies import GroupRow, VerifyGroupReply, VerifyGroupRequestDoc
from genrm_trio.wire.gym_bodies import (
    AggregateMetricsReply,
    AggregateMetricsRequestDoc,
    CloseSessionReply,
    CloseSessionRequestDoc,
    SeedSessionReply,
    SeedSessionRequestDoc,
)
from genrm_trio.wire.openrlhf_bodies import (
    OpenRLHFExtraLogs,
    OpenRLHFRewardReply,
    OpenRLHFRewardRequestDoc,
)
from genrm_trio.wire.schema import (
    CompareMetrics,
    CompareReply,
    CompareRequestDoc,
    ComparisonResult,
    ErrorReply,
    Healthz,
    HistoryItem,
    JudgeReplicaState,
    MaskedInstanceConfig,
    MaskedRow,
    Readyz,
    ResponseObject,
    ResponsesCreateParams,
    VerifyRequestDoc,
    VerifyRow,
)

__all__ = [
    "AggregateMetricsReply",
    "AggregateMetricsRequestDoc",
    "CloseSessionReply",
    "CloseSessionRequestDoc",
    "CompareMetrics",
    "CompareReply",
    "CompareRequestDoc",
    "ComparisonResult",
    "ErrorReply",
    "GroupRow",
    "Healthz",
    "HistoryItem",
    "JudgeReplicaState",
    "MaskedInstanceConfig",
    "MaskedRow",
    "OpenRLHFExtraLogs",
    "OpenRLHFRewardReply",
    "OpenRLHFRewardRequestDoc",
    "Readyz",
    "ResponseObject",
    "ResponsesCreateParams",
    "SeedSessionReply",
    "SeedSessionRequestDoc",
    "VerifyGroupReply",
    "VerifyGroupRequestDoc",
    "VerifyRequestDoc",
    "VerifyRow",
]
