"""Configuration of the masked-rollout window and its warning: the defaults, the warning turned
off with null, and the exact error lines for values that would do nothing or warn always."""

from __future__ import annotations

from typing import Any

import pytest

from genrm_trio.config import ConfigError, config_from_mapping

REQUIRED = {"judge_base_url": "http://judge:8000/v1", "judge_model": "genrm"}


def errors_of(**values: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping({**REQUIRED, **values})
    return info.value.lines


def test_by_default_a_minute_s_window_warns_at_half_masked_from_16_rollouts() -> None:
    config = config_from_mapping(REQUIRED)
    assert config.mask_window_s == 60.0
    assert config.mask_warning_ratio == 0.5
    assert config.mask_warning_min_rollouts == 16


def test_null_turns_the_warning_off_and_1_warns_only_when_everything_is_masked() -> None:
    assert config_from_mapping({**REQUIRED, "mask_warning_ratio": None}).mask_warning_ratio is None
    assert config_from_mapping({**REQUIRED, "mask_warning_ratio": 1}).mask_warning_ratio == 1.0


RATIO_LINE = (
    "invalid configuration: mask_warning_ratio: must be a number > 0 and <= 1, or null to turn"
    " the warning off (got {})"
)


@pytest.mark.parametrize(
    ("value", "shown"),
    [(0, "0"), (0.0, "0.0"), (1.5, "1.5"), (-0.1, "-0.1"), (float("nan"), "nan"), (True, "true")],
)
def test_a_warning_ratio_that_would_warn_always_or_never_is_refused(value: Any, shown: str) -> None:
    assert errors_of(mask_warning_ratio=value) == [RATIO_LINE.format(shown)]


def test_the_window_and_the_minimum_sample_must_be_positive() -> None:
    assert errors_of(mask_window_s=0, mask_warning_min_rollouts=0) == [
        "invalid configuration: mask_window_s: must be a finite number > 0 (got 0)",
        "invalid configuration: mask_warning_min_rollouts: must be an integer >= 1 (got 0)",
    ]
