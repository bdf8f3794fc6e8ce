"""NeMo Gym's aggregate metrics computed in plain Python: the same keys and values as Gym
0.7.0's own `compute_aggregate_metrics` (recorded in tests/data from real rows of a Gym
collection through genrm-trio: scored and masked rows, token usage, four repeats of eight
tasks), and Student's t quantile behind its confidence intervals."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from genrm_trio.core.gym_metrics import gym_aggregate, t_quantile

RECORDED = Path(__file__).parent.parent / "data" / "gym_0.7.0_aggregate_metrics.json"
CASES = json.loads(RECORDED.read_text(encoding="utf-8"))["cases"]


def same(ours: Any, gyms: Any, where: str) -> None:
    if isinstance(gyms, dict):
        assert isinstance(ours, dict), where
        assert set(ours) == set(gyms), f"{where}: keys differ: {set(ours) ^ set(gyms)}"
        for key in gyms:
            same(ours[key], gyms[key], f"{where}.{key}")
    elif isinstance(gyms, list):
        assert isinstance(ours, list) and len(ours) == len(gyms), where
        for index, (a, b) in enumerate(zip(ours, gyms, strict=True)):
            same(a, b, f"{where}[{index}]")
    elif isinstance(gyms, float):
        assert math.isclose(ours, gyms, rel_tol=1e-9, abs_tol=1e-12), f"{where}: {ours} {gyms}"
    else:
        assert ours == gyms, where


@pytest.mark.parametrize("case", CASES, ids=[case["case"] for case in CASES])
def test_every_key_and_value_is_gyms(case: dict[str, Any]) -> None:
    gyms = dict(case["gym"])
    assert gyms.pop("perf_summary") is None  # no row carries ng_perf
    same(gym_aggregate(case["verify_responses"]), gyms, case["case"])


def test_the_spread_is_the_sample_standard_deviation() -> None:
    rows = [
        {"_ng_task_index": 0, "_ng_rollout_index": i, "reward": r} for i, r in enumerate([1, 2, 4])
    ]
    agent = gym_aggregate(rows)["agent_metrics"]
    assert math.isclose(agent["std/reward"], math.sqrt(7 / 3))
    assert agent["num_repeats"] == 3


def test_no_rows_and_only_masked_rows() -> None:
    assert gym_aggregate([]) == {
        "group_level_metrics": [],
        "agent_metrics": {},
        "key_metrics": {},
        "repeat_level_metrics": [],
    }
    masked = gym_aggregate([{"_ng_task_index": 2, "mask_sample": True, "reward": 0.0}])
    assert (
        masked["agent_metrics"]
        == masked["key_metrics"]
        == {
            "coverage/measured_rollouts": 0,
            "coverage/masked_rollouts": 1,
            "coverage/measured_tasks": 0,
            "coverage/fully_masked_tasks": 1,
        }
    )


@pytest.mark.parametrize(
    ("df", "quantile"),
    # scipy.stats.t.ppf(0.975, df)
    [
        (1, 12.706204736174694),
        (3, 3.1824463052837078),
        (7, 2.364624251592784),
        (30, 2.0422724563012378),
    ],
)
def test_t_quantiles_match_the_reference(df: int, quantile: float) -> None:
    assert math.isclose(t_quantile(0.975, df), quantile, rel_tol=1e-12)
