"""Configuration of several judge replicas (X-3, J-36…J-38) and of the log format (O-12): what an
operator writes, what the server takes from it, and the exact error lines."""

from __future__ import annotations

from typing import Any

import pytest

from genrm_trio.config import ConfigError, config_from_mapping, load_config, public_view
from genrm_trio.logs import startup_lines

MODEL = {"judge_model": "genrm"}


def errors_of(values: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping({**MODEL, **values})
    return info.value.lines


def test_defaults_keep_one_judge_and_text_logs() -> None:
    config = config_from_mapping({**MODEL, "judge_base_url": "http://judge:8000/v1"})
    assert config.judge_base_urls is None
    assert (config.judge_balance, config.judge_replica_max_concurrency) == ("affinity", None)
    assert (config.judge_replica_eject_after, config.judge_replica_cooldown_s) == (3, 10.0)
    assert config.log_format == "text"


def test_replicas_alone_stand_in_for_judge_base_url() -> None:
    urls = ["http://judge-0:8000/v1/", "https://u:pw@judge-1:8000/v1"]
    config = config_from_mapping({**MODEL, "judge_base_urls": urls})
    assert config.judge_base_urls == ("http://judge-0:8000/v1", "https://u:pw@judge-1:8000/v1")
    assert config.judge_base_url == "http://judge-0:8000/v1"
    assert public_view(config)["judge_base_urls"] == [
        "http://judge-0:8000/v1",
        "https://judge-1:8000/v1",
    ]
    assert "judge=http://judge-0:8000/v1,https://judge-1:8000/v1 " in startup_lines(config)[0]


def test_both_keys_are_accepted_when_the_single_url_is_one_of_the_replicas() -> None:
    urls = ["http://a/v1", "http://b/v1"]
    config = config_from_mapping(
        {**MODEL, "judge_base_url": "http://b/v1", "judge_base_urls": urls}
    )
    assert config.judge_base_url == "http://b/v1"
    assert errors_of({"judge_base_url": "http://c/v1", "judge_base_urls": urls}) == [
        "invalid configuration: judge_base_url: must be one of judge_base_urls when both are set"
        " (got 'http://c/v1')"
    ]


@pytest.mark.parametrize(
    ("urls", "line"),
    [
        ([], "must be a non-empty list of http or https URLs, or null (got [])"),
        (
            "http://a/v1",
            "must be a non-empty list of http or https URLs, or null (got 'http://a/v1')",
        ),
        (["http://a/v1", "ftp://b"], "every entry must be an http or https URL (got 'ftp://b')"),
        (["http://a/v1", "http://a/v1/"], "lists a replica twice (got 'http://a/v1')"),
    ],
)
def test_bad_replica_lists_are_refused_naming_the_key(urls: Any, line: str) -> None:
    assert errors_of({"judge_base_urls": urls}) == [
        f"invalid configuration: judge_base_urls: {line}"
    ]


def test_neither_url_is_required_once() -> None:
    assert errors_of({}) == ["invalid configuration: judge_base_url: required"]


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("judge_balance", "round_robin", "must be one of affinity, least_outstanding"),
        ("judge_replica_max_concurrency", 0, "must be an integer >= 1 or null"),
        ("judge_replica_eject_after", 0, "must be an integer >= 1"),
        ("judge_replica_cooldown_s", 0, "must be a finite number > 0"),
        ("log_format", "xml", "must be one of text, json"),
    ],
)
def test_bad_replica_and_log_settings_are_refused(key: str, value: Any, problem: str) -> None:
    lines = errors_of({"judge_base_url": "http://a/v1", key: value})
    assert len(lines) == 1 and lines[0].startswith(f"invalid configuration: {key}: {problem}")


def test_replicas_from_the_command_line(tmp_path: Any) -> None:
    path = tmp_path / "genrm.yaml"
    path.write_text("judge_model: genrm\n", encoding="utf-8")
    config = load_config(path, ["judge_base_urls=[http://a/v1, http://b/v1]", "log_format=json"])
    assert config.judge_base_urls == ("http://a/v1", "http://b/v1")
    assert config.log_format == "json"
