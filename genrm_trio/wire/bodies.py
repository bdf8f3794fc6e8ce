"""What a validated /verify or /compare body becomes (§2): the request types the engine
reads and a row echoes, the wire's keys and limits, and ``BadRequest`` for a rejected body."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final

from genrm_trio.wire import _json_scan

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
GROUP_ID_MAX_CODE_POINTS: Final = 1024
FAILURE_TEXT_MAX_CODE_POINTS: Final = 2000

# Optional request fields a masked row names even when the request left them out: Gym's failure
# rows are its whole verify request dumped, where they are null.
MASKED_ROW_REQUEST_KEYS: Final = ("principle", "prompt_id")
COORDINATE_KEYS: Final = (
    "_ng_group_id",
    "_ng_group_attempt",
    "_ng_rollout_index",
    "_ng_task_index",
)
METRIC_KEYS: Final = (
    "genrm_failed_comparison_rate_per_group",
    "genrm_masked_rollout_rate_per_group",
    "mean_individual_score",
    "std_individual_score",
    "tiebreak_usage_rate",
)
SERVER_OWNED_KEYS: Final = frozenset(
    {
        "reward",
        "mask_sample",
        "failure_kind",
        "failure_reason",
        "_ng_failure_class",
        "_ng_failure_judge_error",
        *METRIC_KEYS,
    }
)
ROLLOUT_ID_KEY: Final = "_ng_rollout_id"
# NeMo Gym's collector counts the retries of a rollout here (absent or 0 on its first dispatch).
ATTEMPT_INDEX_KEY: Final = "_ng_attempt_index"


def json_kind(value: Any) -> str:
    """How an error detail names the JSON type of a decoded value ("an object", "null", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


class BadRequest(Exception):
    """A rejected request body: ``status`` is 400, 413 or 422 and ``detail`` the exact text."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True, slots=True)
class FileSpan:
    """Bytes ``start:end`` of a body that waits in a spool file instead of memory."""

    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start


EchoValue = bytes | memoryview | FileSpan
# Values at least this long move to the spool file with the body; shorter ones are copied.
SPOOLED_VALUE_MIN_BYTES: Final = 4096


@dataclass(slots=True)
class RowEcho:
    """The members a row repeats, as (key JSON, value JSON) byte spans in reply order.

    The first ``request_members`` come from the request (coordinates among them rewritten in
    canonical JSON); the rest are the coordinates the request did not carry. ``spans`` gives,
    for each member whose value is a view of the body, where that value sits in it.
    """

    members: list[tuple[bytes | memoryview, EchoValue]]
    request_members: int
    instance_config: int | None  # index of the request's instance_config in ``members``
    spans: list[tuple[int, int] | None] = dataclasses.field(default_factory=list)
    # Members only a masked row adds: the request's optional fields it left out, as null.
    masked_only: tuple[tuple[bytes, bytes], ...] = ()


@dataclass(slots=True, weakref_slot=True)
class VerifyRequest:
    """A validated /verify body: the fields the server reads and what it needs to echo.

    The response is validated in full but, when it is standard JSON, decoded only as far as its
    scoring texts (S-1): the token ids and log-probs are checked, never built. The scoring view
    and prompt input are handed over once (``take_scoring``): a request waiting for its group
    then holds only the body it must echo, not a second form of it (I-10).
    """

    group_id: str | None
    attempt: int
    attempt_given: bool
    rollout_index: int | None
    task_index: int | None
    prompt_id: str | None
    principle: str | None
    input_value: Any  # responses_create_params.input as decoded, until taken
    baseline: str | None
    body: bytes  # as received; the echo's views point into it
    response_span: tuple[int, int]  # where the response value sits in ``body``
    # What the scoring texts are read from: the scoring view of the response (its output
    # items' type, summary and content), or the whole response when it was read leniently.
    response_scoring: Any
    response_may_hold_nan: bool  # False when it was read as standard JSON
    echo: RowEcho
    # Why the row is a resend of one rollout (C-99): Gym's retry count `_ng_attempt_index`
    # >= 1, or a masked row posted back; None for a row of a first dispatch.
    resend: str | None = None

    def response_view(self) -> memoryview:
        """The response value's bytes as sent, without a copy (it keeps the body alive)."""
        start, end = self.response_span
        return memoryview(self.body)[start:end]

    @property
    def response_value(self) -> Any:
        """The whole response, decoded on each access from its bytes (NaN and Infinity read)."""
        return _json_scan.decode_value(self.response_view())

    @property
    def spooled(self) -> bool:
        """The body waits in a spool file; the echo's large values are ``FileSpan``s."""
        return not self.body

    def spool_out(self) -> None:
        """Let go of the body, now copied to a spool file: large echoed values become spans of
        that file, short ones (and ``instance_config``, which a masked row rewrites) are
        copied. The request then holds no view of the body."""
        echo = self.echo
        members: list[tuple[bytes | memoryview, EchoValue]] = []
        for index, (key, value) in enumerate(echo.members):
            span = echo.spans[index] if index < len(echo.spans) else None
            if isinstance(value, memoryview):
                if (
                    span is not None
                    and len(value) >= SPOOLED_VALUE_MIN_BYTES
                    and index != echo.instance_config
                ):
                    value = FileSpan(*span)
                else:
                    value = bytes(value)
            members.append((bytes(key), value))
        echo.members = members
        self.body = b""

    def take_scoring(self) -> tuple[Any, Any]:
        """(scoring view of the response, prompt input); the request lets go of both, so this
        can be called only once."""
        response, input_value = self.response_scoring, self.input_value
        if response is _TAKEN:
            raise RuntimeError("the decoded response and input were already taken")
        self.response_scoring = self.input_value = _TAKEN
        return response, input_value


# What the decoded fields of a VerifyRequest hold once taken; no JSON value decodes to it.
_TAKEN: Final[Any] = object()


@dataclass(slots=True)
class CompareRequest:
    """A validated /compare body."""

    history: list[dict[str, str]]
    responses: list[Any]
    principle: str | None
    baseline: str | None
