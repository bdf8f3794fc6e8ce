"""The /verify and /compare wire format (SPEC §2): body parsing with the exact error texts,
byte-exact rows, reply encoding, and the msgspec types that document these shapes."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, cast

import msgspec
from msgspec import UNSET, Meta, UnsetType

from genrm_trio.config import Config
from genrm_trio.core.canonical import canonical_json
from genrm_trio.http import json_scan

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
GROUP_ID_MAX_CODE_POINTS: Final = 1024
FAILURE_TEXT_MAX_CODE_POINTS: Final = 2000

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
_NOT_ECHOED: Final = SERVER_OWNED_KEYS | {ROLLOUT_ID_KEY}

BASELINE_REQUIRED: Final = (
    "responses_create_params.metadata.baseline_response: expected a non-empty string when "
    "comparison_strategy is fixed_baseline"
)
COMPARE_BASELINE_REQUIRED: Final = (
    "baseline_response: expected a non-empty string when comparison_strategy is fixed_baseline"
)
ROLLOUT_INDEX_REQUIRED: Final = "_ng_rollout_index is required for cohort comparison"

_VERIFY_DECODED: Final = frozenset(
    {"responses_create_params", "response", "_ng_group_id", "prompt_id", "principle"}
)
_COMPARE_DECODED: Final = frozenset(
    {"conversation_history", "response_objs", "principle", "baseline_response"}
)
_INTEGER_LITERAL = re.compile(rb"-?(?:0|[1-9][0-9]*)")
_MASK_MEMBER: Final = b'"mask_sample":true'
_MASKED_INSTANCE_CONFIG: Final = b'{"mask_sample":true}'
_INSTANCE_CONFIG_KEY: Final = b'"instance_config"'
_SCORED_TAIL: Final = b',"mask_sample":false,"failure_kind":null,"failure_reason":null'


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
    # The response's raw SHA-256 and canonical fingerprint, when computed before the request
    # reached the engine (a body about to be spooled, whose bytes will not stay in memory).
    known_fingerprints: tuple[bytes, bytes] | None = None

    @property
    def response_raw(self) -> bytes:
        """The response value's bytes as sent (a copy; the request keeps no second one)."""
        start, end = self.response_span
        return self.body[start:end]

    def response_view(self) -> memoryview:
        """The response value's bytes as sent, without a copy (it keeps the body alive)."""
        start, end = self.response_span
        return memoryview(self.body)[start:end]

    @property
    def response_value(self) -> Any:
        """The whole response, decoded on each access from its bytes (NaN and Infinity read)."""
        return json_scan.decode_value(self.response_view())

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

    def take_decoded(self) -> tuple[Any, Any]:
        """(the whole response decoded, prompt input); like ``take_scoring``, only once."""
        _, input_value = self.take_scoring()
        return self.response_value, input_value


# What the decoded fields of a VerifyRequest hold once taken; no JSON value decodes to it.
_TAKEN: Final[Any] = object()


@dataclass(slots=True)
class CompareRequest:
    """A validated /compare body."""

    history: list[dict[str, str]]
    responses: list[Any]
    principle: str | None
    baseline: str | None


# ---------------------------------------------------------------------------------------------
# Parsing


def parse_verify_body(body: bytes, config: Config) -> VerifyRequest:
    """Validate a /verify body completely (W-4…W-13); ``BadRequest`` names the first problem."""
    body = bytes(body)  # a no-op for bytes; the echo holds views of exactly this object
    by_key, members = _split(body, config, _VERIFY_DECODED, _VERIFY_DECODED_AS)

    params = _required(by_key, "responses_create_params", "an object").value
    if not isinstance(params, dict):
        raise _invalid(f"responses_create_params: expected an object, got {_describe(params)}")
    if "input" not in params:
        raise _invalid(_missing("responses_create_params.input", "a string or an array of objects"))
    input_value = params["input"]
    if isinstance(input_value, list):
        _check_objects(input_value, "responses_create_params.input")
    elif not isinstance(input_value, str):
        raise _invalid(
            "responses_create_params.input: expected a string or an array of objects, "
            f"got {_describe(input_value)}"
        )
    baseline = None
    if config.comparison_strategy == "fixed_baseline":
        metadata = params.get("metadata")
        baseline = metadata.get("baseline_response") if isinstance(metadata, dict) else None
        if not isinstance(baseline, str) or not baseline:
            raise _invalid(BASELINE_REQUIRED)

    response = _required(by_key, "response", "an object with an output array")
    _check_response(response.value, "response")

    group_id = _group_id(by_key.get("_ng_group_id"))
    attempt_member = by_key.get("_ng_group_attempt")
    attempt = 0
    if attempt_member is not None:
        attempt = _attempt(body, attempt_member)
    rollout_index = _nullable_int(body, by_key.get("_ng_rollout_index"), "_ng_rollout_index")
    if config.group_mode:
        slots = config.num_rollouts_per_prompt
        if rollout_index is None:
            raise _invalid(ROLLOUT_INDEX_REQUIRED)
        if not 0 <= rollout_index < slots:
            raise _invalid(f"_ng_rollout_index must be in [0, {slots}); got {rollout_index}")
    task_index = _nullable_int(body, by_key.get("_ng_task_index"), "_ng_task_index")
    prompt_id = _nullable_str(by_key.get("prompt_id"), "prompt_id")
    principle = _nullable_str(by_key.get("principle"), "principle")

    coordinates: dict[str, Any] = {
        "_ng_group_id": group_id,
        "_ng_group_attempt": attempt,
        "_ng_rollout_index": rollout_index,
        "_ng_task_index": task_index,
    }
    view = memoryview(body)
    echoed: list[tuple[bytes | memoryview, EchoValue]] = []
    spans: list[tuple[int, int] | None] = []
    instance_config = None
    for member in members:
        key = member.key
        if key in _NOT_ECHOED:
            continue
        if key in coordinates:
            echoed.append((_COORDINATE_KEY_JSON[key], _coordinate_json(coordinates[key])))
            spans.append(None)
            continue
        if key == "instance_config":
            instance_config = len(echoed)
        echoed.append(
            (view[member.key_start : member.key_end], view[member.value_start : member.value_end])
        )
        spans.append((member.value_start, member.value_end))
    request_members = len(echoed)
    for key in COORDINATE_KEYS:
        if key not in by_key:
            echoed.append((_COORDINATE_KEY_JSON[key], _coordinate_json(coordinates[key])))
            spans.append(None)

    return VerifyRequest(
        group_id=group_id,
        attempt=attempt,
        attempt_given=attempt_member is not None,
        rollout_index=rollout_index,
        task_index=task_index,
        prompt_id=prompt_id,
        principle=principle,
        input_value=input_value,
        baseline=baseline,
        body=body,
        response_span=(response.value_start, response.value_end),
        response_scoring=_scoring_view(response.value),
        response_may_hold_nan=not response.standard,
        echo=RowEcho(echoed, request_members, instance_config, spans),
    )


def parse_compare_body(body: bytes, config: Config) -> CompareRequest:
    """Validate a /compare body (§2.7); ``BadRequest`` names the first problem."""
    by_key, _ = _split(body, config, _COMPARE_DECODED)

    history_value = _required(
        by_key, "conversation_history", "an array of objects with string role and content"
    ).value
    if not isinstance(history_value, list):
        raise _invalid(
            "conversation_history: expected an array of objects with string role and content, "
            f"got {_describe(history_value)}"
        )
    history: list[dict[str, str]] = []
    for index, item in enumerate(history_value):
        path = f"conversation_history[{index}]"
        if not isinstance(item, dict):
            raise _invalid(
                f"{path}: expected an object with string role and content, got {_describe(item)}"
            )
        for field in ("role", "content"):
            if field not in item:
                raise _invalid(_missing(f"{path}.{field}", "a string"))
            if not isinstance(item[field], str):
                raise _invalid(f"{path}.{field}: expected a string, got {_describe(item[field])}")
        history.append({"role": item["role"], "content": item["content"]})

    responses = _required(by_key, "response_objs", "an array of objects").value
    if not isinstance(responses, list):
        raise _invalid(f"response_objs: expected an array of objects, got {_describe(responses)}")
    if len(responses) > config.max_compare_responses:
        raise _invalid(
            f"response_objs: expected at most {config.max_compare_responses} entries, "
            f"got {len(responses)}"
        )
    for index, response in enumerate(responses):
        _check_response(response, f"response_objs[{index}]")

    principle = _nullable_str(by_key.get("principle"), "principle")
    baseline = None
    if config.comparison_strategy == "fixed_baseline":
        member = by_key.get("baseline_response")
        baseline = None if member is None else member.value
        if not isinstance(baseline, str) or not baseline:
            raise _invalid(COMPARE_BASELINE_REQUIRED)
    return CompareRequest(history, responses, principle, baseline)


def _split(
    body: bytes,
    config: Config,
    decode: frozenset[str],
    decode_as: Mapping[str, msgspec.json.Decoder[Any]] | None = None,
) -> tuple[dict[str, json_scan.Member], list[json_scan.Member]]:
    if len(body) > config.max_body_bytes:
        raise BadRequest(413, body_too_large(config.max_body_bytes))
    return split_members(body, decode, decode_as)


def body_too_large(limit: int) -> str:
    """W-4's 413 text for a body over `max_body_bytes`."""
    return f"request body exceeds {limit} bytes"


def split_members(
    body: bytes,
    decode: frozenset[str],
    decode_as: Mapping[str, msgspec.json.Decoder[Any]] | None = None,
) -> tuple[dict[str, json_scan.Member], list[json_scan.Member]]:
    """W-4: the body as one JSON object without repeated top-level keys, by key and in order."""
    try:
        members = json_scan.split_object(body, decode=decode, decode_as=decode_as)
    except json_scan.JsonScanError as exc:
        raise BadRequest(400, f"invalid JSON body: {exc.reason}") from None
    by_key: dict[str, json_scan.Member] = {}
    for member in members:
        if member.key in by_key:
            raise BadRequest(400, f"duplicate key '{member.key}'")
        by_key[member.key] = member
    return by_key, members


def _invalid(detail: str) -> BadRequest:
    return BadRequest(422, detail)


def _missing(path: str, expected: str) -> str:
    return f"{path}: required field missing (expected {expected})"


def _required(by_key: Mapping[str, json_scan.Member], key: str, expected: str) -> json_scan.Member:
    member = by_key.get(key)
    if member is None:
        raise _invalid(_missing(key, expected))
    return member


def _check_objects(items: list[Any], path: str) -> None:
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise _invalid(f"{path}[{index}]: expected an object, got {_describe(item)}")


class _ScoringItem(msgspec.Struct):
    """An output item as far as its scoring texts go (S-1); other keys are validated, not kept."""

    type: Any = None
    summary: Any = None
    content: Any = None


class _ScoringResponse(msgspec.Struct):
    """A response as far as its scoring texts go: it must be an object with an output array of
    objects (anything else is decoded in full and reported by ``_check_response``)."""

    output: list[_ScoringItem]


_VERIFY_DECODED_AS: Final = {"response": msgspec.json.Decoder(_ScoringResponse)}


def _scoring_view(value: Any) -> Any:
    """The response shaped as ``extract_scoring_text`` reads it; a whole response is kept."""
    if not isinstance(value, _ScoringResponse):
        return value
    return {
        "output": [
            {"type": item.type, "summary": item.summary, "content": item.content}
            for item in value.output
        ]
    }


def _check_response(value: Any, path: str) -> None:
    if isinstance(value, _ScoringResponse):
        return  # its type already says it is an object with an output array of objects
    if not isinstance(value, dict):
        raise _invalid(f"{path}: expected an object, got {_describe(value)}")
    if "output" not in value:
        raise _invalid(_missing(f"{path}.output", "an array of objects"))
    output = value["output"]
    if not isinstance(output, list):
        raise _invalid(f"{path}.output: expected an array of objects, got {_describe(output)}")
    _check_objects(output, f"{path}.output")


def _group_id(member: json_scan.Member | None) -> str | None:
    if member is None or member.value is None:
        return None
    value = member.value
    if isinstance(value, str) and 1 <= len(value) <= GROUP_ID_MAX_CODE_POINTS:
        return value
    raise _invalid(
        f"_ng_group_id: expected a string of 1 to {GROUP_ID_MAX_CODE_POINTS} code points or "
        f"null, got {_describe(value)}"
    )


def _coordinate_json(value: str | int | None) -> bytes:
    """W-21: a coordinate in canonical JSON; integers and null need no encoder."""
    if value is None:
        return b"null"
    if isinstance(value, int):
        return str(value).encode("ascii")  # validated: an int, never a bool, within 64 bits
    return canonical_json(value)


def _strict_int(body: bytes, member: json_scan.Member) -> int | None:
    """W-7: the integer a JSON integer literal spells, or None for any other value."""
    raw = body[member.value_start : member.value_end]
    if _INTEGER_LITERAL.fullmatch(raw) is None:
        return None
    if len(raw) > 20:
        # Out of range whatever the digits; int() is spared arbitrarily long digit runs.
        return INT64_MIN - 1 if raw.startswith(b"-") else INT64_MAX + 1
    return int(raw)


def _attempt(body: bytes, member: json_scan.Member) -> int:
    value = _strict_int(body, member)
    if value is None or value < 0:
        got = _describe_raw(body, member)
        raise _invalid(f"_ng_group_attempt: expected an integer >= 0, got {got}")
    if value > INT64_MAX:
        got = _describe_raw(body, member)
        raise _invalid(
            f"_ng_group_attempt: expected an integer between 0 and {INT64_MAX}, got {got}"
        )
    return value


def _nullable_int(body: bytes, member: json_scan.Member | None, key: str) -> int | None:
    if member is None or body[member.value_start : member.value_end] == b"null":
        return None
    value = _strict_int(body, member)
    if value is None:
        raise _invalid(f"{key}: expected an integer or null, got {_describe_raw(body, member)}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise _invalid(
            f"{key}: expected an integer between {INT64_MIN} and {INT64_MAX} or null, "
            f"got {_describe_raw(body, member)}"
        )
    return value


def _nullable_str(member: json_scan.Member | None, key: str) -> str | None:
    if member is None or member.value is None:
        return None
    if isinstance(member.value, str):
        return member.value
    raise _invalid(f"{key}: expected a string or null, got {_describe(member.value)}")


_DESCRIBE_LIMIT: Final = 40


def _describe_raw(body: bytes, member: json_scan.Member) -> str:
    """A top-level scalar as the client spelled it (``1.0``, ``1e3``, ``NaN``), when short."""
    raw = body[member.value_start : member.value_end]
    first = raw[:1]
    if first == b"{":
        return "an object"
    if first == b"[":
        return "an array"
    if first != b'"' and len(raw) <= _DESCRIBE_LIMIT:
        return raw.decode("utf-8")
    return _describe(json_scan.decode_value(raw))


def _describe(value: Any) -> str:
    """A short description of a decoded value for a 422 text."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        if abs(value) < 10**_DESCRIBE_LIMIT:
            return str(value)
        return f"an integer of more than {_DESCRIBE_LIMIT} digits"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, str):
        if len(value) <= _DESCRIBE_LIMIT:
            return json.dumps(value, ensure_ascii=False)
        return f"a string of {len(value)} code points"
    if isinstance(value, list):
        return "an array"
    return "an object"


# ---------------------------------------------------------------------------------------------
# Rendering

_COORDINATE_KEY_JSON: Final = {key: canonical_json(key) for key in COORDINATE_KEYS}
_METRIC_KEY_JSON: Final = {key: b"," + canonical_json(key) + b":" for key in METRIC_KEYS}


def render_scored_row(
    req: VerifyRequest, reward: float, metrics: Mapping[str, float] | None
) -> bytes:
    """W-20: the echo, then reward and the unmasked flags, then the five group metrics if given."""
    return b"".join(_in_memory(scored_row_parts(req, reward, metrics)))


def scored_row_parts(
    req: VerifyRequest, reward: float, metrics: Mapping[str, float] | None
) -> list[EchoValue]:
    """The scored row in order, with the spans of a spooled body left to be read."""
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


def render_masked_row(req: VerifyRequest, failure_text: str) -> bytes:
    """W-30…W-32: the masked row (see ``masked_row_parts``)."""
    return b"".join(_in_memory(masked_row_parts(req, failure_text)))


def _in_memory(parts: list[EchoValue]) -> list[bytes | memoryview]:
    if any(isinstance(part, FileSpan) for part in parts):
        raise ValueError("the request's body waits in a spool file; stream its row instead")
    return cast(list[bytes | memoryview], parts)


def masked_row_parts(req: VerifyRequest, failure_text: str) -> list[EchoValue]:
    """W-30…W-32: the echo with ``instance_config`` masked, then the masked flags and text.

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
    text = _json_string(failure_text[:FAILURE_TEXT_MAX_CODE_POINTS])
    parts = _echo_parts(members)
    parts.append(b'"reward":0.0,"mask_sample":true,"failure_kind":"judge_failed","failure_reason":')
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


def render_healthz(status: str, counts: Mapping[str, int]) -> bytes:
    """W-50: the status, the four state counts, the count of resent legacy groups and the judge
    attempts started so far."""
    if status not in ("ok", "shutting_down"):
        raise ValueError(f"unknown health status {status!r}")
    return _ENCODER.encode(
        Healthz(
            status=status,  # type: ignore[arg-type]
            active_groups=counts["active_groups"],
            retained_records=counts["retained_records"],
            watermarks=counts["watermarks"],
            judge_in_flight=counts["judge_in_flight"],
            legacy_resends_collecting=counts.get("legacy_resends_collecting", 0),
            judge_attempts_total=counts.get("judge_attempts_total", 0),
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
    for member in json_scan.split_object(raw, validate=False):
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


# ---------------------------------------------------------------------------------------------
# Documented shapes (W-51). Validation above is written by hand for the exact texts; these types
# share its limits and drive the OpenAPI document and the encoding of the fixed-shape replies.

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
    metadata: (
        Annotated[
            dict[str, Any],
            Meta(description="`baseline_response` is required here under fixed_baseline."),
        ]
        | UnsetType
    ) = UNSET


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
    reward: Annotated[float, Meta(description="Always 0.0, a placeholder.")]
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
    baseline_response: (
        Annotated[str, Meta(min_length=1, description="Required under fixed_baseline.")] | UnsetType
    ) = UNSET


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


class ErrorReply(msgspec.Struct, frozen=True, kw_only=True):
    """Every error reply; clients match on the key phrases of ``detail``."""

    detail: str


_ENCODER: Final = msgspec.json.Encoder()
