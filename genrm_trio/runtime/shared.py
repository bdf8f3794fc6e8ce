"""The Trio runtime over a shared group store: local waiters, leased evaluations, sweeps.

Several processes serve the same groups. Each /verify runs the core's arrival as one store
transaction; a request that must wait holds a local one-shot slot keyed by its record's id and
is woken by the store's notification, or by the sweep that polls the outcome keys of every
record a local request waits on (a lost notification delays an answer, never strands it).
The transaction that fills a group also claims its evaluation under a lease with a fencing
token; the owner renews the lease while it judges, and publishes only through a transaction
that finds its own token still in the record. Collection deadlines and expired leases are
found by any process's sweep in the store's sorted sets: a group whose owner died is taken over
and judged again once its lease has expired, within its evaluation deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.core.groups import (
    Answer,
    Arrival,
    Decision,
    GroupCounts,
    GroupRegistry,
    Phase,
    Record,
    Rejected,
    Scored,
    Statistics,
    Wait,
    Waiter,
    group_key,
)
from genrm_trio.core.identity import ResponseIdentity
from genrm_trio.core.pairs import Comparison
from genrm_trio.core.verdicts import Verdict
from genrm_trio.judge.client import JudgeFailure
from genrm_trio.judge.slots import JudgeSlots
from genrm_trio.judge.transport import TransportFactory
from genrm_trio.runtime.engine import Engine, MemberRequest, Verified, _first_error
from genrm_trio.runtime.hooks import Hooks, call_hook
from genrm_trio.runtime.judge_budget import SharedJudgeBudget
from genrm_trio.store.records import StoreMeta
from genrm_trio.store.redis_store import (
    RedisGroupStore,
    StoreFailed,
    Transaction,
    group_ref,
    record_ref,
)
from genrm_trio.store.resp import StoreUnavailable

log = logging.getLogger("genrm_trio")

# An offered group: a process judging n groups claims it after n steps (at most half the wait),
# the offering process after the whole wait, if nobody has by then.
OFFER_STEP_S = 0.002
OFFER_WAIT_S = 0.05


class SharedEngine(Engine):
    """A server instance whose groups live in a shared store (SPEC X-4, X-1)."""

    def __init__(
        self,
        config: Config,
        store: RedisGroupStore,
        *,
        judge_transport: TransportFactory | None = None,
        hooks: Hooks | None = None,
        poll_s: float = 1.0,
        notifications: bool = True,
    ) -> None:
        slots = JudgeSlots(config.process_judge_concurrency, shared=True)
        super().__init__(config, judge_transport=judge_transport, hooks=hooks, judge_slots=slots)
        self.store = store
        # judge_max_concurrency holds for the whole deployment: slots come from the store.
        self.judge_budget = SharedJudgeBudget(
            store, slots, config.judge_max_concurrency, poll_s=poll_s
        )
        self.poll_s = poll_s
        self.notifications = notifications
        self._closed = False
        # record id -> this process's waiting requests on it: (slot, one-shot slot)
        self._waiting: dict[str, list[tuple[int, Waiter]]] = {}
        # (record id, fencing token) -> an evaluation this process runs; a process can hold a
        # stale one and a newer one of the same record (it took its own group over).
        self._evaluations: dict[tuple[str, int], trio.CancelScope] = {}
        self._queued: dict[str, list[_Arriving]] = {}  # group -> arrivals for its next batch
        self._store_counts: GroupCounts | None = None  # the deployment's, as last read
        self._counted = False  # the last attempt to read them succeeded
        self._processes = 0  # processes following the store's notifications, as last read
        self.offers = 0  # groups this process filled and offered to a less loaded one
        self.claims = 0  # evaluations this process claimed (at the fill, or by taking over)
        self.published = 0  # outcomes it stored
        self.refused = 0  # results the fence refused: another claim had come since
        self.subscribed = False  # the notification channel is followed right now

    # ---- lifetime ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
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
        """Answer this process's waiters and stop its evaluations; the groups stay in the store.

        Other processes still serve the same groups, so shutting one down fails none of them:
        an evaluation this process owned is taken over when its lease expires.
        """
        if self._shutdown_started:
            return
        self._shutdown_started = True
        self._closed = True
        log.info("GenRM server shutting down")
        shutting_down = Rejected(503, messages.SHUTTING_DOWN)
        waiting, self._waiting = self._waiting, {}
        for waiters in waiting.values():
            for _, waiter in waiters:
                waiter.resolve(shutting_down)
        for scope in self._evaluations.values():
            scope.cancel()

    async def _close_connections(self) -> None:
        await super()._close_connections()
        await self.judge_budget.give_back()
        await self.store.aclose()

    # ---- /verify -------------------------------------------------------------------------------

    async def _verify(
        self, request: MemberRequest, fingerprints: tuple[bytes, bytes] | None
    ) -> Verified:
        prepared = self._arrival(request, fingerprints)
        if isinstance(prepared, Scored | Rejected):
            return Verified.of(prepared, replay=False)
        arrival, identity = prepared
        # Extraction runs once per accepted member even if the transaction is run again (C-31).
        arrival.prepare = _once(arrival.prepare)
        woken = trio.Event()
        legacy_key = None
        if arrival.group_id is None:
            legacy_key = group_key(
                None, arrival.attempt, arrival.task_index, arrival.prompt_id, arrival.digest
            )
        ref = group_ref(arrival.group_id, legacy_key)
        arriving = _Arriving(arrival, identity, woken)
        del arrival, prepared
        self._enqueue(ref, arriving)
        try:
            await arriving.done.wait()
        except BaseException:
            if arriving.done.is_set():
                self._abandon(arriving)
            else:
                arriving.abandoned = True  # the batch it is in cleans up after it
            raise
        if arriving.failed is not None:
            identity.release()
            return Verified(arriving.failed, "unavailable")
        decision = arriving.decision
        assert decision is not None
        reply = decision.reply
        # The member's identity is in the store now (digest and canonical fingerprint): this
        # process needs the bytes only for the reply's echo, which the request holds itself.
        if isinstance(reply, Answer):
            identity.release()
            return Verified.of(reply.outcome, replay=True)
        try:
            await woken.wait()
        except BaseException:
            # A disconnect removes only this request's waiter (C-51); the group goes on.
            self._abandon(arriving)
            raise
        # Usually gone already (delivery pops it); not when the transaction that made this
        # request wait also ended its group (a later member of the same batch failing it).
        self._unregister(_rid(reply.record), reply.waiter)
        assert reply.waiter.outcome is not None
        return Verified.of(reply.waiter.outcome, replay=False, identity_done=identity.release)

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
            unanswered = [a for a in batch + self._queued.pop(ref, []) if not a.done.is_set()]
            for arriving in unanswered:
                arriving.failed = Rejected(503, reason)
                arriving.done.set()

    async def _apply_batch(self, ref: str, batch: list[_Arriving]) -> None:
        def step(tx: Transaction[Any]) -> list[Decision]:
            tx.hand_over = self._hand_over_load()
            decisions = []
            for arriving in batch:
                assert arriving.arrival is not None
                decisions.append(tx.registry.arrive(arriving.arrival, tx.now, arriving.woken.set))
            return decisions

        def before_commit(tx: Transaction[Any]) -> Callable[[], None] | None:
            # Registered before EXEC: the outcome can be published the moment EXEC applies.
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
            tx = await self.store.transact(ref, step, before_commit=before_commit)
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
            arriving.done.set()
            if arriving.abandoned:
                self._abandon(arriving)

    def _abandon(self, arriving: _Arriving) -> None:
        """The request left: drop its local waiter, if any, and its response's bytes."""
        reply = arriving.decision.reply if arriving.decision is not None else None
        if isinstance(reply, Wait):
            self._unregister(_rid(reply.record), reply.waiter)
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

    def _after(self, tx: Transaction[Any]) -> None:
        """Run what a committed transaction asks of this process."""
        # Groups this process ended, for /metrics (each process counts the ones it ended).
        for key, count in tx.registry.finished.items():
            self.registry.finished[key] = self.registry.finished.get(key, 0) + count
        self.registry.rollouts_masked += tx.registry.rollouts_masked
        # Masked answers of the groups this process ended, for /aggregate_metrics.
        for group, stamped, slots in tx.registry.masked_answers.items():
            self.registry.masked_answers.stamp(group, slots, stamped)
        self.registry.masked_answers.prune(
            tx.now,
            self.config.cohort_result_ttl_s,
            self.config.max_terminal_cohorts,
            lambda group, slots: None,
        )
        finished = tx.finished
        if finished is not None:
            # Local waiters need not wait for the notification; an evaluation of ours that
            # this transaction ended (supersession) stops at once.
            self._deliver(finished)
            if finished is not tx.claimed:
                for (rid, _), scope in self._evaluations.items():
                    if rid == _rid(finished):
                        scope.cancel()
        if tx.offered is not None and not self._closed:
            # Claimed back if no less loaded process has taken it meanwhile.
            self.offers += 1
            self._spawn(self._claim_offer, record_ref(tx.offered), OFFER_WAIT_S)
        if tx.claimed is not None and not self._closed:
            self.claims += 1
            # Listed at once, not when the task first runs: the evaluation is this process's
            # from the moment of the claim (statistics, cancellation by a supersession).
            meta = _meta(tx.claimed)
            if meta.fence == 1:  # claimed as it filled, not taken over
                self.metrics.collection_seconds.observe(tx.now - tx.claimed.started_at)
            scope = self._evaluations[meta.rid, meta.fence] = trio.CancelScope()
            self._spawn(self._evaluate, tx.claimed, tx.now, scope)

    # ---- wake-ups ------------------------------------------------------------------------------

    async def _listen(self) -> None:
        """Follow the store's notifications; after every (re)subscription, poll once."""
        while True:
            try:
                connection = await self.store.client.connect()
            except StoreUnavailable:
                await trio.sleep(self.poll_s)
                continue
            budget = self.judge_budget.channel.encode()
            offers = self.store.offers_channel.encode()
            try:
                await connection.pipeline(
                    [
                        ["SUBSCRIBE", self.store.channel],
                        ["SUBSCRIBE", budget],
                        ["SUBSCRIBE", offers],
                    ]
                )
                self.subscribed = True
                self.judge_budget.notified()
                await self._poll_waiters()
                while True:
                    message = await connection.receive()
                    if not (isinstance(message, list) and message and message[0] == b"message"):
                        continue
                    if message[1] == budget:
                        self.judge_budget.notified()
                    elif message[1] == offers:
                        self._offered(message[2].decode())
                    else:
                        rid = message[2].decode()
                        copies = self.hooks.on_notification
                        for _ in range(1 if copies is None else copies(rid)):
                            if rid in self.watched_records():
                                finished = await self.store.finished_records([rid])
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
        for record in (await self.store.finished_records(self.watched_records())).values():
            self._ended_elsewhere(record)

    def _ended_elsewhere(self, record: Record) -> None:
        """A record ended in another process (or in a transaction whose reply this process
        missed): answer its waiters here, and stop an evaluation of it that this process still
        runs, as a supersession does in one process (C-80): its judge calls are cancelled at
        once, not when its next lease renewal finds the record gone."""
        self._deliver(record)
        rid = _rid(record)
        for (evaluated, _), scope in self._evaluations.items():
            if evaluated == rid:
                scope.cancel()

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
        await self._poll_waiters()
        for ref in await self.store.due(self.store.due_set):
            await self._sweep_group(ref, self._collection_expired)
        for ref in await self.store.due(self.store.lease_set):
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
        tx.claim(record, self.store.lease_s)
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
        counts = self._store_counts
        mine = len(self._evaluations)
        if not self.notifications or counts is None or self._processes < 2 or mine < 1:
            return None
        return mine if mine > counts.evaluating / self._processes else None

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

    # ---- evaluation (owner) ----------------------------------------------------------------

    async def _evaluate(self, record: Record, claimed_at: float, scope: trio.CancelScope) -> None:
        """Judge a claimed record and publish its outcome through the fence."""
        meta = _meta(record)
        rid, fence = meta.rid, meta.fence
        ref = record_ref(record)
        assert meta.evaluation_due is not None
        deadline = trio.current_time() + (meta.evaluation_due - claimed_at)
        lane = self.judge.slots.lane(complete=True)
        began = trio.current_time()
        verdicts: dict[int, Verdict] = {}
        finished = 0

        def owned(tx: Transaction[Any]) -> Record | None:
            current = tx.loaded
            if current is None or current.phase is not Phase.EVALUATING:
                return None
            current_meta = _meta(current)
            if current_meta.rid != rid or current_meta.fence != fence:
                return None
            return current

        def failing(text: str) -> Callable[[Transaction[Any]], bool]:
            """A non-judge error ends the evaluation: the group fails with kind cohort (C-63)."""

            def fail(tx: Transaction[Any]) -> bool:
                current = owned(tx)
                if current is None:
                    return False
                tx.registry.fail_evaluation(current, text, tx.now)
                return True

            return fail

        async def compare(comparison: Comparison) -> None:
            nonlocal finished
            await call_hook(
                self.hooks.on_comparison_start,
                comparison.first,
                comparison.second,
                comparison.judge_pass,
            )
            task = self._judge_task(record, comparison, lane)
            result = await self.judge.judge(task, deadline=lambda: deadline)
            finished += 1
            if isinstance(result, JudgeFailure):
                self.registry.comparison_failed(record, comparison, result.text)
            else:
                verdicts[comparison.index] = result.verdict

        async def renew(lost: trio.CancelScope) -> None:
            def extend(tx: Transaction[Any]) -> bool:
                current = owned(tx)
                if current is None:
                    return False
                _meta(current).lease_until = tx.now + self.store.lease_s
                return True

            while True:
                await trio.sleep(self.store.lease_s / 3)
                await call_hook(self.hooks.on_lease_renewal, record.key)
                try:
                    tx = await self.store.transact(ref, extend)
                except StoreFailed:
                    continue
                if not tx.result:
                    lost.cancel()  # superseded, failed, or taken over: nothing to publish
                    return

        publish: Callable[[Transaction[Any]], bool] | None = None
        try:
            with scope:
                async with trio.open_nursery() as outer:
                    outer.start_soon(renew, scope)
                    async with trio.open_nursery() as comparisons:
                        comparisons.cancel_scope.deadline = deadline
                        await call_hook(self.hooks.on_evaluation_start, record.key)
                        for comparison in record.plan:
                            comparisons.start_soon(compare, comparison)
                    outer.cancel_scope.cancel()
                expired = comparisons.cancel_scope.cancel_called
                self.metrics.evaluation_seconds.observe(trio.current_time() - began)

                def finish(tx: Transaction[Any]) -> bool:
                    current = owned(tx)
                    if current is None:
                        return False
                    current.failed_comparisons = dict(record.failed_comparisons)
                    if expired:
                        tx.registry.evaluation_deadline(current, finished, tx.now)
                    else:
                        tx.registry.finish_evaluation(current, verdicts, tx.now)
                    return True

                publish = finish
        except Exception as exc:
            cause = _first_error(exc)
            log.error(
                "GenRM cohort evaluation failed for key='%s'",
                messages.log_key(record.key),
                exc_info=cause,
                extra=messages.log_fields(record.key, record.attempt),
            )
            publish = failing(messages.evaluation_failed(cause))
        except BaseException:
            del self._evaluations[rid, fence]
            raise
        try:
            if publish is not None:  # else: lost the lease, superseded, or shutting down
                fields = messages.log_fields(record.key, record.attempt)
                await self._publish(ref, publish, failing, fields)
        finally:
            # Listed until its outcome is stored, so the evaluation counts as running until then.
            del self._evaluations[rid, fence]

    async def _publish(
        self,
        ref: str,
        step: Callable[[Transaction[Any]], bool],
        failing: Callable[[str], Callable[[Transaction[Any]], bool]],
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
                log.error(
                    "GenRM cohort evaluation failed for ref='%s'", ref, exc_info=exc, extra=fields
                )
                if defective:
                    return
                defective = True
                step = failing(messages.evaluation_failed(exc))
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

    # ---- verification hooks --------------------------------------------------------------

    def statistics(self) -> Statistics:
        """This process's share: its waiters, tasks and judge calls (groups are in the store)."""
        return Statistics(
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

    @property
    def queued(self) -> int:
        """Arrivals waiting for their group's next transaction (a test waits for 0)."""
        return sum(len(batch) for batch in self._queued.values()) + len(self._queued)

    def watched_records(self) -> list[str]:
        """The ids of the records this process waits on or evaluates: their end concerns it."""
        return list({*self._waiting, *(rid for rid, _ in self._evaluations)})

    def check_invariants(self) -> None:
        if self._shutdown_done.is_set() and (self._owned_tasks or self._waiting):
            raise AssertionError("owned tasks or waiters left after shutdown")

    def store_status(self) -> tuple[str, bool]:
        return self.store.name, self.store.available

    async def refresh_counts(self) -> None:
        """Count the deployment's groups in the store; this doubles as a reachability check."""
        try:
            self._store_counts, self._processes = await self.store.counts()
        except StoreFailed:
            self._counted = False
        else:
            self._counted = True

    def group_counts(self) -> GroupCounts:
        """The deployment's groups as the store counted them last (at the last sweep, health
        check or scrape): the same at every process. Kept while the store is unreachable."""
        return self._store_counts or GroupCounts(0, 0, 0, 0, 0.0)

    @property
    def evaluations_running(self) -> int:
        return len(self._evaluations)

    def health(self) -> Mapping[str, int]:
        """The deployment's groups as the store counted them at this health check (this
        process's own evaluations while the store is unreachable), and this process's judge."""
        counts = self._store_counts
        if counts is None or not self._counted:
            active, retained, watermarks = len(self._evaluations), 0, 0
        else:
            active = counts.collecting + counts.evaluating
            retained, watermarks = counts.retained_records, counts.watermarks
        return {
            "active_groups": active,
            "retained_records": retained,
            "watermarks": watermarks,
            "judge_in_flight": self.judge.in_flight,
            "judge_attempts_total": self.judge.attempts_total,
        }


async def check_store_invariants(store: RedisGroupStore, config: Config) -> GroupRegistry:
    """Load every group of the store into one registry and check SPEC I-2..I-4 on it.

    Also checks that the store's sorted sets name exactly the records and watermarks they stand
    for. For tests and operators; it reads every key under the prefix.
    """
    from genrm_trio.store.records import decode_record, decode_watermark

    registry = GroupRegistry(config)
    cursor = b"0"
    keys: list[bytes] = []
    while True:
        cursor, batch = await store.call("SCAN", cursor, "MATCH", f"{store.prefix}*", "COUNT", 500)
        keys += batch
        if cursor == b"0":
            break
    records: dict[str, Record] = {}
    marks: dict[str, bytes] = {}
    for key in keys:
        name = key.decode()[len(store.prefix) :]
        if name.startswith("r:"):
            data = await store.call("GET", key)
            if data is not None:
                records[name[2:]] = decode_record(data)
        elif name.startswith("w:"):
            data = await store.call("GET", key)
            if data is not None:
                marks[name[2:]] = data
    # Keys whose TTL has passed by the store's clock are gone for every reader: Redis expired
    # them, or, with a clock of the store's own, the next transaction that reads them prunes
    # them. They are not counted here, nor are the sorted-set entries that stand for them.
    now = await store.time()
    ttl = config.cohort_result_ttl_s

    def expired(stamped: float | None) -> bool:
        return ttl is not None and stamped is not None and now - stamped >= ttl

    for record in records.values():
        if not expired(record.terminal_time):
            registry.adopt(record)
    for group_id, data in marks.items():
        mark, idle_since = decode_watermark(data)
        if not expired(idle_since):
            registry.adopt(None, (group_id, mark, idle_since))
    registry.check_invariants()

    async def live(name: str) -> set[str]:
        flat = await store.call("ZRANGE", f"{store.prefix}{name}", 0, -1, "WITHSCORES")
        pairs = zip(flat[::2], flat[1::2], strict=True)
        return {m.decode() for m, score in pairs if ttl is None or now - float(score) < ttl}

    expected = {ref for ref, r in records.items() if not r.phase.active}
    expected = {ref for ref in expected if not expired(records[ref].terminal_time)}
    terminal = await live("terminal")
    if terminal != expected:
        raise AssertionError(f"terminal set {sorted(terminal)} != records {sorted(expected)}")
    if await live("idle") != set(registry.idle_order.keys()):
        raise AssertionError("idle set != idle watermarks")
    legacy_active = {m.decode() for m in await store.call("SMEMBERS", store.legacy_active)}
    active_legacy = {ref for ref, r in records.items() if r.group_id is None and r.phase.active}
    if legacy_active != active_legacy:
        raise AssertionError(f"legacy-active set {sorted(legacy_active)} != active legacy records")
    return registry


@dataclass(eq=False)
class _Arriving:
    """One /verify on its way into a batch, and what its transaction decided."""

    arrival: Arrival | None
    identity: ResponseIdentity
    woken: trio.Event
    done: trio.Event = field(default_factory=trio.Event)
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
    meta = record.handle
    assert isinstance(meta, StoreMeta)
    return meta


def _rid(record: Record) -> str:
    return _meta(record).rid


def _once(prepare: Callable[[bool], Any]) -> Callable[[bool], Any]:
    """Extraction at most once per request; again only if a retried transaction finds the
    member has become its group's first and the group's inputs are needed too."""
    done: dict[bool, Any] = {}

    def once(first: bool) -> Any:
        if first not in done:
            done[first] = prepare(first)
        return done[first]

    return once
