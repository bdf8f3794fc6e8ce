"""The Trio runtime of one server instance: requests in, decisions acted on, shutdown.

Every transition runs through the instance's group store (store/group_store.py), which applies
the core's one transition to one group atomically and returns its decision; this module acts on
decisions alike whatever the store. A /verify request becomes an ``Arrival``; arrivals of one
group go to the store in batches (runtime/_batches.py); a request that must wait holds a
``Waiter`` under its record's id (runtime/_waiters.py) until this process learns the record
ended, from its own transition or from the store's watcher. A group's evaluation is an object of
its own (runtime/_evaluation.py) that holds a snapshot of what it judges. Work that outlives a
request (a batch of other requests' arrivals, an evaluation) lives in the server nursery in a
fresh context, never in the request's task.

What only a store shared by several processes needs (notifications, sweeps, take-over, offers,
the deployment's judge budget) sits behind the watcher the store supplies, which the engine
starts and otherwise only asks for a hand-over load and the judge's slots.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any, NamedTuple, Protocol

import trio

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.core.arrivals import Arrival, MemberSource
from genrm_trio.core.canonical import digest_hex
from genrm_trio.core.identity import ResponseIdentity
from genrm_trio.core.mask_window import MaskWindow
from genrm_trio.core.outcomes import Ended, Masked, Outcome, Rejected, Scored
from genrm_trio.core.records import group_key
from genrm_trio.core.server_metrics import ServerMetrics, verify_label
from genrm_trio.core.statistics import GroupCounts, Statistics
from genrm_trio.core.tallies import Tallies
from genrm_trio.core.transition import Answer, Arrive, Decision, Wait, Work
from genrm_trio.judge.client import JudgeClient
from genrm_trio.judge.transport import TransportFactory
from genrm_trio.runtime._batches import Batches, Pending
from genrm_trio.runtime._counters import Counters
from genrm_trio.runtime._evaluation import Evaluation, Services
from genrm_trio.runtime._waiters import Waiters
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.store.configured import configured_store
from genrm_trio.store.group_store import GroupStore, StoreFailed, group_ref

__all__ = ["Counters", "Engine", "MemberRequest", "Verified"]

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


class Verified(NamedTuple):
    """An answered /verify: its outcome and its ``genrm_verify_requests_total`` label."""

    outcome: Outcome
    label: str

    @classmethod
    def of(cls, outcome: Outcome, *, replay: bool) -> Verified:
        return cls(outcome, verify_label(outcome, replay=replay))


class Engine:
    """One server instance's group engine over a group store (the configured one unless one is
    given)."""

    def __init__(
        self,
        config: Config,
        store: GroupStore | None = None,
        *,
        judge_transport: TransportFactory | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.config = config
        self.store: GroupStore = store if store is not None else configured_store(config)
        self.hooks = hooks or Hooks()
        self.metrics = ServerMetrics()
        self.counters = Counters()
        self.metrics.fingerprint_seconds = self.counters.fingerprint_seconds
        self.tallies = Tallies(config.cohort_result_ttl_s, config.max_terminal_cohorts)
        self.masking = MaskWindow(
            config.mask_window_s, config.mask_warning_ratio, config.mask_warning_min_rollouts
        )
        self.waiters = Waiters()
        self.watcher = self.store.watcher(self)
        self.judge = JudgeClient(
            config,
            transport=judge_transport,
            metrics=self.metrics,
            slots=self.watcher.judge_slots,
        )
        self._services = Services(
            config,
            self.store,
            self.judge,
            self.hooks,
            self.act,
            self._published,
            self.metrics.evaluation_seconds.observe,
        )
        self._batches = Batches(self._apply_batch, self._spawn)
        # (record id, fencing token) -> an evaluation this process runs; a process can hold a
        # stale one and a newer one of the same record (it took its own group over).
        self._evaluations: dict[tuple[str, int], Evaluation] = {}
        self._nursery: trio.Nursery | None = None
        self._owned_tasks = 0
        self._tasks_done = trio.Event()
        self._stopped = trio.Event()
        self._shutdown_done = trio.Event()
        self._shutdown_started = False
        self._closed = False
        self._attempt_omission_logged = False
        self.offers = 0  # groups this process filled and offered to a less loaded one
        self.claims = 0  # evaluations this process claimed (at the fill, or by taking over)
        self.published = 0  # outcomes it stored
        self.refused = 0  # results the fence refused: another claim had come since

    # ---- lifetime ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the server nursery until shutdown has drained it."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.watcher.run)
            task_status.started()
            await self._stopped.wait()
            nursery.cancel_scope.cancel()

    @property
    def closed(self) -> bool:
        return self._closed

    def begin_shutdown(self) -> None:
        """Answer this process's waiters and stop its evaluations; synchronous, so it runs
        first (C-98). Groups that die with the process fail (C-96); a shared store's stay for
        the other processes, which take an evaluation this process owned over when its lease
        expires."""
        if self._shutdown_started:
            return
        self._shutdown_started = True
        self._closed = True
        log.info("GenRM server shutting down")
        for decision in self.store.shut_down(trio.current_time()):
            self.act(decision)
        self.waiters.resolve_all(Rejected(503, messages.SHUTTING_DOWN))
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
                await self.watcher.close()
            finally:
                # Even when the grace ran out: the memory store lets its groups go without a
                # checkpoint.
                await self.store.aclose()
        self._stopped.set()
        self._shutdown_done.set()
        log.info("GenRM server shut down")

    # ---- /verify -------------------------------------------------------------------------------

    def verify(
        self, request: MemberRequest, *, fingerprints: tuple[bytes, bytes] | None = None
    ) -> AbstractAsyncContextManager[Verified]:
        """Answer one validated /verify request: a scored or masked outcome, or a rejection.

        Entering waits for the outcome; the block writes the reply. Leaving it, the member's
        response identity keeps its fingerprint for replays (C-34) or lets the response's bytes
        go: after the reply, since keeping it may cost a canonical fingerprint of the whole
        response. ``fingerprints``: the response's raw SHA-256 and canonical fingerprint,
        computed before its bytes left memory (a body that waits in a spool file). Every
        outcome is counted here, once.
        """
        return _Verifying(self, request, fingerprints)

    async def _verify(
        self, request: MemberRequest, fingerprints: tuple[bytes, bytes] | None
    ) -> Pending | Verified:
        """The request's answer at once, or its pending entry once its waiter is answered."""
        prepared = self._arrival(request, fingerprints)
        if isinstance(prepared, Scored | Rejected):
            return Verified.of(prepared, replay=False)
        arrival, identity = prepared
        legacy_key = None
        if arrival.group_id is None:
            legacy_key = group_key(
                None, arrival.attempt, arrival.task_index, arrival.prompt_id, arrival.digest
            )
        pending = Pending(arrival, identity, legacy=arrival.group_id is None)
        del arrival, prepared
        try:
            await self._batches.apply(group_ref(request.group_id, legacy_key), pending)
        except BaseException:
            if pending.applied:
                self._abandon(pending)
            else:
                pending.abandoned = True  # the batch it is in cleans up after it
            raise
        if pending.failed is not None:
            identity.release()
            return Verified(pending.failed, "unavailable")
        reply = pending.reply
        if isinstance(reply, Answer):
            # Nothing keeps this request's identity: its member, if any, has one already.
            identity.release()
            return Verified.of(reply.outcome, replay=True)
        assert isinstance(reply, Wait)
        try:
            await pending.waiter.wait()
        except BaseException:
            # A disconnect removes only this request's waiter (C-51); the group goes on.
            self._abandon(pending)
            raise
        # Usually gone already (delivery pops it); not when shutdown answered it.
        self.waiters.remove(reply.rid, pending.waiter)
        return pending

    def _answered(self, verified: Verified) -> None:
        """Count an answer. A rollout's first answer also goes into the masked-rollout window,
        which says when masking comes to dominate it or stops (a replay or a rejection answers
        no rollout anew)."""
        self.metrics.verify(verified.label)
        outcome, label = verified
        if label in ("scored", "masked"):
            text = outcome.text if isinstance(outcome, Masked) else None
            line = self.masking.answered(text, trio.current_time())
            if line is not None:
                log.log(*line)

    def _arrival(
        self, request: MemberRequest, fingerprints: tuple[bytes, bytes] | None
    ) -> tuple[Arrival, ResponseIdentity] | Scored | Rejected:
        """The request reduced to what the group engine needs, or its answer if it needs none."""
        if self._closed:
            return Rejected(503, messages.SHUTTING_DOWN)
        config = self.config
        if not config.group_mode:
            return Scored(config.default_score, None)
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
        slot = request.rollout_index
        assert slot is not None
        prompt: dict[str, Any] = {"input": input_value, "principle": request.principle}
        if config.comparison_strategy == "fixed_baseline":
            prompt["baseline"] = request.baseline
        fault = self.hooks.on_conversion
        source = MemberSource(
            response,
            input_value,
            request.principle,
            request.baseline,
            config,
            fault=None if fault is None else partial(fault, slot),
        )
        arrival = Arrival(
            group_id=request.group_id,
            attempt=request.attempt,
            slot=slot,
            task_index=request.task_index,
            prompt_id=request.prompt_id,
            digest=digest_hex(prompt),
            fingerprint=identity,
            source=source,
            resend=request.resend,
        )
        return arrival, identity

    async def _apply_batch(self, ref: str, batch: list[Pending]) -> None:
        """One transition for a batch of a group's arrivals."""
        arrivals = [pending.arrival for pending in batch if pending.arrival is not None]

        def register(decision: Decision) -> Callable[[], None]:
            # Listed before the commit: the outcome can be published the moment it applies.
            undo = [
                self.waiters.add(reply.rid, reply.slot, pending.waiter)
                for pending, reply in zip(batch, decision.replies, strict=True)
                if isinstance(reply, Wait)
            ]

            def unregister() -> None:
                for each in undo:
                    each()

            return unregister

        try:
            if self._closed:
                raise _Refused(messages.SHUTTING_DOWN)
            event = Arrive(arrivals, self.watcher.hand_over())
            decision = await self.store.transact(ref, event, before_commit=register)
        except _Refused as refused:
            for pending in batch:
                pending.failed = Rejected(503, refused.detail)
        except StoreFailed as exc:
            for pending in batch:
                pending.failed = Rejected(503, str(exc))
        except Exception as exc:
            # A defect, not the store: these requests fail, the server and the group go on.
            fields = messages.log_fields(ref, arrivals[0].attempt) if arrivals else {}
            log.error("GenRM group store transaction failed", exc_info=exc, extra=fields)
            text = f"GenRM group store transaction failed: {messages.exception_text(exc)}"
            for pending in batch:
                pending.failed = Rejected(503, text)
        else:
            for pending, reply in zip(batch, decision.replies, strict=True):
                pending.reply = reply
            self.act(decision)
        for arrival in arrivals:
            source = arrival.source
            assert isinstance(source, MemberSource)
            self.counters.extractions += source.extracted
            self.counters.conversions += source.converted
        for pending in batch:
            # A waiting request keeps only what its reply echoes (I-10).
            pending.arrival = None
            pending.done()
            if pending.abandoned:
                self._abandon(pending)

    def _abandon(self, pending: Pending) -> None:
        """The request left: drop its waiter, if any, and its response's bytes."""
        reply = pending.reply
        if isinstance(reply, Wait):
            self.waiters.remove(reply.rid, pending.waiter)
        _identity_done(pending)

    # ---- what a transition asks of this process --------------------------------------------

    def act(self, decision: Decision) -> None:
        """Run what a stored transition asks of this process (its own, or its watcher's)."""
        for level, text, fields in decision.logs:
            log.log(level, text, extra=fields)
        for finished in decision.finished:
            self.tallies.count(finished, decision.now)
            self.ended_elsewhere(finished.ended)
        collecting = decision.collecting
        if collecting is not None and not self._closed:
            evaluation = self._start_evaluation(collecting.work, complete=False)
            evaluation.collecting(collecting.collection_due, decision.now)
        for job in decision.jobs:
            collected = self._evaluations.get((job.rid, job.fence))
            if collected is not None:
                collected.add([job])
        if decision.offered is not None and not self._closed:
            self.offers += 1
            self.watcher.offered(decision.ref)
        claim = decision.claim
        if claim is not None and not self._closed:
            self.claims += 1
            work = claim.work
            if work.fence == 1:  # claimed as it filled, not taken over
                self.metrics.collection_seconds.observe(decision.now - claim.started_at)
            # Listed at once, not when its task first runs: the evaluation is this process's
            # from the moment of the claim (statistics, cancellation by a supersession).
            running = self._evaluations.get((work.rid, work.fence))
            if running is None:
                running = self._start_evaluation(work, complete=True)
            running.claimed(claim, decision.now)
            # Complete groups' comparisons go ahead of those of groups still collecting.
            self.judge.slots.promote(running.lane)

    def ended_elsewhere(self, ended: Ended) -> None:
        """A record ended: answer its waiters here, and stop an evaluation of it that this
        process still runs, as a supersession does (C-80): its judge calls are cancelled at
        once, not when its next lease renewal finds the record gone."""
        self.waiters.deliver(ended)
        for (rid, _), evaluation in self._evaluations.items():
            if rid == ended.rid:
                evaluation.scope.cancel()

    def _start_evaluation(self, work: Work, *, complete: bool) -> Evaluation:
        evaluation = Evaluation(self._services, work, self.judge.slots.lane(complete=complete))
        self._evaluations[evaluation.key] = evaluation
        self._spawn(self._evaluate, evaluation)
        return evaluation

    async def _evaluate(self, evaluation: Evaluation) -> None:
        try:
            await evaluation.run()
        finally:
            # Listed until its outcome is stored, so it counts as running until then.
            del self._evaluations[evaluation.key]

    def _published(self, stored: bool) -> None:
        if stored:
            self.published += 1
        else:
            self.refused += 1

    def _spawn(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        assert self._nursery is not None, "the engine is not running"
        self._owned_tasks += 1
        # A fresh, empty context: nothing of the member request that triggered the spawn
        # (context variables, trace ids) may reach the group's work or its judge calls (I-8).
        contextvars.Context().run(self._nursery.start_soon, self._owned, fn, *args)

    async def _owned(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        try:
            await fn(*args)
        except Exception as exc:
            # Each task ends its own group's work with a reason before this point; a defect
            # that still escapes is logged here and never closes the server's nursery.
            name = getattr(fn, "__name__", repr(fn))
            log.error("GenRM background task %s failed", name, exc_info=exc)
        finally:
            self._owned_tasks -= 1
            if self._owned_tasks == 0 and self._shutdown_started:
                self._tasks_done.set()

    # ---- what the watcher asks of the engine -----------------------------------------------

    def watched_records(self) -> list[str]:
        """The ids of the records this process waits on or evaluates: their end concerns it."""
        return list({*self.waiters.records(), *(rid for rid, _ in self._evaluations)})

    def evaluations_running(self) -> int:
        """Groups this process is judging now: claimed, not still collecting here."""
        return sum(1 for evaluation in self._evaluations.values() if evaluation.ready.is_set())

    def notification_copies(self, rid: str) -> int:
        copies = self.hooks.on_notification
        return 1 if copies is None else copies(rid)

    async def sweep_once(self) -> None:
        """One sweep of the store's watcher (a harness on a mock clock picks the instants)."""
        await self.watcher.sweep_once()

    @property
    def subscribed(self) -> bool:
        return self.watcher.subscribed

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
                waiters=len(self.waiters),
                owned_tasks=self._owned_tasks,
                judge_in_flight=self.judge.in_flight,
                prune_visits=0,
            )
        )

    @property
    def queued(self) -> int:
        """Arrivals waiting for their group's next transition (a test waits for 0)."""
        return len(self._batches)

    def check_invariants(self) -> None:
        self.store.check_invariants()
        if self._shutdown_done.is_set() and (self._owned_tasks or len(self.waiters)):
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

    def health(self) -> Mapping[str, int]:
        """The store's groups and this process's judge."""
        return {
            **self.store.health(len(self._evaluations)),
            "judge_in_flight": self.judge.in_flight,
            "judge_attempts_total": self.judge.attempts_total,
        }


class _Verifying:
    """The block of ``Engine.verify``. A class rather than a generator: it runs per request."""

    __slots__ = ("_engine", "_fingerprints", "_pending", "_request")

    def __init__(
        self, engine: Engine, request: MemberRequest, fingerprints: tuple[bytes, bytes] | None
    ) -> None:
        self._engine = engine
        self._request: MemberRequest | None = request
        self._fingerprints = fingerprints
        self._pending: Pending | None = None

    async def __aenter__(self) -> Verified:
        engine, request, fingerprints = self._engine, self._request, self._fingerprints
        assert request is not None, "entered twice"
        self._request = None  # the request's bytes are not held by the block while it waits
        if fingerprints is not None:
            # Computed off the event loop, before the body went to its file (C-23).
            engine.counters.response_digests += 1
            engine.counters.canonical_fingerprints += 1
        pending = await engine._verify(request, fingerprints)
        if isinstance(pending, Verified):
            engine._answered(pending)
            return pending
        self._pending = pending
        outcome = pending.waiter.outcome
        assert outcome is not None
        verified = Verified.of(outcome, replay=False)
        engine._answered(verified)
        return verified

    async def __aexit__(self, *exc_info: object) -> None:
        if self._pending is not None:
            _identity_done(self._pending)


class _Refused(Exception):
    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def _identity_done(pending: Pending) -> None:
    """The request that brought this identity is answered or gone, and with it the bytes.

    If the identity became its member's and the member must still tell responses apart (its
    group is active, or completed with a reward a replay can get), it is settled: its digest
    and canonical fingerprint are kept (C-34). Otherwise the bytes are let go.
    """
    reply = pending.reply
    outcome = pending.waiter.outcome
    kept = (
        isinstance(reply, Wait)
        and reply.kept
        and (outcome is None or (isinstance(outcome, Scored) and not pending.legacy))
    )
    if kept:
        pending.identity.settle()
    else:
        pending.identity.release()
