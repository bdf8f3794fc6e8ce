"""The async client, for Trio and asyncio alike: one `/verify_group` request per group, sent
again on the conditions of `resend`, each group's results in slot order.

Before its first group it asks the server's `/readyz` until the server is ready or
``ready_wait_s`` has passed, and raises `ServerNotReady` then. Past that it never sets a time
limit of its own: a group waits as long as its judging takes. Bound a call with the caller's own
cancel scope (`trio.fail_after`, `asyncio.timeout`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
import trio

from genrm_trio.client._bodies import Prompt, Response, group_body
from genrm_trio.client._readiness import (
    READY_ROUTE,
    NoReadiness,
    Readiness,
    Ready,
    ServerNotReady,
    check_ready_wait,
    readiness,
    unreachable,
)
from genrm_trio.client._resend import (
    Decision,
    Failed,
    Refused,
    ResendPolicy,
    Rows,
    connection_lost,
    decide,
)
from genrm_trio.client._results import NO_ANSWER, RolloutResult, failed_group

GROUP_ROUTE = "/verify_group"
# How often `/readyz` is asked while the client waits for the server to be ready.
READY_POLL_S = 0.5
DEFAULT_READY_WAIT_S = 30.0

log = logging.getLogger("genrm_trio.client")


class GroupRefused(Exception):
    """The server refused a group request as malformed (400, 404, 405, 413, 422): sending it
    again cannot help. ``detail`` names the field, e.g. a group size that is not the server's
    `num_rollouts_per_prompt`."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"POST {GROUP_ROUTE} refused the group ({status}): {detail}")
        self.status = status
        self.detail = detail


def _asyncio_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _sleep(seconds: float) -> None:
    if _asyncio_running():
        await asyncio.sleep(seconds)
    else:
        await trio.sleep(seconds)


def _now() -> float:
    """The running event loop's clock (Trio's, or asyncio's)."""
    if _asyncio_running():
        return asyncio.get_running_loop().time()
    return trio.current_time()


async def gather(calls: Sequence[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Run ``calls`` concurrently under whichever event loop runs this; results in order."""
    results: list[Any] = [None] * len(calls)

    async def one(index: int) -> None:
        results[index] = await calls[index]()

    try:
        if _asyncio_running():
            async with asyncio.TaskGroup() as tasks:
                for index in range(len(calls)):
                    tasks.create_task(one(index))
        else:
            async with trio.open_nursery() as nursery:
                for index in range(len(calls)):
                    nursery.start_soon(one, index)
    except ExceptionGroup as group:
        # The caller asked for results, not for a group of errors: the first one says why.
        raise group.exceptions[0] from group
    return results


def new_group_id() -> str:
    return f"genrm-client-{uuid.uuid4().hex}"


class GenRMClient:
    """Scores whole groups on a genrm-trio server.

    ``base_url`` is the server's (``http://host:8000``). Pass ``http`` to use your own
    ``httpx.AsyncClient`` (its base URL is then ignored and its life is yours); otherwise the
    client makes one without timeouts and without a connection cap, since each group holds one
    connection while it is judged. Use it as an async context manager, or call ``aclose``.

    At first use the client waits up to ``ready_wait_s`` seconds for the server's `/readyz` to
    answer 200, asking every half second, and raises `ServerNotReady` naming the server and what
    is wrong (its reasons, such as an unreachable judge replica, or the connection error) if it
    never does. ``ready_wait_s=0`` asks once; None skips the check. A server without `/readyz`
    (older than the client) is used as it is, with a WARNING.
    """

    def __init__(
        self,
        base_url: str,
        *,
        policy: ResendPolicy | None = None,
        http: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        ready_wait_s: float | None = DEFAULT_READY_WAIT_S,
    ) -> None:
        check_ready_wait(ready_wait_s)
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + GROUP_ROUTE
        self.ready_wait_s = ready_wait_s
        self.ready_checked = ready_wait_s is None
        self.policy = policy or ResendPolicy()
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        self._rng = rng or random.Random()
        self.resends = 0

    async def __aenter__(self) -> GenRMClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def wait_ready(self) -> None:
        """Wait until the server's `/readyz` answers 200, at most ``ready_wait_s`` seconds; raise
        `ServerNotReady` with the last reasons otherwise. Called at first use; once it passed it
        returns at once."""
        if self.ready_checked:
            return
        wait_s = self.ready_wait_s or 0.0
        deadline = _now() + wait_s
        while True:
            state = await self._ask_ready(max(deadline - _now(), READY_POLL_S))
            if isinstance(state, Ready):
                break
            if isinstance(state, NoReadiness):
                log.warning("genrm-trio server %s: %s; not checked", self.base_url, state.problem)
                break
            if _now() + READY_POLL_S > deadline:
                raise ServerNotReady(self.base_url, wait_s, state.reasons)
            await _sleep(READY_POLL_S)
        self.ready_checked = True

    async def _ask_ready(self, timeout_s: float) -> Readiness:
        try:
            reply = await self._http.get(
                self.base_url + READY_ROUTE, timeout=httpx.Timeout(timeout_s)
            )
        except httpx.TransportError as error:
            return unreachable(error)
        return readiness(reply.status_code, reply.content)

    async def score_group(
        self,
        prompt: Prompt,
        responses: Sequence[Response],
        *,
        group_id: str | None = None,
        attempt: int = 0,
        principle: str | None = None,
    ) -> list[RolloutResult]:
        """One result per response, in order.

        ``group_id`` defaults to a fresh id, and ``attempt`` to 0; to score a group id again
        with new responses, pass a higher ``attempt``. Raises ``GroupRefused`` for a request
        the server refuses as malformed, and ``ServerNotReady`` at first use if the server is not
        ready (see the class).
        """
        await self.wait_ready()
        size = len(responses)
        body = group_body(prompt, responses, group_id or new_group_id(), attempt, principle)
        resends = 0
        while True:
            decision = await self._post(body, size)
            if isinstance(decision, Rows):
                return decision.results
            if isinstance(decision, Failed):
                return failed_group(size, decision.reason)
            if isinstance(decision, Refused):
                raise GroupRefused(decision.status, decision.detail)
            if resends == self.policy.max_resends:
                reason = f"{NO_ANSWER}{resends} resends; last: {decision.reason}"
                return failed_group(size, reason)
            resends += 1
            self.resends += 1
            await _sleep(self.policy.sleep_s(resends, self._rng, decision.retry_after_s))

    async def score_groups(
        self, groups: Sequence[tuple[Prompt, Sequence[Response]]]
    ) -> list[list[RolloutResult]]:
        """Several groups at once, each under a fresh id; results in the order given."""
        await self.wait_ready()
        calls = [
            (lambda prompt=prompt, responses=responses: self.score_group(prompt, responses))
            for prompt, responses in groups
        ]
        return await gather(calls)

    async def _post(self, body: bytes, size: int) -> Decision:
        try:
            reply = await self._http.post(
                self.url, content=body, headers={"content-type": "application/json"}
            )
        except httpx.TransportError as error:
            return connection_lost(error)
        return decide(reply.status_code, reply.content, reply.headers.get("retry-after"), size)
