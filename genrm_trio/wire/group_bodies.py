"""A whole group in one `/verify_group` request: its documented shape, and its validation into
the `/verify` request each response would have been on its own; the reply's shape.

Each response becomes the `/verify` body it would have been on its own (same group id, attempt,
prompt and principle, `_ng_rollout_index` = its position) and is validated by the `/verify`
parser, so an error names the response by its place (`responses[i]`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Final, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from genrm_trio.config import Config
from genrm_trio.wire import _json_scan
from genrm_trio.wire.bodies import INT64_MAX, BadRequest, VerifyRequest
from genrm_trio.wire.parsing import parse_verify_body, split_members
from genrm_trio.wire.schema import (
    FailureText,
    GroupId,
    Int64,
    ResponseObject,
    ResponsesCreateParams,
)

RESPONSES_KEY: Final = "responses"
# Keys of a group request that each member carries unchanged.
_SHARED_KEYS: Final = (
    "responses_create_params",
    "_ng_group_id",
    "_ng_group_attempt",
    "_ng_task_index",
    "prompt_id",
    "principle",
)
_GROUP_ID_EXPECTED: Final = "a string of 1 to 1024 code points"
_RAW_LIST: Final = msgspec.json.Decoder(list[msgspec.Raw])


class VerifyGroupRequestDoc(msgspec.Struct, frozen=True, kw_only=True):
    """A whole group: the prompt once and the N responses in slot order."""

    responses_create_params: ResponsesCreateParams
    responses: Annotated[
        list[ResponseObject],
        Meta(
            description=(
                "Exactly num_rollouts_per_prompt responses; the one at position i is slot i "
                "(_ng_rollout_index). Each is what /verify's `response` would be."
            )
        ),
    ]
    ng_group_id: GroupId = msgspec.field(name="_ng_group_id")
    ng_group_attempt: Annotated[int, Meta(ge=0, le=INT64_MAX)] = msgspec.field(
        default=0, name="_ng_group_attempt"
    )
    ng_task_index: Int64 | None = msgspec.field(default=None, name="_ng_task_index")
    prompt_id: str | None = None
    principle: str | None = None


class GroupRow(msgspec.Struct, frozen=True, kw_only=True):
    """One slot's result. A masked slot has `reward: null`; scored slots carry the five group
    metrics of a scored /verify row."""

    ng_rollout_index: int = msgspec.field(name="_ng_rollout_index")
    reward: Annotated[float | None, Meta(description="null exactly when mask_sample is true")]
    mask_sample: bool
    failure_kind: Literal["judge_failed"] | None
    failure_reason: FailureText | None
    genrm_failed_comparison_rate_per_group: float | UnsetType = UNSET
    genrm_masked_rollout_rate_per_group: float | UnsetType = UNSET
    mean_individual_score: float | UnsetType = UNSET
    std_individual_score: float | UnsetType = UNSET
    tiebreak_usage_rate: float | UnsetType = UNSET


class VerifyGroupReply(msgspec.Struct, frozen=True, kw_only=True):
    """Every slot's row, in slot order."""

    ng_group_id: str = msgspec.field(name="_ng_group_id")
    ng_group_attempt: int = msgspec.field(name="_ng_group_attempt")
    rows: list[GroupRow]


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """A validated group request: one parsed /verify request per slot."""

    group_id: str
    attempt: int
    members: list[VerifyRequest]


def parse_group_body(body: bytes, config: Config) -> GroupRequest:
    """Validate a /verify_group body; ``BadRequest`` names the first problem by its path."""
    by_key, _ = split_members(body, frozenset({"_ng_group_id"}))
    group_id = by_key.get("_ng_group_id")
    if group_id is None:
        raise BadRequest(
            422, f"_ng_group_id: required field missing (expected {_GROUP_ID_EXPECTED})"
        )
    responses = by_key.get(RESPONSES_KEY)
    slots = config.num_rollouts_per_prompt
    expected = f"an array of {slots} response objects (num_rollouts_per_prompt)"
    if responses is None:
        raise BadRequest(422, f"{RESPONSES_KEY}: required field missing (expected {expected})")
    items = _raw_items(body[responses.value_start : responses.value_end])
    if items is None:
        raise BadRequest(422, f"{RESPONSES_KEY}: expected {expected}, got {_kind(body, responses)}")
    if len(items) != slots:
        raise BadRequest(422, f"{RESPONSES_KEY}: expected {expected}, got an array of {len(items)}")
    shared = b"".join(
        b'"%s":%s,' % (key.encode(), body[member.value_start : member.value_end])
        for key in _SHARED_KEYS
        if (member := by_key.get(key)) is not None
    )
    members = []
    for slot, item in enumerate(items):
        member_body = b'{%s"response":%s,"_ng_rollout_index":%d}' % (shared, item, slot)
        try:
            members.append(parse_verify_body(member_body, config))
        except BadRequest as exc:
            detail = exc.detail
            if detail.startswith("response"):
                detail = detail.replace("response", f"{RESPONSES_KEY}[{slot}]", 1)
            raise BadRequest(exc.status, detail) from None
    first = members[0]
    if first.group_id is None:
        raise BadRequest(422, f"_ng_group_id: expected {_GROUP_ID_EXPECTED}, got null")
    return GroupRequest(first.group_id, first.attempt, members)


def _raw_items(raw: bytes) -> list[bytes] | None:
    """The array's elements as sent, or None if it is not an array of objects."""
    try:
        items = [bytes(item) for item in _RAW_LIST.decode(raw)]
    except msgspec.DecodeError:
        # Non-standard literals (NaN, Infinity) are allowed inside a response, as in /verify.
        try:
            value = _json_scan.decode_value(raw)
        except ValueError:
            return None
        if not isinstance(value, list):
            return None
        items = [json.dumps(item).encode() for item in value]
    if not all(item.lstrip().startswith(b"{") for item in items):
        return None
    return items


def _kind(body: bytes, member: _json_scan.Member) -> str:
    first = body[member.value_start : member.value_start + 1]
    return {b"{": "an object", b'"': "a string", b"n": "null", b"t": "a boolean"}.get(
        first, "an array with an element that is not an object" if first == b"[" else "a number"
    )
