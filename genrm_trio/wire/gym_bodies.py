"""NeMo Gym's resources-server routes besides /verify, on the wire: the request and reply shapes
of `/seed_session`, `/close_session` and `/aggregate_metrics`, the validation of their bodies,
and Gym's AggregateMetrics with genrm-trio's counts, built from a run's rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import msgspec

from genrm_trio.core.gym_metrics import ROLLOUT_KEY as ROLLOUT_INDEX_KEY
from genrm_trio.core.gym_metrics import TASK_KEY as TASK_INDEX_KEY
from genrm_trio.core.gym_metrics import gym_aggregate
from genrm_trio.core.records import RowsGroup, rows_group
from genrm_trio.core.run_metrics import RunMetrics, summarize_rows
from genrm_trio.wire import _json_scan
from genrm_trio.wire.bodies import BadRequest, json_kind
from genrm_trio.wire.parsing import split_members

ROWS_KEY: Final = "verify_responses"
# The failure class of a masked row this server answered (W-30).
MASKED_ROW_CLASS: Final = "judge_failed"
# What only this server knows, added to Gym's keys overall and per task.
_KEY_METRICS: Final[tuple[str, ...]] = ("mask_rate", "scored", "failed")


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
    """Gym's AggregateMetrics: Gym's own keys with Gym's definitions (`core.gym_metrics`), and
    genrm-trio's counts added overall and per task.

    genrm-trio's keys: `rows` (rows given), `scored`, `failed`, `failures/<class>`,
    `masked_by_server` (rollouts of these rows' groups that this server answered masked, given
    or not), `rollouts` (rows given plus those masked rollouts that are not among them) and
    `mask_rate` (failed / rollouts). A masked rollout the collector kept out of the rows thus
    still counts, in `failed`, `failures/judge_failed` and `mask_rate`.
    """

    group_level_metrics: list[dict[str, Any]] = msgspec.field(default_factory=list)
    agent_metrics: dict[str, Any] = msgspec.field(default_factory=dict)
    key_metrics: dict[str, Any] = msgspec.field(default_factory=dict)
    perf_summary: dict[str, Any] | None = None
    repeat_level_metrics: list[dict[str, Any]] = msgspec.field(default_factory=list)


_ROWS_EXPECTED: Final = "an array of objects"
SESSION_ID_KEY: Final = "resources_session_id"
_SESSION_ID_EXPECTED: Final = "a non-empty string"
# Gym's ReverifyMode: `gym eval reverify` refuses a server that is not `stateless`.
REVERIFY_MODE: Final = "unsupported"


def _members(body: bytes, decode: frozenset[str]) -> dict[str, _json_scan.Member]:
    return split_members(body, decode)[0]


def _session_id(member: _json_scan.Member | None) -> str | None:
    if member is None:
        return None
    value = member.value
    if not isinstance(value, str) or not value:
        got = "" if isinstance(value, str) else f", got {json_kind(value)}"
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
        raise BadRequest(422, f"{ROWS_KEY}: expected {_ROWS_EXPECTED}, got {json_kind(rows)}")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise BadRequest(422, f"{ROWS_KEY}[{index}]: expected an object, got {json_kind(row)}")
    return rows


def counts(metrics: RunMetrics, unseen_masked: int, masked_by_server: int) -> dict[str, Any]:
    """genrm-trio's counts over some rows, with the masked rollouts that are not among them."""
    failures = dict(metrics.failures_by_class)
    if unseen_masked:
        failures[MASKED_ROW_CLASS] = failures.get(MASKED_ROW_CLASS, 0) + unseen_masked
    rollouts = metrics.rows + unseen_masked
    failed = metrics.failed + unseen_masked
    flat: dict[str, Any] = {
        "rows": metrics.rows,
        "scored": metrics.scored,
        "failed": failed,
        "rollouts": rollouts,
        "masked_by_server": masked_by_server,
        "mask_rate": failed / rollouts if rollouts else 0.0,
    }
    for failure_class, count in sorted(failures.items()):
        flat[f"failures/{failure_class}"] = count
    return flat


def _task_of(row: Mapping[str, Any]) -> Any:
    # Gym's grouping: a row without a task index is task 0.
    task = row.get(TASK_INDEX_KEY)
    return 0 if task is None else task


def _int_or(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _rows_group(row: Mapping[str, Any]) -> RowsGroup | None:
    group_id = row.get("_ng_group_id")
    attempt = _int_or(row.get("_ng_group_attempt"), 0)
    return rows_group(
        group_id if isinstance(group_id, str) else None,
        attempt if attempt is not None else 0,
        _int_or(row.get(TASK_INDEX_KEY), None),
    )


def aggregate_metrics(
    rows: Iterable[Mapping[str, Any]],
    masked_rollouts: Callable[[RowsGroup], frozenset[int] | None] = lambda group: None,
) -> AggregateMetricsReply:
    """Gym's AggregateMetrics over ``rows`` with genrm-trio's counts; ``masked_rollouts`` says
    which slots of a group the server answered masked, when it knows."""
    rows = list(rows)
    if not rows:
        return AggregateMetricsReply()
    gym = gym_aggregate(rows)
    by_task: dict[Any, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_task.setdefault(_task_of(row), []).append(row)
    slots_given: dict[RowsGroup, set[Any]] = {}
    task_of_group: dict[RowsGroup, Any] = {}
    for row in rows:
        group = _rows_group(row)
        if group is not None:
            slots_given.setdefault(group, set()).add(row.get(ROLLOUT_INDEX_KEY))
            task_of_group.setdefault(group, _task_of(row))
    unseen: dict[Any, int] = {}
    known: dict[Any, int] = {}
    for group, given in slots_given.items():
        masked = masked_rollouts(group)
        if masked:
            task = task_of_group[group]
            unseen[task] = unseen.get(task, 0) + len(masked - given)
            known[task] = known.get(task, 0) + len(masked)
    ours = {
        task: counts(summarize_rows(task_rows), unseen.get(task, 0), known.get(task, 0))
        for task, task_rows in by_task.items()
    }
    groups = {entry[TASK_INDEX_KEY]: entry for entry in gym["group_level_metrics"]}
    for task, flat in ours.items():
        groups.setdefault(task, {TASK_INDEX_KEY: task}).update(flat)
    overall = counts(summarize_rows(rows), sum(unseen.values()), sum(known.values()))
    agent_metrics = {**gym["agent_metrics"], **overall}
    key_metrics = {**gym["key_metrics"], **{name: overall[name] for name in _KEY_METRICS}}
    return AggregateMetricsReply(
        group_level_metrics=[groups[task] for task in sorted(groups, key=_task_order)],
        agent_metrics=agent_metrics,
        key_metrics=key_metrics,
        repeat_level_metrics=gym["repeat_level_metrics"],
    )


def _task_order(task: Any) -> tuple[int, Any]:
    # Task indices are integers in Gym's rows; anything else sorts after them, by its text.
    return (0, task) if isinstance(task, int) else (1, str(task))
