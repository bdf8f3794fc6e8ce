"""NeMo Gym's resources-server routes besides /verify: `POST /seed_session`,
`POST /close_session`, `GET /reverify_mode` and `POST /aggregate_metrics`. Gym's request and reply
shapes, the checks of the bodies and the metrics are in ``wire.gym_bodies``.

Gym's agents call `/seed_session` before every rollout (an environment server seeds and closes a
session by its `resources_session_id`) and pass `/aggregate_metrics` through at the end of a
collection. Sessions keep no state here: a group's identity travels on each /verify row.
`/reverify_mode` is `unsupported`: a group judge cannot score one stored row on its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
from quart import Response
from quart_trio import QuartTrio

from genrm_trio.core.records import RowsGroup
from genrm_trio.wire.bodies import BadRequest
from genrm_trio.wire.gym_bodies import (
    REVERIFY_MODE,
    CloseSessionReply,
    SeedSessionReply,
    aggregate_metrics,
    parse_aggregate_metrics_body,
    parse_close_session_body,
    parse_seed_session_body,
)
from genrm_trio.wire.rendering import error_body

_ENCODER: Final = msgspec.json.Encoder()


def register_gym_routes(
    app: QuartTrio,
    read_body: Callable[[], Awaitable[bytes]],
    masked_rollouts: Callable[[RowsGroup], frozenset[int] | None],
) -> None:
    """Add Gym's session, reverify-mode and metrics routes to ``app``; ``read_body`` reads the
    request body under the server's body limit (413)."""

    def reply(status: int, payload: bytes) -> Response:
        return Response(payload, status=status, content_type="application/json")

    @app.post("/seed_session")
    async def seed_session() -> Response:
        try:
            session = parse_seed_session_body(await read_body())
        except BadRequest as exc:
            return reply(exc.status, error_body(exc.detail))
        seeded = (
            SeedSessionReply()
            if session is None
            else SeedSessionReply(resources_session_id=session)
        )
        return reply(200, _ENCODER.encode(seeded))

    @app.post("/close_session")
    async def close_session() -> Response:
        try:
            session = parse_close_session_body(await read_body())
        except BadRequest as exc:
            return reply(exc.status, error_body(exc.detail))
        return reply(200, _ENCODER.encode(CloseSessionReply(resources_session_id=session)))

    @app.get("/reverify_mode")
    async def reverify_mode() -> Response:
        return reply(200, _ENCODER.encode(REVERIFY_MODE))

    @app.post("/aggregate_metrics")
    async def aggregate() -> Response:
        try:
            rows = parse_aggregate_metrics_body(await read_body())
        except BadRequest as exc:
            return reply(exc.status, error_body(exc.detail))
        return reply(200, _ENCODER.encode(aggregate_metrics(rows, masked_rollouts)))
