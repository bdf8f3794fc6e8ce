"""The quart-trio application: routes that translate HTTP to engine calls and back.

No behaviour lives here beyond reading bodies, mapping errors to `{"detail": ...}` and writing
replies; the engine and the wire module do the rest.
"""

from __future__ import annotations

import hashlib
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
    RequestTimeout,
)

from genrm_trio import __version__
from genrm_trio.config import Config, config_from_mapping, config_warnings
from genrm_trio.core import messages
from genrm_trio.core.canonical import fingerprint_json
from genrm_trio.core.groups import Masked, Outcome, Scored
from genrm_trio.core.identity import ResponseIdentity
from genrm_trio.http.gym_endpoints import register_gym_routes
from genrm_trio.http.openapi import openapi_json
from genrm_trio.http.openrlhf_endpoint import register_openrlhf_route
from genrm_trio.http.prometheus import (
    CONTENT_TYPE,
    EngineCollector,
    metrics_registry,
    render_metrics,
)
from genrm_trio.http.receiving import BodyReceiver, Refused
from genrm_trio.http.spool import Spool, SpoolBudget, SpoolError, SpoolFile, spool_failed
from genrm_trio.http.whole_groups import (
    GROUP_ROUTE,
    first_rejection,
    parse_group_body,
    render_group_reply,
    run_members,
)
from genrm_trio.http.worker_metrics import WorkerMetrics, worker_settings
from genrm_trio.judge.transport import TransportFactory
from genrm_trio.runtime.compare import CompareUnavailable, run_compare
from genrm_trio.runtime.engine import Engine
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.runtime.stores import build_engine
from genrm_trio.wire.bodies import BadRequest, EchoValue, FileSpan, VerifyRequest
from genrm_trio.wire.parsing import body_too_large, parse_compare_body, parse_verify_body
from genrm_trio.wire.rendering import (
    bound_failure_text,
    error_body,
    masked_row_parts,
    render_compare_reply,
    render_healthz,
    scored_row_parts,
)

log = logging.getLogger("genrm_trio")

JSON = "application/json"


VerifyASGI = Callable[[HTTPScope, ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]


class GenRMApp(QuartTrio):
    """A quart-trio app that carries its engine (one independent server instance, I-20).

    `/verify` is the hot path: every rollout of every group passes through it, so it is
    answered straight from ASGI, without Quart's per-request context, routing and response
    objects, which cost about as much CPU as the rest of the request. It is the only
    implementation of the route: Quart never sees `/verify`, so before/after-request hooks do
    not run for it. `/verify_group` is answered from ASGI too, because Quart reads a body as it
    arrives, before the handler runs: the group's body must wait, unread, for room in
    `waiting_body_memory_bytes`. Every other route goes through Quart.
    """

    engine: Engine
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
                        await _send_reply(
                            send, 405, _http_error_body(MethodNotAllowed()), _ALLOW_POST
                        )
                    return
        await super().__call__(scope, receive, send)


_ALLOW_POST: Final = ((b"allow", b"POST"),)
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


def _render_parts(request: VerifyRequest, outcome: Outcome) -> tuple[int, list[EchoValue]]:
    """The reply in parts; a spooled request's large echoed values stay spans of its file."""
    if isinstance(outcome, Scored):
        return 200, scored_row_parts(request, outcome.reward, outcome.metrics)
    if isinstance(outcome, Masked):
        text = bound_failure_text(outcome.text, outcome.suffix)
        return 200, masked_row_parts(request, text, outcome.placeholder)
    return outcome.status, [error_body(outcome.detail)]


def _spool_and_fingerprint(
    spool: Spool, request: VerifyRequest
) -> tuple[SpoolFile, tuple[bytes, bytes]]:
    """In a worker thread: the body to a file, and what its member's identity needs once the
    bytes are gone from memory (the raw digest and the canonical fingerprint)."""
    file = spool.write_sync(request.body)
    raw = request.response_view()
    return file, (hashlib.sha256(raw).digest(), fingerprint_json(raw))


async def _send_streamed(
    send: ASGISendCallable, status: int, parts: list[EchoValue], spool: Spool, file: SpoolFile
) -> None:
    """Send a reply whose large parts are read from the request's spool file as it goes."""
    length = sum(len(part) for part in parts)
    # Opened before the head is sent, so that a missing file is still a whole 503.
    async with spool.reader(file) as reader:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % length)]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        pending: list[bytes | memoryview] = []
        for part in parts:
            if not isinstance(part, FileSpan):
                pending.append(part)
                continue
            if pending:
                await send(
                    {"type": "http.response.body", "body": b"".join(pending), "more_body": True}
                )
                pending = []
            try:
                async for chunk in reader.chunks(part.start, part.end):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except SpoolError as exc:
                # The head is out: the connection is cut, and the length it announced tells the
                # client the row is incomplete; it is never taken for a whole one.
                raise RuntimeError(f"reply cut short: {exc.cause}") from None
        await send({"type": "http.response.body", "body": b"".join(pending), "more_body": False})


# A reply from a body in memory goes out in pieces of about this size: its large values are
# views of the request's body, so no copy of the whole row is made while it is sent.
REPLY_PIECE_BYTES: Final = 64 * 1024


async def _send_parts(send: ASGISendCallable, status: int, parts: list[bytes | memoryview]) -> None:
    length = sum(len(part) for part in parts)
    if length <= REPLY_PIECE_BYTES:
        await _send_reply(send, status, b"".join(parts))
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % length)]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    pending: list[bytes | memoryview] = []
    pending_size = 0
    for part in parts:
        if len(part) < REPLY_PIECE_BYTES:
            pending.append(part)
            pending_size += len(part)
            if pending_size < REPLY_PIECE_BYTES:
                continue
            piece = b"".join(pending)
            pending, pending_size = [], 0
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            continue
        if pending:
            piece = b"".join(pending)
            pending, pending_size = [], 0
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        view = memoryview(part)
        for start in range(0, len(view), REPLY_PIECE_BYTES):
            piece = bytes(view[start : start + REPLY_PIECE_BYTES])
            await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b"".join(pending), "more_body": False})


async def _send_reply(
    send: ASGISendCallable,
    status: int,
    payload: bytes,
    extra_headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    headers.extend(extra_headers)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _cancel_on_disconnect(receive: ASGIReceiveCallable, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` once the client has gone (the body has been read by then)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def _http_error_body(exc: HTTPException) -> bytes:
    return error_body(f"{exc.name}: {exc.description}")


def create_app(
    config: Config | Mapping[str, Any],
    *,
    judge_transport: TransportFactory | None = None,
    hooks: Hooks | None = None,
) -> GenRMApp:
    """Build an independent server instance; `judge_transport` replaces the judge's network."""
    if not isinstance(config, Config):
        config = config_from_mapping(config)
    app = GenRMApp("genrm_trio")
    # A /verify waits for its whole group: Quart's default 60 s response timeout would cut
    # waiting requests off long before the group's own deadlines.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    engine = build_engine(config, judge_transport=judge_transport, hooks=hooks)
    app.engine = engine
    budget = SpoolBudget(config.waiting_body_memory_bytes)
    receiver = BodyReceiver(budget, config.max_body_bytes, app.config["BODY_TIMEOUT"])
    spool = Spool(config.spool_dir)
    app.spool = spool
    app.spool_budget = budget
    app.body_receiver = receiver
    openapi_bytes = openapi_json(__version__)
    metrics = engine.metrics
    prometheus = metrics_registry(engine, spool, budget)
    # One of `serve --workers N`'s workers: /metrics and /healthz speak for the whole server.
    worker = worker_settings(os.environ)
    worker_metrics = (
        None if worker is None else WorkerMetrics(worker, EngineCollector(engine, spool, budget))
    )
    for warning in config_warnings(config):
        log.warning(warning)

    @app.before_serving
    async def start_engine() -> None:
        if config.waiting_body_memory_bytes is not None:
            spool.prepare()
        await app.nursery.start(engine.run)
        if worker_metrics is not None:
            await app.nursery.start(worker_metrics.run)

    @app.after_serving
    async def stop_engine() -> None:
        await engine.shutdown()
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

    too_large = error_body(body_too_large(config.max_body_bytes))

    async def refuse(send: ASGISendCallable, refused: Refused) -> None:
        metrics.verify("invalid")
        if refused.status == 413:
            await _send_reply(send, 413, too_large)
        else:
            await _send_reply(send, 408, _http_error_body(RequestTimeout()))

    async def verify_asgi(
        scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """`POST /verify`, straight from ASGI."""
        if engine.closed:
            metrics.verify("unavailable")
            await _send_reply(send, 503, error_body(messages.SHUTTING_DOWN))
            return
        async with receiver.receive(scope, receive) as received:
            if received is None:
                return  # the client left while sending
            if isinstance(received, Refused):
                await refuse(send, received)
                return
            try:
                parsed = parse_verify_body(received.take_body(), config)
            except BadRequest as exc:
                metrics.verify("invalid")
                await _send_reply(send, exc.status, error_body(exc.detail))
                return
            except Exception:
                metrics.verify("error")
                log.exception("Exception on request POST /verify")
                await _send_reply(send, 500, _http_error_body(InternalServerError()))
                return
            if received.within_budget:
                received.admitted()
                await _verify_and_reply(parsed, None, receive, send)
                return
            # Beyond the memory budget the body waits in a file. Nothing has happened to the
            # request's group yet, so a disk that cannot take it is a clean 503.
            try:
                file, known = await trio.to_thread.run_sync(_spool_and_fingerprint, spool, parsed)
            except SpoolError as exc:
                metrics.verify("unavailable")
                await _send_reply(send, 503, error_body(spool_failed(exc.cause, budget)))
                return
            try:
                parsed.known_fingerprints = known
                engine.counters.response_digests += 1
                engine.counters.canonical_fingerprints += 1
                parsed.spool_out()
                received.spooled()
                await _verify_and_reply(parsed, file, receive, send)
            finally:
                await spool.remove(file)

    async def _verify_and_reply(
        parsed: VerifyRequest,
        file: SpoolFile | None,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
    ) -> None:
        def spool_out(identity: ResponseIdentity) -> None:
            # The request waits and its body lives in the file only: the identity's view of
            # the bytes it was built with goes too.
            if file is not None:
                identity.release()

        reply: tuple[int, list[EchoValue]] | None = None
        # Work the engine leaves for after the reply, so that it does not delay it.
        after_reply: list[Callable[[], None]] = []
        try:
            try:
                # A client that leaves while its group is still collecting or judging cancels
                # only its own wait (C-51), as it does through Quart.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
                    outcome = await engine.verify(
                        parsed, after_reply=after_reply, on_wait=spool_out
                    )
                    reply = _render_parts(parsed, outcome)
                    nursery.cancel_scope.cancel()
            except Exception:
                metrics.verify("error")
                log.exception("Exception on request POST /verify")
                reply = (500, [_http_error_body(InternalServerError())])
            if reply is None:
                return
            status, parts = reply
            if file is not None and parsed.spooled:
                try:
                    await _send_streamed(send, status, parts, spool, file)
                except SpoolError as exc:
                    # Only a file that cannot be opened gets here: nothing was sent yet.
                    log.error("GenRM could not read a spooled request body: %s", exc.cause)
                    await _send_reply(send, 503, error_body(spool_failed(exc.cause, budget)))
                return
            await _send_parts(send, status, cast(list[bytes | memoryview], parts))
        finally:
            for work in after_reply:
                work()

    app.verify_asgi = verify_asgi

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
            metrics.verify("unavailable")
            await _send_reply(send, 503, error_body(messages.SHUTTING_DOWN))
            return
        # A group's body stays in memory until the group is judged (it is not spooled: judging
        # starts as soon as it is read). Beyond the budget it waits unread, and the client's
        # upload with it; every group admitted completes on its own, so the wait always ends.
        async with receiver.receive_held(scope, receive) as received:
            if received is None:
                return  # the client left while sending
            if isinstance(received, Refused):
                await refuse(send, received)
                return
            body = received.take_body()
            try:
                group = parse_group_body(body, config)
            except BadRequest as exc:
                metrics.verify("invalid")
                await _send_reply(send, exc.status, error_body(exc.detail))
                return
            del body
            received.admitted()
            outcomes: list[Outcome | None] | None = None
            try:
                # A client that leaves ends its own wait only (C-51), as on /verify.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
                    outcomes = await run_members(engine, group.members)
                    nursery.cancel_scope.cancel()
            except Exception:
                metrics.verify("error")
                log.exception("Exception on request POST /verify_group")
                await _send_reply(send, 500, _http_error_body(InternalServerError()))
                return
            if outcomes is None:
                return
            rejected = first_rejection(outcomes)
            if rejected is not None:
                await _send_reply(send, rejected.status, error_body(rejected.detail))
                return
            rows = [o for o in outcomes if isinstance(o, Scored | Masked)]
            await _send_reply(send, 200, render_group_reply(group, rows))

    app.group_asgi = group_asgi

    register_gym_routes(app, read_body, engine.registry.masked_rollouts)
    register_openrlhf_route(app, read_body, engine, config)

    def health(status: str) -> bytes:
        workers = None if worker_metrics is None else worker_metrics.health()
        counts = {
            **engine.health(),
            "body_bytes_receiving": budget.receiving,
            "body_bytes_in_memory": budget.waiting,
            "body_bytes_spooled": spool.bytes_on_disk,
        }
        return render_healthz(status, counts, engine.store_status(), workers)

    @app.get("/healthz")
    async def healthz() -> Response:
        if engine.closed:
            return _reply(503, health("shutting_down"))
        await engine.refresh_counts()
        return _reply(200, health("ok"))

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
        status = exc.code or 500
        if isinstance(exc, RequestEntityTooLarge):
            return _reply(413, error_body(body_too_large(config.max_body_bytes)))
        return _reply(status, error_body(f"{exc.name}: {exc.description}"))

    return app
