"""The configuration's checks: one checker per key, every problem reported on its own line.

Validation happens once, at load (§7); `config_from_mapping` validates a plain mapping over the
defaults.
"""

from __future__ import annotations

import copy
import difflib
import math
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, get_args

import msgspec

from genrm_trio.config._schema import (
    SAMPLING_KEY,
    AppendFsync,
    Config,
    JudgeApi,
    JudgeBalance,
    LogFormat,
    LogLevel,
    MaskedRewardPlaceholder,
    Strategy,
)
from genrm_trio.core.chat_markup import check_strip_token

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


class InvalidValue(Exception):
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


def format_got(value: Any) -> str:
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
        items = ", ".join(f"{format_got(k)}: {format_got(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(format_got(v) for v in value) + "]"
    return repr(value)


def shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _invalid_line(key: str, problem: str, got: Any) -> str:
    return f"invalid configuration: {key}: {problem} (got {shorten(format_got(got))})"


def _integer(minimum: int, maximum: int | None = None) -> _Check:
    if maximum is None:
        problem = f"must be an integer >= {minimum}"
    else:
        problem = f"must be an integer from {minimum} to {maximum}"

    def check(value: Any) -> int:
        # bool is an int subclass; a YAML `true` is never a count.
        if isinstance(value, bool):
            raise InvalidValue(problem, value)
        if isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, int):
            number = value
        else:
            raise InvalidValue(problem, value)
        if number < minimum or (maximum is not None and number > maximum):
            raise InvalidValue(problem, value)
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
            raise InvalidValue(problem, value)
        try:
            number = float(value)
        except OverflowError:
            raise InvalidValue(problem, value) from None
        if not math.isfinite(number):
            raise InvalidValue(problem, value)
        if above is not None and not number > above:
            raise InvalidValue(problem, value)
        if at_least is not None and number < at_least:
            raise InvalidValue(problem, value)
        if at_most is not None and number > at_most:
            raise InvalidValue(problem, value)
        return number

    return check


def _choice(literal: Any) -> _Check:
    choices: tuple[str, ...] = get_args(literal)
    problem = "must be one of " + ", ".join(choices)

    def check(value: Any) -> str:
        # Case-sensitive on purpose (CF-5): `INFO` and `info` are not both accepted.
        if not isinstance(value, str) or value not in choices:
            raise InvalidValue(problem, value)
        return value

    return check


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidValue("must be true or false", value)
    return value


def _non_empty_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidValue("must be a non-empty string", value)
    return value


def _group_store(value: Any) -> str:
    from genrm_trio.store.resp import StoreAddress

    if value == "memory":
        return value
    if not isinstance(value, str):
        raise InvalidValue("must be 'memory' or a redis://, rediss:// or unix:// URL", value)
    try:
        StoreAddress.parse(value)
    except ValueError as exc:
        raise InvalidValue(str(exc), url_without_userinfo(value)) from None
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidValue("must be a string", value)
    return value


def _nullable_integer(minimum: int) -> _Check:
    check = _integer(minimum)
    problem = f"must be an integer >= {minimum} or null"

    def nullable(value: Any) -> int | None:
        if value is None:
            return None
        try:
            return int(check(value))
        except InvalidValue:
            raise InvalidValue(problem, value) from None

    return nullable


def _nullable_path(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise InvalidValue("must be a non-empty path or null", value)
    return value


def _warning_ratio(value: Any) -> float | None:
    # 0 is refused rather than read as "off": it would warn on every window, masked or not.
    problem = "must be a number > 0 and <= 1, or null to turn the warning off"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidValue(problem, value)
    if not 0 < value <= 1:  # also refuses nan
        raise InvalidValue(problem, value)
    return float(value)


class _HiddenValue:
    """Stands in for a secret in an error message so the message still says what was wrong."""

    def __init__(self, value: Any) -> None:
        self.kind = type(value).__name__

    def __repr__(self) -> str:
        return f"<hidden {self.kind}>"


def _api_key(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InvalidValue("must be a string or null", _HiddenValue(value))


def _judge_base_url(value: Any) -> str:
    problem = "must be an http or https URL"
    if not isinstance(value, str):
        raise InvalidValue(problem, value)
    shown = url_without_userinfo(value)
    if any(ch.isspace() for ch in value):
        raise InvalidValue(problem, shown)
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise InvalidValue(problem, shown) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidValue(problem, shown)
    if parts.query or parts.fragment:
        raise InvalidValue(problem + " without query or fragment", shown)
    # The judge paths are appended as `<base>/chat/completions`, so a trailing `/` is dropped.
    return value.rstrip("/")


def _judge_base_urls(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not value:
        raise InvalidValue("must be a non-empty list of http or https URLs, or null", value)
    urls: list[str] = []
    for item in value:
        try:
            url = _judge_base_url(item)
        except InvalidValue as exc:
            raise InvalidValue(f"every entry {exc.problem}", exc.got) from None
        if url in urls:
            raise InvalidValue("lists a replica twice", url_without_userinfo(url))
        urls.append(url)
    return tuple(urls)


def _probe_path(value: Any) -> str | None:
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not value.startswith("/")
        or any(ch.isspace() or ch in "?#" for ch in value)
    ):
        raise InvalidValue("must be a path starting with / (no query), or null", value)
    return value


def _strip_tokens(value: Any) -> tuple[str, ...]:
    problem = "must be a list of non-empty strings, or [] to strip nothing"
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise InvalidValue(problem, value)
    for token in value:
        wrong = check_strip_token(token)
        if wrong is not None:
            raise InvalidValue(wrong, value)
    return tuple(value)


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
        except InvalidValue as exc:
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
    "judge_process_max_concurrency": _nullable_integer(1),
    "judge_base_urls": _judge_base_urls,
    "judge_balance": _choice(JudgeBalance),
    "judge_replica_max_concurrency": _nullable_integer(1),
    "judge_replica_eject_after": _integer(1),
    "judge_replica_cooldown_s": _number(above=0),
    "judge_request_timeout_s": _number(above=0),
    "judge_retry_max_sleep_s": _number(at_least=0),
    "judge_probe_path": _probe_path,
    "judge_probe_interval_s": _number(above=0),
    "judge_probe_timeout_s": _number(above=0),
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
    "judge_input_strip_tokens": _strip_tokens,
    "aggregator_method": _choice(Literal["simple_tiebreaker"]),
    "reasoning_bonus": _number(at_least=0),
    "answer_bonus": _number(at_least=0),
    "top_percentile": _number(at_least=0, at_most=1),
    "group_reasoning_length_penalty_coeff": _number(at_least=0),
    "group_answer_length_penalty_coeff": _number(at_least=0),
    "group_style_penalty_coeff": _number(at_least=0),
    "default_score": _number(),
    "default_ranking": _number(),
    "masked_reward_placeholder": _choice(MaskedRewardPlaceholder),
    "openrlhf_fail_on_transport_mask": _boolean,
    "max_body_bytes": _integer(1024),
    "waiting_body_memory_bytes": _nullable_integer(0),
    "spool_dir": _nullable_path,
    "max_compare_responses": _integer(1),
    "shutdown_grace_s": _number(above=0),
    "log_level": _choice(LogLevel),
    "log_format": _choice(LogFormat),
    "debug_logging": _boolean,
    "mask_window_s": _number(above=0),
    "mask_warning_ratio": _warning_ratio,
    "mask_warning_min_rollouts": _integer(1),
    "early_judging": _boolean,
    "group_store": _group_store,
    "group_store_key_prefix": _non_empty_text,
    "group_store_lease_s": _number(above=0),
    "group_store_poll_s": _number(above=0),
    "workers": _integer(1),
    "embedded_store_appendfsync": _choice(AppendFsync),
}

CONFIG_KEYS: tuple[str, ...] = tuple(_CHECKS)
REQUIRED_KEYS = ("judge_base_url", "judge_model")


def _unknown_key_line(key: Any) -> str:
    line = f"unknown configuration key '{key}'"
    close = difflib.get_close_matches(str(key), _CHECKS, n=1)
    return f"{line} (did you mean '{close[0]}'?)" if close else line


def _validate(values: Mapping[Any, Any]) -> Config:
    """Check every key of `values` (over the defaults) and report all problems at once."""
    lines = [_unknown_key_line(key) for key in values if key not in _CHECKS]
    accepted: dict[str, Any] = {}
    replicas = values.get("judge_base_urls") is not None
    for key, check in _CHECKS.items():
        # With judge_base_urls, judge_base_url may be left out: the first replica stands for it.
        required = key in REQUIRED_KEYS and not (key == "judge_base_url" and replicas)
        if key not in values:
            if required:
                lines.append(f"invalid configuration: {key}: required")
            continue
        value = values[key]
        if value is None and required:
            lines.append(f"invalid configuration: {key}: required")
        elif value is None and key in REQUIRED_KEYS:
            continue
        elif key == SAMPLING_KEY:
            sampling, problems = _check_sampling(value)
            lines.extend(problems)
            accepted[key] = sampling
        else:
            try:
                accepted[key] = check(value)
            except InvalidValue as exc:
                lines.append(_invalid_line(key, exc.problem, exc.got))
    urls = accepted.get("judge_base_urls")
    if urls and not lines:
        base = accepted.setdefault("judge_base_url", urls[0])
        if base not in urls:
            lines.append(
                _invalid_line(
                    "judge_base_url",
                    "must be one of judge_base_urls when both are set",
                    url_without_userinfo(base),
                )
            )
    if lines:
        raise ConfigError(lines)
    return Config(**accepted)


def config_from_mapping(values: Mapping[str, Any]) -> Config:
    """Validate a plain mapping of configuration keys over the defaults (as `create_app` does)."""
    return _validate(values)
