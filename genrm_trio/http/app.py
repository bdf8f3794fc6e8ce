"""The quart-trio application: one server instance and the routes that translate HTTP to engine
calls and back.

No behaviour lives here beyond reading bodies and writing replies: `/verify` is its own module
(``verify_route``), the replies and error mapping the routes share are in ``asgi``, and the
engine and the wire module do the rest.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, cast

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, HTTPScope, Scope
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import (
    HTTPException,
    InternalServerError,
    MethodNotAllowed,
    RequestEntityTooLarge,
)

from genrm_trio._version import __version__
from genrm_trio.config import Config, config_from_mapping, config_warnings
from genrm_trio.core import messages
from genrm_trio.core.outcomes import Masked, Outcome, Scored
from genrm_trio.http._asgi import (
    ALLOW_POST,
    JSON,
    cancel_on_disconnect,
    http_error_body,
    http_error_reply,
    refusal_reply,
    send_reply,
)
from genrm_trio.http._gym_endpoints import register_gym_routes
from genrm_trio.http._openapi import openapi_json
from genrm_trio.http._openrlhf_endpoint import register_openrlhf_route
from genrm_trio.http._prometheus import (
    CONTENT_TYPE,
    EngineCollector,
    metrics_registry,
    render_metrics,
)
from genrm_trio.http._receiving import BodyReceiver, Refused
from genrm_trio.http._request_counts import RequestCounts
from genrm_trio.http._spool import Spool, SpoolBudget
from genrm_trio.http._verify_route import VerifyRoute
from genrm_trio.http._whole_groups import (
    GROUP_ROUTE,
    first_rejection,
    render_group_reply,
    run_members,
)
from genrm_trio.http._worker_metrics import WorkerMetrics, worker_settings
from genrm_trio.http.read_gates import ReadGates
from genrm_trio.judge import Http11Transport, JudgeProbe, ReplicaState, readiness_verdict
from genrm_trio.judge.transport import TransportFactory
from genrm_trio.runtime.compare import CompareUnavailable, run_compare
from genrm_trio.runtime.engine import Engine
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.store.configured import configured_store
from genrm_trio.store.group_store import GroupStore
from genrm_trio.wire.bodies import BadRequest
from genrm_trio.wire.group_bodies import parse_group_body
from genrm_trio.wire.parsing import body_too_large, parse_compare_body
from genrm_trio.wire.rendering import (
    error_body,
    render_compare_reply,
    render_healthz,
    render_readyz,
)
from genrm_trio.wire.schema import JudgeReplicaState

log = logging.getLogger("genrm_trio")

VerifyASGI = Callable[[HTTPScope, ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]


class GenRMApp(QuartTrio):
    """A quart-trio app that carries its engine (one independent server instance, I-20).

    `/verify`, the hot path, is answered straight from ASGI (``VerifyRoute``); Quart never
    sees it, so before/after-request hooks do not run for it. `/verify_group` is answered from
    ASGI too, because Quart reads a body as it
    arrives, before the handler runs: the group's body must wait, unread, for room in
    `waiting_body_memory_bytes`. Every other route goes through Quart.
    """

    engine: Engine
    judge_probe: JudgeProbe
    metrics_collector: EngineCollector
    spool: Spool
    spool_budget: SpoolBudget
    body_receiver: BodyReceiver
    verify_asgi: VerifyASGI
    group_asgi: VerifyASGI

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "http":
            scope = _without_rollout_prefix(scope)
        if scope["type"] == "http":
            for route, handler in (("/verify", self.verify_asgi), (GROUP_ROUTE, self.group_asgi)):
                if _is_path(scope, route):
                    if scope["method"] == "POST":
                        await handler(scope, receive, send)
                    else:
                        body = http_error_body(MethodNotAllowed())
                        await send_reply(send, 405, body, ALLOW_POST)
                    return
        await super().__call__(scope, receive, send)


# With observability on, NeMo Gym calls every route of a server under `/ng-rollout/<rollout
# id>/` (the id keys its captures); Gym's own servers strip the prefix before routing.
_ROLLOUT_PREFIX: Final = re.compile(r"/ng-rollout/[A-Za-z0-9][A-Za-z0-9._-]*(/.*)")


def _without_rollout_prefix(scope: HTTPScope) -> HTTPScope:
    match = _ROLLOUT_PREFIX.fullmatch(scope["path"])
    if match is None:
        return scope
    path = match.group(1)
    return cast(HTTPScope, {**scope, "path": path, "raw_path": path.encode()})


def _is_path(scope: HTTPScope, route: str) -> bool:
    # Mounted under a prefix, the path may or may not carry the prefix, depending on the server.
    path = scope["path"]
    return path == route or path == scope.get("root_path", "") + route


def _reply(status: int, payload: bytes) -> Response:
    return Response(payload, status=status, content_type=JSON)


def _replicas_wire(replicas: list[ReplicaState]) -> list[JudgeReplicaState]:
    return [
        JudgeReplicaState(
            url=replica.url,
            reachable=replica.reachable,
            last_probe_at=replica.last_probe_at,
            last_error=replica.last_error,
        )
        for replica in replicas
    ]


def create_app(
    config: Config | Mapping[str, Any],
    *,
    judge_transport: TransportFactory | None = None,
    hooks: Hooks | None = None,
    store: GroupStore | None = None,
    read_gates: ReadGates | None = None,
    judge_probe_transport: TransportFactory | None = None,
) -> GenRMApp:
    """Build an independent server instance; `judge_transport` replaces the judge's network,
    `store` the group store the configuration names (`group_store`). `read_gates`: given by
    `serve`, which then lets a body wait unread for room in the budget.
    `judge_probe_transport`: what the readiness probe reaches the replicas through; the network
    by default, but with a `judge_transport` handed in and no probe transport, probing is off
    (the network probe would not reach that judge)."""
    if not isinstance(config, Config):
        config = config_from_mapping(config)
    app = GenRMApp("genrm_trio")
    # A /verify waits for its whole group: Quart's default 60 s response timeout would cut
    # waiting requests off long before the group's own deadlines.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    if store is None:
        store = configured_store(config)
    engine = Engine(config, store, judge_transport=judge_transport, hooks=hooks)
    app.engine = engine
    if judge_probe_transport is None and judge_transport is None:
        judge_probe_transport = Http11Transport
    probe = app.judge_probe = JudgeProbe(config, judge_probe_transport)
    budget = SpoolBudget(config.waiting_body_memory_bytes)
    receiver = BodyReceiver(budget, config.max_body_bytes, app.config["BODY_TIMEOUT"], read_gates)
    spool = Spool(config.spool_dir)
    app.spool = spool
    app.spool_budget = budget
    app.body_receiver = receiver
    openapi_bytes = openapi_json(__version__)
    metrics = engine.metrics
    counts = RequestCounts()
    collector = app.metrics_collector = EngineCollector(
        engine, spool, budget, counts, probe.readiness
    )
    prometheus = metrics_registry(collector)
    # One of `serve --workers N`'s workers: /metrics and /healthz speak for the whole server.
    worker = worker_settings(os.environ)
    worker_metrics = None if worker is None else WorkerMetrics(worker, collector)
    for warning in config_warnings(config):
        log.warning(warning)

    @app.before_serving
    async def start_engine() -> None:
        if config.waiting_body_memory_bytes is not None:
            spool.prepare()
        await app.nursery.start(engine.run)
        # Probes run beside serving: a dead judge is reported, never waited for (that is
        # `serve --wait-for-judge`).
        await app.nursery.start(probe.run)
        if worker_metrics is not None:
            await app.nursery.start(worker_metrics.run)

    @app.after_serving
    async def stop_engine() -> None:
        probe.stop()
        await engine.shutdown()
        await probe.aclose()
        spool.close()
        if worker_metrics is not None:
            worker_metrics.retire()

    async def read_body() -> bytes:
        if request.content_length is not None and request.content_length > config.max_body_bytes:
            raise BadRequest(413, body_too_large(config.max_body_bytes))
        try:
            body = await request.get_data(cache=False, as_text=False)
            assert isinstance(body, bytes)
            return body
        except RequestEntityTooLarge:
            raise BadRequest(413, body_too_large(config.max_body_bytes)) from None

    app.verify_asgi = VerifyRoute(engine, receiver, spool, config, counts)
    internal_error = http_error_reply(InternalServerError(), config.max_body_bytes)

    @app.post("/compare")
    async def compare() -> Response:
        if engine.closed:
            metrics.compare("unavailable")
            return _reply(503, error_body(messages.SHUTTING_DOWN))
        try:
            parsed = parse_compare_body(await read_body(), config)
        except BadRequest as exc:
            metrics.compare("invalid")
            return _reply(exc.status, error_body(exc.detail))
        try:
            result = await run_compare(
                config,
                engine.judge,
                parsed.history,
                parsed.responses,
                parsed.principle,
                parsed.baseline,
            )
        except CompareUnavailable as exc:
            metrics.compare("unavailable")
            return _reply(503, error_body(exc.detail))
        except Exception as exc:
            metrics.compare("error")
            log.error("GenRM compare failed", exc_info=exc)
            detail = f"GenRM compare failed: {messages.exception_text(exc)}"
            return _reply(500, error_body(detail))
        payload = render_compare_reply(result.rewards, result.comparison_results, result.metrics)
        metrics.compare("scored")
        return _reply(200, payload)

    async def group_asgi(
        scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """`POST /verify_group`, straight from ASGI."""
        if engine.closed:
            counts.verify_answered("unavailable")
            await send_reply(send, 503, error_body(messages.SHUTTING_DOWN))
            return
        # A group's body stays in memory until the group is judged (it is not spooled: judging
        # starts as soon as it is read). Beyond the budget it waits unread, and the client's
        # upload with it; every group admitted completes on its own, so the wait always ends.
        async with receiver.receive_held(scope, receive) as received:
            if received is None:
                return  # the client left while sending
            if isinstance(received, Refused):
                counts.verify_answered("invalid")
                await send_reply(send, *refusal_reply(received, config.max_body_bytes))
                return
            body = received.take_body()
            try:
                group = parse_group_body(body, config)
            except BadRequest as exc:
                counts.verify_answered("invalid")
                await send_reply(send, exc.status, error_body(exc.detail))
                return
            del body
            received.admitted()
            outcomes: list[Outcome | None] | None = None
            try:
                # A client that leaves ends its own wait only (C-51), as on /verify.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancel_on_disconnect, receive, nursery.cancel_scope)
                    outcomes = await run_members(engine, group.members)
                    nursery.cancel_scope.cancel()
            except Exception:
                counts.verify_answered("error")
                log.exception("Exception on request POST /verify_group")
                await send_reply(send, *internal_error)
                return
            if outcomes is None:
                return
            rejected = first_rejection(outcomes)
            if rejected is not None:
                await send_reply(send, rejected.status, error_body(rejected.detail))
                return
            rows = [o for o in outcomes if isinstance(o, Scored | Masked)]
            await send_reply(send, 200, render_group_reply(group, rows))

    app.group_asgi = group_asgi

    register_gym_routes(app, read_body, engine.tallies.masked_rollouts)
    register_openrlhf_route(app, read_body, engine, config)

    def judge_replicas() -> list[ReplicaState]:
        """Each replica's probe state: this process's, or under `serve --workers` the
        deployment's."""
        local = probe.readiness.replicas
        return local if worker_metrics is None else worker_metrics.judge_replicas(local)

    def health(status: str) -> bytes:
        workers = None if worker_metrics is None else worker_metrics.health()
        counts = {
            **engine.health(),
            "body_bytes_receiving": budget.receiving,
            "body_bytes_in_memory": budget.waiting,
            "body_bytes_spooled": spool.bytes_on_disk,
        }
        return render_healthz(
            status,
            counts,
            engine.store_status(),
            workers,
            num_rollouts_per_prompt=config.num_rollouts_per_prompt if config.group_mode else None,
            comparison_strategy=config.comparison_strategy,
            judge_replicas=_replicas_wire(judge_replicas()),
        )

    @app.get("/healthz")
    async def healthz() -> Response:
        if engine.closed:
            return _reply(503, health("shutting_down"))
        await engine.refresh_counts()
        return _reply(200, health("ok"))

    @app.get("/readyz")
    async def readyz() -> Response:
        if not engine.closed:
            await engine.refresh_counts()
        replicas = judge_replicas()
        store = engine.store_status()
        verdict = readiness_verdict(
            replicas, probing=probe.readiness.probing, store=store, shutting_down=engine.closed
        )
        body = render_readyz(verdict.status, verdict.reasons, _replicas_wire(replicas), store[1])
        return _reply(verdict.http_status, body)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        await engine.refresh_counts()
        if worker_metrics is None:
            body = render_metrics(prometheus)
        else:
            body = await worker_metrics.render()
        return Response(body, status=200, content_type=CONTENT_TYPE)

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return _reply(200, openapi_bytes)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        return _reply(*http_error_reply(exc, config.max_body_bytes))

    return app
