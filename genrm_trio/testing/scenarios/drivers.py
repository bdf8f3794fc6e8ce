"""How a scenario run reaches the server: straight into the engine (one on the memory store, or
two sharing one Redis store), or over HTTP.

Every driver offers the runner the same operations (send a request, let the server settle,
sweep, kill an engine, lose notifications, restart the store, read the store for the checks),
so the runner never asks which store it plays on. What differs between the stores is the
store's own: its tenure (a store without a lease keeps its groups in the one process that
holds them, which a kill would take with it: such a driver kills nothing) and how it retains
finished work (pruned at arrivals, or trimmed after every write), which the model is told.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio
import trio.testing

from genrm_trio.config import Config
from genrm_trio.core.outcomes import Masked, Outcome, Rejected, Scored
from genrm_trio.core.ownership import Tenure
from genrm_trio.core.statistics import Statistics
from genrm_trio.runtime.engine import Engine
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.store.group_store import GroupStore, StoreView
from genrm_trio.store.memory_store import MemoryGroupStore
from genrm_trio.store.redis_store import RedisGroupStore
from genrm_trio.store.resp import StoreAddress
from genrm_trio.testing._invariants import Seen
from genrm_trio.testing.controlled_judge import ControlledJudge
from genrm_trio.testing.fixtures import serve
from genrm_trio.testing.harness import Reply
from genrm_trio.testing.scenarios.steps import (
    ENGINES,
    LEASE_S,
    STORE_EPOCH,
    Post,
    Via,
    engine_for,
)
from genrm_trio.wire.bodies import METRIC_KEYS
from genrm_trio.wire.parsing import parse_verify_body


def seen_outcome(outcome: Outcome) -> Seen:
    if isinstance(outcome, Scored):
        return Seen("scored", 200, reward=outcome.reward, metrics=outcome.metrics)
    if isinstance(outcome, Masked):
        return Seen("masked", 200, outcome.text + outcome.suffix)
    assert isinstance(outcome, Rejected)
    return Seen("rejected", outcome.status, outcome.detail)


def seen_reply(reply: Reply) -> Seen:
    body = reply.body
    if reply.status != 200:
        return Seen("rejected", reply.status, str(body.get("detail")))
    if body.get("mask_sample"):
        return Seen("masked", 200, str(body["failure_reason"]))
    metrics = {name: float(body[name]) for name in METRIC_KEYS if name in body}
    return Seen("scored", 200, reward=float(body["reward"]), metrics=metrics or None)


async def engine_outcome(engine: Engine, body: dict[str, Any]) -> Outcome:
    """``Engine.verify``'s outcome for ``body``, its reply taken as written at once."""
    request = parse_verify_body(msgspec.json.encode(body), engine.config)
    async with engine.verify(request) as verified:
        return verified.outcome


# Only guards against a store that never settles; no run comes near it.
SETTLE_LIMIT_S = 60.0
# How long every task must have been blocked before the store's I/O is taken to be done, in
# real time (Trio's clock stands still meanwhile).
CUSHION_S = 0.0005

Verify = Callable[[dict[str, Any], int], Any]


class Driver:
    """Engines on stores from ``new_store``, reached straight through ``Engine.verify`` with a
    parsed body (the fast path for long runs), or through ``verify`` when given (HTTP)."""

    def __init__(
        self,
        config: Config,
        judge: ControlledJudge,
        convert: Callable[[int], None],
        nursery: trio.Nursery,
        new_store: Callable[[], GroupStore],
        *,
        engines: int = 1,
        check_store: GroupStore | None = None,
        restart_store: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.judge = judge
        self.convert = convert
        self.nursery = nursery
        self.new_store = new_store
        self.count = engines
        self.engines: list[Engine] = []
        # What the checks read: the one engine's own store, or connections of their own.
        self._check_store = check_store
        self._restart_store = restart_store
        self._modes = ["delivered"] * engines  # notifications: delivered, lost or duplicated
        self._scopes: list[trio.CancelScope] = []
        self._gone: list[trio.Event] = []

    @property
    def engine(self) -> Engine:
        return self.engines[0]

    @property
    def tenure(self) -> Tenure:
        return self.engine.store.tenure

    @property
    def trims_after_writes(self) -> bool:
        """The store trims its retention after every write and hides what has expired, rather
        than pruning at arrivals (R-3): its retention at an instant is what a prune then would
        leave."""
        return not self.tenure.exclusive

    async def start(self) -> None:
        for index in range(self.count):
            await self._start(index)

    async def _start(self, index: int) -> None:
        hooks = Hooks(
            on_conversion=self.convert,
            on_notification=lambda rid: {"lost": 0, "duplicated": 2}.get(self._modes[index], 1),
        )
        engine = Engine(
            self.config, self.new_store(), judge_transport=self.judge.transport(), hooks=hooks
        )
        scope, gone = trio.CancelScope(), trio.Event()

        async def run(task_status: trio.TaskStatus[None]) -> None:
            try:
                with scope:
                    await engine.run(task_status=task_status)
            finally:
                gone.set()

        await self.nursery.start(run)
        if index == len(self.engines):
            self.engines.append(engine)
            self._scopes.append(scope)
            self._gone.append(gone)
        else:
            self.engines[index], self._scopes[index], self._gone[index] = engine, scope, gone

    def route(self, seed: int, post: Post) -> int:
        """The engine a post (every copy of it) goes to: drawn from the seed and the post, so a
        shrunk scenario routes the same way."""
        return engine_for(seed, post) % len(self.engines)

    async def verify(self, body: dict[str, Any], engine: int = 0) -> Seen:
        return seen_outcome(await engine_outcome(self.engines[engine], body))

    # ---- the instants the runner picks -----------------------------------------------------

    def busy(self) -> bool:
        """A store command is on its way, or arrivals wait for their transition."""
        return any(e.queued or e.store.busy for e in self.engines)

    async def settle(self) -> None:
        """Every task blocked, no command on its way to the store, and every engine told of the
        end of every record it waits on. Tasks waiting for a store reply look blocked too: this
        waits in real time (Trio's clock stands still) until the store has answered. An engine
        that loses its notifications (or is not subscribed: its subscription dropped with the
        store, and it waits a sweep interval to subscribe again) learns of an end by a sweep at
        this instant."""
        await trio.testing.wait_all_tasks_blocked()
        give_up = time.monotonic() + SETTLE_LIMIT_S
        while time.monotonic() < give_up:
            if self.busy():
                await trio.testing.wait_all_tasks_blocked(cushion=CUSHION_S)
                continue
            late = [i for i, e in enumerate(self.engines) if await e.watcher.undelivered()]
            if not late:
                await trio.testing.wait_all_tasks_blocked()
                if not self.busy():
                    return
                continue
            for index in late:
                engine = self.engines[index]
                if self._modes[index] == "lost" or not engine.subscribed:
                    await engine.sweep_once()
            await trio.testing.wait_all_tasks_blocked(cushion=CUSHION_S)
        raise RuntimeError(f"the store did not settle within {SETTLE_LIMIT_S}s")

    async def sweep(self, index: int) -> None:
        await self.engines[index].sweep_once()

    def notify(self, index: int, mode: str) -> None:
        """From now on, engine ``index`` receives, loses or duplicates every notification."""
        self._modes[index] = mode

    async def kill(self, index: int, dropped: Callable[[int], None]) -> None:
        """Engine ``index`` dies at once (nothing of a shutdown runs) and a fresh one takes its
        place; ``dropped(index)`` first drops its clients' connections. A store without a lease
        dies with its one process: nothing is killed."""
        if self.tenure.exclusive:
            return
        dropped(index)
        self._scopes[index].cancel()
        await self._gone[index].wait()
        await self.engines[index].store.aclose()
        await self._start(index)

    def restart_store(self) -> None:
        if self._restart_store is not None:
            self._restart_store()

    # ---- what the checks read ------------------------------------------------------------

    async def view(self) -> StoreView:
        """The store's groups, after its own checks (AssertionError on a broken invariant)."""
        store = self._check_store or self.engine.store
        for engine in self.engines:
            engine.check_invariants()
        return await store.view()

    def statistics(self, view: StoreView) -> Statistics:
        """Groups by phase and retention from the store; waiters, tasks and judge calls summed
        over the engines."""
        each = [engine.statistics() for engine in self.engines]
        records = [g.record for g in view.groups.values() if g.record is not None]
        active = [r for r in records if r.phase.active]
        collecting = sum(1 for r in active if r.phase.value == "collecting")
        return Statistics(
            collecting=collecting,
            evaluating=len(active) - collecting,
            retained_records=len(records) - len(active),
            watermarks=sum(1 for g in view.groups.values() if g.watermark is not None),
            idle_entries=sum(1 for g in view.groups.values() if g.idle_since is not None),
            waiters=sum(s.waiters for s in each),
            owned_tasks=sum(s.owned_tasks for s in each),
            judge_in_flight=sum(s.judge_in_flight for s in each),
            prune_visits=view.prune_visits or 0,
        )

    async def shutdown(self) -> None:
        for engine in self.engines:
            await engine.shutdown()


class HttpDriver(Driver):
    """Through the HTTP app over ASGI, as a client would, on the memory store."""

    def __init__(self, server: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.server = server
        self.engines = [server.engine]

    async def start(self) -> None:
        pass  # the server runs already

    async def verify(self, body: dict[str, Any], engine: int = 0) -> Seen:
        return seen_reply(await self.server.verify(body))


@asynccontextmanager
async def open_driver(
    via: Via,
    config: Config,
    judge: ControlledJudge,
    convert: Callable[[int], None],
    store_url: str | None = None,
    restart_store: Callable[[], None] | None = None,
) -> AsyncIterator[Driver]:
    """A running driver for ``via``: ``engine`` (one engine, memory store), ``http`` (the same
    through the app), or ``shared`` (two engines, each with its own connections to the Redis
    store at ``store_url``, on the harness's clock: the store's clock is ``STORE_EPOCH`` plus
    Trio's, and nobody sweeps but the runner)."""
    if via == "http":
        hooks = Hooks(on_conversion=convert)
        async with serve(config, judge=judge, hooks=hooks, check_on_exit=False) as server:
            async with trio.open_nursery() as nursery:
                yield HttpDriver(
                    server,
                    config=config,
                    judge=judge,
                    convert=convert,
                    nursery=nursery,
                    new_store=lambda: server.engine.store,
                )
                nursery.cancel_scope.cancel()
        return
    new_store: Callable[[], GroupStore]
    check_store: GroupStore | None = None
    engines = 1
    if via == "shared":
        assert store_url is not None, "shared mode needs a store URL"
        prefix = f"scenario:{uuid.uuid4().hex[:12]}:"

        def new_store() -> GroupStore:
            return RedisGroupStore(
                config,
                StoreAddress.parse(store_url),
                prefix,
                LEASE_S,
                clock=lambda: STORE_EPOCH + trio.current_time(),
                poll_s=math.inf,  # no sweep of its own: the runner sweeps at its instants
            )

        check_store = new_store()
        engines = ENGINES
    else:

        def new_store() -> GroupStore:
            return MemoryGroupStore(config)

    async with trio.open_nursery() as nursery:
        driver = Driver(
            config,
            judge,
            convert,
            nursery,
            new_store,
            engines=engines,
            check_store=check_store,
            restart_store=restart_store,
        )
        try:
            await driver.start()
            yield driver
        finally:
            with trio.CancelScope(shield=True):
                await driver.shutdown()
                if check_store is not None:
                    await check_store.aclose()
