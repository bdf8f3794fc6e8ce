"""NeMo Gym's resources-server routes besides /verify: `POST /seed_session`,
`POST /close_session`, `GET /reverify_mode` and `POST /aggregate_metrics`, with Gym's request and
reply shapes.

Gym's agents call `/seed_session` before every rollout (an environment server seeds and closes a
session by its `resources_session_id`) and pass `/aggregate_metrics` through at the end of a
collection. Sessions keep no state here: a group's identity travels on each /verify row.
`/reverify_mode` is `unsupported`: a group judge cannot score one stored row on its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

import msgspec
from quart import Response
from quart_trio import QuartTrio

from genrm_trio.core.run_metrics import RunMetrics, summarize_rows
from genrm_trio.http import json_scan
from genrm_trio.http.bodies import BadRequest
from genrm_trio.http.parsing import split_members
from genrm_trio.http.rendering import error_body

TASK_INDEX_KEY: Final = "_ng_task_index"
ROWS_KEY: Final = "verify_responses"
# The reward statistics under Gym's `<statistic>/<field>` names, so that Gym's collector logs
# them as it logs its own (its default headline metrics are the `mean/` entries).
_REWARD_STATISTICS: Final = (
    ("mean/reward", "reward_mean"),
    ("std/reward", "reward_std"),
    ("min/reward", "reward_min"),
    ("max/reward", "reward_max"),
    ("median/reward", "reward_median"),
)
_KEY_METRICS: Final[tuple[str, ...]] = ("mean/reward", "mask_rate", "scored", "failed")


class SeedSessionRequestDoc(msgspec.Struct, frozen=True, kw_only=True):
    """Any JSON object (Gym's agents send the rollout's run request; an environment server
    sends its `resources_session_id`); nothing is kept."""

    resources_session_id: str | msgspec.UnsetType = msgspec.UNSET


class SeedSessionReply(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An empty object, or the `resources_session_id` an environment server seeded with: there
    is no session state to seed."""

    resources_session_id: str | msgspec.UnsetType = msgspec.UNSET


class CloseSessionRequestDoc(msgspec.Struct, frozen=True, kw_only=True):
    """Gym's ResourcesCloseSessionRequest; nothing is kept, so nothing is released."""

    resources_session_id: str
    episode_id: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class CloseSessionReply(msgspec.Struct, frozen=True, kw_only=True):
    """Gym's ResourcesCloseSessionResponse: the session id, confirmed closed."""

    resources_session_id: str


class AggregateMetricsRequestDoc(msgspec.Struct, frozen=True, kw_only=True):
    """Finished rows of a run (/verify replies, with or without their heavy fields)."""

    verify_responses: list[dict[str, Any]]


class AggregateMetricsReply(msgspec.Struct, frozen=True, kw_only=True):
    """Gym's AggregateMetrics: flat metric names, overall and per task.

    Metrics: `rows`, `scored`, `failed`, `mask_rate` (failed / rows), `failures/<class>` for each
    failure class present, and over scored rows only `mean/reward`, `std/reward` (population),
    `min/reward`, `max/reward`, `median/reward` (absent when no row is scored).
    """

    group_level_metrics: list[dict[str, Any]] = msgspec.field(default_factory=list)
    agent_metrics: dict[str, Any] = msgspec.field(default_factory=dict)
    key_metrics: dict[str, Any] = msgspec.field(default_factory=dict)


_ENCODER: Final = msgspec.json.Encoder()
_ROWS_EXPECTED: Final = "an array of objects"
SESSION_ID_KEY: Final = "resources_session_id"
_SESSION_ID_EXPECTED: Final = "a non-empty string"
# Gym's ReverifyMode: `gym eval reverify` refuses a server that is not `stateless`.
REVERIFY_MODE: Final = "unsupported"


def _members(body: bytes, decode: frozenset[str]) -> dict[str, json_scan.Member]:
    return split_members(body, decode)[0]


def _session_id(member: json_scan.Member | None) -> str | None:
    if member is None:
        return None
    value = member.value
    if not isinstance(value, str) or not value:
        got = "" if isinstance(value, str) else f", got {_kind(value)}"
        raise BadRequest(422, f"{SESSION_ID_KEY}: expected {_SESSION_ID_EXPECTED}{got}")
    return value


def parse_seed_session_body(body: bytes) -> str | None:
    """Any JSON object is a valid seed request; the environment server's session id if sent."""
    return _session_id(_members(body, frozenset({SESSION_ID_KEY})).get(SESSION_ID_KEY))


def parse_close_session_body(body: bytes) -> str:
    """The session id of a close request; ``BadRequest`` names the field when it is bad."""
    session = _session_id(_members(body, frozenset({SESSION_ID_KEY})).get(SESSION_ID_KEY))
    if session is None:
        raise BadRequest(
            422, f"{SESSION_ID_KEY}: required field missing (expected {_SESSION_ID_EXPECTED})"
        )
    return session


def parse_aggregate_metrics_body(body: bytes) -> list[dict[str, Any]]:
    """The rows of an aggregate-metrics request; ``BadRequest`` names the first bad field."""
    member = _members(body, frozenset({ROWS_KEY})).get(ROWS_KEY)
    if member is None:
        raise BadRequest(422, f"{ROWS_KEY}: required field missing (expected {_ROWS_EXPECTED})")
    rows = member.value
    if not isinstance(rows, list):
        raise BadRequest(422, f"{ROWS_KEY}: expected {_ROWS_EXPECTED}, got {_kind(rows)}")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise BadRequest(422, f"{ROWS_KEY}[{index}]: expected an object, got {_kind(row)}")
    return rows


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def flat_metrics(metrics: RunMetrics) -> dict[str, Any]:
    """One RunMetrics under flat names, as Gym logs them (W&B, MLflow)."""
    flat: dict[str, Any] = {
        "rows": metrics.rows,
        "scored": metrics.scored,
        "failed": metrics.failed,
        "mask_rate": metrics.mask_rate,
    }
    for failure_class, count in metrics.failures_by_class.items():
        flat[f"failures/{failure_class}"] = count
    for name, attribute in _REWARD_STATISTICS:
        value = getattr(metrics, attribute)
        if value is not None:
            flat[name] = value
    return flat


def _task_of(row: Mapping[str, Any]) -> int | None:
    task = row.get(TASK_INDEX_KEY)
    return task if isinstance(task, int) and not isinstance(task, bool) else None


def aggregate_metrics(rows: Iterable[Mapping[str, Any]]) -> AggregateMetricsReply:
    """Gym's AggregateMetrics over ``rows``: the whole run, then each task in index order
    (rows without an integer task index together, last)."""
    rows = list(rows)
    if not rows:
        return AggregateMetricsReply()
    by_task: dict[int | None, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_task.setdefault(_task_of(row), []).append(row)
    order = sorted(by_task, key=lambda task: (task is None, task or 0))
    groups = [
        {TASK_INDEX_KEY: task} | flat_metrics(summarize_rows(by_task[task])) for task in order
    ]
    overall = flat_metrics(summarize_rows(rows))
    key_metrics = {name: overall[name] for name in _KEY_METRICS if name in overall}
    return AggregateMetricsReply(
        group_level_metrics=groups, agent_metrics=overall, key_metrics=key_metrics
    )


def register_gym_routes(app: QuartTrio, read_body: Callable[[], Awaitable[bytes]]) -> None:
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
        return reply(200, _ENCODER.encode(aggregate_metrics(rows)))
