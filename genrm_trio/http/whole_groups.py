"""A whole group in one request: `POST /verify_group` and the member runner it shares with the
OpenRLHF route.

A group request carries the prompt once and the N responses in slot order. Each response becomes
the `/verify` body it would have been on its own (same group id, attempt, prompt and principle,
`_ng_rollout_index` = its position), is validated by the `/verify` parser and is answered by the
engine exactly as a `/verify` post would be: attach, replay, mask, 409 and 503 all mean what they
mean there. What differs is the framing: the reply comes once, with one compact row per slot and
no echo, and a masked row's `reward` is null, never a number.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Annotated, Final, Literal

import msgspec
import trio
from msgspec import UNSET, Meta, UnsetType

from genrm_trio.config import Config
from genrm_trio.core.outcomes import Masked, Outcome, Rejected, Scored
from genrm_trio.runtime.engine import Engine
from genrm_trio.wire import json_scan
from genrm_trio.wire.bodies import INT64_MAX, BadRequest, VerifyRequest
from genrm_trio.wire.parsing import parse_verify_body, split_members
from genrm_trio.wire.rendering import bound_failure_text
from genrm_trio.wire.schema import (
    FailureText,
    GroupId,
    Int64,
    ResponseObject,
    ResponsesCreateParams,
)

GROUP_ROUTE: Final = "/verify_group"
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
_GROUP_ID_MISSING: Final = f"_ng_group_id: required field missing (expected {_GROUP_ID_EXPECTED})"
_RAW_LIST: Final = msgspec.json.Decoder(list[msgspec.Raw])
_ENCODER: Final = msgspec.json.Encoder()


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
            value = json_scan.decode_value(raw)
        except ValueError:
            return None
        if not isinstance(value, list):
            return None
        items = [json.dumps(item).encode() for item in value]
    if not all(item.lstrip().startswith(b"{") for item in items):
        return None
    return items


def _kind(body: bytes, member: json_scan.Member) -> str:
    first = body[member.value_start : member.value_start + 1]
    return {b"{": "an object", b'"': "a string", b"n": "null", b"t": "a boolean"}.get(
        first, "an array with an element that is not an object" if first == b"[" else "a number"
    )


async def run_members(engine: Engine, members: Sequence[VerifyRequest]) -> list[Outcome | None]:
    """Answer every member as its own /verify post would be, concurrently.

    The first rejection (409 or 503) ends the wait of the others, as a client leaving would
    (C-51): their members stay in their groups, which go on without them, and their places in
    the result are None.
    """
    outcomes: list[Outcome | None] = [None] * len(members)
    # Left once every member is answered: keeping their fingerprints (C-34) holds up no answer.
    async with AsyncExitStack() as answered, trio.open_nursery() as nursery:

        async def one(slot: int, member: VerifyRequest) -> None:
            verified = await answered.enter_async_context(engine.verify(member))
            outcomes[slot] = verified.outcome
            if isinstance(verified.outcome, Rejected):
                nursery.cancel_scope.cancel()

        for slot, member in enumerate(members):
            nursery.start_soon(one, slot, member)
    return outcomes


def first_rejection(outcomes: Sequence[Outcome | None]) -> Rejected | None:
    """The rejection that ended a run, if one did."""
    return next((o for o in outcomes if isinstance(o, Rejected)), None)


def group_row(slot: int, outcome: Scored | Masked) -> GroupRow:
    if isinstance(outcome, Masked):
        return GroupRow(
            ng_rollout_index=slot,
            reward=None,
            mask_sample=True,
            failure_kind="judge_failed",
            failure_reason=bound_failure_text(outcome.text, outcome.suffix),
        )
    metrics = outcome.metrics or {}
    return GroupRow(
        ng_rollout_index=slot,
        reward=outcome.reward,
        mask_sample=False,
        failure_kind=None,
        failure_reason=None,
        **{key: metrics[key] for key in metrics},
    )


def render_group_reply(request: GroupRequest, outcomes: Sequence[Scored | Masked]) -> bytes:
    rows = [group_row(slot, outcome) for slot, outcome in enumerate(outcomes)]
    reply = VerifyGroupReply(
        ng_group_id=request.group_id, ng_group_attempt=request.attempt, rows=rows
    )
    return _ENCODER.encode(reply)
