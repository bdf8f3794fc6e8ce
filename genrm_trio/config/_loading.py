"""Loading the configuration: YAML files, ``--set`` overrides, the API key, logs and warnings.

YAML is read with the 1.2 core schema, so `yes`, `on` and `0755` mean what they say and `1e3` is
a number.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import msgspec
import yaml

from genrm_trio.config._checks import (
    ConfigError,
    InvalidValue,
    config_from_mapping,
    format_got,
    shorten,
    url_without_userinfo,
)
from genrm_trio.config._schema import SAMPLING_KEY, Config, default_sampling
from genrm_trio.core.messages import format_seconds

API_KEY_ENV = "GENRM_JUDGE_API_KEY"


class _ConfigYamlLoader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 core-schema scalars and no silently repeated keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}'", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text)


_KEPT_TAGS = {"tag:yaml.org,2002:merge"}
_ConfigYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag in _KEPT_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), [*"~nN", ""]
)
_ConfigYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_ConfigYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"),
)
_ConfigYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+.0123456789"),
)
_ConfigYamlLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def parse_yaml(text: str) -> Any:
    """YAML as configuration is read: YAML 1.2 core-schema scalars, no repeated keys."""
    return yaml.load(text, Loader=_ConfigYamlLoader)


def _yaml_problem(exc: Exception) -> str:
    """A one-line description of a YAML error: what went wrong and where."""
    if isinstance(exc, yaml.MarkedYAMLError):
        problem = exc.problem or exc.context or "invalid YAML"
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
        return problem
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def read_config_file(path: str | os.PathLike[str]) -> Mapping[Any, Any]:
    """A configuration file's mapping (empty for an empty file); ``ConfigError`` says why a file
    cannot be read as one."""
    shown = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(
            [f"cannot read configuration file '{shown}': {exc.strerror or exc}"]
        ) from None
    except UnicodeDecodeError:
        raise ConfigError([f"invalid configuration file '{shown}': not UTF-8 text"]) from None
    try:
        document = parse_yaml(text)
    except (yaml.YAMLError, ValueError) as exc:
        raise ConfigError([f"invalid configuration file '{shown}': {_yaml_problem(exc)}"]) from None
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ConfigError(
            [
                f"invalid configuration file '{shown}': expected a mapping of configuration keys "
                f"(got {shorten(format_got(document))})"
            ]
        )
    return document


def _parse_set(argument: str) -> tuple[str, Any]:
    key, sep, text = argument.partition("=")
    if not sep:
        raise InvalidValue("expected key=value", argument)
    key = key.strip()
    try:
        return key, parse_yaml(text)
    except (yaml.YAMLError, ValueError) as exc:
        raise InvalidValue(f"value is not valid YAML: {_yaml_problem(exc)}", argument) from None


def _apply_set(merged: dict[Any, Any], key: str, value: Any) -> None:
    head, dot, rest = key.partition(".")
    if not dot or head != SAMPLING_KEY:
        merged[key] = value
        return
    if rest == "" or "" in rest.split("."):
        # An empty sub-key name cannot be meant; report it as the unknown key it is.
        merged[key] = value
        return
    current = merged.get(SAMPLING_KEY, default_sampling())
    if not isinstance(current, Mapping):
        # The whole mapping is already invalid and will be reported as such.
        return
    sampling = copy.deepcopy(dict(current))
    target = sampling
    *parents, leaf = rest.split(".")
    for parent in parents:
        child = target.get(parent)
        target[parent] = dict(child) if isinstance(child, Mapping) else {}
        target = target[parent]
    target[leaf] = value
    merged[SAMPLING_KEY] = sampling


def load_config(
    path: str | os.PathLike[str] | None = None,
    sets: Sequence[str] = (),
    *,
    host: str | None = None,
    port: int | None = None,
    base: Mapping[str, Any] | None = None,
) -> Config:
    """Merge defaults < `base` < the YAML file < each `--set` in order < host/port, then validate.

    Raises ConfigError with every problem found, one per line (CF-4).
    """
    merged: dict[Any, Any] = dict(base or {})
    if path is not None:
        merged.update(read_config_file(path))
    problems: list[str] = []
    for argument in sets:
        try:
            key, value = _parse_set(argument)
        except InvalidValue as exc:
            problems.append(f"invalid --set argument '{exc.got}': {exc.problem}")
            continue
        _apply_set(merged, key, value)
    if problems:
        raise ConfigError(problems)
    if host is not None:
        merged["host"] = host
    if port is not None:
        merged["port"] = port
    return config_from_mapping(merged)


def resolve_api_key(config: Config) -> str | None:
    """J-35: `judge_api_key`, else a non-empty GENRM_JUDGE_API_KEY, else no key."""
    if config.judge_api_key:
        return config.judge_api_key
    return os.environ.get(API_KEY_ENV) or None


def public_view(config: Config) -> dict[str, Any]:
    """The effective configuration for logs: the key shown as `<set>` or null, no URL user-info.

    `<set>` means a key will be sent, whether it came from `judge_api_key` or the environment.
    """
    view = msgspec.structs.asdict(config)
    view["judge_base_url"] = url_without_userinfo(config.judge_base_url)
    if config.judge_base_urls is not None:
        view["judge_base_urls"] = [url_without_userinfo(url) for url in config.judge_base_urls]
    view["judge_api_key"] = "<set>" if resolve_api_key(config) is not None else None
    view[SAMPLING_KEY] = copy.deepcopy(config.genrm_responses_create_params)
    view["judge_input_strip_tokens"] = list(config.judge_input_strip_tokens)
    view["group_store"] = url_without_userinfo(config.group_store)
    return view


def config_warnings(config: Config) -> list[str]:
    """Settings that are accepted but partly ineffective, as startup WARNING texts (CF-10)."""
    warnings: list[str] = []
    if config.early_judging and config.group_store != "memory":
        warnings.append(
            "early_judging has no effect with a shared group_store: a group's comparisons "
            "start when its last member is stored"
        )
    own = config.judge_process_max_concurrency
    if own is not None and own >= config.judge_max_concurrency:
        warnings.append(
            f"judge_process_max_concurrency ({own}) has no effect: it is not below "
            f"judge_max_concurrency ({config.judge_max_concurrency}), which no process exceeds"
        )
    if config.masked_reward_placeholder != "zero" and not config.group_mode:
        warnings.append(
            f"masked_reward_placeholder: {config.masked_reward_placeholder} has no effect in "
            "single-rollout mode: no row is ever masked there"
        )
    if config.judge_request_timeout_s > config.cohort_evaluation_timeout_s:
        warnings.append(
            f"judge_request_timeout_s ({format_seconds(config.judge_request_timeout_s)}) is "
            f"longer than cohort_evaluation_timeout_s "
            f"({format_seconds(config.cohort_evaluation_timeout_s)}): in /verify the per-request "
            "deadline can never fire before the evaluation deadline (it still bounds /compare)"
        )
    return warnings
