"""OpenRLHF's remote reward protocol on the wire: the request and reply shapes, the validation of
a request, and the `/verify` body each of its samples becomes in its group.

OpenRLHF posts `{"query": [...], "prompts": [...], "labels": [...]}` (a query is the prompt
followed by the response, as decoded text) and reads `{"rewards": [...], "scores": [...],
"extra_logs": {...}}`, one entry per query in order.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec
from msgspec import Meta

from genrm_trio.core.prompt_groups import Placement
from genrm_trio.wire.bodies import BadRequest, json_kind
from genrm_trio.wire.parsing import split_members

MASKED_LOG_KEY: Final = "genrm_masked"
_ENCODER: Final = msgspec.json.Encoder()
_STRINGS: Final = "an array of strings"


class OpenRLHFRewardRequestDoc(msgspec.Struct, frozen=True, kw_only=True):
    """OpenRLHF's remote reward request (`SingleTurnAgentExecutor._fetch_rewards_via_http`)."""

    query: Annotated[
        list[str], Meta(description="Each sample's prompt followed by its response, as text.")
    ]
    prompts: Annotated[
        list[str], Meta(description="Each sample's prompt; as long as `query`. Groups by it.")
    ]
    labels: Annotated[Any, Meta(description="Accepted and not read.")] = None


class OpenRLHFExtraLogs(msgspec.Struct, frozen=True, kw_only=True):
    genrm_masked: Annotated[
        list[float], Meta(description="1.0 for a masked sample (its reward is a placeholder).")
    ]


class OpenRLHFRewardReply(msgspec.Struct, frozen=True, kw_only=True):
    """One entry per query, in order. A masked sample's reward and score are the placeholder
    of masked_reward_placeholder."""

    rewards: list[float]
    scores: list[float]
    extra_logs: OpenRLHFExtraLogs


def parse_reward_body(body: bytes) -> list[tuple[str, str]]:
    """The (prompt, response text) of each sample; ``BadRequest`` names the first bad field."""
    by_key, _ = split_members(body, frozenset({"query", "prompts"}))
    columns = []
    for key in ("query", "prompts"):
        member = by_key.get(key)
        if member is None:
            raise BadRequest(422, f"{key}: required field missing (expected {_STRINGS})")
        value = member.value
        if not isinstance(value, list):
            raise BadRequest(422, f"{key}: expected {_STRINGS}, got {json_kind(value)}")
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise BadRequest(422, f"{key}[{index}]: expected a string, got {json_kind(item)}")
        columns.append(value)
    queries, prompts = columns
    if len(queries) != len(prompts):
        raise BadRequest(
            422, f"prompts: expected one prompt per query ({len(queries)}), got {len(prompts)}"
        )
    return [
        (prompt, response_text(query, prompt))
        for query, prompt in zip(queries, prompts, strict=True)
    ]


def response_text(query: str, prompt: str) -> str:
    """The response part of a query: what follows the prompt, or the whole query when the
    decoded text does not start with the prompt (a tokenizer that does not round-trip it)."""
    return query[len(prompt) :] if query.startswith(prompt) else query


def member_body(prompt: str | list[dict[str, str]], text: str, placement: Placement) -> bytes:
    """The /verify body of one sample in its group: ``prompt`` is its
    `responses_create_params.input`, a text or a list of messages."""
    return _ENCODER.encode(
        {
            "responses_create_params": {"input": prompt},
            "response": {
                "output": [
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": text}],
                    }
                ]
            },
            "_ng_group_id": placement.group_id,
            "_ng_group_attempt": 0,
            "_ng_rollout_index": placement.slot,
        }
    )
