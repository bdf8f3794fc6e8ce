"""One group's evaluation in this process: its collection deadline, its judging, its lease and
the transition that publishes it.

An evaluation is born either with its group, when the group's evaluation is this process's
from the first member (the memory store: it then arms the collection deadline and judges
comparisons as their slots fill), or when this process claims it (the group filled here, or
was taken over or offered). It owns a snapshot of everything it judges (``Work`` and its
``Job``s, taken by the transition that handed them over) and never reads the group's record:
a transition that ends the group (supersession, shutdown, another process) cancels it, and it
stops without touching state that is gone.

The comparisons nursery spans collection and evaluation, so comparisons started early and the
rest are cancelled and drained together by either deadline. While a lease holds the evaluation,
it is renewed beside the comparisons; a renewal the fence refuses stops it. Its outcome is
published through a transition that finds the evaluation's own token still in the record, so a
group is published once however many processes judged it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import trio

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.core.transition import (
    Claim,
    CollectionDue,
    Decision,
    Event,
    Fail,
    Finish,
    Job,
    Renew,
    Work,
)
from genrm_trio.core.verdicts import Verdict
from genrm_trio.judge.client import JudgeClient, JudgeFailure, JudgeTask
from genrm_trio.judge.slots import Lane
from genrm_trio.runtime.hooks import Hooks, call_hook
from genrm_trio.store.group_store import GroupStore, StoreFailed

__all__ = ["Evaluation", "Services"]

log = logging.getLogger("genrm_trio")


@dataclass(frozen=True, slots=True)
class Services:
    """What an evaluation uses of its engine."""

    config: Config
    store: GroupStore
    judge: JudgeClient
    hooks: Hooks
    act: Callable[[Decision], None]  # run what a stored transition asks of this process
    published: Callable[[bool], None]  # an outcome was stored (True) or refused by the fence
    evaluation_seconds: Callable[[float], None]


class Evaluation:
    """This process's work on one record, from its start or claim to its publication."""

    def __init__(self, services: Services, work: Work, lane: Lane) -> None:
        self.services = services
        self.work = work
        self.lane = lane  # the group's place in the judge queue, promoted once it is full
        self.scope = trio.CancelScope()
        self.ready = trio.Event()  # claimed: judge the whole plan
        self._wake = trio.Event()  # comparisons were queued
        self._queued: list[Job] = []
        self.collection_due = math.inf  # in Trio's clock, while it collects here
        self.deadline = math.inf  # the evaluation deadline, in Trio's clock, once claimed
        self.began = math.inf  # when it was claimed, in Trio's clock
        self.renew_every: float | None = None
        self.verdicts: dict[int, Verdict] = {}
        self.failed: dict[int, str] = {}  # comparison index -> judge error text (M-10)
        self.finished = 0

    @property
    def key(self) -> tuple[str, int]:
        return self.work.rid, self.work.fence

    def add(self, jobs: list[Job]) -> None:
        """Comparisons to judge as soon as this evaluation's task gets to them."""
        self._queued += jobs
        self._wake.set()

    def collecting(self, due: float, now: float) -> None:
        """The group collects here until ``due`` (store clock; ``now`` is the transition's)."""
        self.collection_due = trio.current_time() + (due - now)

    def claimed(self, claim: Claim, now: float) -> None:
        """This process owns the evaluation: judge every comparison by the deadline."""
        started = trio.current_time()
        self.deadline = started + (claim.evaluation_due - now)
        self.began = started
        self.renew_every = claim.renew_every
        self.ready.set()
        self.add(claim.jobs)

    async def run(self) -> None:
        """Collect (a group collecting in this process), judge and publish."""
        work = self.work
        fields = messages.log_fields(work.key, work.attempt)
        publish: Event | None = None
        with self.scope:
            try:
                async with trio.open_nursery() as outer:
                    async with trio.open_nursery() as comparisons:
                        if not await self._collect(comparisons):
                            comparisons.cancel_scope.cancel()
                            outer.cancel_scope.cancel()
                            return
                        if self.renew_every is not None:
                            outer.start_soon(self._renew, self.renew_every)
                        comparisons.cancel_scope.deadline = self.deadline
                        await call_hook(self.services.hooks.on_evaluation_start, work.key)
                        self._start_queued(comparisons)
                    outer.cancel_scope.cancel()
                self.services.evaluation_seconds(trio.current_time() - self.began)
                if self.services.config.debug_logging:
                    log.debug(
                        "GenRM verdicts key='%s' comparisons=%d verdicts=%d failed=%d",
                        messages.log_key(work.key),
                        work.comparisons,
                        len(self.verdicts),
                        len(self.failed),
                        extra=fields,
                    )
                # cancel_called also covers a deadline that expired in the same instant as the
                # last comparison's own request deadline: the evaluation deadline wins (M-7).
                expired = comparisons.cancel_scope.cancel_called
                publish = Finish(
                    work.rid, work.fence, self.verdicts, self.failed, self.finished, expired
                )
            except Exception as exc:
                cause = _first_error(exc)
                log.error(
                    "GenRM cohort evaluation failed for key='%s'",
                    messages.log_key(work.key),
                    exc_info=cause,
                    extra=fields,
                )
                publish = Fail(work.rid, work.fence, messages.evaluation_failed(cause))
            except BaseException:
                # Cancelled from outside: a group that dies with the process fails (unless a
                # supersession or the shutdown has failed it already); a shared one is left to
                # its lease.
                decision = self.services.store.evaluation_cancelled(work.ref, work.rid)
                if decision is not None:
                    self.services.act(decision)
                raise
        if publish is not None:  # else: lost the lease, superseded, or shutting down
            await self._publish(publish)

    async def _collect(self, comparisons: trio.Nursery) -> bool:
        """Wait for the group to fill, starting comparisons as they become ready."""
        if self.ready.is_set():
            return True
        with trio.move_on_at(self.collection_due):
            while True:
                self._start_queued(comparisons)
                if self.ready.is_set():
                    return True
                await self._wake.wait()
                self._wake = trio.Event()
        # Filling the group and claiming its evaluation happen in one transition, so the last
        # member and the deadline can never both win (C-95).
        if self.ready.is_set():
            return True
        self.services.act(await self.services.store.transact(self.work.ref, CollectionDue()))
        return False

    def _start_queued(self, nursery: trio.Nursery) -> None:
        queued, self._queued = self._queued, []
        if self.scope.cancel_called:
            return  # the group ended before this task got here
        for job in queued:
            nursery.start_soon(self._compare, job)

    async def _compare(self, job: Job) -> None:
        comparison, work = job.comparison, self.work
        await call_hook(
            self.services.hooks.on_comparison_start,
            comparison.first,
            comparison.second,
            comparison.judge_pass,
        )
        task = JudgeTask(
            history=work.history,
            principle=work.principle,
            text_1=job.text_1,
            text_2=job.text_2,
            pair=(comparison.first, comparison.second),
            judge_pass=comparison.judge_pass,
            lane=self.lane,
            group_key=work.key,
            group_attempt=work.attempt,
        )
        # A retry sleep must not outlast the evaluation deadline (J-32); while the group is
        # still collecting that deadline is not known yet and nothing bounds the sleep but the
        # collection deadline's cancellation.
        result = await self.services.judge.judge(task, deadline=self._deadline)
        self.finished += 1
        if isinstance(result, JudgeFailure):
            # Noted as it fails, before anything else ends the group (M-10).
            self.failed[comparison.index] = result.text
            log.warning(
                "GenRM dropped comparison (%d, %d) (judge %d) of %d after a judge failure: %s",
                comparison.first,
                comparison.second,
                comparison.judge_pass,
                work.comparisons,
                result.text,
                extra={
                    **messages.log_fields(work.key, work.attempt),
                    "pair": [comparison.first, comparison.second],
                    "judge_pass": comparison.judge_pass,
                },
            )
        else:
            self.verdicts[comparison.index] = result.verdict

    def _deadline(self) -> float:
        return self.deadline

    async def _renew(self, every: float) -> None:
        """Keep the lease while judging; a renewal the fence refuses stops the evaluation."""
        work = self.work
        while True:
            await trio.sleep(every)
            await call_hook(self.services.hooks.on_lease_renewal, work.key)
            try:
                decision = await self.services.store.transact(work.ref, Renew(work.rid, work.fence))
            except StoreFailed:
                continue
            if not decision.held:
                self.scope.cancel()  # superseded, failed, or taken over: nothing to publish
                return

    async def _publish(self, event: Event) -> None:
        """Store the outcome; while the store is down, try again until it answers or the
        fence refuses (another process took the evaluation over meanwhile). If building the
        outcome raises (a failed internal check, C-64), the group fails instead (C-63); if
        even that raises, the group is left to its lease, as if this process had died."""
        work, services = self.work, self.services
        fields = messages.log_fields(work.key, work.attempt)
        defective = False
        while True:
            try:
                decision = await services.store.transact(work.ref, event)
            except StoreFailed as exc:
                log.warning("GenRM could not store an outcome, retrying: %s", exc, extra=fields)
                await trio.sleep(services.store.retry_s)
                continue
            except Exception as exc:
                log.error(
                    "GenRM cohort evaluation failed for key='%s'",
                    messages.log_key(work.key),
                    exc_info=exc,
                    extra=fields,
                )
                if defective:
                    return
                defective = True
                event = Fail(work.rid, work.fence, messages.evaluation_failed(exc))
                continue
            services.published(decision.held)
            if not decision.held:
                log.warning(
                    "GenRM discarded an evaluation result: the group's fence moved on",
                    extra=fields,
                )
            services.act(decision)
            return


def _first_error(exc: BaseException) -> BaseException:
    """The first leaf of an exception group: the error a nursery collected first."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
