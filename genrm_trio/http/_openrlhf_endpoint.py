"""OpenRLHF's remote reward model protocol: `POST /openrlhf/get_reward`.

OpenRLHF posts `{"query": [...], "prompts": [...], "labels": [...]}` (a query is the prompt
followed by the response, as decoded text) and reads `{"rewards": [...], "scores": [...],
"extra_logs": {...}}`, one entry per query in order. Its samples carry no group id or slot, so
they are grouped by prompt here (`core.prompt_groups`): samples of one prompt fill one group of
`num_rollouts_per_prompt` slots in arrival order, across requests, and each sample is then
answered as its own `/verify` post would be. A request waits until every group its samples
joined has been judged.

The judge reads each sample without its chat-template markup (`core.chat_markup`, the
`judge_input_strip_tokens` list): a templated prompt becomes the messages of its turns and a
response loses its end marker. Grouping goes by the prompt as posted.

A masked sample's reward is the configured placeholder (`masked_reward_placeholder`), since
OpenRLHF takes only numbers; `extra_logs.genrm_masked` says which samples were masked. When every
sample of a request was masked because its whole group could not reach the judge, the request
is answered 503 instead (`openrlhf_fail_on_transport_mask`, on by default): OpenRLHF retries it,
then goes on without a reward for the sample and its step fails, rather than training on
placeholders. The shapes and the checks of a request are in ``wire.openrlhf_bodies``.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
import trio
from quart import Response
from quart_trio import QuartTrio

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.core.chat_markup import ChatMarkup
from genrm_trio.core.outcomes import Masked, Outcome, Rejected, Scored
from genrm_trio.core.prompt_groups import Placement, PromptGroups
from genrm_trio.core.reachability import group_unreachable, unreachable_refusal
from genrm_trio.http._whole_groups import first_rejection, run_members
from genrm_trio.runtime.engine import Engine
from genrm_trio.wire.bodies import BadRequest, VerifyRequest
from genrm_trio.wire.openrlhf_bodies import (
    OpenRLHFExtraLogs,
    OpenRLHFRewardReply,
    member_body,
    parse_reward_body,
)
from genrm_trio.wire.parsing import parse_verify_body
from genrm_trio.wire.rendering import error_body

ROUTE: Final = "/openrlhf/get_reward"
_ENCODER: Final = msgspec.json.Encoder()


def render_reply(outcomes: list[Scored | Masked]) -> bytes:
    rewards = [o.placeholder if isinstance(o, Masked) else o.reward for o in outcomes]
    masked = [1.0 if isinstance(o, Masked) else 0.0 for o in outcomes]
    reply = OpenRLHFRewardReply(
        rewards=rewards, scores=rewards, extra_logs=OpenRLHFExtraLogs(genrm_masked=masked)
    )
    return _ENCODER.encode(reply)


def unreachable_detail(outcomes: list[Scored | Masked]) -> str | None:
    """The 503 detail when every sample was masked because its group could not reach the judge,
    else None. A sample masked on its own, beside scored ones, is answered as usual."""
    masked = [o for o in outcomes if isinstance(o, Masked) and group_unreachable(o.text)]
    if not outcomes or len(masked) != len(outcomes):
        return None
    return unreachable_refusal(len(masked), masked[0].text)


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

    markup = ChatMarkup(config.judge_input_strip_tokens)

    def reply(status: int, payload: bytes) -> Response:
        return Response(payload, status=status, content_type="application/json")

    @app.post(ROUTE)
    async def get_reward() -> Response:
        if engine.closed:
            return reply(503, error_body(messages.SHUTTING_DOWN))
        try:
            samples = parse_reward_body(await read_body())
            # What the judge reads of each sample; the texts as posted still group it.
            judged = [(markup.prompt(prompt), markup.response(text)) for prompt, text in samples]
            # Validated before any sample takes a slot, so bad input changes nothing (W-5).
            checked = [
                parse_verify_body(member_body(prompt, text, Placement("check", 0)), config)
                for prompt, text in judged
            ]
        except BadRequest as exc:
            return reply(exc.status, error_body(exc.detail))
        del checked
        now = trio.current_time()
        placements = [groups.place(prompt, text, now) for prompt, text in samples]
        members: list[VerifyRequest] = [
            parse_verify_body(member_body(prompt, text, placement), config)
            for (prompt, text), placement in zip(judged, placements, strict=True)
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
        answered = [o for o in outcomes if isinstance(o, Scored | Masked)]
        refusal = unreachable_detail(answered) if config.openrlhf_fail_on_transport_mask else None
        if refusal is not None:
            return reply(503, error_body(refusal))
        return reply(200, render_reply(answered))
