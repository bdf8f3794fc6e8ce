"""The Trio runtime of one server instance: the server nursery, group tasks, waiters and shutdown.

It runs the group registry's decisions. Work that outlives a request (a group's deadlines and
judging) lives in the server nursery in a fresh context, never in the request's task.
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import trio

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.core.canonical import digest_hex
from genrm_trio.core.groups import (
    Answer,
    Arrival,
    BeginEvaluation,
    CancelGroup,
    Effect,
    GroupCounts,
    GroupInputs,
    GroupRegistry,
    MemberTexts,
    Outcome,
    Record,
    Rejected,
    Scored,
    StartComparisons,
    StartGroup,
    Statistics,
)
from genrm_trio.core.identity import ResponseIdentity
from genrm_trio.core.pairs import Comparison, baseline_order_digest
from genrm_trio.core.server_metrics import FAST_BUCKETS, Histogram, ServerMetrics, verify_label
from genrm_trio.core.texts import (
    convert_history,
    effective_principle,
    extract_scoring_text,
    judge_answer_text,
)
from genrm_trio.core.verdicts import Verdict
from genrm_trio.judge.client import JudgeClient, JudgeFailure, JudgeTask
from genrm_trio.judge.slots import JudgeSlots, Lane
from genrm_trio.judge.transport import TransportFactory
from genrm_trio.runtime.hooks import Hooks, call_hook

log = logging.getLogger("genrm_trio")


class MemberRequest(Protocol):
    """The fields of a validated /verify request that the engine reads."""

    group_id: str | None
    attempt: int
    attempt_given: bool
    rollout_index: int | None
    task_index: int | None
    prompt_id: str | None
    principle: str | None
    baseline: str | None
    resend: str | None

    def take_scoring(self) -> tuple[Any, Any]:
        """(the response as far as its scoring texts go, responses_create_params.input) as
        decoded, handed over once."""
        ...

    def response_view(self) -> memoryview:
        """The response's bytes as sent."""
        ...


@dataclass(frozen=True, slots=True)
class Verified:
    """An answered /verify: its outcome, its ``genrm_verify_requests_total`` label, and what its
    member's response identity still needs once the reply is written."""

    outcome: Outcome
    label: str
    identity_done: Callable[[], None] | None = None

    @classmethod
    def of(
        cls, outcome: Outcome, *, replay: bool, identity_done: Callable[[], None] | None = None
    ) -> Verified:
        return cls(outcome, verify_label(outcome, replay=replay), identity_done)

    def reply_sent(self) -> None:
        """The reply is out, or the request ended without one: the member's identity keeps its
        fingerprint for replays (C-34) or lets the response's bytes go. Call it once."""
        if self.identity_done is not None:
            self.identity_done()


@dataclass
class Counters:
    """How often the expensive per-request steps ran (SPEC C-23, C-31, C-32).

    ``fingerprints`` counts response identities, one per valid group-mode request; the work
    behind them is counted apart: SHA-256 digests of raw response bytes, and canonical
    fingerprints (only for bytes that differ from a member's, or for what a finished group
    keeps).
    """

    fingerprints: int = 0
    extractions: int = 0
    conversions: int = 0
    response_digests: int = 0
    canonical_fingerprints: int = 0
    fingerprint_seconds: Histogram = field(default_factory=lambda: Histogram(FAST_BUCKETS))

    def fingerprint_took(self, seconds: float) -> None:
        self.fingerprint_seconds.observe(seconds)


@dataclass(eq=False)
class GroupHandle:
    """The runtime side of one record: its cancel scope, queued comparisons and results."""

    lane: Lane  # the group's place in the judge queue, promoted once the group is full
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    ready: trio.Event = field(default_factory=trio.Event)  # the group is full
    wake: trio.Event = field(default_factory=trio.Event)  # comparisons were queued
    queued: list[Comparison] = field(default_factory=list)
    evaluation_deadline: float = math.inf
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    finished: int = 0

    def retry_deadline(self) -> float:
        return self.evaluation_deadline


class Engine:
    """One server instance's group engine; instances share nothing (I-11)."""

    def __init__(
        self,
        config: Config,
        *,
        judge_transport: TransportFactory | None = None,
        hooks: Hooks | None = None,
        judge_slots: JudgeSlots | None = None,
    ) -> None:
        self.config = config
        self.hooks = hooks or Hooks()
        self.metrics = ServerMetrics()
        self.judge = JudgeClient(
            config, transport=judge_transport, metrics=self.metrics, slots=judge_slots
        )
        self.registry = GroupRegistry(config, log=log.log)
        self.counters = Counters()
        self.metrics.fingerprint_seconds = self.counters.fingerprint_seconds
        self._nursery: trio.Nursery | None = None
        self._owned_tasks = 0
        self._tasks_done = trio.Event()
        self._stopped = trio.Event()
        self._shutdown_done = trio.Event()
        self._shutdown_started = False
        self._attempt_omission_logged = False

    # ---- lifetime ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the server nursery until shutdown has drained it."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await self._stopped.wait()
            nursery.cancel_scope.cancel()

    @property
    def closed(self) -> bool:
        return self.registry.closed

    def begin_shutdown(self) -> None:
        """Fail every active group and cancel owned work; synchronous, so it runs first (C-98)."""
        if self._shutdown_started:
            return
        self._shutdown_started = True
        log.info("GenRM server shutting down")
        self._apply(self.registry.shut_down(trio.current_time()))

    async def shutdown(self) -> None:
        """C-96: fail groups, drain owned tasks within shutdown_grace_s, close the judge client."""
        self.begin_shutdown()
        if self._shutdown_done.is_set():
            return
        with trio.move_on_after(self.config.shutdown_grace_s, shield=True):
            if self._owned_tasks:
                await self._tasks_done.wait()
        with trio.move_on_after(self.config.shutdown_grace_s, shield=True):
            await self._close_connections()
        self.registry.clear()
        self._stopped.set()
        self._shutdown_done.set()
        log.info("GenRM server shut down")

    async def _close_connections(self) -> None:
        """Close what the engine holds open: the judge client's connections."""
        await self.judge.aclose()

    # ---- /verify -------------------------------------------------------------------------------

    async def verify(
        self, request: MemberRequest, *, fingerprints: tuple[bytes, bytes] | None = None
    ) -> Verified:
        """Answer one validated /verify request: a scored or masked outcome, or a rejection.

        ``fingerprints``: the response's raw SHA-256 and canonical fingerprint, computed before
        its bytes left memory (a body that waits in a spool file). The caller calls
        ``reply_sent`` on the result once the reply is written, or the request ended without
        one. Every outcome is counted here, once.
        """
        if fingerprints is not None:
            # Computed off the event loop, before the body went to its file (C-23).
            self.counters.response_digests += 1
            self.counters.canonical_fingerprints += 1
        verified = await self._verify(request, fingerprints)
        self.metrics.verify(verified.label)
        return verified

    def verify_unanswered(self, label: str) -> None:
        """Count a /verify (or a whole group) that got no outcome from the engine: refused or
        invalid before it arrived, a spool file that failed, a server shutting down, a defect."""
        self.metrics.verify(label)

    async def _verify(
        self, request: MemberRequest, fingerprints: tuple[bytes, bytes] | None
    ) -> Verified:
        prepared = self._arrival(request, fingerprints)
        if isinstance(prepared, Scored | Rejected):
            return Verified.of(prepared, replay=False)
        arrival, identity = prepared
        woken = trio.Event()
        decision = self.registry.arrive(arrival, trio.current_time(), woken.set)
        # A waiting request keeps only what its reply echoes.
        del arrival, prepared
        self._apply(decision.effects)
        reply = decision.reply
        if isinstance(reply, Answer):
            return Verified.of(reply.outcome, replay=True)
        done = partial(self.registry.identity_done, reply.record, reply.slot, identity)
        try:
            await woken.wait()
        except BaseException:
            # A disconnect removes only this request's waiter (C-51); the group goes on.
            self.registry.detach(reply.record, reply.slot, reply.waiter)
            done()
            raise
        assert reply.waiter.outcome is not None
        # Keeping the member's fingerprint for replays (C-34) may cost a canonical fingerprint
        # of the whole response: it waits until the reply is out, so as not to delay it.
        return Verified.of(reply.waiter.outcome, replay=False, identity_done=done)

    def _arrival(
        self, request: MemberRequest, fingerprints: tuple[bytes, bytes] | None
    ) -> tuple[Arrival, ResponseIdentity] | Scored | Rejected:
        """The request reduced to what the group engine needs, or its answer if it needs none."""
        if self.closed:
            return Rejected(503, messages.SHUTTING_DOWN)
        if not self.config.group_mode:
            return Scored(self.config.default_score, None)
        if request.group_id is not None and not request.attempt_given:
            if not self._attempt_omission_logged:
                self._attempt_omission_logged = True
                log.info(messages.ATTEMPT_OMITTED)
        # The validating pass decoded only what the prompt digest and the compact texts need;
        # none of it is kept while the request waits (I-10). The response is known by its raw
        # bytes; its canonical fingerprint is computed only when needed (C-24).
        response, input_value = request.take_scoring()
        # A spooled body's view is empty: comparing uses the fingerprints taken before it went.
        identity = ResponseIdentity(request.response_view(), self.counters, known=fingerprints)
        self.counters.fingerprints += 1
        assert request.rollout_index is not None
        arrival = Arrival(
            group_id=request.group_id,
            attempt=request.attempt,
            slot=request.rollout_index,
            task_index=request.task_index,
            prompt_id=request.prompt_id,
            digest=self._prompt_digest(request, input_value),
            fingerprint=identity,
            prepare=partial(self._prepare_member, request, response, input_value),
            resend=request.resend,
        )
        return arrival, identity

    def _prompt_digest(self, request: MemberRequest, input_value: Any) -> str:
        value: dict[str, Any] = {"input": input_value, "principle": request.principle}
        if self.config.comparison_strategy == "fixed_baseline":
            value["baseline"] = request.baseline
        return digest_hex(value)

    def _prepare_member(
        self, request: MemberRequest, response: Any, input_value: Any, first: bool
    ) -> tuple[MemberTexts, GroupInputs | None]:
        assert request.rollout_index is not None
        if self.hooks.on_conversion is not None:
            self.hooks.on_conversion(request.rollout_index)
        reasoning, answer = extract_scoring_text(response)
        self.counters.extractions += 1
        if not first:
            return MemberTexts(reasoning, answer), None
        self.counters.conversions += 1
        history = convert_history(input_value)
        principle = effective_principle(
            request.principle, self.config.default_principle, self.config.use_principle
        )
        baseline = request.baseline if self.config.comparison_strategy == "fixed_baseline" else None
        order = (
            baseline_order_digest(baseline, history, principle) if baseline is not None else None
        )
        return MemberTexts(reasoning, answer), GroupInputs(history, principle, baseline, order)

    # ---- effects -------------------------------------------------------------------------------

    def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            record = effect.record
            if isinstance(effect, StartGroup):
                record.handle = GroupHandle(self.judge.slots.lane(complete=False))
                self._spawn(self._run_group, record)
            elif isinstance(effect, StartComparisons):
                record.handle.queued.extend(effect.comparisons)
                record.handle.wake.set()
            elif isinstance(effect, BeginEvaluation):
                handle: GroupHandle = record.handle
                now = trio.current_time()
                handle.evaluation_deadline = now + self.config.cohort_evaluation_timeout_s
                self.metrics.collection_seconds.observe(now - record.started_at)
                # Complete groups' comparisons go ahead of those of groups still collecting.
                self.judge.slots.promote(handle.lane)
                handle.ready.set()
                handle.wake.set()
            elif isinstance(effect, CancelGroup) and record.handle is not None:
                record.handle.scope.cancel()

    def _spawn(self, fn: Any, *args: Any) -> None:
        assert self._nursery is not None, "the engine is not running"
        self._owned_tasks += 1
        # A fresh, empty context: nothing of the member request that triggered the spawn
        # (context variables, trace ids) may reach the group's work or its judge calls (I-8).
        contextvars.Context().run(self._nursery.start_soon, self._owned, fn, *args)

    async def _owned(self, fn: Any, *args: Any) -> None:
        try:
            await fn(*args)
        except Exception as exc:
            # Each task ends its own group's work with a reason before this point; a defect
            # that still escapes is logged here and never closes the server's nursery.
            records = [arg for arg in args if isinstance(arg, Record)]
            fields = messages.log_fields(records[0].key, records[0].attempt) if records else {}
            log.error("GenRM background task %s failed", fn.__name__, exc_info=exc, extra=fields)
        finally:
            self._owned_tasks -= 1
            if self._owned_tasks == 0 and self._shutdown_started:
                self._tasks_done.set()

    # ---- a group's life ------------------------------------------------------------------------

    async def _run_group(self, record: Record) -> None:
        """Collect, judge and publish one record; everything it starts lives in its scope.

        The comparisons nursery spans collection and evaluation, so comparisons started early
        (early judging) and the rest are cancelled and drained together by either deadline.
        """
        handle: GroupHandle = record.handle
        with handle.scope:
            try:
                async with trio.open_nursery() as comparisons:
                    if not await self._collect(record, handle, comparisons):
                        comparisons.cancel_scope.cancel()
                        return
                    comparisons.cancel_scope.deadline = handle.evaluation_deadline
                    await call_hook(self.hooks.on_evaluation_start, record.key)
                    self._start_queued(record, handle, comparisons)
                now = trio.current_time()
                began = handle.evaluation_deadline - self.config.cohort_evaluation_timeout_s
                self.metrics.evaluation_seconds.observe(now - began)
                if self.config.debug_logging:
                    log.debug(
                        "GenRM verdicts key='%s' comparisons=%d verdicts=%d failed=%d",
                        messages.log_key(record.key),
                        len(record.plan),
                        len(handle.verdicts),
                        len(record.failed_comparisons),
                        extra=messages.log_fields(record.key, record.attempt),
                    )
                # cancel_called also covers a deadline that expired in the same instant as the
                # last comparison's own request deadline: the evaluation deadline wins (M-7).
                if comparisons.cancel_scope.cancel_called:
                    self.registry.evaluation_deadline(record, handle.finished, now)
                else:
                    self.registry.finish_evaluation(record, handle.verdicts, now)
            except Exception as exc:
                cause = _first_error(exc)
                log.error(
                    "GenRM cohort evaluation failed for key='%s'",
                    messages.log_key(record.key),
                    exc_info=cause,
                    extra=messages.log_fields(record.key, record.attempt),
                )
                self.registry.fail_evaluation(
                    record, messages.evaluation_failed(cause), trio.current_time()
                )
            except BaseException:
                # Cancelled from outside. Supersession and shutdown have already failed the
                # record, so this only records anything for an unexplained cancellation.
                self.registry.fail_evaluation(
                    record, messages.EVALUATION_CANCELLED, trio.current_time()
                )
                raise
            finally:
                # The verdicts and queues die with the task; the retained record keeps only
                # its outcomes (C-34).
                record.handle = None

    async def _collect(
        self, record: Record, handle: GroupHandle, comparisons: trio.Nursery
    ) -> bool:
        """Wait for the group to fill, starting comparisons as they become ready."""
        collection_deadline = record.started_at + self.config.cohort_collection_timeout_s
        with trio.move_on_at(collection_deadline):
            while True:
                self._start_queued(record, handle, comparisons)
                if handle.ready.is_set():
                    return True
                await handle.wake.wait()
                handle.wake = trio.Event()
        # Filling the group and arming the evaluation happen in one critical section, so the
        # last member and the deadline can never both win (C-95).
        if handle.ready.is_set():
            return True
        self.registry.collection_expired(record, trio.current_time())
        return False

    def _start_queued(self, record: Record, handle: GroupHandle, nursery: trio.Nursery) -> None:
        queued, handle.queued = handle.queued, []
        for comparison in queued:
            nursery.start_soon(
                self._compare,
                record,
                handle,
                comparison,
                self._judge_task(record, comparison, handle.lane),
            )

    def _judge_task(self, record: Record, comparison: Comparison, lane: Lane) -> JudgeTask:
        inputs = record.inputs
        assert inputs is not None

        def text(slot: int) -> str:
            if slot == record.size:
                assert inputs.baseline is not None
                return judge_answer_text(inputs.baseline)
            texts = record.members[slot].texts
            assert texts is not None
            return judge_answer_text(texts.answer)

        return JudgeTask(
            history=inputs.history,
            principle=inputs.principle,
            text_1=text(comparison.first),
            text_2=text(comparison.second),
            pair=(comparison.first, comparison.second),
            judge_pass=comparison.judge_pass,
            lane=lane,
            group_key=record.key,
            group_attempt=record.attempt,
        )

    async def _compare(
        self, record: Record, handle: GroupHandle, comparison: Comparison, task: JudgeTask
    ) -> None:
        await call_hook(
            self.hooks.on_comparison_start,
            comparison.first,
            comparison.second,
            comparison.judge_pass,
        )
        # A retry sleep must not outlast the evaluation deadline (J-32); while the group is
        # still collecting that deadline is not known yet and nothing bounds the sleep but the
        # collection deadline's cancellation.
        result = await self.judge.judge(task, deadline=handle.retry_deadline)
        handle.finished += 1
        if isinstance(result, JudgeFailure):
            self.registry.comparison_failed(record, comparison, result.text)
        else:
            handle.verdicts[comparison.index] = result.verdict

    # ---- verification hooks (I-21, I-22) -------------------------------------------------------

    def statistics(self) -> Statistics:
        return self.registry.statistics(
            owned_tasks=self._owned_tasks, judge_in_flight=self.judge.in_flight
        )

    def check_invariants(self) -> None:
        self.registry.check_invariants()
        if self._shutdown_done.is_set() and self._owned_tasks:
            raise AssertionError("owned tasks still running after shutdown")

    def store_status(self) -> tuple[str, bool]:
        """Where groups live, and whether that store answered its last use."""
        return "memory", True

    async def refresh_counts(self) -> None:
        """Bring ``group_counts`` and ``health`` up to date (a shared store is asked for its
        own); /healthz and /metrics call it before they answer."""

    def group_counts(self) -> GroupCounts:
        """The groups of the store this server uses, for its gauges."""
        return self.registry.group_counts(trio.current_time())

    @property
    def evaluations_running(self) -> int:
        """Groups this process is judging now."""
        return self.statistics().evaluating

    def health(self) -> Mapping[str, int]:
        stats = self.statistics()
        return {
            "active_groups": stats.active_groups,
            "retained_records": stats.retained_records,
            "watermarks": stats.watermarks,
            "judge_in_flight": stats.judge_in_flight,
            "legacy_resends_collecting": self.registry.legacy_resends_collecting,
            "judge_attempts_total": self.judge.attempts_total,
        }


def _first_error(exc: BaseException) -> BaseException:
    """The first leaf of an exception group: the error a nursery collected first."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
