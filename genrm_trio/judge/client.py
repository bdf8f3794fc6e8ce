"""The judge client: one comparison in, a verdict or a judge failure out.

It runs the attempt loop that attempts.py decides, under one priority concurrency limit per
server (with a shared group store, slots drawn from the deployment's budget), and reaches the
judge only through the transport seam (judge/transport.py): HTTP/1.1 over the network by default
(judge/http11.py), or any transport a test or an embedding hands in.
With several judge replicas (X-3) each attempt goes where the balancer (judge/balancer.py) says,
one transport per replica; every attempt is counted in the server's metrics by replica and
outcome.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import trio

from genrm_trio.config import Config, url_without_userinfo
from genrm_trio.core.messages import log_key
from genrm_trio.core.server_metrics import ServerMetrics
from genrm_trio.core.verdicts import Verdict
from genrm_trio.judge._attempts import (
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
    reply_label,
    reply_outcome,
    retry_log_text,
    retry_sleep,
    short_cause,
    status_label,
    status_outcome,
    timeout_outcome,
    transport_outcome,
)
from genrm_trio.judge._requests import (
    build_body,
    encode_body,
    judge_headers,
    judge_url,
    replica_base_urls,
    resolve_api_key,
)
from genrm_trio.judge.balancer import Balancer, Pick
from genrm_trio.judge.http11 import Http11Transport
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
# Attempt outcomes that count against a replica's health: it is unreachable, broken or stuck.
_REPLICA_FAILURES = frozenset({"transport", "http_5xx", "timeout"})


@dataclass(frozen=True, slots=True)
class JudgeTask:
    """One comparison as the judge sees it; every attempt resends exactly these texts."""

    history: list[dict[str, str]]  # judge-facing conversation, already converted (J-7)
    principle: str | None  # effective principle (J-6 applied), or None
    text_1: str  # response_1 as sent (J-5 applied)
    text_2: str  # response_2 as sent
    pair: tuple[int, int]  # presentation-order slots, for texts and logs
    judge_pass: int
    # The group's key: its comparisons prefer one judge replica and it names them in logs.
    group_key: str | None = None
    group_attempt: int | None = None  # the group's _ng_group_attempt, for logs
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


class ReplicaStatistics(NamedTuple):
    name: str  # its URL, without user-info
    in_service: bool  # False while it is ejected
    in_flight: int  # attempts on it now


class JudgeStatistics(NamedTuple):
    """A snapshot of the judge client for /metrics and /healthz."""

    in_flight: int  # attempts holding a concurrency slot (I-13)
    waiting_for_slot: int  # attempts waiting for one
    attempts_total: int  # judge HTTP requests started since creation
    replicas: tuple[ReplicaStatistics, ...]


class JudgeClient:
    """All judge calls of one server: one transport and one concurrency limit (J-33, J-34)."""

    def __init__(
        self,
        config: Config,
        *,
        transport: TransportFactory | None = None,
        rng: random.Random | None = None,
        metrics: ServerMetrics | None = None,
        slots: JudgeSlots | None = None,
    ) -> None:
        self._config = config
        bases = replica_base_urls(config)
        self._urls = [judge_url(base, config.judge_api) for base in bases]
        # Replicas are named by their base URL without user-info, in metrics and logs.
        self.replica_names = [url_without_userinfo(base).rstrip("/") for base in bases]
        self._api_key = resolve_api_key(config, os.environ)
        self._rng = rng if rng is not None else random.Random()
        # A shared group store hands in slots that draw on the deployment's budget.
        self.slots = slots if slots is not None else JudgeSlots(config.process_judge_concurrency)
        self.balancer = Balancer(
            self.replica_names,
            policy=config.judge_balance,
            per_replica_cap=config.judge_replica_max_concurrency,
            eject_after=config.judge_replica_eject_after,
            cooldown_s=config.judge_replica_cooldown_s,
        )
        self._replica_freed = trio.Event()
        self._waiting_for_replica = 0  # attempts waiting for a replica under its own cap
        self.metrics = metrics if metrics is not None else ServerMetrics()
        self._max_attempts = config.attempts_per_comparison
        self._max_output_tokens = max_output_tokens_text(config.genrm_responses_create_params)
        self._default = Verdict(config.default_score, config.default_score, config.default_ranking)
        self._attempts_total = 0
        # J-34: one transport per replica, built for its endpoint; over the network unless a
        # test or an embedding hands in another (an in-memory fake judge, say).
        headers = judge_headers(self._api_key)
        factory = transport or Http11Transport
        self._transports = [
            factory(
                JudgeEndpoint(url=url, headers=headers, timeout_s=config.judge_request_timeout_s)
            )
            for url in self._urls
        ]

    @property
    def url(self) -> str:
        """The (first replica's) judge request URL, without user-info."""
        return self._urls[0]

    @property
    def in_flight(self) -> int:
        """Attempts holding a concurrency slot now (I-13)."""
        return self.slots.in_use

    @property
    def transport(self) -> JudgeTransport:
        """The (first replica's) transport."""
        return self._transports[0]

    @property
    def attempts_total(self) -> int:
        """Judge HTTP requests started since creation."""
        return self._attempts_total

    def statistics(self) -> JudgeStatistics:
        replicas = tuple(
            ReplicaStatistics(name, replica.in_service, replica.in_flight)
            for name, replica in zip(self.replica_names, self.balancer.replicas, strict=True)
        )
        return JudgeStatistics(
            self.slots.in_use, self.slots.queue.waiting, self._attempts_total, replicas
        )

    async def aclose(self) -> None:
        for transport in self._transports:
            await transport.aclose()

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
        replica: int | None = None
        max_attempts = self._max_attempts
        attempt = 0
        while True:
            attempt += 1
            # A retry prefers another replica. Only an attempt that leaves its comparison
            # another one may probe a replica back from ejection, unless no attempt ever does.
            may_probe = attempt < max_attempts or max_attempts == 1
            outcome, label, replica = await self._attempt(body, lane, task, replica, may_probe)
            outcomes.append(outcome)
            if isinstance(outcome, ParseFailure) and outcome.exhausted:
                logger.warning(
                    budget_exhausted_log_text(
                        api=config.judge_api,
                        pair=task.pair,
                        attempt=attempt,
                        max_attempts=self._max_attempts,
                        max_output_tokens=self._max_output_tokens,
                    ),
                    extra=self._log_fields(task, attempt, replica),
                )
            conclusion = conclude(
                outcomes,
                max_attempts=self._max_attempts,
                default=self._default,
                max_output_tokens=self._max_output_tokens,
            )
            if conclusion is not None:
                return self._finish(task, conclusion, attempt, replica)
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
                return self._finish(task, conclusion, attempt, replica)
            self.metrics.judge_retry(self.replica_names[replica], label)
            logger.info(
                retry_log_text(
                    pair=task.pair,
                    judge_pass=task.judge_pass,
                    attempt=attempt,
                    max_attempts=self._max_attempts,
                    cause=short_cause(outcome),
                    sleep_s=sleep_s,
                ),
                extra=self._log_fields(task, attempt, replica),
            )
            if sleep_s > 0:
                await trio.sleep(sleep_s)

    def _log_fields(self, task: JudgeTask, attempt: int, replica: int) -> dict[str, object]:
        """The fields a structured log record carries for one comparison's attempt."""
        return {
            "group_key": None if task.group_key is None else log_key(task.group_key),
            "group_attempt": task.group_attempt,
            "pair": list(task.pair),
            "judge_pass": task.judge_pass,
            "attempt": attempt,
            "replica": self.replica_names[replica],
        }

    def _finish(
        self, task: JudgeTask, conclusion: Conclusion, attempts: int, replica: int
    ) -> JudgeResult:
        if isinstance(conclusion, Failed):
            self.metrics.comparison("failed")
            text = judge_error_text(
                url=self._urls[replica],
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
        self.metrics.comparison("default_fallback" if conclusion.fallback else "verdict")
        if conclusion.fallback:
            logger.warning(
                fallback_log_text(pair=task.pair, judge_pass=task.judge_pass, attempts=attempts),
                extra=self._log_fields(task, attempts, replica),
            )
        return JudgeVerdict(
            verdict=conclusion.verdict, fallback=conclusion.fallback, attempts=attempts
        )

    async def _attempt(
        self, body: bytes, lane: Lane, task: JudgeTask, previous: int | None, may_probe: bool
    ) -> tuple[AttemptOutcome, str, int]:
        """One judge HTTP request, holding a concurrency slot for exactly its duration: its
        outcome, the outcome's metrics label and the replica it went to."""
        timeout = self._config.judge_request_timeout_s
        asked = started = trio.current_time()
        if await self.slots.acquire(lane):
            started = trio.current_time()
        pick: Pick | None = None
        label = "cancelled"
        try:
            pick = self.balancer.choose(
                task.group_key, started, avoid=previous, may_probe=may_probe
            )
            if pick is None:  # every replica that could take it is at its own cap
                pick = await self._wait_for_replica(task.group_key, previous, may_probe)
                started = trio.current_time()
            self.metrics.slot_wait_seconds.observe(started - asked)
            self._attempts_total += 1
            # J-27: the deadline starts once the slot is held and covers the whole exchange;
            # the transport's connect timeout is only a second line behind it.
            with trio.CancelScope(deadline=started + timeout):
                try:
                    outcome, label = await self._exchange(body, self._transports[pick.replica])
                except ConnectTimedOut:
                    outcome, label = timeout_outcome(timeout), "timeout"
                except JudgeTransportError as exc:
                    outcome, label = transport_outcome(exc), "transport"
                return outcome, label, pick.replica
            label = "timeout"
            return timeout_outcome(timeout), label, pick.replica
        finally:
            if pick is not None:
                self._attempt_ended(pick, label, started)
            self.slots.release()

    async def _wait_for_replica(
        self, key: str | None, previous: int | None, may_probe: bool
    ) -> Pick:
        """Wait until a replica that could take the attempt has room under its own cap."""
        while True:
            self._waiting_for_replica += 1
            try:
                await self._replica_freed.wait()
            finally:
                self._waiting_for_replica -= 1
            pick = self.balancer.choose(
                key, trio.current_time(), avoid=previous, may_probe=may_probe
            )
            if pick is not None:
                return pick

    def _attempt_ended(self, pick: Pick, label: str, started: float) -> None:
        now = trio.current_time()
        name = self.replica_names[pick.replica]
        self.metrics.judge_attempt(name, label, now - started)
        failed = None if label == "cancelled" else label in _REPLICA_FAILURES
        if self.balancer.finished(pick, failed=failed, now=now):
            self.metrics.ejection(name)
            logger.warning(
                "GenRM judge replica %s ejected for %ss after repeated failures (last: %s)",
                name,
                self._config.judge_replica_cooldown_s,
                label,
                extra={"replica": name},
            )
        if self._waiting_for_replica:
            freed, self._replica_freed = self._replica_freed, trio.Event()
            freed.set()

    async def _exchange(self, body: bytes, transport: JudgeTransport) -> tuple[AttemptOutcome, str]:
        reply = await transport.send(body)
        try:
            return await self._outcome(reply)
        finally:
            await reply.release()

    async def _outcome(self, reply: JudgeReply) -> tuple[AttemptOutcome, str]:
        """Read the reply's body as far as its status calls for and classify the attempt."""
        chunks: list[bytes] = []
        status = reply.status
        if 200 <= status <= 299:
            if not await reply.read_at_most(MAX_REPLY_BYTES, chunks):
                too_large = f"ReplyTooLarge: judge reply exceeds {MAX_REPLY_BYTES} bytes"
                return FatalFailure(cause=too_large), "unusable"
            outcome = reply_outcome(
                self._config.judge_api,
                chunks[0] if len(chunks) == 1 else b"".join(chunks),
                default_score=self._config.default_score,
                default_ranking=self._config.default_ranking,
            )
            return outcome, reply_label(outcome)
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
        return status_outcome(status, prefix, retry_after), status_label(status)
