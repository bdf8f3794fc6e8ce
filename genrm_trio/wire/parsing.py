"""Parsing /verify and /compare bodies (W-4…W-13, §2.7): complete validation with the exact
400, 413 and 422 texts, and the echo a row will repeat."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from genrm_trio.config import Config
from genrm_trio.core.canonical import canonical_json
from genrm_trio.wire import _json_scan
from genrm_trio.wire.bodies import (
    ATTEMPT_INDEX_KEY,
    COORDINATE_KEYS,
    GROUP_ID_MAX_CODE_POINTS,
    INT64_MAX,
    INT64_MIN,
    MASKED_ROW_REQUEST_KEYS,
    ROLLOUT_ID_KEY,
    SERVER_OWNED_KEYS,
    BadRequest,
    CompareRequest,
    EchoValue,
    RowEcho,
    VerifyRequest,
)

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
_COORDINATE_KEY_JSON: Final = {key: canonical_json(key) for key in COORDINATE_KEYS}
_MASKED_ROW_KEY_JSON: Final = {key: canonical_json(key) for key in MASKED_ROW_REQUEST_KEYS}


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
    resend = _resend(body, by_key)
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
        resend=resend,
        echo=RowEcho(
            echoed,
            request_members,
            instance_config,
            spans,
            tuple(
                (_MASKED_ROW_KEY_JSON[key], b"null")
                for key in MASKED_ROW_REQUEST_KEYS
                if key not in by_key
            ),
        ),
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
) -> tuple[dict[str, _json_scan.Member], list[_json_scan.Member]]:
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
) -> tuple[dict[str, _json_scan.Member], list[_json_scan.Member]]:
    """W-4: the body as one JSON object without repeated top-level keys, by key and in order."""
    try:
        members = _json_scan.split_object(body, decode=decode, decode_as=decode_as)
    except _json_scan.JsonScanError as exc:
        raise BadRequest(400, f"invalid JSON body: {exc.reason}") from None
    by_key: dict[str, _json_scan.Member] = {}
    for member in members:
        if member.key in by_key:
            raise BadRequest(400, f"duplicate key '{member.key}'")
        by_key[member.key] = member
    return by_key, members


def _invalid(detail: str) -> BadRequest:
    return BadRequest(422, detail)


def _missing(path: str, expected: str) -> str:
    return f"{path}: required field missing (expected {expected})"


def _required(
    by_key: Mapping[str, _json_scan.Member], key: str, expected: str
) -> _json_scan.Member:
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


def _group_id(member: _json_scan.Member | None) -> str | None:
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


def _strict_int(body: bytes, member: _json_scan.Member) -> int | None:
    """W-7: the integer a JSON integer literal spells, or None for any other value."""
    raw = body[member.value_start : member.value_end]
    if _INTEGER_LITERAL.fullmatch(raw) is None:
        return None
    if len(raw) > 20:
        # Out of range whatever the digits; int() is spared arbitrarily long digit runs.
        return INT64_MIN - 1 if raw.startswith(b"-") else INT64_MAX + 1
    return int(raw)


def _attempt(body: bytes, member: _json_scan.Member) -> int:
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


def _nullable_int(body: bytes, member: _json_scan.Member | None, key: str) -> int | None:
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


def _resend(body: bytes, by_key: Mapping[str, _json_scan.Member]) -> str | None:
    """Why the row is a resend of one rollout (C-99), or None for a first dispatch."""
    member = by_key.get(ATTEMPT_INDEX_KEY)
    if member is not None and body[member.value_start : member.value_end] != b"null":
        attempt = _strict_int(body, member)
        if attempt is None or not 0 <= attempt <= INT64_MAX:
            raise _invalid(
                f"{ATTEMPT_INDEX_KEY}: expected an integer >= 0 or null, "
                f"got {_describe_raw(body, member)}"
            )
        if attempt > 0:
            return f"{ATTEMPT_INDEX_KEY}={attempt}"
    masked = by_key.get("mask_sample")
    if masked is not None and body[masked.value_start : masked.value_end] == b"true":
        return "a masked row posted back"
    return None


def _nullable_str(member: _json_scan.Member | None, key: str) -> str | None:
    if member is None or member.value is None:
        return None
    if isinstance(member.value, str):
        return member.value
    raise _invalid(f"{key}: expected a string or null, got {_describe(member.value)}")


_DESCRIBE_LIMIT: Final = 40


def _describe_raw(body: bytes, member: _json_scan.Member) -> str:
    """A top-level scalar as the client spelled it (``1.0``, ``1e3``, ``NaN``), when short."""
    raw = body[member.value_start : member.value_end]
    first = raw[:1]
    if first == b"{":
        return "an object"
    if first == b"[":
        return "an array"
    if first != b'"' and len(raw) <= _DESCRIBE_LIMIT:
        return raw.decode("utf-8")
    return _describe(_json_scan.decode_value(raw))


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
