"""Group engines sharing one Redis store inside one process: for tests and benchmarks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio

from genrm_trio.config import Config, config_from_mapping
from genrm_trio.fakes.judge import FakeJudge
from genrm_trio.runtime.engine import Engine
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.store.redis_store import RedisGroupStore
from genrm_trio.store.resp import StoreAddress
from genrm_trio.testing.harness import SCENARIO_DEFAULTS
from genrm_trio.testing.scenarios.steps import STORE_EPOCH

PREFIX = "test:"


def harness_time() -> float:
    """A store clock that follows Trio's (a mock clock, in tests that move time themselves),
    from an instant far ahead of the real one, so that Redis never expires a key by its own
    clock first: retention is the store's, by this clock."""
    return STORE_EPOCH + trio.current_time()


def shared_config(**overrides: Any) -> Config:
    return config_from_mapping({**SCENARIO_DEFAULTS, **overrides})


def new_store(
    url: str,
    config: Config,
    lease_s: float = 5.0,
    clock: Callable[[], float] | None = None,
    *,
    poll_s: float = 1.0,
    notifications: bool = True,
) -> RedisGroupStore:
    return RedisGroupStore(
        config,
        StoreAddress.parse(url),
        PREFIX,
        lease_s,
        clock=clock,
        poll_s=poll_s,
        notifications=notifications,
    )


@asynccontextmanager
async def shared_engines(
    url: str,
    count: int = 2,
    *,
    judge: FakeJudge | None = None,
    hooks: list[Hooks | None] | None = None,
    lease_s: float = 5.0,
    poll_s: float = 0.05,
    notifications: bool = True,
    clock: Callable[[], float] | None = None,
    **overrides: Any,
) -> AsyncIterator[list[Engine]]:
    """``count`` running engines sharing one store and one fake judge; ``clock`` is the
    stores' (None: Redis's own TIME)."""
    config = shared_config(**overrides)
    judge = judge or FakeJudge()
    engines = []
    async with AsyncExitStack() as stack:
        # No scenario here takes more than a few seconds; a hang fails instead of blocking.
        stack.enter_context(trio.fail_after(60))
        nursery = await stack.enter_async_context(trio.open_nursery())
        for index in range(count):
            store = new_store(
                url, config, lease_s, clock, poll_s=poll_s, notifications=notifications
            )
            engine = Engine(
                config,
                store,
                judge_transport=judge.transport(),
                hooks=(hooks or [None] * count)[index],
            )
            await nursery.start(engine.run)
            engines.append(engine)
        try:
            yield engines
        finally:
            for engine in engines:
                await engine.shutdown()
