"""A group attempt superseded in the instant between its evaluation's spawn and that
evaluation's first step.

With early judging under ``fixed_baseline``, a group's first member makes a comparison ready
at once (the baseline is always there), so the transaction that accepts it both spawns the
group's evaluation and hands it a comparison to judge. A request of the next attempt that runs
in the same scheduler batch supersedes the group before the evaluation has taken a step. The
evaluation must then end quietly: cancelled, with no judge call, no ERROR line for the operator
and no effect on the replies.

Trio runs one batch of runnable tasks either in order or reversed, so each round sets the race
up for two groups at once, mirrored: when the four requests reach the engine in one batch,
whichever way it runs, one of the two groups is superseded between its evaluation's spawn and
its first checkpoint (its attempt-0 request gets the 503 of a supersession while active) and
the other sees the newer attempt first (its attempt-0 request is refused 409 as stale). The
test counts the rounds that raced, and requires some.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
import trio

if TYPE_CHECKING:
    from genrm_trio.testing.controlled_judge import ControlledJudge
    from genrm_trio.testing.fixtures import GenRMServer


ROUNDS = 8
# Under fixed_baseline every member is compared with the prompt's baseline response.
WITH_BASELINE = {"input": "2+2?", "metadata": {"baseline_response": "BASE"}}


def superseded(g: str) -> str:
    return f"GenRM group '{g}' attempt 0 was superseded by attempt 1"


@pytest.mark.genrm_config(comparison_strategy="fixed_baseline", early_judging=True)
async def test_an_attempt_superseded_before_its_evaluation_runs_ends_quietly(
    genrm_server: GenRMServer, genrm_judge: ControlledJudge, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="genrm_trio")
    raced = 0
    for round_ in range(ROUNDS):
        x, y = f"x{round_}", f"y{round_}"
        async with trio.open_nursery() as nursery:
            # One batch: x's attempt 0 before its attempt 1, y's attempt 1 before its attempt 0
            # (or all four reversed).
            pending = [
                genrm_server.start_member(
                    nursery, 0, g=g, a=a, responses_create_params=WITH_BASELINE
                )
                for g, a in ((x, 0), (x, 1), (y, 1), (y, 0))
            ]
            stale = {x: pending[0], y: pending[3]}
            for g in (x, y):
                reply = await stale[g].result()
                assert reply.detail == superseded(g) or reply.status == 409, reply.body
                if reply.status == 503:
                    raced += 1
            # The newer attempts complete as any group does.
            rows = [
                await genrm_server.post_member(1, g=g, a=1, responses_create_params=WITH_BASELINE)
                for g in (x, y)
            ]
            rows += [await pending[1].result(), await pending[2].result()]
        assert [row.status for row in rows] == [200] * 4
        assert not any(row.masked for row in rows)
        for g in (x, y):
            assert genrm_judge.matching(group=g, attempt=0) == []
    assert raced >= 1  # the race happened, in most rounds in practice
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
