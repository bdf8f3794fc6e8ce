"""The quart-trio application: routes that translate HTTP to engine calls and back.

No behaviour lives here beyond reading bodies, mapping errors to `{"detail": ...}` and writing
replies; the engine and the wire module do the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

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


class GenRMApp(QuartTrio):
    """A quart-trio app that carries its engine (one independent server instance, I-20)."""

    engine: Engine


def _reply(status: int, payload: bytes) -> Response:
    return Response(payload, status=status, content_type=JSON)


def _render(request: VerifyRequest, outcome: Outcome) -> Response:
    if isinstance(outcome, Scored):
        return _reply(200, render_scored_row(request, outcome.reward, outcome.metrics))
    if isinstance(outcome, Masked):
        text = bound_failure_text(outcome.text, outcome.suffix)
        return _reply(200, render_masked_row(request, text))
    return _reply(outcome.status, error_body(outcome.detail))


def create_app(
    config: Config | Mapping[str, Any],
    *,
    judge_transport: httpx.AsyncBaseTransport | None = None,
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

    @app.post("/verify")
    async def verify() -> Response:
        if engine.closed:
            return _reply(503, error_body(messages.SHUTTING_DOWN))
        try:
            parsed = parse_verify_body(await read_body(), config)
        except BadRequest as exc:
            return _reply(exc.status, error_body(exc.detail))
        return _render(parsed, await engine.verify(parsed))

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
