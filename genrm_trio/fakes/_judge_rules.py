"""What a fake judge is told to do: latency models, the prefix-cache model, scripted rules and
random fault rates, each parsed and checked before a judge uses it (§8.2)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Api = Literal["chat_completions", "responses"]

APIS: tuple[Api, ...] = ("chat_completions", "responses")

ACTIONS: tuple[str, ...] = (
    "verdict",
    "text",
    "empty",
    "null_content",
    "finish",
    "budget_exhausted",
    "http_status",
    "truncated_body",
    "non_json",
    "raw",
    "close",
    "hang",
)

_RULE_KEYS = frozenset({"match", "times", "after", "probability", "delay_s", "action"})

_MATCH_KEYS = frozenset({"response_1", "response_2", "any_order", "principle", "api"})

_ACTION_FIELDS: dict[str, frozenset[str]] = {
    "verdict": frozenset({"score_1", "score_2", "ranking"}),
    "text": frozenset({"text", "finish"}),
    "empty": frozenset(),
    "null_content": frozenset(),
    "finish": frozenset({"value"}),
    "budget_exhausted": frozenset(),
    "http_status": frozenset({"status", "body", "retry_after"}),
    "truncated_body": frozenset(),
    "non_json": frozenset(),
    "raw": frozenset({"body", "status", "content_type"}),
    "close": frozenset(),
    "hang": frozenset(),
}

_REQUIRED_FIELDS: dict[str, frozenset[str]] = {
    "text": frozenset({"text"}),
    "finish": frozenset({"value"}),
    "http_status": frozenset({"status"}),
    "raw": frozenset({"body"}),
}


# --------------------------------------------------------------------------------------------
# Latency (CL-16)


@dataclass(frozen=True, slots=True)
class Latency:
    """A parsed ``--latency`` setting."""

    kind: Literal["none", "fixed", "uniform", "lognormal"]
    a: float = 0.0
    b: float = 0.0

    def draw(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b)
        if self.kind == "lognormal":
            return rng.lognormvariate(math.log(self.a), self.b)
        return 0.0


@dataclass(frozen=True, slots=True)
class PrefixCacheModel:
    """A parsed ``--prefix-cache CAPACITY:MISS_S`` setting."""

    capacity: int
    miss_s: float


def parse_prefix_cache(spec: str | None) -> PrefixCacheModel | None:
    """Parse ``none`` (or None) or ``CAPACITY:MISS_S`` (CAPACITY >= 1, MISS_S >= 0)."""
    if spec is None or spec.strip() == "none":
        return None
    capacity, sep, miss = spec.strip().partition(":")
    try:
        model = PrefixCacheModel(int(capacity), float(miss))
    except ValueError:
        model = None
    if not sep or model is None or model.capacity < 1 or not 0 <= model.miss_s < math.inf:
        raise ValueError(
            f"prefix cache {spec!r}: expected none or CAPACITY:MISS_S "
            "(CAPACITY an integer >= 1, MISS_S seconds >= 0)"
        )
    return model


def parse_latency(spec: str) -> Latency:
    """Parse ``none``, ``fixed:S``, ``uniform:LO:HI`` or ``lognormal:MEDIAN:SIGMA``."""
    kind, *parts = spec.strip().split(":")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"latency {spec!r}: values must be numbers") from None
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"latency {spec!r}: values must be finite")
    if kind == "none" and not values:
        return Latency("none")
    if kind == "fixed" and len(values) == 1 and values[0] >= 0:
        return Latency("fixed", values[0])
    if kind == "uniform" and len(values) == 2 and 0 <= values[0] <= values[1]:
        return Latency("uniform", values[0], values[1])
    if kind == "lognormal" and len(values) == 2 and values[0] > 0 and values[1] >= 0:
        return Latency("lognormal", values[0], values[1])
    raise ValueError(
        f"latency {spec!r}: expected none, fixed:S, uniform:LO:HI (0 <= LO <= HI) "
        "or lognormal:MEDIAN:SIGMA (MEDIAN > 0, SIGMA >= 0)"
    )


# --------------------------------------------------------------------------------------------
# Rules (CL-15) and fault rates (CL-17)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_action_fields(action: object, fields: Mapping[str, Any], where: str) -> str:
    """Validate an action name and its fields; return the action name."""
    if not isinstance(action, str) or action not in _ACTION_FIELDS:
        expected = ", ".join(ACTIONS)
        raise ValueError(f"{where}: unknown action {action!r}; expected one of {expected}")
    missing = _REQUIRED_FIELDS.get(action, frozenset()) - fields.keys()
    if missing:
        raise ValueError(f"{where}: action {action!r} needs {', '.join(sorted(missing))}")
    if action == "text":
        if not isinstance(fields["text"], str):
            raise ValueError(f"{where}: text must be a string")
        if "finish" in fields and not isinstance(fields["finish"], str):
            raise ValueError(f"{where}: finish must be a string")
    if action == "finish" and not isinstance(fields["value"], str):
        raise ValueError(f"{where}: value must be a string")
    if "status" in fields and not (_is_int(fields["status"]) and 200 <= fields["status"] <= 599):
        raise ValueError(f"{where}: status must be an integer HTTP status in 200..599")
    if "content_type" in fields and not isinstance(fields["content_type"], str):
        raise ValueError(f"{where}: content_type must be a string")
    if "retry_after" in fields and not (
        _is_number(fields["retry_after"]) or isinstance(fields["retry_after"], str)
    ):
        raise ValueError(f"{where}: retry_after must be a number of seconds or an HTTP date")
    return action


@dataclass(slots=True)
class Rule:
    source: dict[str, Any]
    action: str
    fields: dict[str, Any]
    response_1: str | None
    response_2: str | None
    any_order: bool
    principle: str | None
    api: str | None
    times: int | None
    after: int
    probability: float
    delay_s: float
    matched: int = 0

    def matches(self, api: Api, response_1: str, response_2: str, principle: str | None) -> bool:
        if self.api is not None and self.api != api:
            return False
        if self.principle is not None and (principle is None or self.principle not in principle):
            return False
        straight = (self.response_1 is None or self.response_1 in response_1) and (
            self.response_2 is None or self.response_2 in response_2
        )
        if straight or not self.any_order:
            return straight
        return (self.response_1 is None or self.response_1 in response_2) and (
            self.response_2 is None or self.response_2 in response_1
        )


def compile_rule(index: int, rule: object) -> Rule:
    where = f"rule {index}"
    if not isinstance(rule, Mapping):
        raise ValueError(f"{where}: expected a mapping")
    action = _check_action_fields(rule.get("action"), rule, where)
    allowed = _RULE_KEYS | _ACTION_FIELDS[action]
    unknown = sorted(str(k) for k in rule if k not in allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} for action {action!r}")
    match = rule.get("match", {})
    if not isinstance(match, Mapping):
        raise ValueError(f"{where}: match must be a mapping")
    unknown = sorted(str(k) for k in match if k not in _MATCH_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown match key {unknown[0]!r}")
    for key in ("response_1", "response_2", "principle"):
        if key in match and not isinstance(match[key], str):
            raise ValueError(f"{where}: match.{key} must be a string")
    if not isinstance(match.get("any_order", False), bool):
        raise ValueError(f"{where}: match.any_order must be a boolean")
    if "api" in match and match["api"] not in APIS:
        raise ValueError(f"{where}: match.api must be one of {', '.join(APIS)}")
    times = rule.get("times")
    if times is not None and not (_is_int(times) and times >= 0):
        raise ValueError(f"{where}: times must be an integer >= 0")
    after = rule.get("after", 0)
    if not (_is_int(after) and after >= 0):
        raise ValueError(f"{where}: after must be an integer >= 0")
    probability = rule.get("probability", 1)
    if not (_is_number(probability) and 0 <= probability <= 1):
        raise ValueError(f"{where}: probability must be a number in [0, 1]")
    delay_s = rule.get("delay_s", 0)
    if not (_is_number(delay_s) and math.isfinite(delay_s) and delay_s >= 0):
        raise ValueError(f"{where}: delay_s must be a finite number >= 0")
    return Rule(
        source=dict(rule),
        action=action,
        fields={k: rule[k] for k in _ACTION_FIELDS[action] if k in rule},
        response_1=match.get("response_1"),
        response_2=match.get("response_2"),
        any_order=match.get("any_order", False),
        principle=match.get("principle"),
        api=match.get("api"),
        times=times,
        after=after,
        probability=float(probability),
        delay_s=float(delay_s),
    )


@dataclass(frozen=True, slots=True)
class FaultRate:
    name: str
    action: str
    fields: dict[str, Any]
    probability: float


def parse_fault_action(name: str) -> tuple[str, dict[str, Any]]:
    """``budget_exhausted`` -> (action, {}); ``http_status:503`` and ``finish:length`` carry
    their one field after the colon. Actions that need a body or text cannot be fault rates."""
    action, sep, argument = name.partition(":")
    fields: dict[str, Any] = {}
    if action == "http_status":
        if not sep or not argument.isdigit():
            raise ValueError(f"fault rate {name!r}: write http_status:<status>, e.g. :503")
        fields["status"] = int(argument)
    elif action == "finish":
        if not sep or not argument:
            raise ValueError(f"fault rate {name!r}: write finish:<value>, e.g. finish:length")
        fields["value"] = argument
    elif sep:
        raise ValueError(f"fault rate {name!r}: action {action!r} takes no argument")
    elif action in ("verdict", "text", "raw"):
        raise ValueError(f"fault rate {name!r}: action {action!r} needs fields; use a rule")
    _check_action_fields(action, fields, f"fault rate {name!r}")
    return action, fields


def compile_fault_rates(rates: Mapping[str, float] | None) -> list[FaultRate]:
    compiled = []
    for name, probability in (rates or {}).items():
        action, fields = parse_fault_action(name)
        if not (_is_number(probability) and 0 <= probability <= 1):
            raise ValueError(f"fault rate {name!r}: probability must be a number in [0, 1]")
        compiled.append(FaultRate(name, action, fields, float(probability)))
    return compiled
