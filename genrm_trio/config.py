"""Typed server configuration: defaults, YAML file, ``--set`` overrides and validation.

Validation happens once, at load; every invalid key is reported on its own line.
"""

from __future__ import annotations

import copy
import math
import os
import re
import urllib.parse
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar, Literal, get_args

import msgspec
import yaml

from genrm_trio.core.messages import format_seconds

DEFAULT_PRINCIPLE = (
    "You are an impartial judge comparing two assistant responses to the conversation above. "
    "Before judging, write your own answer to the user's last message. Then check both responses "
    "against it, and point out and correct any mistakes or inaccurate statements. Decide how "
    "helpful each response is: it should answer the request or follow the instructions, and when "
    "the request is ambiguous or open to several readings, asking the user to clarify is better "
    "than guessing. Decide how relevant each response is: every part should relate to what was "
    "asked. Decide how concise each response is: clear and to the point, without padding or "
    "needless length. Where it matters, weigh creativity and novelty. Note any important "
    "information that is missing from either response and would help the user."
)


def _default_sampling() -> dict[str, Any]:
    return {"max_output_tokens": 16384, "temperature": 0.6, "top_p": 0.95}


JudgeApi = Literal["chat_completions", "responses"]
Strategy = Literal["circular", "all_pairs", "fixed_baseline"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


class Config(msgspec.Struct, frozen=True, kw_only=True):
    """The effective configuration; field names are the configuration keys."""

    judge_base_url: str
    judge_model: str
    host: str = "127.0.0.1"
    port: int = 8000
    listen_backlog: int = 4096
    judge_api: JudgeApi = "chat_completions"
    judge_api_key: str | None = None
    judge_max_concurrency: int = 256
    judge_request_timeout_s: float = 1800.0
    judge_retry_max_sleep_s: float = 8.0
    genrm_parse_retries: int = 3
    genrm_parse_retry_sleep_s: float = 0.2
    genrm_responses_create_params: dict[str, Any] = msgspec.field(default_factory=_default_sampling)
    compare_timeout_s: float | None = None
    num_rollouts_per_prompt: int = 16
    cohort_collection_timeout_s: float = 1800.0
    cohort_evaluation_timeout_s: float = 1800.0
    cohort_result_ttl_s: float | None = 3600.0
    max_terminal_cohorts: int = 4096
    comparison_strategy: Strategy = "circular"
    num_judges_per_comparison: int = 1
    use_principle: bool = False
    default_principle: str = DEFAULT_PRINCIPLE
    aggregator_method: Literal["simple_tiebreaker"] = "simple_tiebreaker"
    reasoning_bonus: float = 0.0
    answer_bonus: float = 0.0
    top_percentile: float = 0.2
    group_reasoning_length_penalty_coeff: float = 0.0
    group_answer_length_penalty_coeff: float = 0.0
    group_style_penalty_coeff: float = 0.0
    default_score: float = 3.0
    default_ranking: float = 3.5
    max_body_bytes: int = 67108864
    # Bodies of requests in flight kept in memory; beyond it they wait in files in spool_dir
    # (None: no budget, every body stays in memory).
    waiting_body_memory_bytes: int | None = 1073741824
    spool_dir: str | None = None  # None: a private temporary directory removed at exit
    max_compare_responses: int = 1024
    shutdown_grace_s: float = 5.0
    log_level: LogLevel = "INFO"
    debug_logging: bool = False
    early_judging: bool = False

    @property
    def group_mode(self) -> bool:
        """W-11: groups are gathered when N > 1 or under fixed_baseline."""
        return self.num_rollouts_per_prompt > 1 or self.comparison_strategy == "fixed_baseline"

    @property
    def attempts_per_comparison(self) -> int:
        return self.genrm_parse_retries + 1


# ---------------------------------------------------------------------------------------------
# Loading and validation (§7)
# ---------------------------------------------------------------------------------------------

API_KEY_ENV = "GENRM_JUDGE_API_KEY"
SAMPLING_KEY = "genrm_responses_create_params"
# Keys of the sampling mapping the server fills in itself (CF-12), in the order they are reported.
SERVER_OWNED_SAMPLING_KEYS = ("model", "messages", "stream")


class ConfigError(Exception):
    """Every problem found in one load, one message per line; the command exits with status 2."""

    exit_status: ClassVar[int] = 2

    def __init__(self, lines: str | Sequence[str]) -> None:
        self.lines: list[str] = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("\n".join(self.lines))

    def __str__(self) -> str:
        return "\n".join(self.lines)


class _Invalid(Exception):
    """One value's problem; `got` is the value as the user wrote it."""

    def __init__(self, problem: str, got: Any) -> None:
        super().__init__(problem)
        self.problem = problem
        self.got = got


_Check = Callable[[Any], Any]


def url_without_userinfo(url: str) -> str:
    """`url` with any `user:password@` removed, for logs and error texts (J-41)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url.rpartition("@")[2] if "@" in url else url
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _format_got(value: Any) -> str:
    """A value the way YAML would spell it back: null, true, inf, 'text', [1, 2], {a: 1}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, Mapping):
        items = ", ".join(f"{_format_got(k)}: {_format_got(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_format_got(v) for v in value) + "]"
    return repr(value)


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _invalid_line(key: str, problem: str, got: Any) -> str:
    return f"invalid configuration: {key}: {problem} (got {_shorten(_format_got(got))})"


def _integer(minimum: int, maximum: int | None = None) -> _Check:
    if maximum is None:
        problem = f"must be an integer >= {minimum}"
    else:
        problem = f"must be an integer from {minimum} to {maximum}"

    def check(value: Any) -> int:
        # bool is an int subclass; a YAML `true` is never a count.
        if isinstance(value, bool):
            raise _Invalid(problem, value)
        if isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, int):
            number = value
        else:
            raise _Invalid(problem, value)
        if number < minimum or (maximum is not None and number > maximum):
            raise _Invalid(problem, value)
        return number

    return check


def _format_bound(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


def _number(
    *,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
    nullable: bool = False,
) -> _Check:
    if above is not None:
        problem = f"must be a finite number > {_format_bound(above)}"
    elif at_least is not None and at_most is not None:
        problem = (
            f"must be a finite number from {_format_bound(at_least)} to {_format_bound(at_most)}"
        )
    elif at_least is not None:
        problem = f"must be a finite number >= {_format_bound(at_least)}"
    else:
        problem = "must be a finite number"
    if nullable:
        problem += " or null"

    def check(value: Any) -> float | None:
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Invalid(problem, value)
        try:
            number = float(value)
        except OverflowError:
            raise _Invalid(problem, value) from None
        if not math.isfinite(number):
            raise _Invalid(problem, value)
        if above is not None and not number > above:
            raise _Invalid(problem, value)
        if at_least is not None and number < at_least:
            raise _Invalid(problem, value)
        if at_most is not None and number > at_most:
            raise _Invalid(problem, value)
        return number

    return check


def _choice(literal: Any) -> _Check:
    choices: tuple[str, ...] = get_args(literal)
    problem = "must be one of " + ", ".join(choices)

    def check(value: Any) -> str:
        # Case-sensitive on purpose (CF-5): `INFO` and `info` are not both accepted.
        if not isinstance(value, str) or value not in choices:
            raise _Invalid(problem, value)
        return value

    return check


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid("must be true or false", value)
    return value


def _non_empty_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Invalid("must be a non-empty string", value)
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise _Invalid("must be a string", value)
    return value


def _nullable_integer(minimum: int) -> _Check:
    check = _integer(minimum)
    problem = f"must be an integer >= {minimum} or null"

    def nullable(value: Any) -> int | None:
        if value is None:
            return None
        try:
            return int(check(value))
        except _Invalid:
            raise _Invalid(problem, value) from None

    return nullable


def _nullable_path(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise _Invalid("must be a non-empty path or null", value)
    return value


class _HiddenValue:
    """Stands in for a secret in an error message so the message still says what was wrong."""

    def __init__(self, value: Any) -> None:
        self.kind = type(value).__name__

    def __repr__(self) -> str:
        return f"<hidden {self.kind}>"


def _api_key(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _Invalid("must be a string or null", _HiddenValue(value))


def _judge_base_url(value: Any) -> str:
    problem = "must be an http or https URL"
    if not isinstance(value, str):
        raise _Invalid(problem, value)
    shown = url_without_userinfo(value)
    if any(ch.isspace() for ch in value):
        raise _Invalid(problem, shown)
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise _Invalid(problem, shown) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _Invalid(problem, shown)
    if parts.query or parts.fragment:
        raise _Invalid(problem + " without query or fragment", shown)
    # The judge paths are appended as `<base>/chat/completions`, so a trailing `/` is dropped.
    return value.rstrip("/")


_max_output_tokens = _integer(1)


def _check_sampling(value: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """J-4/CF-12: a JSON mapping without the keys the server sets itself."""
    problem = "must be a mapping with string keys"
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        return None, [_invalid_line(SAMPLING_KEY, problem, value)]
    try:
        msgspec.json.encode(value)
    except (TypeError, msgspec.EncodeError):
        return None, [_invalid_line(SAMPLING_KEY, "must hold only JSON values", value)]
    sampling = copy.deepcopy(dict(value))
    lines = [
        f"invalid configuration: {SAMPLING_KEY}.{key}: set by the server; remove it"
        for key in SERVER_OWNED_SAMPLING_KEYS
        if key in sampling
    ]
    if "max_output_tokens" in sampling:
        try:
            sampling["max_output_tokens"] = _max_output_tokens(sampling["max_output_tokens"])
        except _Invalid as exc:
            lines.append(_invalid_line(f"{SAMPLING_KEY}.max_output_tokens", exc.problem, exc.got))
    return (None if lines else sampling), lines


# Every key, in the order of the §7 table; problems are reported in this order.
_CHECKS: dict[str, _Check] = {
    "host": _non_empty_text,
    "port": _integer(0, 65535),
    "listen_backlog": _integer(1),
    "judge_base_url": _judge_base_url,
    "judge_model": _non_empty_text,
    "judge_api": _choice(JudgeApi),
    "judge_api_key": _api_key,
    "judge_max_concurrency": _integer(1),
    "judge_request_timeout_s": _number(above=0),
    "judge_retry_max_sleep_s": _number(at_least=0),
    "genrm_parse_retries": _integer(0),
    "genrm_parse_retry_sleep_s": _number(at_least=0),
    SAMPLING_KEY: lambda value: value,  # checked by _check_sampling, which reports sub-keys
    "compare_timeout_s": _number(above=0, nullable=True),
    "num_rollouts_per_prompt": _integer(1),
    "cohort_collection_timeout_s": _number(above=0),
    "cohort_evaluation_timeout_s": _number(above=0),
    "cohort_result_ttl_s": _number(above=0, nullable=True),
    "max_terminal_cohorts": _integer(1),
    "comparison_strategy": _choice(Strategy),
    "num_judges_per_comparison": _integer(1),
    "use_principle": _boolean,
    "default_principle": _text,
    "aggregator_method": _choice(Literal["simple_tiebreaker"]),
    "reasoning_bonus": _number(at_least=0),
    "answer_bonus": _number(at_least=0),
    "top_percentile": _number(at_least=0, at_most=1),
    "group_reasoning_length_penalty_coeff": _number(at_least=0),
    "group_answer_length_penalty_coeff": _number(at_least=0),
    "group_style_penalty_coeff": _number(at_least=0),
    "default_score": _number(),
    "default_ranking": _number(),
    "max_body_bytes": _integer(1024),
    "waiting_body_memory_bytes": _nullable_integer(0),
    "spool_dir": _nullable_path,
    "max_compare_responses": _integer(1),
    "shutdown_grace_s": _number(above=0),
    "log_level": _choice(LogLevel),
    "debug_logging": _boolean,
    "early_judging": _boolean,
}

CONFIG_KEYS: tuple[str, ...] = tuple(_CHECKS)
REQUIRED_KEYS = ("judge_base_url", "judge_model")


def _validate(values: Mapping[Any, Any]) -> Config:
    """Check every key of `values` (over the defaults) and report all problems at once."""
    lines = [f"unknown configuration key '{key}'" for key in values if key not in _CHECKS]
    accepted: dict[str, Any] = {}
    for key, check in _CHECKS.items():
        if key not in values:
            if key in REQUIRED_KEYS:
                lines.append(f"invalid configuration: {key}: required")
            continue
        value = values[key]
        if value is None and key in REQUIRED_KEYS:
            lines.append(f"invalid configuration: {key}: required")
        elif key == SAMPLING_KEY:
            sampling, problems = _check_sampling(value)
            lines.extend(problems)
            accepted[key] = sampling
        else:
            try:
                accepted[key] = check(value)
            except _Invalid as exc:
                lines.append(_invalid_line(key, exc.problem, exc.got))
    if lines:
        raise ConfigError(lines)
    return Config(**accepted)


def config_from_mapping(values: Mapping[str, Any]) -> Config:
    """Validate a plain mapping of configuration keys over the defaults (as `create_app` does)."""
    return _validate(values)


# ---------------------------------------------------------------------------------------------
# YAML: the 1.2 core schema, so `yes`, `on` and `0755` mean what they say and `1e3` is a number.
# ---------------------------------------------------------------------------------------------


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


def _parse_yaml(text: str) -> Any:
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


def _read_file(path: str | os.PathLike[str]) -> Mapping[Any, Any]:
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
        document = _parse_yaml(text)
    except (yaml.YAMLError, ValueError) as exc:
        raise ConfigError([f"invalid configuration file '{shown}': {_yaml_problem(exc)}"]) from None
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ConfigError(
            [
                f"invalid configuration file '{shown}': expected a mapping of configuration keys "
                f"(got {_shorten(_format_got(document))})"
            ]
        )
    return document


def _parse_set(argument: str) -> tuple[str, Any]:
    key, sep, text = argument.partition("=")
    if not sep:
        raise _Invalid("expected key=value", argument)
    key = key.strip()
    try:
        return key, _parse_yaml(text)
    except (yaml.YAMLError, ValueError) as exc:
        raise _Invalid(f"value is not valid YAML: {_yaml_problem(exc)}", argument) from None


def _apply_set(merged: dict[Any, Any], key: str, value: Any) -> None:
    head, dot, rest = key.partition(".")
    if not dot or head != SAMPLING_KEY:
        merged[key] = value
        return
    if rest == "" or "" in rest.split("."):
        # An empty sub-key name cannot be meant; report it as the unknown key it is.
        merged[key] = value
        return
    current = merged.get(SAMPLING_KEY, _default_sampling())
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
        merged.update(_read_file(path))
    problems: list[str] = []
    for argument in sets:
        try:
            key, value = _parse_set(argument)
        except _Invalid as exc:
            problems.append(f"invalid --set argument '{exc.got}': {exc.problem}")
            continue
        _apply_set(merged, key, value)
    if problems:
        raise ConfigError(problems)
    if host is not None:
        merged["host"] = host
    if port is not None:
        merged["port"] = port
    return _validate(merged)


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
    view["judge_api_key"] = "<set>" if resolve_api_key(config) is not None else None
    view[SAMPLING_KEY] = copy.deepcopy(config.genrm_responses_create_params)
    return view


def config_warnings(config: Config) -> list[str]:
    """Settings that are accepted but partly ineffective, as startup WARNING texts (CF-10)."""
    warnings: list[str] = []
    if config.judge_request_timeout_s > config.cohort_evaluation_timeout_s:
        warnings.append(
            f"judge_request_timeout_s ({format_seconds(config.judge_request_timeout_s)}) is "
            f"longer than cohort_evaluation_timeout_s "
            f"({format_seconds(config.cohort_evaluation_timeout_s)}): in /verify the per-request "
            "deadline can never fire before the evaluation deadline (it still bounds /compare)"
        )
    return warnings
