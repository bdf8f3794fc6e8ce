"""OpenRLHF's remote reward model protocol: `POST /openrlhf/get_reward`.

OpenRLHF posts `{"query": [...], "prompts": [...], "labels": [...]}` (a query is the prompt
followed by the response, as decoded text) and reads `{"rewards": [...], "scores": [...],
"extra_logs": {...}}`, one entry per query in order. Its samples carry no group id or slot, so
they are grouped by prompt here (`core.prompt_groups`): samples of one prompt fill one group of
`num_rollouts_per_prompt` slots in arrival order, across requests, and each sample is then
answered as its own `/verify` post would be. A request waits until every group its samples
joined has been judged.

A masked sample's reward is the configured placeholder (`masked_reward_placeholder`), since
OpenRLHF takes only numbers; `extra_logs.genrm_masked` says which samples were masked.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Final

import msgspec
import trio
from msgspec import Meta
from quart import Response
from quart_trio import QuartTrio

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.core.outcomes import Masked, Outcome, Rejected, Scored
from genrm_trio.core.prompt_groups import Placement, PromptGroups
from genrm_trio.http.whole_groups import first_rejection, run_members
from genrm_trio.runtime.engine import Engine
from genrm_trio.wire.bodies import BadRequest, VerifyRequest, json_kind
from genrm_trio.wire.parsing import parse_verify_body, split_members
from genrm_trio.wire.rendering import error_body

ROUTE: Final = "/openrlhf/get_reward"
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


def member_body(prompt: str, text: str, placement: Placement) -> bytes:
    """The /verify body of one sample in its group."""
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


def render_reply(outcomes: list[Scored | Masked]) -> bytes:
    rewards = [o.placeholder if isinstance(o, Masked) else o.reward for o in outcomes]
    masked = [1.0 if isinstance(o, Masked) else 0.0 for o in outcomes]
    reply = OpenRLHFRewardReply(
        rewards=rewards, scores=rewards, extra_logs=OpenRLHFExtraLogs(genrm_masked=masked)
    )
    return _ENCODER.encode(reply)


def register_openrlhf_route(
    app: QuartTrio, read_body: Callable[[], Awaitable[bytes]], engine: Engine, config: Config
) -> None:
    """Add `POST /openrlhf/get_reward` to ``app``."""
    # Samples can be resent long after their group opened; keep each group while its result is.
    horizon = config.cohort_collection_timeout_s + config.cohort_evaluation_timeout_s
    horizon += config.cohort_result_ttl_s or 3600.0
    # A fresh prefix per server instance: a restarted server never reuses a group id.
    groups = PromptGroups(
        config.num_rollouts_per_prompt, f"openrlhf-{secrets.token_hex(4)}", horizon
    )

    def reply(status: int, payload: bytes) -> Response:
        return Response(payload, status=status, content_type="application/json")

    @app.post(ROUTE)
    async def get_reward() -> Response:
        if engine.closed:
            return reply(503, error_body(messages.SHUTTING_DOWN))
        try:
            samples = parse_reward_body(await read_body())
            # Validated before any sample takes a slot, so bad input changes nothing (W-5).
            checked = [
                parse_verify_body(member_body(prompt, text, Placement("check", 0)), config)
                for prompt, text in samples
            ]
        except BadRequest as exc:
            return reply(exc.status, error_body(exc.detail))
        del checked
        now = trio.current_time()
        placements = [groups.place(prompt, text, now) for prompt, text in samples]
        members: list[VerifyRequest] = [
            parse_verify_body(member_body(prompt, text, placement), config)
            for (prompt, text), placement in zip(samples, placements, strict=True)
        ]
        outcomes: list[Outcome | None] = [None] * len(members)
        try:
            outcomes = await run_members(engine, members)
        finally:
            # A sample whose wait ended without an answer keeps its slot for its resend.
            for placement, outcome in zip(placements, outcomes, strict=True):
                groups.release(
                    placement,
                    answered=outcome is not None,
                    failed=isinstance(outcome, Rejected),
                )
        rejected = first_rejection(outcomes)
        if rejected is not None:
            return reply(rejected.status, error_body(rejected.detail))
        return reply(200, render_reply([o for o in outcomes if isinstance(o, Scored | Masked)]))
