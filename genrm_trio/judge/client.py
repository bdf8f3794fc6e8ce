"""The judge client: one comparison in, a verdict or a judge failure out.

It runs the attempt loop that attempts.py decides, under one FIFO concurrency limit per server,
and reaches the judge only through the transport seam (judge/transport.py): HTTP/1.1 over the
network by default (judge/http11.py), or any transport a test or an embedding hands in.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from genrm_trio.config import Config
from genrm_trio.core.verdicts import Verdict
from genrm_trio.judge.attempts import (
    ERROR_BODY_BYTES,
    AttemptOutcome,
    Conclusion,
    Failed,
    FatalFailure,
    ParseFailure,
    TransientFailure,
    budget_exhausted_log_text,
    conclude,
    conclude_without_time,
    draw_backoff,
    fallback_log_text,
    judge_error_text,
    max_output_tokens_text,
    parse_retry_after,
    reply_outcome,
    retry_log_text,
    retry_sleep,
    short_cause,
    status_outcome,
    timeout_outcome,
    transport_outcome,
)
from genrm_trio.judge.http11 import Http11Transport
from genrm_trio.judge.requests import (
    build_body,
    encode_body,
    judge_headers,
    judge_url,
    resolve_api_key,
)
from genrm_trio.judge.slots import JudgeSlots, Lane
from genrm_trio.judge.transport import (
    ConnectTimedOut,
    JudgeEndpoint,
    JudgeReply,
    JudgeTransport,
    JudgeTransportError,
    TransportFactory,
)

logger = logging.getLogger("genrm_trio")

# A judge reply is a few kilobytes; a body beyond this is refused rather than held in memory.
MAX_REPLY_BYTES = 16 * 1024 * 1024
# Error bodies are read this far so that the connection can be reused; longer ones are cut off.
MAX_ERROR_BODY_BYTES = 64 * 1024
_REDACTED = "<redacted>"


@dataclass(frozen=True, slots=True)
class JudgeTask:
    """One comparison as the judge sees it; every attempt resends exactly these texts."""

    history: list[dict[str, str]]  # judge-facing conversation, already converted (J-7)
    principle: str | None  # effective principle (J-6 applied), or None
    text_1: str  # response_1 as sent (J-5 applied)
    text_2: str  # response_2 as sent
    pair: tuple[int, int]  # presentation-order slots, for texts and logs
    judge_pass: int
    # Where its attempts wait for a slot (``JudgeClient.slots``); None: a complete lane of its
    # own, ranked by when the comparison started.
    lane: Lane | None = None


@dataclass(frozen=True, slots=True)
class JudgeFailure:
    """A failed comparison: its J-40 judge error text and the attempts it made."""

    text: str
    attempts: int


@dataclass(frozen=True, slots=True)
class JudgeVerdict:
    """A comparison with a verdict; ``fallback`` marks J-24's default verdict."""

    verdict: Verdict
    fallback: bool
    attempts: int


JudgeResult = JudgeVerdict | JudgeFailure


class JudgeClient:
    """All judge calls of one server: one transport and one concurrency limit (J-33, J-34)."""

    def __init__(
        self,
        config: Config,
        *,
        transport: TransportFactory | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._config = config
        self._url = judge_url(config.judge_base_url, config.judge_api)
        self._api_key = resolve_api_key(config, os.environ)
        self._rng = rng if rng is not None else random.Random()
        self.slots = JudgeSlots(config.judge_max_concurrency)
        self._max_attempts = config.attempts_per_comparison
        self._max_output_tokens = max_output_tokens_text(config.genrm_responses_create_params)
        self._default = Verdict(config.default_score, config.default_score, config.default_ranking)
        self._attempts_total = 0
        # J-34: one transport per server, built for this endpoint; over the network unless a
        # test or an embedding hands in another (an in-memory fake judge, say).
        endpoint = JudgeEndpoint(
            url=self._url,
            headers=judge_headers(self._api_key),
            timeout_s=config.judge_request_timeout_s,
        )
        self._transport = (transport or Http11Transport)(endpoint)

    @property
    def url(self) -> str:
        """The judge request URL, without user-info."""
        return self._url

    @property
    def in_flight(self) -> int:
        """Attempts holding a concurrency slot now (I-13)."""
        return self.slots.in_use

    @property
    def transport(self) -> JudgeTransport:
        """The transport every attempt goes through."""
        return self._transport

    @property
    def attempts_total(self) -> int:
        """Judge HTTP requests started since creation."""
        return self._attempts_total

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def judge(
        self, task: JudgeTask, *, deadline: float | Callable[[], float] = math.inf
    ) -> JudgeVerdict | JudgeFailure:
        """Run one comparison's attempt loop (J-20…J-32).

        ``deadline`` is the absolute Trio time of the enclosing deadline, or a function giving
        it when it can still move; a retry sleep that would end after it is not taken (J-32).
        Every attempt waits for a slot in the task's lane. The caller's own cancel scope bounds
        the call.
        """
        config = self._config
        lane = task.lane
        if lane is None:
            lane = self.slots.lane(complete=True)
        body = encode_body(
            build_body(
                config,
                history=task.history,
                principle=task.principle,
                text_1=task.text_1,
                text_2=task.text_2,
            )
        )
        outcomes: list[AttemptOutcome] = []
        while True:
            outcome = await self._attempt(body, lane)
            outcomes.append(outcome)
            attempt = len(outcomes)
            if isinstance(outcome, ParseFailure) and outcome.exhausted:
                logger.warning(
                    budget_exhausted_log_text(
                        api=config.judge_api,
                        pair=task.pair,
                        attempt=attempt,
                        max_attempts=self._max_attempts,
                        max_output_tokens=self._max_output_tokens,
                    )
                )
            conclusion = conclude(
                outcomes,
                max_attempts=self._max_attempts,
                default=self._default,
                max_output_tokens=self._max_output_tokens,
            )
            if conclusion is not None:
                return self._finish(task, conclusion, attempt)
            assert isinstance(outcome, TransientFailure | ParseFailure)
            drawn = draw_backoff(
                self._rng,
                attempt,
                base_s=config.genrm_parse_retry_sleep_s,
                max_s=config.judge_retry_max_sleep_s,
            )
            sleep_s = retry_sleep(outcome, drawn)
            limit = deadline() if callable(deadline) else deadline
            if trio.current_time() + sleep_s > limit:
                conclusion = conclude_without_time(
                    outcomes, default=self._default, max_output_tokens=self._max_output_tokens
                )
                return self._finish(task, conclusion, attempt)
            logger.info(
                retry_log_text(
                    pair=task.pair,
                    judge_pass=task.judge_pass,
                    attempt=attempt,
                    max_attempts=self._max_attempts,
                    cause=short_cause(outcome),
                    sleep_s=sleep_s,
                )
            )
            if sleep_s > 0:
                await trio.sleep(sleep_s)

    def _finish(self, task: JudgeTask, conclusion: Conclusion, attempts: int) -> JudgeResult:
        if isinstance(conclusion, Failed):
            text = judge_error_text(
                url=self._url,
                pair=task.pair,
                judge_pass=task.judge_pass,
                attempt=attempts,
                max_attempts=self._max_attempts,
                timeout_s=self._config.judge_request_timeout_s,
                cause=conclusion.cause,
            )
            if self._api_key:
                # A judge may echo request headers in an error body (J-41).
                text = text.replace(self._api_key, _REDACTED)
            return JudgeFailure(text=text, attempts=attempts)
        if conclusion.fallback:
            logger.warning(
                fallback_log_text(pair=task.pair, judge_pass=task.judge_pass, attempts=attempts)
            )
        return JudgeVerdict(
            verdict=conclusion.verdict, fallback=conclusion.fallback, attempts=attempts
        )

    async def _attempt(self, body: bytes, lane: Lane) -> AttemptOutcome:
        """One judge HTTP request, holding a concurrency slot for exactly its duration."""
        timeout = self._config.judge_request_timeout_s
        await self.slots.acquire(lane)
        try:
            self._attempts_total += 1
            # J-27: the deadline starts once the slot is held and covers the whole exchange;
            # the transport's connect timeout is only a second line behind it.
            with trio.move_on_after(timeout):
                try:
                    return await self._exchange(body)
                except ConnectTimedOut:
                    return timeout_outcome(timeout)
                except JudgeTransportError as exc:
                    return transport_outcome(exc)
            return timeout_outcome(timeout)
        finally:
            self.slots.release()

    async def _exchange(self, body: bytes) -> AttemptOutcome:
        reply = await self._transport.send(body)
        try:
            return await self._outcome(reply)
        finally:
            await reply.release()

    async def _outcome(self, reply: JudgeReply) -> AttemptOutcome:
        """Read the reply's body as far as its status calls for and classify the attempt."""
        chunks: list[bytes] = []
        status = reply.status
        if 200 <= status <= 299:
            if not await reply.read_at_most(MAX_REPLY_BYTES, chunks):
                return FatalFailure(
                    cause=f"ReplyTooLarge: judge reply exceeds {MAX_REPLY_BYTES} bytes"
                )
            return reply_outcome(
                self._config.judge_api,
                chunks[0] if len(chunks) == 1 else b"".join(chunks),
                default_score=self._config.default_score,
                default_ranking=self._config.default_ranking,
            )
        try:
            await reply.read_at_most(MAX_ERROR_BODY_BYTES, chunks)
        except JudgeTransportError:
            pass  # the status decides; whatever part of the body arrived is shown
        prefix = b"".join(chunks)[:ERROR_BODY_BYTES]
        retry_after_header = reply.header(b"retry-after")
        retry_after = parse_retry_after(
            None if retry_after_header is None else retry_after_header.decode("latin-1"),
            now_epoch_s=time.time(),
        )
        return status_outcome(status, prefix, retry_after)
