"""The quart-trio application: routes that translate HTTP to engine calls and back.

No behaviour lives here beyond reading bodies, mapping errors to `{"detail": ...}` and writing
replies; the engine and the wire module do the rest.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import httpx
import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, HTTPScope, Scope
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import (
    HTTPException,
    InternalServerError,
    RequestEntityTooLarge,
    RequestTimeout,
)

from genrm_trio import __version__
from genrm_trio.config import Config, config_from_mapping, config_warnings
from genrm_trio.core import messages
from genrm_trio.core.groups import Masked, Outcome, Scored
from genrm_trio.http.openapi import openapi_json
from genrm_trio.http.wire import (
    BadRequest,
    VerifyRequest,
    bound_failure_text,
    error_body,
    parse_compare_body,
    parse_verify_body,
    render_compare_reply,
    render_healthz,
    render_masked_row,
    render_scored_row,
)
from genrm_trio.runtime.compare import CompareUnavailable, run_compare
from genrm_trio.runtime.engine import Engine
from genrm_trio.runtime.hooks import Hooks

log = logging.getLogger("genrm_trio")

JSON = "application/json"


VerifyASGI = Callable[[HTTPScope, ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]


class GenRMApp(QuartTrio):
    """A quart-trio app that carries its engine (one independent server instance, I-20).

    `POST /verify` is the hot path: every rollout of every group passes through it, so it is
    answered straight from ASGI, without Quart's per-request context, routing and response
    objects, which cost about as much CPU as the rest of the request. Its replies are the ones
    the Quart route would give (the route stays registered for other methods and mounts);
    before/after-request hooks do not run for it. Every other route goes through Quart.
    """

    engine: Engine
    verify_asgi: VerifyASGI | None = None

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == "/verify"
            and scope["method"] == "POST"
            and not scope.get("root_path")
            and self.verify_asgi is not None
        ):
            await self.verify_asgi(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _reply(status: int, payload: bytes) -> Response:
    return Response(payload, status=status, content_type=JSON)


def _render(request: VerifyRequest, outcome: Outcome) -> tuple[int, bytes]:
    if isinstance(outcome, Scored):
        return 200, render_scored_row(request, outcome.reward, outcome.metrics)
    if isinstance(outcome, Masked):
        text = bound_failure_text(outcome.text, outcome.suffix)
        return 200, render_masked_row(request, text)
    return outcome.status, error_body(outcome.detail)


async def _send_reply(send: ASGISendCallable, status: int, payload: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


def _declared_length(scope: HTTPScope) -> int | None:
    for name, value in scope["headers"]:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


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
    judge_transport: httpx.AsyncBaseTransport | None = None,
    hooks: Hooks | None = None,
) -> GenRMApp:
    """Build an independent server instance; `judge_transport` replaces the judge's network."""
    if not isinstance(config, Config):
        config = config_from_mapping(config)
    # Free-form values may hold integers of any size and are echoed and fingerprinted exactly
    # (W-21, C-20); Python's default cap of 4300 digits would turn them into errors. Bodies
    # are bounded by max_body_bytes, which bounds the cost of converting them.
    sys.set_int_max_str_digits(0)
    app = GenRMApp("genrm_trio")
    # A /verify waits for its whole group: Quart's default 60 s response timeout would cut
    # waiting requests off long before the group's own deadlines.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    engine = Engine(config, judge_transport=judge_transport, hooks=hooks)
    app.engine = engine
    openapi_bytes = openapi_json(__version__)
    for warning in config_warnings(config):
        log.warning(warning)

    @app.before_serving
    async def start_engine() -> None:
        await app.nursery.start(engine.run)

    @app.after_serving
    async def stop_engine() -> None:
        await engine.shutdown()

    async def read_body() -> bytes:
        if request.content_length is not None and request.content_length > config.max_body_bytes:
            raise BadRequest(413, f"request body exceeds {config.max_body_bytes} bytes")
        try:
            body = await request.get_data(cache=False, as_text=False)
            assert isinstance(body, bytes)
            return body
        except RequestEntityTooLarge:
            raise BadRequest(413, f"request body exceeds {config.max_body_bytes} bytes") from None

    too_large = error_body(f"request body exceeds {config.max_body_bytes} bytes")

    @app.post("/verify")
    async def verify() -> Response:
        if engine.closed:
            return _reply(503, error_body(messages.SHUTTING_DOWN))
        try:
            parsed = parse_verify_body(await read_body(), config)
        except BadRequest as exc:
            return _reply(exc.status, error_body(exc.detail))
        return _reply(*_render(parsed, await engine.verify(parsed)))

    async def verify_asgi(
        scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """`POST /verify` straight from ASGI; the same replies as the route above."""
        if engine.closed:
            await _send_reply(send, 503, error_body(messages.SHUTTING_DOWN))
            return
        declared = _declared_length(scope)
        if declared is not None and declared > config.max_body_bytes:
            await _send_reply(send, 413, too_large)
            return
        chunks: list[bytes] = []
        size = 0
        timeout = app.config["BODY_TIMEOUT"]
        with trio.move_on_after(float("inf") if timeout is None else timeout) as reading:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = cast(bytes, message.get("body", b""))
                size += len(chunk)
                if size > config.max_body_bytes:
                    await _send_reply(send, 413, too_large)
                    return
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        if reading.cancelled_caught:
            await _send_reply(send, 408, _http_error_body(RequestTimeout()))
            return
        try:
            parsed = parse_verify_body(chunks[0] if len(chunks) == 1 else b"".join(chunks), config)
        except BadRequest as exc:
            await _send_reply(send, exc.status, error_body(exc.detail))
            return
        except Exception:
            log.exception("Exception on request POST /verify")
            await _send_reply(send, 500, _http_error_body(InternalServerError()))
            return
        del chunks
        reply: tuple[int, bytes] | None = None
        # Work the engine leaves for after the reply, so that it does not delay it.
        after_reply: list[Callable[[], None]] = []
        try:
            try:
                # A client that leaves while its group is still collecting or judging cancels
                # only its own wait (C-51), as it does through Quart.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
                    reply = _render(parsed, await engine.verify(parsed, after_reply=after_reply))
                    nursery.cancel_scope.cancel()
            except Exception:
                log.exception("Exception on request POST /verify")
                reply = (500, _http_error_body(InternalServerError()))
            if reply is not None:
                await _send_reply(send, *reply)
        finally:
            for work in after_reply:
                work()

    app.verify_asgi = verify_asgi

    @app.post("/compare")
    async def compare() -> Response:
        if engine.closed:
            return _reply(503, error_body(messages.SHUTTING_DOWN))
        try:
            parsed = parse_compare_body(await read_body(), config)
        except BadRequest as exc:
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
            return _reply(503, error_body(exc.detail))
        except Exception as exc:
            log.error("GenRM compare failed", exc_info=exc)
            detail = f"GenRM compare failed: {messages.exception_text(exc)}"
            return _reply(500, error_body(detail))
        payload = render_compare_reply(result.rewards, result.comparison_results, result.metrics)
        return _reply(200, payload)

    @app.get("/healthz")
    async def healthz() -> Response:
        if engine.closed:
            return _reply(503, render_healthz("shutting_down", engine.health()))
        return _reply(200, render_healthz("ok", engine.health()))

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return _reply(200, openapi_bytes)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        if isinstance(exc, RequestEntityTooLarge):
            return _reply(413, error_body(f"request body exceeds {config.max_body_bytes} bytes"))
        return _reply(status, error_body(f"{exc.name}: {exc.description}"))

    return app
