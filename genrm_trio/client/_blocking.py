"""The blocking form of the client, for code that is not async (a trainer's reward function):
each call runs the async client in its own Trio run and returns when every group has results."""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Sequence

import trio

from genrm_trio.client._bodies import Prompt, Response
from genrm_trio.client._readiness import check_ready_wait
from genrm_trio.client._resend import ResendPolicy
from genrm_trio.client._results import NO_RESULTS_BY_DEADLINE, RolloutResult, failed_group
from genrm_trio.client._session import DEFAULT_READY_WAIT_S, GenRMClient, gather

Call = Callable[[GenRMClient], Awaitable[list[RolloutResult]]]


class BlockingGenRMClient:
    """Scores whole groups on a genrm-trio server, blocking the calling thread.

    ``deadline_s`` bounds one call as a whole: a group without results by then is answered
    with every rollout failed (``verify_failed``, saying so), never with a number. None waits
    as long as judging takes. Do not call it from inside a running event loop; use
    ``GenRMClient`` there.

    The first call waits up to ``ready_wait_s`` for the server to be ready and raises
    `ServerNotReady` if it is not (see ``GenRMClient``); that wait is not part of ``deadline_s``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        policy: ResendPolicy | None = None,
        deadline_s: float | None = None,
        rng: random.Random | None = None,
        ready_wait_s: float | None = DEFAULT_READY_WAIT_S,
    ) -> None:
        if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
            raise ValueError(f"deadline_s {deadline_s!r}: expected a finite number > 0 or None")
        check_ready_wait(ready_wait_s)
        self.base_url = base_url
        self.policy = policy or ResendPolicy()
        self.deadline_s = deadline_s
        self.rng = rng or random.Random()
        self.resends = 0
        self.ready_wait_s = ready_wait_s
        self.ready_checked = ready_wait_s is None

    def score_group(
        self,
        prompt: Prompt,
        responses: Sequence[Response],
        *,
        group_id: str | None = None,
        attempt: int = 0,
        principle: str | None = None,
    ) -> list[RolloutResult]:
        """One result per response, in order (see ``GenRMClient.score_group``)."""

        async def one(client: GenRMClient) -> list[RolloutResult]:
            return await client.score_group(
                prompt, responses, group_id=group_id, attempt=attempt, principle=principle
            )

        calls: list[tuple[Call, int]] = [(one, len(responses))]
        return trio.run(self._run, calls)[0]

    def score_groups(
        self, groups: Sequence[tuple[Prompt, Sequence[Response]]]
    ) -> list[list[RolloutResult]]:
        """Several groups at once, each under a fresh id; results in the order given."""
        calls: list[tuple[Call, int]] = []
        for prompt, responses in groups:

            async def one(
                client: GenRMClient,
                prompt: Prompt = prompt,
                responses: Sequence[Response] = responses,
            ) -> list[RolloutResult]:
                return await client.score_group(prompt, responses)

            calls.append((one, len(responses)))
        return trio.run(self._run, calls)

    async def _run(self, calls: list[tuple[Call, int]]) -> list[list[RolloutResult]]:
        late = f"{NO_RESULTS_BY_DEADLINE}{self.deadline_s}s"
        ready_wait_s = None if self.ready_checked else self.ready_wait_s
        async with GenRMClient(
            self.base_url, policy=self.policy, rng=self.rng, ready_wait_s=ready_wait_s
        ) as client:
            await client.wait_ready()
            self.ready_checked = True
            deadline = (
                math.inf if self.deadline_s is None else trio.current_time() + self.deadline_s
            )

            def bounded(call: Call, size: int) -> Callable[[], Awaitable[list[RolloutResult]]]:
                async def run() -> list[RolloutResult]:
                    with trio.move_on_at(deadline):
                        return await call(client)
                    return failed_group(size, late)

                return run

            try:
                return await gather([bounded(call, size) for call, size in calls])
            finally:
                self.resends += client.resends
