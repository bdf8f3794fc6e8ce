"""The Trio runtime of one server instance: waiters, evaluations, leases, sweeps and shutdown.

Every transition runs through the instance's group store (store/group_store.py), which applies
one of the core's transitions atomically and reports what changed; this module acts on those
reports. Work that outlives a request (a group's collection deadline, its judging, a lease's
renewal) lives in the server nursery in a fresh context, never in the request's task.

With the memory store a group collects in this process: its collection deadline is a cancel
scope around the task that judges it, comparisons whose slots are filled start at once (early
judging), and a waiting request is answered by the core itself. With a shared store several
processes serve the same groups: a request that must wait holds a local one-shot slot keyed by
its record's id and is woken by the store's notification, or by the sweep that polls the outcome
keys of every record a local request waits on (a lost notification delays an answer, never
strands it). The transaction that fills a group also claims its evaluation under a lease with a
fencing token; the owner renews the lease while it judges, and publishes only through a
transaction that finds its own token still in the record. Collection deadlines and expired
leases are found by any process's sweep in the store's sorted sets: a group whose owner died is
taken over and judged again once its lease has expired, within its evaluation deadline.
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, cast

import trio

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.core.canonical import digest_hex
from genrm_trio.core.groups import (
    Answer,
    Arrival,
    Decision,
    GroupCounts,
    GroupInputs,
    MemberTexts,
    Outcome,
    Phase,
    Record,
    Rejected,
    Scored,
    Statistics,
    StoreMeta,
    Wait,
    Waiter,
    group_key,
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
from genrm_trio.runtime.judge_budget import SharedJudgeBudget
from genrm_trio.store.group_store import (
    GroupStore,
    StoreFailed,
    Transaction,
    group_ref,
    record_ref,
)
from genrm_trio.store.memory_store import MemoryGroupStore
from genrm_trio.store.resp import StoreUnavailable

if TYPE_CHECKING:
    from genrm_trio.store.redis_store import RedisGroupStore

log = logging.getLogger("genrm_trio")

# An offered group: a process judging n groups claims it after n steps (at most half the wait),
# the offering process after the whole wait, if nobody has by then.
OFFER_STEP_S = 0.002
OFFER_WAIT_S = 0.05


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
    """How often the expensive per-request steps ran (C-23, C-31, C-32).

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
class Evaluation:
    """This process's work on one record: its cancel scope, queued comparisons and results.

    With the memory store it exists from the group's first member (its collection deadline and
    early comparisons); with a shared store from the claim of its evaluation.
    """

    record: Record
    lane: Lane  # the group's place in the judge queue, promoted once the group is full
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    ready: trio.Event = field(default_factory=trio.Event)  # claimed: judge the whole plan
    wake: trio.Event = field(default_factory=trio.Event)  # comparisons were queued
    # Comparisons to start, each with its judge task built from the record as the transaction
    # that queued it left it: a supersession may drop the record's inputs before this
    # evaluation's task first runs, but never the snapshot it holds.
    queued: list[tuple[Comparison, JudgeTask]] = field(default_factory=list)
    deadline: float = math.inf  # the evaluation deadline, in Trio's clock, once claimed
    began: float = math.inf  # when it was claimed, in Trio's clock
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    finished: int = 0

    def retry_deadline(self) -> float:
        return self.deadline


class Engine:
    """One server instance's group engine over a group store (memory unless one is given)."""

    def __init__(
        self,
        config: Config,
        store: GroupStore | None = None,
        *,
        judge_transport: TransportFactory | None = None,
        hooks: Hooks | None = None,
        judge_slots: JudgeSlots | None = None,
        poll_s: float = 1.0,
        notifications: bool = True,
    ) -> None:
        self.config = config
        self.store: GroupStore = store if store is not None else MemoryGroupStore(config)
        self.hooks = hooks or Hooks()
        self.metrics = ServerMetrics()
        shared = self.store.shared
        if shared and judge_slots is None:
            judge_slots = JudgeSlots(config.process_judge_concurrency, shared=True)
        self.judge = JudgeClient(
            config, transport=judge_transport, metrics=self.metrics, slots=judge_slots
        )
        self.registry = self.store.registry
        # A shared store's own operations: notifications, sweeps, counts, the judge budget.
        self._shared = cast("RedisGroupStore", self.store) if shared else None
        self.judge_budget: SharedJudgeBudget | None = None
        if self._shared is not None:
            # judge_max_concurrency holds for the whole deployment: slots come from the store.
            self.judge_budget = SharedJudgeBudget(
                self._shared, self.judge.slots, config.judge_max_concurrency, poll_s=poll_s
            )
        self.counters = Counters()
        self.metrics.fingerprint_seconds = self.counters.fingerprint_seconds
        self.poll_s = poll_s
        self.notifications = notifications
        self._nursery: trio.Nursery | None = None
        self._owned_tasks = 0
        self._tasks_done = trio.Event()
        self._stopped = trio.Event()
        self._shutdown_done = trio.Event()
        self._shutdown_started = False
        self._closed = False
        self._attempt_omission_logged = False
        # record id -> this process's waiting requests on it, when the store keeps no waiters
        self._waiting: dict[str, list[tuple[int, Waiter]]] = {}
        # (record id, fencing token) -> an evaluation this process runs; a process can hold a
        # stale one and a newer one of the same record (it took its own group over).
        self._evaluations: dict[tuple[str, int], Evaluation] = {}
        self._queued: dict[str, list[_Arriving]] = {}  # group -> arrivals for its next batch
        self.offers = 0  # groups this process filled and offered to a less loaded one
        self.claims = 0  # evaluations this process claimed (at the fill, or by taking over)
        self.published = 0  # outcomes it stored
        self.refused = 0  # results the fence refused: another claim had come since
        self.subscribed = False  # the notification channel is followed right now

    # ---- lifetime ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the server nursery until shutdown has drained it."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.store.shared:
                # Other processes end groups, and deadlines and leases are in the store.
                assert self.judge_budget is not None
                if self.notifications:
                    nursery.start_soon(self._listen)
                nursery.start_soon(self._sweep)
                nursery.start_soon(self.judge_budget.run)
            task_status.started()
            await self._stopped.wait()
            nursery.cancel_scope.cancel()

    @property
    def closed(self) -> bool:
        return self._closed

    def begin_shutdown(self) -> None:
        """Answer this process's waiters and stop its evaluations; synchronous, so it runs
        first (C-98). Groups that die with the process fail (C-96); a shared store's stay for
        the other processes, and an evaluation this process owned is taken over when its lease
        expires."""
        if self._shutdown_started:
            return
        self._shutdown_started = True
        self._closed = True
        log.info("GenRM server shutting down")
        for record in self.store.shut_down(trio.current_time()):
            self._cancel_evaluations(_rid(record))
        shutting_down = Rejected(503, messages.SHUTTING_DOWN)
        waiting, self._waiting = self._waiting, {}
        for waiters in waiting.values():
            for _, waiter in waiters:
                waiter.resolve(shutting_down)
        if self.store.shared:
            # The groups stay for the other processes; this process's work on them stops.
            for evaluation in self._evaluations.values():
                evaluation.scope.cancel()

    async def shutdown(self) -> None:
        """C-96: fail or leave groups, drain owned tasks within shutdown_grace_s, close the
        judge client and the store."""
        self.begin_shutdown()
        if self._shutdown_done.is_set():
            return
        with trio.move_on_after(self.config.shutdown_grace_s, shield=True):
            if self._owned_tasks:
                await self._tasks_done.wait()
        with trio.move_on_after(self.config.shutdown_grace_s, shield=True):
            try:
                await self.judge.aclose()
                if self.judge_budget is not None:
                    await self.judge_budget.give_back()
            finally:
                # Even when the grace ran out: the memory store lets its groups go without a
                # checkpoint.
                await self.store.aclose()
        self._stopped.set()
        self._shutdown_done.set()
        log.info("GenRM server shut down")

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
        legacy_key = (
            group_key(None, arrival.attempt, arrival.task_index, arrival.prompt_id, arrival.digest)
            if arrival.group_id is None
            else None
        )
        ref = group_ref(arrival.group_id, legacy_key)
        arriving = _Arriving(arrival, identity, woken)
        del arrival, prepared
        if self.store.batches_arrivals:
            # Extraction runs once per accepted member even if the transaction runs again
            # (C-31).
            assert arriving.arrival is not None
            arriving.arrival.prepare = _once(arriving.arrival.prepare)
            arriving.done = applied = trio.Event()
            self._enqueue(ref, arriving)
            try:
                await applied.wait()
            except BaseException:
                if applied.is_set():
                    self._abandon(arriving)
                else:
                    arriving.abandoned = True  # the batch it is in cleans up after it
                raise
        else:
            await self._apply_batch(ref, [arriving])
        if arriving.failed is not None:
            identity.release()
            return Verified(arriving.failed, "unavailable")
        decision = arriving.decision
        assert decision is not None
        reply = decision.reply
        if isinstance(reply, Answer):
            # Nothing keeps this request's identity: its member, if any, has one already.
            identity.release()
            return Verified.of(reply.outcome, replay=True)
        done = partial(self.registry.identity_done, reply.record, reply.slot, identity)
        try:
            await woken.wait()
        except BaseException:
            # A disconnect removes only this request's waiter (C-51); the group goes on.
            self._abandon(arriving)
            raise
        if not self.store.holds_waiters:
            # Usually gone already (delivery pops it); not when the transaction that made this
            # request wait also ended its group (a later member of the same batch failing it).
            self._unregister(_rid(reply.record), reply.waiter)
        assert reply.waiter.outcome is not None
        # Keeping the member's fingerprint for replays (C-34) may cost a canonical fingerprint
        # of the whole response: it waits until the reply is out, so as not to delay it.
        return Verified.of(reply.waiter.outcome, replay=False, identity_done=done)

    def _arrival(
        self, request: MemberRequest, fingerprints: tuple[bytes, bytes] | None
    ) -> tuple[Arrival, ResponseIdentity] | Scored | Rejected:
        """The request reduced to what the group engine needs, or its answer if it needs none."""
        if self._closed:
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

    def _enqueue(self, ref: str, arriving: _Arriving) -> None:
        """Arrivals of one group in this process go to the store together, one transaction
        per batch: the members of a group come within milliseconds, and one transaction each
        would only make them retry on each other's WATCH."""
        queue = self._queued.get(ref)
        if queue is not None:
            queue.append(arriving)
            return
        self._queued[ref] = [arriving]
        self._spawn(self._flush, ref)

    async def _flush(self, ref: str) -> None:
        batch: list[_Arriving] = []
        reason = messages.SHUTTING_DOWN
        try:
            while True:
                batch = self._queued[ref]
                if not batch:
                    del self._queued[ref]
                    return
                self._queued[ref] = []
                await self._apply_batch(ref, batch)
        except Exception as exc:
            reason = f"GenRM group store transaction failed: {messages.exception_text(exc)}"
            raise
        finally:
            # Cancelled (shutdown) or a defect: whoever still waits for a transaction is told
            # so at once, never left waiting.
            for arriving in batch + self._queued.pop(ref, []):
                if arriving.done is not None and not arriving.done.is_set():
                    arriving.failed = Rejected(503, reason)
                    arriving.done.set()

    async def _apply_batch(self, ref: str, batch: list[_Arriving]) -> None:
        def step(tx: Transaction[Any]) -> list[Decision]:
            tx.hand_over = self._hand_over_load()
            decisions = []
            for arriving in batch:
                assert arriving.arrival is not None
                decision = tx.registry.arrive(arriving.arrival, tx.now, arriving.woken.set)
                tx.effects += decision.effects
                decisions.append(decision)
            return decisions

        def before_commit(tx: Transaction[Any]) -> Callable[[], None] | None:
            # Registered before the commit: the outcome can be published the moment it applies.
            undo: list[Callable[[], None]] = []
            for decision in tx.result or ():
                reply = decision.reply
                if isinstance(reply, Wait):
                    undo.append(self._register(_rid(reply.record), reply.slot, reply.waiter))

            def undo_all() -> None:
                for each in undo:
                    each()

            return undo_all

        try:
            tx = await self.store.transact(
                ref, step, before_commit=None if self.store.holds_waiters else before_commit
            )
        except StoreFailed as exc:
            for arriving in batch:
                arriving.failed = Rejected(503, str(exc))
        except Exception as exc:
            # A defect, not the store: these requests fail, the server and the group go on.
            log.error("GenRM group store transaction failed", exc_info=exc, extra=_fields(batch))
            text = f"GenRM group store transaction failed: {messages.exception_text(exc)}"
            for arriving in batch:
                arriving.failed = Rejected(503, text)
        else:
            assert tx.result is not None
            for arriving, decision in zip(batch, tx.result, strict=True):
                arriving.decision = decision
            self._after(tx)
        for arriving in batch:
            # A waiting request keeps only what its reply echoes (I-10).
            arriving.arrival = None
            if arriving.done is not None:
                arriving.done.set()
            if arriving.abandoned:
                self._abandon(arriving)

    def _abandon(self, arriving: _Arriving) -> None:
        """The request left: drop its waiter, if any, and its response's bytes."""
        reply = arriving.decision.reply if arriving.decision is not None else None
        if isinstance(reply, Wait):
            self.registry.detach(reply.record, reply.slot, reply.waiter)
            self._unregister(_rid(reply.record), reply.waiter)
            self.registry.identity_done(reply.record, reply.slot, arriving.identity)
        else:
            arriving.identity.release()

    def _register(self, rid: str, slot: int, waiter: Waiter) -> Callable[[], None]:
        self._waiting.setdefault(rid, []).append((slot, waiter))
        return lambda: self._unregister(rid, waiter)

    def _unregister(self, rid: str, waiter: Waiter) -> None:
        waiters = self._waiting.get(rid)
        if waiters is None:
            return
        waiters[:] = [entry for entry in waiters if entry[1] is not waiter]
        if not waiters:
            del self._waiting[rid]

    def _deliver(self, record: Record) -> None:
        """Answer every local waiter of a finished record with its slot's outcome."""
        waiters = self._waiting.pop(_rid(record), None)
        for slot, waiter in waiters or ():
            outcome = self.registry.settled_outcome(record, slot)
            assert outcome is not None, "a finished record answers every slot"
            waiter.resolve(outcome)

    # ---- what a transition asks of this process --------------------------------------------

    def _after(self, tx: Transaction[Any]) -> None:
        """Run what a committed transaction asks of this process."""
        if tx.started is not None:
            # A group collecting here: its collection deadline and early comparisons run in
            # its evaluation's task from now on.
            self._start_evaluation(tx.started, complete=False)
        for record, comparisons in tx.comparisons:
            evaluation = self._evaluations.get(_key(record))
            if evaluation is not None:
                evaluation.queued += self._snapshot(record, comparisons, evaluation.lane)
                evaluation.wake.set()
        finished = tx.finished
        if finished is not None:
            # Local waiters need not wait for the notification; an evaluation of ours that
            # this transaction ended (supersession) stops at once.
            self._deliver(finished)
            if finished is not tx.claimed:
                self._cancel_evaluations(_rid(finished))
        if tx.offered is not None and not self._closed:
            # Claimed back if no less loaded process has taken it meanwhile.
            self.offers += 1
            self._spawn(self._claim_offer, record_ref(tx.offered), OFFER_WAIT_S)
        claimed = tx.claimed
        if claimed is not None and not self._closed:
            self.claims += 1
            meta = _meta(claimed)
            now = trio.current_time()
            if meta.fence == 1:  # claimed as it filled, not taken over
                self.metrics.collection_seconds.observe(tx.now - claimed.started_at)
            # Listed at once, not when its task first runs: the evaluation is this process's
            # from the moment of the claim (statistics, cancellation by a supersession).
            evaluation = self._evaluations.get((meta.rid, meta.fence))
            if evaluation is None:
                evaluation = self._start_evaluation(claimed, complete=True)
                evaluation.queued = self._snapshot(claimed, claimed.plan, evaluation.lane)
            assert meta.evaluation_due is not None
            evaluation.deadline = now + (meta.evaluation_due - tx.now)
            evaluation.began = now
            # Complete groups' comparisons go ahead of those of groups still collecting.
            self.judge.slots.promote(evaluation.lane)
            evaluation.ready.set()
            evaluation.wake.set()

    def _start_evaluation(self, record: Record, *, complete: bool) -> Evaluation:
        evaluation = Evaluation(record, self.judge.slots.lane(complete=complete))
        self._evaluations[_key(record)] = evaluation
        self._spawn(self._evaluate, record, evaluation)
        return evaluation

    def _cancel_evaluations(self, rid: str) -> None:
        for (evaluated, _), evaluation in self._evaluations.items():
            if evaluated == rid:
                evaluation.scope.cancel()

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

    # ---- a group's evaluation ------------------------------------------------------------------

    async def _evaluate(self, record: Record, evaluation: Evaluation) -> None:
        """Collect (a group collecting in this process), judge and publish one record.

        The comparisons nursery spans collection and evaluation, so comparisons started early
        (early judging) and the rest are cancelled and drained together by either deadline.
        While a lease holds the evaluation, it is renewed beside the comparisons.
        """
        key = _key(record)
        ref = record_ref(record)
        publish: Callable[[Transaction[Any]], bool] | None = None
        try:
            with evaluation.scope:
                try:
                    async with trio.open_nursery() as outer:
                        if self.store.lease_s is not None:
                            outer.start_soon(self._renew, record, evaluation.scope)
                        async with trio.open_nursery() as comparisons:
                            if not await self._collect(record, evaluation, comparisons):
                                comparisons.cancel_scope.cancel()
                                outer.cancel_scope.cancel()
                                return
                            comparisons.cancel_scope.deadline = evaluation.deadline
                            await call_hook(self.hooks.on_evaluation_start, record.key)
                            self._start_queued(record, evaluation, comparisons)
                        outer.cancel_scope.cancel()
                    now = trio.current_time()
                    self.metrics.evaluation_seconds.observe(now - evaluation.began)
                    if self.config.debug_logging:
                        log.debug(
                            "GenRM verdicts key='%s' comparisons=%d verdicts=%d failed=%d",
                            messages.log_key(record.key),
                            len(record.plan),
                            len(evaluation.verdicts),
                            len(record.failed_comparisons),
                            extra=messages.log_fields(record.key, record.attempt),
                        )
                    # cancel_called also covers a deadline that expired in the same instant as
                    # the last comparison's own request deadline: the evaluation deadline wins
                    # (M-7).
                    publish = self._finishing(
                        record, evaluation, comparisons.cancel_scope.cancel_called
                    )
                except Exception as exc:
                    cause = _first_error(exc)
                    log.error(
                        "GenRM cohort evaluation failed for key='%s'",
                        messages.log_key(record.key),
                        exc_info=cause,
                        extra=messages.log_fields(record.key, record.attempt),
                    )
                    publish = self._failing(record, messages.evaluation_failed(cause))
                except BaseException:
                    # Cancelled from outside: a group that dies with the process fails (unless
                    # supersession or shutdown has failed it already); a shared one is left to
                    # its lease.
                    self.store.evaluation_cancelled(record, trio.current_time())
                    raise
            if publish is not None:  # else: lost the lease, superseded, or shutting down
                fields = messages.log_fields(record.key, record.attempt)
                await self._publish(record, ref, publish, fields)
        finally:
            # Listed until its outcome is stored, so the evaluation counts as running until then.
            del self._evaluations[key]

    async def _collect(
        self, record: Record, evaluation: Evaluation, comparisons: trio.Nursery
    ) -> bool:
        """Wait for the group to fill, starting comparisons as they become ready."""
        if evaluation.ready.is_set():
            return True
        with trio.move_on_at(_meta(record).collection_due):
            while True:
                self._start_queued(record, evaluation, comparisons)
                if evaluation.ready.is_set():
                    return True
                await evaluation.wake.wait()
                evaluation.wake = trio.Event()
        # Filling the group and arming the evaluation happen in one critical section, so the
        # last member and the deadline can never both win (C-95).
        if evaluation.ready.is_set():
            return True
        self._after(await self.store.transact(record_ref(record), self._collection_expired))
        return False

    def _start_queued(self, record: Record, evaluation: Evaluation, nursery: trio.Nursery) -> None:
        queued, evaluation.queued = evaluation.queued, []
        if evaluation.scope.cancel_called:
            return  # superseded or shut down before this task's first checkpoint
        for comparison, task in queued:
            nursery.start_soon(self._compare, record, evaluation, comparison, task)

    def _snapshot(
        self, record: Record, comparisons: list[Comparison], lane: Lane
    ) -> list[tuple[Comparison, JudgeTask]]:
        return [(c, self._judge_task(record, c, lane)) for c in comparisons]

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
        self, record: Record, evaluation: Evaluation, comparison: Comparison, task: JudgeTask
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
        result = await self.judge.judge(task, deadline=evaluation.retry_deadline)
        evaluation.finished += 1
        if isinstance(result, JudgeFailure):
            self.registry.comparison_failed(record, comparison, result.text)
        else:
            evaluation.verdicts[comparison.index] = result.verdict

    async def _renew(self, record: Record, lost: trio.CancelScope) -> None:
        """Keep the lease while judging; a renewal the fence refuses stops the evaluation."""
        lease_s = self.store.lease_s
        assert lease_s is not None
        owned = _owner(record)

        def extend(tx: Transaction[Any]) -> bool:
            current = owned(tx)
            if current is None:
                return False
            _meta(current).lease_until = tx.now + lease_s
            return True

        ref = record_ref(record)
        while True:
            await trio.sleep(lease_s / 3)
            await call_hook(self.hooks.on_lease_renewal, record.key)
            try:
                tx = await self.store.transact(ref, extend)
            except StoreFailed:
                continue
            if not tx.result:
                lost.cancel()  # superseded, failed, or taken over: nothing to publish
                return

    @staticmethod
    def _finishing(
        record: Record, evaluation: Evaluation, expired: bool
    ) -> Callable[[Transaction[Any]], bool]:
        """The step that publishes an evaluation's outcome, if the record is still its own."""
        owned = _owner(record)

        def finish(tx: Transaction[Any]) -> bool:
            current = owned(tx)
            if current is None:
                return False
            current.failed_comparisons = dict(record.failed_comparisons)
            if expired:
                tx.registry.evaluation_deadline(current, evaluation.finished, tx.now)
            else:
                tx.registry.finish_evaluation(current, evaluation.verdicts, tx.now)
            return True

        return finish

    @staticmethod
    def _failing(record: Record, text: str) -> Callable[[Transaction[Any]], bool]:
        """A non-judge error ends the evaluation: the group fails with kind cohort (C-63)."""
        owned = _owner(record)

        def fail(tx: Transaction[Any]) -> bool:
            current = owned(tx)
            if current is None:
                return False
            tx.registry.fail_evaluation(current, text, tx.now)
            return True

        return fail

    async def _publish(
        self,
        record: Record,
        ref: str,
        step: Callable[[Transaction[Any]], bool],
        fields: Mapping[str, Any],
    ) -> None:
        """Store the outcome; while the store is down, try again until it answers or the
        fence refuses (another process took the evaluation over meanwhile). If building the
        outcome raises (a failed internal check, C-64), the group fails instead (C-63); if
        even that raises, the group is left to its lease, as if this process had died."""
        defective = False
        while True:
            try:
                tx = await self.store.transact(ref, step)
            except StoreFailed as exc:
                log.warning("GenRM could not store an outcome, retrying: %s", exc, extra=fields)
                await trio.sleep(self.poll_s)
                continue
            except Exception as exc:
                if self.store.shared:
                    log.error(
                        "GenRM cohort evaluation failed for ref='%s'",
                        ref,
                        exc_info=exc,
                        extra=fields,
                    )
                else:
                    log.error(
                        "GenRM cohort evaluation failed for key='%s'",
                        messages.log_key(record.key),
                        exc_info=exc,
                        extra=fields,
                    )
                if defective:
                    return
                defective = True
                step = self._failing(record, messages.evaluation_failed(exc))
                continue
            if tx.result:
                self.published += 1
            else:
                self.refused += 1
                log.warning(
                    "GenRM discarded an evaluation result: the group's fence moved on",
                    extra=fields,
                )
            self._after(tx)
            return

    # ---- wake-ups ------------------------------------------------------------------------------

    async def _listen(self) -> None:
        """Follow the store's notifications; after every (re)subscription, poll once."""
        store, budget_ = self._shared, self.judge_budget
        assert store is not None and budget_ is not None
        while True:
            try:
                connection = await store.client.connect()
            except StoreUnavailable:
                await trio.sleep(self.poll_s)
                continue
            budget = budget_.channel.encode()
            offers = store.offers_channel.encode()
            try:
                await connection.pipeline(
                    [
                        ["SUBSCRIBE", store.channel],
                        ["SUBSCRIBE", budget],
                        ["SUBSCRIBE", offers],
                    ]
                )
                self.subscribed = True
                budget_.notified()
                await self._poll_waiters()
                while True:
                    message = await connection.receive()
                    if not (isinstance(message, list) and message and message[0] == b"message"):
                        continue
                    if message[1] == budget:
                        budget_.notified()
                    elif message[1] == offers:
                        self._offered(message[2].decode())
                    else:
                        rid = message[2].decode()
                        copies = self.hooks.on_notification
                        for _ in range(1 if copies is None else copies(rid)):
                            if rid in self.watched_records():
                                finished = await store.finished_records([rid])
                                for record in finished.values():
                                    self._ended_elsewhere(record)
            except (StoreUnavailable, StoreFailed):
                self.subscribed = False
                await trio.sleep(self.poll_s)
            except Exception as exc:
                # A defect must not end the engine: the sweep still answers every waiter.
                log.error("GenRM notification listener failed; subscribing again", exc_info=exc)
                self.subscribed = False
                await trio.sleep(self.poll_s)
            finally:
                self.subscribed = False
                await connection.aclose()

    async def _poll_waiters(self) -> None:
        assert self._shared is not None
        for record in (await self._shared.finished_records(self.watched_records())).values():
            self._ended_elsewhere(record)

    def _ended_elsewhere(self, record: Record) -> None:
        """A record ended in another process (or in a transaction whose reply this process
        missed): answer its waiters here, and stop an evaluation of it that this process still
        runs, as a supersession does in one process (C-80): its judge calls are cancelled at
        once, not when its next lease renewal finds the record gone."""
        self._deliver(record)
        self._cancel_evaluations(_rid(record))

    async def _sweep(self) -> None:
        """Every poll interval: waiters' outcomes, expired collections, expired leases, and the
        deployment's group counts for the gauges."""
        while True:
            await trio.sleep(self.poll_s)
            try:
                await self.sweep_once()
                await self.refresh_counts()
            except StoreFailed as exc:
                log.debug("GenRM group store sweep failed: %s", exc)
            except Exception as exc:
                # Never the end of the engine: the next sweep runs, and requests go on.
                log.error("GenRM group store sweep failed", exc_info=exc)

    async def sweep_once(self) -> None:
        """One sweep (a test harness on a mock clock runs them at the instants it chooses).

        A defect in one group's transition fails that group with its reason and the sweep goes
        on with the others; the store being unreachable ends the sweep until the next one.
        """
        store = self._shared
        assert store is not None
        await self._poll_waiters()
        for ref in await store.due(store.due_set):
            await self._sweep_group(ref, self._collection_expired)
        for ref in await store.due(store.lease_set):
            await self._sweep_group(ref, self._take_over)

    async def _sweep_group(self, ref: str, step: Callable[[Transaction[Any]], None]) -> None:
        try:
            tx = await self.store.transact(ref, step)
        except StoreFailed:
            raise
        except Exception as exc:
            log.error("GenRM group store sweep failed for ref='%s'", ref, exc_info=exc)
            text = messages.evaluation_failed(exc)

            def fail(tx: Transaction[Any]) -> None:
                if tx.loaded is not None and tx.loaded.phase.active:
                    tx.registry.fail_evaluation(tx.loaded, text, tx.now)

            try:
                tx = await self.store.transact(ref, fail)
            except StoreFailed:
                raise
            except Exception as again:
                log.error("GenRM could not fail group ref='%s'", ref, exc_info=again)
                return
        self._after(tx)

    @staticmethod
    def _collection_expired(tx: Transaction[Any]) -> None:
        """The collection deadline has passed: the group fails unless it filled meanwhile."""
        record = tx.loaded
        if record is not None and record.phase is Phase.COLLECTING:
            meta = _meta(record)
            if meta.collection_due <= tx.now:
                tx.registry.collection_expired(record, tx.now)

    def _take_over(self, tx: Transaction[Any]) -> None:
        """An evaluation whose owner stopped renewing its lease, or one offered and not yet
        claimed: claim it, or fail it if its evaluation deadline has passed meanwhile."""
        record = tx.loaded
        if record is None or record.phase is not Phase.EVALUATING:
            return
        meta = _meta(record)
        if meta.lease_until is None or meta.lease_until > tx.now:
            return
        assert meta.evaluation_due is not None
        if meta.evaluation_due <= tx.now:
            tx.registry.evaluation_deadline(record, 0, tx.now)
            return
        offered = meta.fence == 0
        lease_s = self.store.lease_s
        assert lease_s is not None
        tx.claim(record, lease_s)
        if offered:
            return
        # Among processes racing for the same expired lease, only the one whose EXEC applies
        # logs it: the transaction's logs are emitted once it is stored.
        tx.logs.append(
            (
                logging.WARNING,
                f"GenRM took over the evaluation of key='{messages.log_key(record.key)}' "
                "after its owner's lease expired",
                {"extra": messages.log_fields(record.key, record.attempt)},
            )
        )

    # ---- where groups are judged ---------------------------------------------------------

    def _hand_over_load(self) -> int | None:
        """This process's evaluations running, when it judges more groups than its share of
        the deployment's (by the last count): a group it fills is then offered to a process
        judging fewer. None: it judges the group itself."""
        store = self._shared
        if store is None:
            return None
        counts = store.last_counts
        mine = len(self._evaluations)
        if not self.notifications or counts is None or store.processes < 2 or mine < 1:
            return None
        return mine if mine > counts.evaluating / store.processes else None

    def _offered(self, message: str) -> None:
        """Another process offers a group it filled: claim it if this process judges fewer
        groups, the sooner the fewer it judges, so the least loaded one gets it."""
        load, _, ref = message.partition(" ")
        mine = len(self._evaluations)
        if self._closed or mine >= int(load):
            return
        self._spawn(self._claim_offer, ref, min(OFFER_STEP_S * mine, OFFER_WAIT_S / 2))

    async def _claim_offer(self, ref: str, delay_s: float) -> None:
        await trio.sleep(delay_s)
        try:
            await self._sweep_group(ref, self._take_over)
        except StoreFailed:
            pass  # a sweep claims it once the store answers again

    # ---- verification hooks (I-21, I-22) -------------------------------------------------------

    def statistics(self) -> Statistics:
        """With the memory store, every group's; with a shared one, this process's share: its
        waiters, evaluations, tasks and judge calls (the groups are in the store)."""
        return self.store.statistics(
            Statistics(
                collecting=0,
                evaluating=len(self._evaluations),
                retained_records=0,
                watermarks=0,
                idle_entries=0,
                waiters=sum(len(w) for w in self._waiting.values()),
                owned_tasks=self._owned_tasks,
                judge_in_flight=self.judge.in_flight,
                prune_visits=0,
            )
        )

    @property
    def queued(self) -> int:
        """Arrivals waiting for their group's next transaction (a test waits for 0)."""
        return sum(len(batch) for batch in self._queued.values()) + len(self._queued)

    def watched_records(self) -> list[str]:
        """The ids of the records this process waits on or evaluates: their end concerns it."""
        return list({*self._waiting, *(rid for rid, _ in self._evaluations)})

    def check_invariants(self) -> None:
        self.store.check_invariants()
        if self._shutdown_done.is_set() and (self._owned_tasks or self._waiting):
            raise AssertionError("owned tasks or waiters left after shutdown")

    def store_status(self) -> tuple[str, bool]:
        """Where groups live, and whether that store answered its last use."""
        return self.store.name, self.store.available

    async def refresh_counts(self) -> None:
        """Bring ``group_counts`` and ``health`` up to date (a shared store is asked for its
        own); /healthz and /metrics call it before they answer."""
        await self.store.refresh_counts()

    def group_counts(self) -> GroupCounts:
        """The groups of the store this server uses, for its gauges."""
        return self.store.group_counts(trio.current_time())

    @property
    def evaluations_running(self) -> int:
        """Groups this process is judging now."""
        return self.statistics().evaluating

    def health(self) -> Mapping[str, int]:
        """The store's groups and this process's judge."""
        return {
            **self.store.health(len(self._evaluations)),
            "judge_in_flight": self.judge.in_flight,
            "judge_attempts_total": self.judge.attempts_total,
        }


@dataclass(slots=True, eq=False)
class _Arriving:
    """One /verify on its way into a transition, and what that transition decided."""

    arrival: Arrival | None
    identity: ResponseIdentity
    woken: trio.Event
    done: trio.Event | None = None  # set once its batch is applied (batched arrivals only)
    decision: Decision | None = None
    failed: Rejected | None = None
    abandoned: bool = False  # the request left before its batch was applied


def _fields(batch: list[_Arriving]) -> dict[str, Any]:
    """The log fields of the group attempt a batch of arrivals is for (its first member's)."""
    arrival = batch[0].arrival
    if arrival is None:
        return {}
    key = group_key(
        arrival.group_id, arrival.attempt, arrival.task_index, arrival.prompt_id, arrival.digest
    )
    return messages.log_fields(key, arrival.attempt)


def _meta(record: Record) -> StoreMeta:
    meta = record.meta
    assert meta is not None, "a record in a store carries its StoreMeta"
    return meta


def _rid(record: Record) -> str:
    return _meta(record).rid


def _key(record: Record) -> tuple[str, int]:
    meta = _meta(record)
    return meta.rid, meta.fence


def _owner(record: Record) -> Callable[[Transaction[Any]], Record | None]:
    """The record as a transaction finds it, if the evaluation of ``record`` still owns it: the
    same record, still evaluating, under the same fencing token."""
    meta = _meta(record)
    rid, fence = meta.rid, meta.fence

    def owned(tx: Transaction[Any]) -> Record | None:
        current = tx.loaded
        if current is None or current.phase is not Phase.EVALUATING:
            return None
        current_meta = _meta(current)
        if current_meta.rid != rid or current_meta.fence != fence:
            return None
        return current

    return owned


def _once(prepare: Callable[[bool], Any]) -> Callable[[bool], Any]:
    """Extraction at most once per request; again only if a retried transaction finds the
    member has become its group's first and the group's inputs are needed too."""
    done: dict[bool, Any] = {}

    def once(first: bool) -> Any:
        if first not in done:
            done[first] = prepare(first)
        return done[first]

    return once


def _first_error(exc: BaseException) -> BaseException:
    """The first leaf of an exception group: the error a nursery collected first."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
