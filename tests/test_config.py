"""Configuration loading and validation (§7, AS-1…AS-7, AS-9) at the loader level.

Each test states what an operator sees: the effective values, or the exact error lines.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest

from genrm_trio.config import (
    CONFIG_KEYS,
    DEFAULT_PRINCIPLE,
    Config,
    ConfigError,
    config_from_mapping,
    config_warnings,
    format_seconds,
    load_config,
    public_view,
    resolve_api_key,
)

REQUIRED = {"judge_base_url": "http://judge:8000/v1", "judge_model": "genrm"}
DEADLINE_KEYS = (
    "cohort_collection_timeout_s",
    "cohort_evaluation_timeout_s",
    "judge_request_timeout_s",
)
# (YAML text, how the error line shows it)
BAD_DEADLINES = (("null", "null"), ("0", "0"), ("-1", "-1"), (".inf", "inf"), (".nan", "nan"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "genrm.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def required_yaml() -> str:
    return "judge_base_url: http://judge:8000/v1\njudge_model: genrm\n"


def errors_of(**values: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping({**REQUIRED, **values})
    return info.value.lines


# --- AS-1: defaults -------------------------------------------------------------------------


def test_only_required_keys_give_the_spec_defaults() -> None:
    config = config_from_mapping(REQUIRED)
    assert config == Config(judge_base_url="http://judge:8000/v1", judge_model="genrm")
    assert config.host == "127.0.0.1"
    assert config.port == 8000
    assert config.num_rollouts_per_prompt == 16
    assert config.comparison_strategy == "circular"
    assert config.num_judges_per_comparison == 1
    assert config.cohort_result_ttl_s == 3600.0
    assert config.max_terminal_cohorts == 4096
    assert config.use_principle is False
    assert config.default_principle == DEFAULT_PRINCIPLE
    assert config.aggregator_method == "simple_tiebreaker"
    assert config.default_score == 3.0
    assert config.default_ranking == 3.5
    assert config.cohort_collection_timeout_s == 1800.0
    assert config.cohort_evaluation_timeout_s == 1800.0
    assert config.judge_request_timeout_s == 1800.0
    assert config.judge_api == "chat_completions"
    assert config.judge_max_concurrency == 256
    assert config.genrm_parse_retries == 3
    assert config.attempts_per_comparison == 4
    assert config.genrm_responses_create_params == {
        "max_output_tokens": 16384,
        "temperature": 0.6,
        "top_p": 0.95,
    }
    assert config.compare_timeout_s is None
    assert config.max_body_bytes == 67108864
    assert config.max_compare_responses == 1024
    assert config.shutdown_grace_s == 5.0
    assert config.log_level == "INFO"
    assert config.debug_logging is False
    assert config.group_mode is True


def test_file_with_only_required_keys_gives_the_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, required_yaml()))
    assert config == Config(judge_base_url="http://judge:8000/v1", judge_model="genrm")


def test_every_config_field_is_a_validated_key() -> None:
    assert set(CONFIG_KEYS) == set(Config.__struct_fields__)


def test_missing_required_keys_are_each_reported() -> None:
    with pytest.raises(ConfigError) as info:
        load_config()
    assert info.value.lines == [
        "invalid configuration: judge_base_url: required",
        "invalid configuration: judge_model: required",
    ]


def test_null_base_url_is_reported_as_required() -> None:
    assert errors_of(judge_base_url=None) == ["invalid configuration: judge_base_url: required"]


# --- AS-2: the three deadlines --------------------------------------------------------------


@pytest.mark.parametrize("key", DEADLINE_KEYS)
@pytest.mark.parametrize(("text", "shown"), BAD_DEADLINES)
def test_bad_deadline_in_file_is_rejected(tmp_path: Path, key: str, text: str, shown: str) -> None:
    path = write(tmp_path, required_yaml() + f"{key}: {text}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.lines == [
        f"invalid configuration: {key}: must be a finite number > 0 (got {shown})"
    ]


@pytest.mark.parametrize("key", DEADLINE_KEYS)
@pytest.mark.parametrize(("text", "shown"), BAD_DEADLINES)
def test_bad_deadline_in_set_is_rejected(key: str, text: str, shown: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(sets=[f"{key}={text}"], base=REQUIRED)
    assert info.value.lines == [
        f"invalid configuration: {key}: must be a finite number > 0 (got {shown})"
    ]


def test_negative_infinity_is_shown_as_minus_inf() -> None:
    assert errors_of(cohort_collection_timeout_s=-math.inf) == [
        "invalid configuration: cohort_collection_timeout_s: must be a finite number > 0 (got -inf)"
    ]


def test_integer_deadline_is_stored_as_seconds_float() -> None:
    config = load_config(sets=["cohort_collection_timeout_s=5"], base=REQUIRED)
    assert config.cohort_collection_timeout_s == 5.0
    assert isinstance(config.cohort_collection_timeout_s, float)


def test_cf11_example_messages() -> None:
    lines = errors_of(cohort_collection_timeout_s=0, comparison_strategy="ring")
    assert lines == [
        "invalid configuration: cohort_collection_timeout_s: must be a finite number > 0 (got 0)",
        "invalid configuration: comparison_strategy: must be one of circular, all_pairs, "
        "fixed_baseline (got 'ring')",
    ]


# --- AS-3: unknown keys ---------------------------------------------------------------------


def test_unknown_key_in_file_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, required_yaml() + "cohort_timeout_s: 5\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.lines == [
        "unknown configuration key 'cohort_timeout_s' (did you mean 'compare_timeout_s'?)"
    ]


def test_unknown_key_in_set_is_named() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(sets=["cohort_timeout_s=5"], base=REQUIRED)
    assert info.value.lines == [
        "unknown configuration key 'cohort_timeout_s' (did you mean 'compare_timeout_s'?)"
    ]


def test_unknown_key_in_mapping_is_named() -> None:
    assert errors_of(cohort_timeout_s=5) == [
        "unknown configuration key 'cohort_timeout_s' (did you mean 'compare_timeout_s'?)"
    ]


def test_a_misspelt_key_is_named_with_the_key_it_resembles() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(sets=["judge_modle=genrm"], base={"judge_base_url": "http://judge:8000/v1"})
    assert info.value.lines == [
        "unknown configuration key 'judge_modle' (did you mean 'judge_model'?)",
        "invalid configuration: judge_model: required",
    ]
    # A key like none of them gets no guess.
    assert errors_of(colour="blue") == ["unknown configuration key 'colour'"]


def test_judge_input_strip_tokens_defaults_to_the_common_templates_and_may_be_emptied() -> None:
    default = config_from_mapping(REQUIRED).judge_input_strip_tokens
    for marker in ("<|im_start|>{role}", "<|eot_id|>", "[INST]", "<end_of_turn>", "</s>"):
        assert marker in default
    assert "<|endoftext|>" in default
    assert (
        config_from_mapping(REQUIRED | {"judge_input_strip_tokens": []}).judge_input_strip_tokens
        == ()
    )
    assert errors_of(judge_input_strip_tokens="<|im_end|>") == [
        "invalid configuration: judge_input_strip_tokens: must be a list of non-empty strings, "
        "or [] to strip nothing (got '<|im_end|>')"
    ]
    [line] = errors_of(judge_input_strip_tokens=["<|im_end|>", "{role}:"])
    assert "judge_input_strip_tokens" in line and "starts with {role}" in line


def test_dotted_key_other_than_sampling_is_unknown() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(sets=["port.x=1"], base=REQUIRED)
    assert info.value.lines == ["unknown configuration key 'port.x' (did you mean 'port'?)"]


# --- AS-4: every problem at once ------------------------------------------------------------


def test_two_invalid_keys_are_both_reported_one_line_each(tmp_path: Path) -> None:
    path = write(tmp_path, required_yaml() + "port: 70000\nnum_judges_per_comparison: 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.lines == [
        "invalid configuration: port: must be an integer from 0 to 65535 (got 70000)",
        "invalid configuration: num_judges_per_comparison: must be an integer >= 1 (got 0)",
    ]
    assert str(info.value) == "\n".join(info.value.lines)
    assert info.value.exit_status == 2


def test_unknown_and_invalid_keys_are_reported_together() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(sets=["cohort_timeout_s=5", "top_percentile=2"])
    assert info.value.lines == [
        "unknown configuration key 'cohort_timeout_s' (did you mean 'compare_timeout_s'?)",
        "invalid configuration: judge_base_url: required",
        "invalid configuration: judge_model: required",
        "invalid configuration: top_percentile: must be a finite number from 0 to 1 (got 2)",
    ]


# --- AS-5: types, ranges and enums ----------------------------------------------------------


@pytest.mark.parametrize(("text", "shown"), [("16.5", "16.5"), ("true", "true"), ('"16"', "'16'")])
def test_group_size_must_be_an_integer(tmp_path: Path, text: str, shown: str) -> None:
    path = write(tmp_path, required_yaml() + f"num_rollouts_per_prompt: {text}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.lines == [
        f"invalid configuration: num_rollouts_per_prompt: must be an integer >= 1 (got {shown})"
    ]


@pytest.mark.parametrize(
    ("key", "value", "line"),
    [
        (
            "top_percentile",
            1.5,
            "invalid configuration: top_percentile: must be a finite number from 0 to 1 (got 1.5)",
        ),
        (
            "answer_bonus",
            -0.1,
            "invalid configuration: answer_bonus: must be a finite number >= 0 (got -0.1)",
        ),
        (
            "comparison_strategy",
            "ring",
            "invalid configuration: comparison_strategy: must be one of circular, all_pairs, "
            "fixed_baseline (got 'ring')",
        ),
        (
            "aggregator_method",
            "mean",
            "invalid configuration: aggregator_method: must be one of simple_tiebreaker "
            "(got 'mean')",
        ),
        (
            "judge_api",
            "Responses",
            "invalid configuration: judge_api: must be one of chat_completions, responses "
            "(got 'Responses')",
        ),
        (
            "log_level",
            "info",
            "invalid configuration: log_level: must be one of DEBUG, INFO, WARNING, ERROR "
            "(got 'info')",
        ),
        ("port", -1, "invalid configuration: port: must be an integer from 0 to 65535 (got -1)"),
        ("host", "", "invalid configuration: host: must be a non-empty string (got '')"),
        (
            "judge_model",
            "",
            "invalid configuration: judge_model: must be a non-empty string (got '')",
        ),
        (
            "max_body_bytes",
            1023,
            "invalid configuration: max_body_bytes: must be an integer >= 1024 (got 1023)",
        ),
        (
            "genrm_parse_retries",
            -1,
            "invalid configuration: genrm_parse_retries: must be an integer >= 0 (got -1)",
        ),
        (
            "judge_retry_max_sleep_s",
            "8",
            "invalid configuration: judge_retry_max_sleep_s: must be a finite number >= 0 "
            "(got '8')",
        ),
        (
            "default_score",
            True,
            "invalid configuration: default_score: must be a finite number (got true)",
        ),
        (
            "compare_timeout_s",
            0,
            "invalid configuration: compare_timeout_s: must be a finite number > 0 or null (got 0)",
        ),
        (
            "cohort_result_ttl_s",
            -5,
            "invalid configuration: cohort_result_ttl_s: must be a finite number > 0 or null "
            "(got -5)",
        ),
        (
            "shutdown_grace_s",
            0,
            "invalid configuration: shutdown_grace_s: must be a finite number > 0 (got 0)",
        ),
        (
            "use_principle",
            1,
            "invalid configuration: use_principle: must be true or false (got 1)",
        ),
        (
            "default_principle",
            None,
            "invalid configuration: default_principle: must be a string (got null)",
        ),
        (
            "judge_process_max_concurrency",
            0,
            "invalid configuration: judge_process_max_concurrency: must be an integer >= 1 or "
            "null (got 0)",
        ),
    ],
)
def test_invalid_value_is_rejected_naming_its_key(key: str, value: Any, line: str) -> None:
    assert errors_of(**{key: value}) == [line]


@pytest.mark.parametrize("text", ["yes", "on", "1"])
def test_boolean_keys_accept_only_yaml_booleans(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(sets=[f"debug_logging={text}"], base=REQUIRED)
    shown = "1" if text == "1" else f"'{text}'"
    assert info.value.lines == [
        f"invalid configuration: debug_logging: must be true or false (got {shown})"
    ]


def test_yaml_booleans_and_nulls_are_accepted() -> None:
    config = load_config(
        sets=["use_principle=true", "debug_logging=False", "cohort_result_ttl_s=null"],
        base=REQUIRED,
    )
    assert config.use_principle is True
    assert config.debug_logging is False
    assert config.cohort_result_ttl_s is None


def test_boundary_values_are_accepted() -> None:
    config = config_from_mapping(
        {
            **REQUIRED,
            "port": 0,
            "top_percentile": 1,
            "genrm_parse_retries": 0,
            "judge_retry_max_sleep_s": 0,
            "max_body_bytes": 1024,
            "default_score": -2.5,
            "num_rollouts_per_prompt": 1,
        }
    )
    assert config.port == 0
    assert config.top_percentile == 1.0
    assert config.genrm_parse_retries == 0
    assert config.max_body_bytes == 1024
    assert config.default_score == -2.5
    assert config.group_mode is False


def test_integral_float_for_integer_key_is_stored_as_int() -> None:
    config = load_config(sets=["num_rollouts_per_prompt=4.0"], base=REQUIRED)
    assert config.num_rollouts_per_prompt == 4
    assert isinstance(config.num_rollouts_per_prompt, int)


def test_exponent_notation_is_a_number() -> None:
    config = load_config(sets=["judge_request_timeout_s=1e3"], base=REQUIRED)
    assert config.judge_request_timeout_s == 1000.0


# --- judge_base_url -------------------------------------------------------------------------


def test_trailing_slash_of_base_url_is_dropped() -> None:
    config = config_from_mapping({**REQUIRED, "judge_base_url": "https://judge.example/v1/"})
    assert config.judge_base_url == "https://judge.example/v1"


@pytest.mark.parametrize(
    "url", ["judge:8000/v1", "ftp://judge/v1", "http://", "http://judge:port/v1", "http://a b/"]
)
def test_base_url_must_be_http(url: str) -> None:
    assert errors_of(judge_base_url=url) == [
        f"invalid configuration: judge_base_url: must be an http or https URL (got '{url}')"
    ]


def test_invalid_base_url_error_hides_user_info() -> None:
    lines = errors_of(judge_base_url="ftp://alice:s3cret@judge/v1")
    assert lines == [
        "invalid configuration: judge_base_url: must be an http or https URL (got 'ftp://judge/v1')"
    ]


# --- AS-6: sampling parameters --------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), [("stream", True), ("model", "x"), ("messages", [])])
def test_server_owned_sampling_key_is_rejected(key: str, value: Any) -> None:
    params = {"temperature": 0.6, key: value}
    assert errors_of(genrm_responses_create_params=params) == [
        f"invalid configuration: genrm_responses_create_params.{key}: set by the server; remove it"
    ]


def test_server_owned_sampling_key_in_set_is_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(sets=["genrm_responses_create_params.stream=true"], base=REQUIRED)
    assert info.value.lines == [
        "invalid configuration: genrm_responses_create_params.stream: set by the server; remove it"
    ]


def test_input_and_metadata_sampling_keys_are_accepted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        required_yaml()
        + "genrm_responses_create_params: {temperature: 1.0, input: [], metadata: {}}\n",
    )
    config = load_config(path)
    assert config.genrm_responses_create_params == {
        "temperature": 1.0,
        "input": [],
        "metadata": {},
    }


@pytest.mark.parametrize(("value", "shown"), [(0, "0"), (1.5, "1.5"), (None, "null")])
def test_max_output_tokens_must_be_positive_integer(value: Any, shown: str) -> None:
    params = {"max_output_tokens": value}
    assert errors_of(genrm_responses_create_params=params) == [
        "invalid configuration: genrm_responses_create_params.max_output_tokens: "
        f"must be an integer >= 1 (got {shown})"
    ]


def test_sampling_must_be_a_mapping() -> None:
    assert errors_of(genrm_responses_create_params=[1, 2]) == [
        "invalid configuration: genrm_responses_create_params: must be a mapping with string "
        "keys (got [1, 2])"
    ]


def test_sampling_mapping_is_not_shared_with_the_caller() -> None:
    params: dict[str, Any] = {"temperature": 0.5, "extra_body": {"top_k": 20}}
    config = config_from_mapping({**REQUIRED, "genrm_responses_create_params": params})
    params["extra_body"]["top_k"] = 1
    assert config.genrm_responses_create_params["extra_body"] == {"top_k": 20}


# --- AS-7: merging --------------------------------------------------------------------------


def test_set_overrides_file_and_sub_key_keeps_the_other_sampling_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        required_yaml()
        + "num_rollouts_per_prompt: 16\n"
        + "genrm_responses_create_params:\n"
        + "  max_output_tokens: 16384\n"
        + "  temperature: 0.7\n"
        + "  top_p: 0.9\n",
    )
    config = load_config(
        path,
        [
            "num_rollouts_per_prompt=4",
            "genrm_responses_create_params.max_output_tokens=1341",
        ],
    )
    assert config.num_rollouts_per_prompt == 4
    assert config.genrm_responses_create_params == {
        "max_output_tokens": 1341,
        "temperature": 0.7,
        "top_p": 0.9,
    }


def test_sampling_sub_key_without_file_starts_from_the_default() -> None:
    config = load_config(sets=["genrm_responses_create_params.temperature=1"], base=REQUIRED)
    assert config.genrm_responses_create_params == {
        "max_output_tokens": 16384,
        "temperature": 1,
        "top_p": 0.95,
    }


def test_sampling_sub_key_path_sets_a_nested_value() -> None:
    config = load_config(
        sets=["genrm_responses_create_params.reasoning.effort=high"], base=REQUIRED
    )
    assert config.genrm_responses_create_params["reasoning"] == {"effort": "high"}


def test_sampling_in_file_replaces_the_default_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, required_yaml() + "genrm_responses_create_params: {temperature: 1}\n")
    assert load_config(path).genrm_responses_create_params == {"temperature": 1}


def test_sources_apply_in_precedence_order(tmp_path: Path) -> None:
    base = {**REQUIRED, "host": "10.0.0.1", "port": 1, "judge_model": "from-base"}
    path = write(tmp_path, "port: 2\njudge_model: from-file\nnum_judges_per_comparison: 3\n")
    config = load_config(
        path,
        ["port=3", "num_judges_per_comparison=4", "num_judges_per_comparison=5"],
        host="0.0.0.0",
        port=4,
        base=base,
    )
    assert config.host == "0.0.0.0"
    assert config.port == 4
    assert config.judge_model == "from-file"
    assert config.num_judges_per_comparison == 5
    assert config.judge_base_url == "http://judge:8000/v1"


def test_set_values_are_yaml() -> None:
    config = load_config(
        sets=[
            "genrm_responses_create_params={temperature: 0.1, max_output_tokens: 64}",
            "judge_api_key=null",
            "judge_model=genrm=v2",
        ],
        base=REQUIRED,
    )
    assert config.genrm_responses_create_params == {"temperature": 0.1, "max_output_tokens": 64}
    assert config.judge_api_key is None
    assert config.judge_model == "genrm=v2"


def test_host_and_port_flags_are_validated() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(host="", port=65536, base=REQUIRED)
    assert info.value.lines == [
        "invalid configuration: host: must be a non-empty string (got '')",
        "invalid configuration: port: must be an integer from 0 to 65535 (got 65536)",
    ]


# --- sources that cannot be read ------------------------------------------------------------


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert info.value.lines == [
        f"cannot read configuration file '{missing}': No such file or directory"
    ]


def test_invalid_yaml_is_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, "judge_model: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert len(info.value.lines) == 1
    assert info.value.lines[0].startswith(f"invalid configuration file '{path}': ")
    assert "line " in info.value.lines[0]


def test_file_that_is_not_a_mapping_is_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, "- judge_model\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.lines == [
        f"invalid configuration file '{path}': expected a mapping of configuration keys "
        "(got ['judge_model'])"
    ]


def test_duplicate_key_in_file_is_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, required_yaml() + "port: 1\nport: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.lines == [
        f"invalid configuration file '{path}': duplicate key 'port' at line 4, column 1"
    ]


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), base=REQUIRED)
    assert config == config_from_mapping(REQUIRED)


def test_set_without_equals_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(sets=["num_rollouts_per_prompt", "port=1"], base=REQUIRED)
    assert info.value.lines == [
        "invalid --set argument 'num_rollouts_per_prompt': expected key=value"
    ]


def test_set_value_that_is_not_yaml_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(sets=["genrm_responses_create_params={temperature: 0.1"], base=REQUIRED)
    assert len(info.value.lines) == 1
    assert info.value.lines[0].startswith(
        "invalid --set argument 'genrm_responses_create_params={temperature: 0.1': "
        "value is not valid YAML: "
    )


def test_single_message_error_has_one_line() -> None:
    assert ConfigError("invalid configuration: port: required").lines == [
        "invalid configuration: port: required"
    ]


# --- CF-10 ----------------------------------------------------------------------------------


def test_request_timeout_longer_than_evaluation_is_accepted_with_one_warning() -> None:
    config = config_from_mapping(
        {**REQUIRED, "judge_request_timeout_s": 3600, "cohort_evaluation_timeout_s": 1800}
    )
    assert config_warnings(config) == [
        "judge_request_timeout_s (3600.0) is longer than cohort_evaluation_timeout_s (1800.0): "
        "in /verify the per-request deadline can never fire before the evaluation deadline "
        "(it still bounds /compare)"
    ]


def test_equal_deadlines_and_defaults_give_no_warning() -> None:
    assert config_warnings(config_from_mapping(REQUIRED)) == []
    equal = config_from_mapping(
        {**REQUIRED, "judge_request_timeout_s": 30, "cohort_evaluation_timeout_s": 30}
    )
    assert config_warnings(equal) == []


def test_a_group_mean_placeholder_without_groups_is_warned_about() -> None:
    # CF-14
    group_mean = {**REQUIRED, "masked_reward_placeholder": "group_mean"}
    single = config_from_mapping({**group_mean, "num_rollouts_per_prompt": 1})
    assert config_warnings(single) == [
        "masked_reward_placeholder: group_mean has no effect in single-rollout mode: no row is "
        "ever masked there"
    ]
    assert config_warnings(config_from_mapping(group_mean)) == []
    baseline = {"num_rollouts_per_prompt": 1, "comparison_strategy": "fixed_baseline"}
    assert config_warnings(config_from_mapping({**group_mean, **baseline})) == []


def test_a_process_cap_is_warned_about_when_it_is_not_under_the_budget() -> None:
    assert config_from_mapping(REQUIRED).process_judge_concurrency == 256
    under = config_from_mapping({**REQUIRED, "judge_process_max_concurrency": 64})
    assert under.process_judge_concurrency == 64 and config_warnings(under) == []
    over = config_from_mapping(
        {**REQUIRED, "judge_max_concurrency": 8, "judge_process_max_concurrency": 8}
    )
    assert over.process_judge_concurrency == 8
    assert config_warnings(over) == [
        "judge_process_max_concurrency (8) has no effect: it is not below judge_max_concurrency "
        "(8), which no process exceeds"
    ]


# --- J-35, I-14: the API key ----------------------------------------------------------------


def test_config_key_wins_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENRM_JUDGE_API_KEY", "k1")
    config = config_from_mapping({**REQUIRED, "judge_api_key": "k2"})
    assert resolve_api_key(config) == "k2"


def test_environment_key_is_used_when_config_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENRM_JUDGE_API_KEY", "k1")
    assert resolve_api_key(config_from_mapping(REQUIRED)) == "k1"


def test_empty_or_absent_environment_key_means_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENRM_JUDGE_API_KEY", "")
    assert resolve_api_key(config_from_mapping(REQUIRED)) is None
    monkeypatch.delenv("GENRM_JUDGE_API_KEY")
    assert resolve_api_key(config_from_mapping(REQUIRED)) is None


def test_public_view_never_contains_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENRM_JUDGE_API_KEY", "env-secret-k1")
    config = config_from_mapping(
        {
            **REQUIRED,
            "judge_api_key": "sk-secret-k2",
            "judge_base_url": "http://bob:url-secret@judge:8000/v1",
        }
    )
    view = public_view(config)
    text = json.dumps(view)
    assert view["judge_api_key"] == "<set>"
    assert view["judge_base_url"] == "http://judge:8000/v1"
    for secret in ("env-secret-k1", "sk-secret-k2", "url-secret", "bob"):
        assert secret not in text


def test_public_view_shows_environment_key_as_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENRM_JUDGE_API_KEY", "k1")
    assert public_view(config_from_mapping(REQUIRED))["judge_api_key"] == "<set>"
    monkeypatch.delenv("GENRM_JUDGE_API_KEY")
    assert public_view(config_from_mapping(REQUIRED))["judge_api_key"] is None


def test_public_view_lists_every_key_with_effective_values() -> None:
    config = config_from_mapping({**REQUIRED, "num_rollouts_per_prompt": 4})
    view = public_view(config)
    assert set(view) == set(CONFIG_KEYS)
    assert view["num_rollouts_per_prompt"] == 4
    assert msgspec.json.decode(msgspec.json.encode(view)) == view


def test_key_of_wrong_type_is_not_echoed() -> None:
    lines = errors_of(judge_api_key=123456789)
    assert lines == [
        "invalid configuration: judge_api_key: must be a string or null (got <hidden int>)"
    ]


# --- message formatting ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.2, "0.2"),
        (0.05, "0.05"),
        (1800, "1800.0"),
        (5.0, "5.0"),
        (1e20, "100000000000000000000.0"),
    ],
)
def test_durations_are_written_with_a_fractional_part(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text
