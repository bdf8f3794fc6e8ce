"""pytest fixtures for testing against an in-process genrm-trio server on a controlled judge.

Enable with ``pytest_plugins = ["genrm_trio.testing.fixtures"]`` (pytest-trio required).

- ``genrm_server``: a running server (`GenRMServer`) on ``genrm_judge``, with the settings of
  ``genrm_settings`` and any ``@pytest.mark.genrm_config(...)`` marker on the test;
- ``genrm_judge``: the `ControlledJudge` behind it (hold, release, fail or delay calls);
- ``genrm_server_factory``: ``async with genrm_server_factory(**overrides) as server`` for
  more servers, or other settings, inside one test;
- ``genrm_hooks``: fault-injection hooks (`Hooks`) for ``genrm_server``, None by default.

Every server checks the engine's invariants and the critical-section instrument (I-1) when
it stops, and fails the test if either is broken. Time is Trio's: add pytest-trio's
``autojump_clock`` fixture to the test's own arguments to make deadlines instant.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from genrm_trio.config import Config, config_from_mapping
from genrm_trio.core.statistics import Statistics
from genrm_trio.http.app import GenRMApp, create_app
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.testing.controlled_judge import ControlledJudge, group_marker
from genrm_trio.testing.harness import (
    SCENARIO_DEFAULTS,
    PendingReply,
    Reply,
    Server,
    member,
    server_store,
)
from genrm_trio.testing.instrument import CriticalSectionInstrument

__all__ = [
    "GenRMServer",
    "genrm_hooks",
    "genrm_judge",
    "genrm_server",
    "genrm_server_factory",
    "genrm_settings",
    "serve",
    "tagged_member",
]

MARKER = "genrm_config"


def tagged_member(
    i: int,
    q: float = 3,
    g: str | None = "g",
    a: int | None = 0,
    *,
    regenerated: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """§10's ``member(i, q, g, a)`` with a group marker in its answer text, so that
    judge controls can select this group attempt (``group=g, attempt=a``)."""
    body = member(i, q, g, a, regenerated=regenerated, **extra)
    part = body["response"]["output"][0]["content"][0]
    part["text"] += " " + group_marker(str(g), a or 0)
    return body


class GenRMServer(Server):
    """A running in-process server with a controlled judge and helpers for group scenarios."""

    judge: ControlledJudge

    def __init__(
        self,
        app: GenRMApp,
        client: httpx.AsyncClient,
        judge: ControlledJudge,
        instrument: CriticalSectionInstrument,
    ) -> None:
        super().__init__(app, client, judge)
        self.instrument = instrument
        # group id -> the newest attempt posted to /verify through this server
        self._attempts: dict[str, int] = {}

    async def verify(self, body: Any, **kwargs: Any) -> Reply:
        if isinstance(body, dict) and isinstance(body.get("_ng_group_id"), str):
            group, attempt = body["_ng_group_id"], body.get("_ng_group_attempt", 0)
            if isinstance(attempt, int):
                self._attempts[group] = max(self._attempts.get(group, -1), attempt)
        return await super().verify(body, **kwargs)

    @property
    def size(self) -> int:
        """N, the number of rollouts per group."""
        return self.config.num_rollouts_per_prompt

    async def post_member(
        self, i: int, q: float = 3, g: str = "g", a: int = 0, **options: Any
    ) -> Reply:
        """Post one member and wait for its reply."""
        return await self.verify(tagged_member(i, q, g, a, **options))

    def start_member(
        self, nursery: trio.Nursery, i: int, q: float = 3, g: str = "g", a: int = 0, **options: Any
    ) -> PendingReply:
        """Post one member in the background; `disconnect` it or await `.result()`."""
        return self.start_verify(nursery, tagged_member(i, q, g, a, **options))

    async def post_group(
        self, g: str = "g", a: int = 0, *, qualities: list[float] | None = None, **options: Any
    ) -> list[Reply]:
        """Post all N members of group `g` attempt `a` at once; replies in slot order."""
        qs = qualities or [3] * self.size
        return await self.verify_all(
            [tagged_member(i, qs[i], g, a, **options) for i in range(self.size)]
        )

    def start_group(
        self,
        nursery: trio.Nursery,
        g: str = "g",
        a: int = 0,
        *,
        qualities: list[float] | None = None,
        **options: Any,
    ) -> list[PendingReply]:
        qs = qualities or [3] * self.size
        return [self.start_member(nursery, i, qs[i], g, a, **options) for i in range(self.size)]

    def next_attempt(self, g: str = "g") -> int:
        """One more than the newest attempt posted to /verify for group `g` (0 if none)."""
        return self._attempts.get(g, -1) + 1

    async def new_attempt(
        self, g: str = "g", *, qualities: list[float] | None = None, **options: Any
    ) -> list[Reply]:
        """Replace group `g` by resending all N members under the next attempt (C-84)."""
        return await self.post_group(g, self.next_attempt(g), qualities=qualities, **options)

    async def disconnect(self, pending: PendingReply) -> None:
        """Cancel a waiting request, as a client closing its connection, and let it unwind."""
        pending.disconnect()
        await pending.done.wait()

    async def shutdown(self) -> None:
        """Shut the engine down (C-96): waiters get 503, records and tasks are cleared."""
        await self.engine.shutdown()

    def statistics(self) -> Statistics:
        return self.engine.statistics()

    def check_invariants(self) -> None:
        """Raise on a broken engine invariant (I-2…I-4) or a checkpoint in a critical section."""
        self.engine.check_invariants()
        if self.instrument.violations:
            raise AssertionError(
                "a task step ended inside a critical section (I-1): "
                + ", ".join(self.instrument.violations)
            )


def _config(settings: Config | Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> Config:
    if isinstance(settings, Config):
        if overrides:
            raise TypeError("pass overrides in the settings mapping, not with a Config")
        return settings
    return config_from_mapping({**SCENARIO_DEFAULTS, **(settings or {}), **overrides})


@asynccontextmanager
async def serve(
    settings: Config | Mapping[str, Any] | None = None,
    *,
    judge: ControlledJudge | None = None,
    hooks: Hooks | None = None,
    check_on_exit: bool = True,
    **overrides: Any,
) -> AsyncIterator[GenRMServer]:
    """Run one server instance on a controlled judge, with §10's defaults under `settings`.

    On exit the server shuts down and, with `check_on_exit`, its invariants are checked: an
    error is raised if any is broken or a critical section reached a checkpoint.
    """
    judge = judge if judge is not None else ControlledJudge()
    config = _config(settings, overrides)
    instrument = CriticalSectionInstrument()
    trio.lowlevel.add_instrument(instrument)
    try:
        store = server_store(config)
        app = create_app(config, judge_transport=judge.transport(), hooks=hooks, store=store)
        async with app.test_app():
            transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
            async with httpx.AsyncClient(
                transport=transport, base_url="http://genrm.test"
            ) as client:
                server = GenRMServer(app, client, judge, instrument)
                yield server
                if check_on_exit:
                    server.check_invariants()
        if check_on_exit:
            server.check_invariants()
    finally:
        trio.lowlevel.remove_instrument(instrument)


# ---- pytest plugin ------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(**settings): configuration overrides for the genrm_server fixture"
    )


@pytest.fixture
def genrm_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Settings for ``genrm_server``: §10's defaults, then the test's marker, if any.

    Override this fixture in a conftest or module for settings shared by many tests.
    """
    settings: dict[str, Any] = {}
    for marker in reversed(list(request.node.iter_markers(MARKER))):
        settings.update(marker.kwargs)
    return settings


@pytest.fixture
def genrm_hooks() -> Hooks | None:
    return None


@pytest.fixture
def genrm_judge() -> ControlledJudge:
    return ControlledJudge()


@pytest.fixture
async def genrm_server(
    genrm_judge: ControlledJudge,
    genrm_settings: dict[str, Any],
    genrm_hooks: Hooks | None,
) -> AsyncIterator[GenRMServer]:
    async with serve(genrm_settings, judge=genrm_judge, hooks=genrm_hooks) as server:
        yield server


@pytest.fixture
def genrm_server_factory() -> Callable[..., AbstractAsyncContextManager[GenRMServer]]:
    """``async with genrm_server_factory(num_rollouts_per_prompt=4) as server: ...``"""
    return serve
