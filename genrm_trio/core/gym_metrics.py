"""NeMo Gym's aggregate metrics over finished rows, computed the way Gym's own resources servers
compute them (its reward profiler, `nemo_gym.reward_profile`), in plain Python.

Definitions, as Gym states and applies them:

- A row with a true `mask_sample` is not a measurement: quality statistics come from the other
  (*measured*) rows only, and masking is reported as `coverage/*` keys, present only when some row
  is masked. When every row is masked only the coverage keys remain.
- The *columns* of a measured row are its numeric top-level fields whose names do not start with
  `_` (booleans as 0 or 1, `mask_sample` left out), together with the numeric fields of
  `response.usage` (which win over a top-level field of the same name).
- Over a set of rows each column gets `mean/`, `max/`, `min/`, `median/` and `std/` (the sample
  standard deviation; where it is undefined for every column, the columns with no gap get 0).
  A statistic that is undefined (a column no row has) is left out.
- `group_level_metrics` has one entry per task (`_ng_task_index`, 0 when absent) with those
  statistics and `num_rollouts`, `expected_num_rollouts`, `missing_num_rollouts`,
  `reward_profile_completion_pct`, `sample` and `rollout_infos` over its measured rows.
- `repeat_level_metrics` has, when the measured rows have more than one `_ng_rollout_index`, one
  entry per rollout index: `sample_count` and `missing_count` (tasks with and without a measured
  row at that index) and per column `mean/`, `median/`, `std/`, `sem/`, `min/`, `max/`, `p25/`,
  `p75/` (linear interpolation) and the 95% Student-t interval `ci_low_95/`, `ci_high_95/`.
- `agent_metrics` holds the statistics over all measured rows, the coverage keys, `num_repeats`
  (rollout indices among all rows) and, across the repeat entries, for each primary `mean/<col>`:
  `mean_across_repeats/`, `median_across_repeats/`, `std_across_repeats/`, `min_across_repeats/`,
  `max_across_repeats/`, `se_across_repeats/` and the 95% interval.
- `key_metrics` holds the `mean/` entries of `agent_metrics` and the coverage keys.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any, Final

TASK_KEY: Final = "_ng_task_index"
ROLLOUT_KEY: Final = "_ng_rollout_index"
MASK_KEY: Final = "mask_sample"
AGENT_REF: Final = {"name": "agent"}
_SUMMARY_STATS: Final = ("mean", "max", "min", "median", "std")
_ACROSS: Final = "_across_repeats/"
# Names Gym never aggregates across repeats: coordinates and bookkeeping counts.
_NOT_PRIMARY_NAMES: Final = frozenset(
    {TASK_KEY, ROLLOUT_KEY, "_ng_attempt_index", "sample_count", "missing_count", "num_repeats"}
    | {"token_usage_version"}
)
_NOT_PRIMARY_PREFIXES: Final = tuple(
    f"{stat}/"
    for stat in (
        "max",
        "min",
        "median",
        "std",
        "sem",
        "se",
        "p25",
        "p75",
        "ci_low_95",
        "ci_high_95",
        "histogram",
    )
)
_NOT_PRIMARY_SUFFIXES: Final = (
    "/max",
    "/min",
    "/median",
    "/p5",
    "/p25",
    "/p75",
    "/p95",
    "/ci_low_95",
    "/ci_high_95",
    "/ci_lower",
    "/ci_upper",
    "_ci_lower",
    "_ci_upper",
    "_ci95_lower",
    "_ci95_upper",
    "/_ng_attempt_index",
    "/std_dev_across_runs",
    "/std_err_across_runs",
    "/avg_sample_std_dev",
)

Number = int | float


def _numeric(value: Any) -> Number | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    return None


def _usage(row: Mapping[str, Any]) -> Mapping[str, Any]:
    response = row.get("response")
    usage = response.get("usage") if isinstance(response, Mapping) else None
    return usage if isinstance(usage, Mapping) else {}


def _coordinate(row: Mapping[str, Any], key: str) -> Any:
    value = row.get(key, 0)
    return 0 if value is None else value


def columns_of(row: Mapping[str, Any]) -> dict[str, Number]:
    """A measured row's columns: numeric top-level fields not starting with `_` (without
    `mask_sample`), then the numeric fields of `response.usage` over them."""
    found: dict[str, Number] = {}
    for key, value in (*row.items(), *_usage(row).items()):
        if not isinstance(key, str) or key.startswith("_") or key == MASK_KEY:
            continue
        number = _numeric(value)
        if number is not None:
            found[key] = number
        else:
            found.pop(key, None)
    return found


def rollout_info(row: Mapping[str, Any]) -> dict[str, Any]:
    """One entry of a group's `rollout_infos`: the row's coordinates, reward and columns."""
    task, rollout = _coordinate(row, TASK_KEY), _coordinate(row, ROLLOUT_KEY)
    info: dict[str, Any] = {"rollout_id": f"{task}:{rollout}", TASK_KEY: task, ROLLOUT_KEY: rollout}
    if "reward" in row:
        info["reward"] = row.get("reward")
    for key, value in _usage(row).items():
        number = _numeric(value)
        if number is not None:
            info[key] = number
    for key, value in row.items():
        if key.startswith("_") or key in ("reward", "response", MASK_KEY):
            continue
        number = _numeric(value)
        if number is not None:
            info[key] = number
    return info


def _sample_std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else math.nan


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (pandas' and numpy's default)."""
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def describe(records: list[dict[str, Number]], columns: list[str]) -> dict[str, Any]:
    """`<stat>/<column>` over ``records`` for each of ``columns`` (gaps skipped)."""
    values = {c: [float(r[c]) for r in records if c in r and not _is_nan(r[c])] for c in columns}
    stds = {c: _sample_std(v) if v else math.nan for c, v in values.items()}
    if all(math.isnan(s) for s in stds.values()):
        # Gym reports a spread of 0 rather than nothing when no column has one, for the
        # columns every row has.
        stds = {c: 0.0 if len(values[c]) == len(records) else s for c, s in stds.items()}
    described: dict[str, Any] = {}
    for stat in _SUMMARY_STATS:
        for column in columns:
            column_values = values[column]
            if stat == "std":
                if not math.isnan(stds[column]):
                    described[f"std/{column}"] = stds[column]
                continue
            if not column_values:
                continue
            raw = [r[column] for r in records if column in r and not _is_nan(r[column])]
            if stat == "mean":
                described[f"mean/{column}"] = math.fsum(column_values) / len(column_values)
            elif stat == "max":
                described[f"max/{column}"] = max(raw)
            elif stat == "min":
                described[f"min/{column}"] = min(raw)
            else:
                described[f"median/{column}"] = float(statistics.median(column_values))
    return described


def _is_nan(value: Number) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _ordered_columns(records: Iterable[Mapping[str, Number]]) -> list[str]:
    seen: dict[str, None] = {}
    for record in records:
        for key in record:
            seen.setdefault(key, None)
    return list(seen)


def t_interval(mean: float, spread: float, n: int) -> tuple[float, float] | None:
    """The 95% Student-t interval ``mean ± t(0.975, n-1) * spread``; None when n <= 1."""
    if n <= 1:
        return None
    if spread == 0:
        return mean, mean
    half = t_quantile(0.975, n - 1) * spread
    return mean - half, mean + half


def _repeat_entries(
    measured: list[tuple[Mapping[str, Any], dict[str, Number]]], columns: list[str]
) -> list[dict[str, Any]]:
    rollouts = sorted({_coordinate(row, ROLLOUT_KEY) for row, _ in measured})
    if len(rollouts) <= 1:
        return []
    all_tasks = {_coordinate(row, TASK_KEY) for row, _ in measured}
    entries: list[dict[str, Any]] = []
    for rollout in rollouts:
        at = [(row, cols) for row, cols in measured if _coordinate(row, ROLLOUT_KEY) == rollout]
        present = len({_coordinate(row, TASK_KEY) for row, _ in at})
        entry: dict[str, Any] = {
            ROLLOUT_KEY: rollout,
            "sample_count": present,
            "missing_count": len(all_tasks) - present,
        }
        for column in columns:
            values = [float(c[column]) for _, c in at if column in c and not _is_nan(c[column])]
            n = len(values)
            if n == 0:
                continue
            mean = math.fsum(values) / n
            std = statistics.stdev(values) if n > 1 else 0.0
            sem = std / math.sqrt(n)
            ordered = sorted(values)
            entry.update(
                {
                    f"mean/{column}": mean,
                    f"median/{column}": float(statistics.median(values)),
                    f"std/{column}": std,
                    f"sem/{column}": sem,
                    f"min/{column}": ordered[0],
                    f"max/{column}": ordered[-1],
                    f"p25/{column}": _quantile(ordered, 0.25),
                    f"p75/{column}": _quantile(ordered, 0.75),
                }
            )
            interval = t_interval(mean, sem, n)
            if interval is not None:
                entry[f"ci_low_95/{column}"], entry[f"ci_high_95/{column}"] = interval
        entries.append(entry)
    return entries


def is_primary(name: str) -> bool:
    """A point estimate Gym aggregates across repeats (not a spread, bound or count)."""
    return (
        name not in _NOT_PRIMARY_NAMES
        and not name.startswith(_NOT_PRIMARY_PREFIXES)
        and not name.endswith(_NOT_PRIMARY_SUFFIXES)
        and _ACROSS not in name
    )


def across_repeats(entries: list[dict[str, Any]]) -> dict[str, float]:
    """Each primary repeat metric, treated as one observation per repeat."""
    aggregated: dict[str, float] = {}
    names = _ordered_columns(
        {k: v for k, v in e.items() if _numeric(v) is not None} for e in entries
    )
    for name in names:
        if not is_primary(name):
            continue
        values = [float(e[name]) for e in entries if name in e and not _is_nan(e[name])]
        n = len(values)
        if n == 0:
            continue
        mean = math.fsum(values) / n
        std = statistics.stdev(values) if n > 1 else 0.0
        se = std / math.sqrt(n)
        aggregated[f"mean{_ACROSS}{name}"] = mean
        aggregated[f"median{_ACROSS}{name}"] = float(statistics.median(values))
        aggregated[f"std{_ACROSS}{name}"] = std
        aggregated[f"min{_ACROSS}{name}"] = min(values)
        aggregated[f"max{_ACROSS}{name}"] = max(values)
        aggregated[f"se{_ACROSS}{name}"] = se
        interval = t_interval(mean, se, n)
        if interval is not None:
            aggregated[f"ci_low_95{_ACROSS}{name}"], aggregated[f"ci_high_95{_ACROSS}{name}"] = (
                interval
            )
    return aggregated


def coverage(rows: list[Mapping[str, Any]], measured: list[Mapping[str, Any]]) -> dict[str, int]:
    """Gym's coverage keys: how many rows and tasks the quality metrics come from; empty when no
    row is masked."""
    masked = len(rows) - len(measured)
    if not masked:
        return {}
    tasks = {_coordinate(row, TASK_KEY) for row in rows}
    measured_tasks = {_coordinate(row, TASK_KEY) for row in measured}
    return {
        "coverage/measured_rollouts": len(measured),
        "coverage/masked_rollouts": masked,
        "coverage/measured_tasks": len(measured_tasks),
        "coverage/fully_masked_tasks": len(tasks - measured_tasks),
    }


def gym_aggregate(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Gym's AggregateMetrics over ``rows``: `group_level_metrics`, `agent_metrics`,
    `key_metrics` and `repeat_level_metrics` (see the module's definitions)."""
    rows = list(rows)
    result: dict[str, Any] = {
        "group_level_metrics": [],
        "agent_metrics": {},
        "key_metrics": {},
        "repeat_level_metrics": [],
    }
    if not rows:
        return result
    measured_rows = [row for row in rows if not row.get(MASK_KEY)]
    covered = coverage(rows, measured_rows)
    if not measured_rows:
        result["agent_metrics"] = dict(covered)
        result["key_metrics"] = dict(covered)
        return result
    measured = [(row, columns_of(row)) for row in measured_rows]
    columns = _ordered_columns(cols for _, cols in measured)

    by_task: dict[Any, list[tuple[Mapping[str, Any], dict[str, Number]]]] = {}
    for row, cols in measured:
        by_task.setdefault(_coordinate(row, TASK_KEY), []).append((row, cols))
    groups: list[dict[str, Any]] = []
    for task in sorted(by_task):
        members = by_task[task]
        group: dict[str, Any] = {TASK_KEY: task}
        group.update(describe([cols for _, cols in members], columns))
        count = len(members)
        group["sample"] = {"agent_ref": dict(AGENT_REF)}
        group["num_rollouts"] = count
        group["expected_num_rollouts"] = count
        group["missing_num_rollouts"] = 0
        group["reward_profile_completion_pct"] = 100.0
        group["rollout_infos"] = sorted(
            (rollout_info(row) for row, _ in members), key=lambda info: info[ROLLOUT_KEY]
        )
        groups.append(group)

    agent = describe([cols for _, cols in measured], columns)
    repeats = _repeat_entries(measured, columns)
    agent.update(across_repeats(repeats))
    agent.update(covered)
    agent["num_repeats"] = len({_coordinate(row, ROLLOUT_KEY) for row in rows})
    key_metrics = {k: v for k, v in agent.items() if k.startswith("mean/")}
    key_metrics.update(covered)
    result.update(
        group_level_metrics=groups,
        agent_metrics=agent,
        key_metrics=key_metrics,
        repeat_level_metrics=repeats,
    )
    return result


# ---- Student's t quantile ----------------------------------------------------------------------


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 10_000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            step = c * d
            fraction *= step
        if abs(step - 1.0) < 1e-16:
            break
    return fraction


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _continued_fraction(a, b, x) / a
    return 1.0 - front * _continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom, to about
    machine precision: bisection on the distribution function."""
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if middle in (low, high):
            break
        if t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2.0
