"""A whole group in one request: `POST /verify_group`'s answers from the engine, and the member
runner it shares with the OpenRLHF route.

A group request carries the prompt once and the N responses in slot order; its shape and
validation are in ``wire.group_bodies``. Each response is answered by the engine exactly as a
`/verify` post would be: attach, replay, mask, 409 and 503 all mean what they mean there. What
differs is the framing: the reply comes once, with one compact row per slot and no echo, and a
masked row's `reward` is null, never a number.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Final

import msgspec
import trio

from genrm_trio.core.outcomes import Masked, Outcome, Rejected, Scored
from genrm_trio.runtime.engine import Engine
from genrm_trio.wire.bodies import VerifyRequest
from genrm_trio.wire.group_bodies import GroupRequest, GroupRow, VerifyGroupReply
from genrm_trio.wire.rendering import bound_failure_text

GROUP_ROUTE: Final = "/verify_group"
_ENCODER: Final = msgspec.json.Encoder()


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
