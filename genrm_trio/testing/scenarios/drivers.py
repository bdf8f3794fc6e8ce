"""How a scenario run reaches the server: straight into the engine (one on the memory store, or
two sharing one Redis store), or over HTTP."""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Protocol, cast

import msgspec
import trio
import trio.testing

from genrm_trio.config import Config
from genrm_trio.core.outcomes import Masked, Outcome, Rejected, Scored
from genrm_trio.runtime.engine import Engine
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.store.group_store import GroupStore
from genrm_trio.store.memory_store import MemoryGroupStore
from genrm_trio.store.redis_store import RedisGroupStore
from genrm_trio.store.resp import StoreAddress
from genrm_trio.testing._invariants import Seen
from genrm_trio.testing.controlled_judge import ControlledJudge
from genrm_trio.testing.fixtures import GenRMServer, serve
from genrm_trio.testing.harness import Reply
from genrm_trio.testing.scenarios.steps import (
    ENGINES,
    LEASE_S,
    STORE_EPOCH,
    Via,
)
from genrm_trio.wire.bodies import METRIC_KEYS
from genrm_trio.wire.parsing import parse_verify_body


class Driver(Protocol):
    @property
    def engine(self) -> Engine: ...

    async def verify(self, body: dict[str, Any], engine: int = 0) -> Seen: ...

    async def shutdown(self) -> None: ...


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


class EngineDriver:
    """Straight into `Engine.verify` with a parsed body: the fast path for long runs. Each
    engine runs on a store of its own from `new_store`; the engines differ in nothing else."""

    def __init__(
        self,
        config: Config,
        judge: ControlledJudge,
        hooks: list[Hooks],
        nursery: trio.Nursery,
        new_store: Callable[[], GroupStore],
    ) -> None:
        self.config = config
        self.judge = judge
        self.hooks = hooks
        self.nursery = nursery
        self.new_store = new_store
        self.engines: list[Engine] = []
        self._scopes: list[trio.CancelScope] = []
        self._gone: list[trio.Event] = []

    @property
    def engine(self) -> Engine:
        return self.engines[0]

    async def start(self, index: int) -> None:
        engine = Engine(
            self.config,
            self.new_store(),
            judge_transport=self.judge.transport(),
            hooks=self.hooks[index],
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

    async def verify(self, body: dict[str, Any], engine: int = 0) -> Seen:
        return seen_outcome(await engine_outcome(self.engines[engine], body))

    async def shutdown(self) -> None:
        for engine in self.engines:
            await engine.shutdown()

    async def kill(self, index: int) -> None:
        """The engine dies at once (nothing of a shutdown runs); a fresh one takes its place."""
        self._scopes[index].cancel()
        await self._gone[index].wait()
        await self.engines[index].store.aclose()
        await self.start(index)

    async def aclose(self) -> None:
        for engine in self.engines:
            await engine.shutdown()


class HttpDriver:
    """Through the HTTP app over ASGI, as a client would."""

    def __init__(self, server: GenRMServer) -> None:
        self.server = server
        self.engine = server.engine

    async def verify(self, body: dict[str, Any], engine: int = 0) -> Seen:
        return seen_reply(await self.server.verify(body))

    async def shutdown(self) -> None:
        await self.engine.shutdown()


class SharedDriver(EngineDriver):
    """Engines sharing one Redis store, each with its own connections, on the harness's clock
    (the store's clock is `STORE_EPOCH` plus Trio's); they sweep only when told to. What it adds
    is a view into the store, for the checks."""

    def __init__(
        self,
        url: str,
        config: Config,
        judge: ControlledJudge,
        hooks: list[Hooks],
        nursery: trio.Nursery,
    ) -> None:
        self.url = url
        self.prefix = f"scenario:{uuid.uuid4().hex[:12]}:"
        super().__init__(config, judge, hooks, nursery, self._store)
        self.stores: list[RedisGroupStore] = []  # each engine's, by index
        self.store = self._store()  # the checks' own connections

    def _store(self) -> RedisGroupStore:
        return RedisGroupStore(
            self.config,
            StoreAddress.parse(self.url),
            self.prefix,
            LEASE_S,
            clock=lambda: STORE_EPOCH + trio.current_time(),
            # No sweep of its own: the runner sweeps at the instants it picks.
            poll_s=math.inf,
        )

    async def start(self, index: int) -> None:
        await super().start(index)
        store = cast(RedisGroupStore, self.engines[index].store)
        if index == len(self.stores):
            self.stores.append(store)
        else:
            self.stores[index] = store

    def busy(self) -> bool:
        """A store command is on its way, or arrivals wait for their transaction."""
        return any(
            s.client.in_use or e.queued for e, s in zip(self.engines, self.stores, strict=True)
        )

    async def undelivered(self) -> list[int]:
        """The engines with a waiter on, or an evaluation of, a record that has already ended
        (its notification is on its way, or lost)."""
        late = []
        for index, engine in enumerate(self.engines):
            if await self.stores[index].ended_records(engine.watched_records()):
                late.append(index)
        return late

    async def aclose(self) -> None:
        await super().aclose()
        await self.store.aclose()


@asynccontextmanager
async def open_driver(
    via: Via,
    config: Config,
    judge: ControlledJudge,
    hooks: Hooks,
    shared: tuple[str, list[Hooks]] | None = None,
) -> AsyncIterator[Driver]:
    if via == "shared":
        assert shared is not None, "shared mode needs a store URL"
        async with trio.open_nursery() as nursery:
            driver = SharedDriver(shared[0], config, judge, shared[1], nursery)
            try:
                for index in range(ENGINES):
                    await driver.start(index)
                yield driver
            finally:
                with trio.CancelScope(shield=True):
                    await driver.aclose()
        return
    if via == "http":
        async with serve(config, judge=judge, hooks=hooks, check_on_exit=False) as server:
            yield HttpDriver(server)
        return
    async with trio.open_nursery() as nursery:
        engines = EngineDriver(config, judge, [hooks], nursery, partial(MemoryGroupStore, config))
        try:
            await engines.start(0)
            yield engines
        finally:
            with trio.CancelScope(shield=True):
                await engines.aclose()
