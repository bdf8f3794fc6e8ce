"""An in-process server on the fake judge, with helpers to post members and whole groups.

`running_server(...)` builds an app with `create_app`, runs its lifespan, and talks to it through
a real httpx client over ASGI; the judge is a `FakeJudge` reached through the in-memory judge
transport (fakes/memory_transport.py). Defaults follow the acceptance-scenario harness of
§10.

Its groups live in the store the configuration names, unless the caller gives one, or runs the
server inside ``servers_on(stores)``: a suite that runs the same tests on several group stores
sets, per test, where every server such a test starts keeps its groups.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import trio
import trio.testing

from genrm_trio.config import Config, config_from_mapping
from genrm_trio.core.exact_ints import int_from_digits
from genrm_trio.fakes.judge import FakeJudge
from genrm_trio.http.app import GenRMApp, create_app
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.store.group_store import GroupStore

JUDGE_URL = "http://fake-judge/v1"

# A server's group store from its configuration.
StoreFactory = Callable[[Config], GroupStore]
# The innermost ``servers_on`` block's factory is last. Process-wide rather than a context
# variable: a pytest fixture sets it outside the Trio run that the test then runs in.
_stores: list[StoreFactory] = []


@contextmanager
def servers_on(stores: StoreFactory) -> Iterator[None]:
    """Every server ``running_server`` (and the race harness's ``serve``) starts while this
    block is open keeps its groups in a store ``stores`` makes from its configuration, unless
    the caller gives one."""
    _stores.append(stores)
    try:
        yield
    finally:
        _stores.remove(stores)


def server_store(config: Config, store: GroupStore | None = None) -> GroupStore | None:
    """The store a harness server runs on: ``store``, else the one of the innermost open
    ``servers_on`` block, else None (the one the configuration names)."""
    if store is not None:
        return store
    return _stores[-1](config) if _stores else None


SCENARIO_DEFAULTS: dict[str, Any] = {
    "judge_base_url": JUDGE_URL,
    "judge_model": "judge",
    "num_rollouts_per_prompt": 2,
    "comparison_strategy": "circular",
    "num_judges_per_comparison": 1,
    "genrm_parse_retries": 3,
    "genrm_parse_retry_sleep_s": 0.0,
    "cohort_collection_timeout_s": 5.0,
    "cohort_evaluation_timeout_s": 5.0,
    "judge_request_timeout_s": 2.0,
}


def member(
    i: int,
    q: float = 3,
    g: str | None = "g",
    a: int | None = 0,
    *,
    regenerated: bool = False,
    prompt: Any = "2+2?",
    **extra: Any,
) -> dict[str, Any]:
    """The `/verify` body `member(i, q, g, a)` of §10 (None leaves a coordinate out)."""
    again = " again" if regenerated else ""
    body: dict[str, Any] = {
        "responses_create_params": {"input": prompt},
        "response": {
            "id": f"r-{g}-{a}-{i}{'-again' if regenerated else ''}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"answer-{i}{again} [[q={q}]]"}],
                }
            ],
        },
    }
    if g is not None:
        body["_ng_group_id"] = g
    if a is not None:
        body["_ng_group_attempt"] = a
    body["_ng_rollout_index"] = i
    body.update(extra)
    return body


@dataclass
class Reply:
    status: int
    body: Any
    raw: bytes

    @property
    def reward(self) -> float:
        return float(self.body["reward"])

    @property
    def masked(self) -> bool:
        return bool(self.body.get("mask_sample"))

    @property
    def detail(self) -> str:
        return str(self.body["detail"])


class Server:
    """A running in-process server, its client and its fake judge."""

    def __init__(self, app: GenRMApp, client: httpx.AsyncClient, judge: FakeJudge) -> None:
        self.app = app
        self.client = client
        self.judge = judge

    @property
    def config(self) -> Config:
        return self.app.engine.config

    @property
    def engine(self) -> Any:
        return self.app.engine

    def calls(self) -> int:
        """Judge requests made so far (the spec's "calls")."""
        return int(self.judge.stats()["requests_total"])

    async def post(
        self, path: str, body: Any, *, headers: Mapping[str, str] | None = None
    ) -> Reply:
        content = body if isinstance(body, bytes) else msgspec.json.encode(body)
        response = await self.client.post(path, content=content, headers=headers)
        raw = response.content
        try:
            decoded = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            decoded = json.loads(raw, parse_int=int_from_digits)
        return Reply(response.status_code, decoded, raw)

    async def verify(self, body: Any, **kwargs: Any) -> Reply:
        return await self.post("/verify", body, **kwargs)

    async def compare(self, body: Any) -> Reply:
        return await self.post("/compare", body)

    async def groups(self) -> dict[str, int]:
        """The group store's counts as /healthz gives them (with a shared store, the whole
        deployment's): active groups, retained results, watermarks."""
        body = (await self.get("/healthz")).body
        return {k: body[k] for k in ("active_groups", "retained_records", "watermarks")}

    async def get(self, path: str) -> Reply:
        response = await self.client.get(path)
        return Reply(response.status_code, response.json(), response.content)

    async def complete(
        self,
        g: str | None = "g",
        a: int | None = 0,
        *,
        qualities: list[float] | None = None,
        **extra: Any,
    ) -> list[Reply]:
        """Send all N members of group `g` attempt `a` at once and wait for every reply."""
        size = self.config.num_rollouts_per_prompt
        qs = qualities or [3] * size
        return await self.verify_all([member(i, qs[i], g, a, **extra) for i in range(size)])

    async def verify_all(self, bodies: list[Any]) -> list[Reply]:
        """Post every body concurrently; replies come back in the order of `bodies`."""
        replies: list[Reply | None] = [None] * len(bodies)

        async def one(index: int) -> None:
            replies[index] = await self.verify(bodies[index])

        async with trio.open_nursery() as nursery:
            for index in range(len(bodies)):
                nursery.start_soon(one, index)
        return [reply for reply in replies if reply is not None]

    async def settle(self) -> None:
        """Wait until every request posted so far has reached its group (answered, or waiting
        for it) and every task is blocked. With a shared store a task waiting for the store
        looks blocked too: this also waits, in real time, until no arrival waits for its
        group's transition and no command is on its way to the store."""
        engine = self.app.engine
        await trio.testing.wait_all_tasks_blocked()
        while engine.queued or engine.store.busy:
            await trio.testing.wait_all_tasks_blocked(cushion=0.001)

    def start_verify(self, nursery: trio.Nursery, body: Any) -> PendingReply:
        """Post in the background; cancel `pending.scope` to disconnect the client."""
        pending = PendingReply()
        nursery.start_soon(pending.run, self, body)
        return pending


class PendingReply:
    """A /verify posted in the background, with its own cancel scope (a disconnectable client)."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.reply: Reply | None = None
        self.done = trio.Event()

    async def run(self, server: Server, body: Any) -> None:
        try:
            with self.scope:
                self.reply = await server.verify(body)
        finally:
            self.done.set()

    async def result(self) -> Reply:
        await self.done.wait()
        assert self.reply is not None, "the request was cancelled"
        return self.reply

    def disconnect(self) -> None:
        self.scope.cancel()


@asynccontextmanager
async def running_server(
    settings: Config | Mapping[str, Any] | None = None,
    *,
    judge: FakeJudge | None = None,
    hooks: Hooks | None = None,
    store: GroupStore | None = None,
    **overrides: Any,
) -> AsyncIterator[Server]:
    """Run one server instance (lifespan included) on a fake judge; yields a `Server`."""
    judge = judge or FakeJudge()
    if isinstance(settings, Config):
        config = settings
    else:
        config = config_from_mapping({**SCENARIO_DEFAULTS, **(settings or {}), **overrides})
    store = server_store(config, store)
    app = create_app(config, judge_transport=judge.transport(), hooks=hooks, store=store)
    async with app.test_app():
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://genrm.test") as client:
            yield Server(app, client, judge)
