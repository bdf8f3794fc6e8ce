"""NeMo Gym's resources-server routes besides /verify: `POST /seed_session` and
`POST /aggregate_metrics`, with Gym's request and reply shapes.

Gym's agents call `/seed_session` before every rollout and pass `/aggregate_metrics` through at
the end of a collection. Seeding keeps no state here: a group's identity travels on each /verify
row. Aggregation reports the run metrics of `core.run_metrics` (scored rows only, the mask rate
and failures by class) over the rows it is given, overall and per task.
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
    """Any JSON object (Gym's agents send the rollout's run request); nothing is kept."""


class SeedSessionReply(msgspec.Struct, frozen=True, kw_only=True):
    """An empty object: there is no session state to seed."""


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
_SEED_REPLY: Final = _ENCODER.encode(SeedSessionReply())
_ROWS_EXPECTED: Final = "an array of objects"


def _members(body: bytes, decode: frozenset[str]) -> dict[str, json_scan.Member]:
    return split_members(body, decode)[0]


def parse_seed_session_body(body: bytes) -> None:
    """Any JSON object is a valid seed request."""
    _members(body, frozenset())


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
    """Add `/seed_session` and `/aggregate_metrics` to ``app``; ``read_body`` reads the request
    body under the server's body limit (413)."""

    def reply(status: int, payload: bytes) -> Response:
        return Response(payload, status=status, content_type="application/json")

    @app.post("/seed_session")
    async def seed_session() -> Response:
        try:
            parse_seed_session_body(await read_body())
        except BadRequest as exc:
            return reply(exc.status, error_body(exc.detail))
        return reply(200, _SEED_REPLY)

    @app.post("/aggregate_metrics")
    async def aggregate() -> Response:
        try:
            rows = parse_aggregate_metrics_body(await read_body())
        except BadRequest as exc:
            return reply(exc.status, error_body(exc.detail))
        return reply(200, _ENCODER.encode(aggregate_metrics(rows)))
