"""The fake judge's logic: quality, verdicts, rules, faults, latency, statistics and recordings.
Adapters in ``fake_judge_http`` feed it requests and carry out the reply it decides (SPEC §8.2).

Theory of operation. Every HTTP request goes through :meth:`FakeJudge.handle`, which is
synchronous and returns a :class:`FakeReply`: what to send (status, headers, body), how
(``respond``, ``truncate``, ``close`` or ``hang``) and after how long (``delay_s``). A reply for a
judge call (``POST /v1/chat/completions`` or ``POST /v1/responses``) is *tracked*: it counts in
``in_flight`` from ``handle`` until the adapter calls :meth:`FakeJudge.end_request`, saying
whether the caller went away first. Control routes (CL-18), ``/v1/models`` and ``/healthz`` are
answered at once and are not judge calls.

Order of decisions for a judge call: API key (401), request checks (400), the first applicable
rule (CL-15), else the first fault rate that fires (CL-17), else the quality verdict (CL-13).
Rejected calls are answered without latency; every other action but ``hang`` waits the drawn
latency plus the rule's ``delay_s`` first (CL-16), plus, with the prefix-cache model on, the
prefill time of a conversation this judge has not served recently: the judge remembers the
conversation prefixes (history and principle, everything before the two responses) of its last
CAPACITY distinct prefixes, least recently used first out, and a call whose prefix is not among
them waits MISS_S more, as a vLLM replica recomputes a prefix its cache no longer holds.
Every random draw comes from a generator seeded with ``(seed, purpose, request number)``, so a
request's latency and faults depend only on the seed, the rules and its position in the request
sequence, never on timing (CL-19). ``reset()`` restarts the request numbering.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import re
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs

if TYPE_CHECKING:
    from genrm_trio.judge.transport import TransportFactory

Api = Literal["chat_completions", "responses"]
ReplyKind = Literal["respond", "truncate", "close", "hang"]
Number = int | float

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
DEFAULT_MODEL = "fake-judge"
REASONING = "comparing the two responses"
UNFINISHED_REASONING = "comparing the two responses, weighing the first one against"
INJECTED_ERROR_BODY = b'{"error":"injected"}'
NON_JSON_BODY = b"<html>not json</html>"
REDACTED = "<redacted>"
MAX_RECORDED_REQUESTS = 1000

_CHAT_PATH = "/v1/chat/completions"
_RESPONSES_PATH = "/v1/responses"
# A fixed creation time keeps replies byte-identical across runs (CL-19).
_CREATED = 1_700_000_000
_STANDARD_ROLES = frozenset({"system", "user", "assistant", "developer", "tool"})
_QUALITY_DIRECTIVE = re.compile(r"\[\[q=([+-]?(?:\d+(?:\.\d*)?|\.\d+))\]\]")

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
# Quality and verdict (CL-12, CL-13)


def _plain(value: float) -> Number:
    """An integral float becomes an int so that JSON shows ``5`` rather than ``5.0`` (CL-13)."""
    if math.isfinite(value) and value == int(value):
        return int(value)
    return value


def quality(text: str) -> float:
    """The quality q of an answer text (CL-12)."""
    directives = _QUALITY_DIRECTIVE.findall(text)
    if directives:
        return float(directives[-1])
    if text == "None":
        return 1.0
    return float(1 + len(text.strip()) % 5)


def quality_verdict(
    response_1: str, response_2: str, *, position_bias: float = 0.0, tie_ranking: float = 3.5
) -> tuple[Number, Number, Number]:
    """``(score_1, score_2, ranking)`` for two answer texts (CL-13)."""
    score_1, score_2, ranking = verdict_for_qualities(
        quality(response_1),
        quality(response_2),
        position_bias=position_bias,
        tie_ranking=tie_ranking,
    )
    return _plain(score_1), _plain(score_2), _plain(ranking)


def verdict_for_qualities(
    quality_1: float, quality_2: float, *, position_bias: float = 0.0, tie_ranking: float = 3.5
) -> tuple[float, float, float]:
    """``(score_1, score_2, ranking)`` for two answers of these qualities (CL-13)."""
    score_1 = min(max(quality_1 + position_bias, 1.0), 5.0)
    score_2 = min(max(quality_2, 1.0), 5.0)
    d = score_1 - score_2
    if d >= 2:
        ranking = 1.0
    elif d >= 1:
        ranking = 2.0
    elif d > 0:
        ranking = 3.0
    elif d == 0:
        ranking = tie_ranking
    elif d > -1:
        ranking = 4.0
    elif d > -2:
        ranking = 5.0
    else:
        ranking = 6.0
    return score_1, score_2, ranking


def pair_rule(i: int, j: int, action: str, **fields: Any) -> dict[str, Any]:
    """The rule "pair (i, j) fails with ``action``" of SPEC §10 (every matching call).

    ``fields`` holds the action's own fields (``status=503``) and may also carry ``times``,
    ``after``, ``probability`` or ``delay_s``.
    """
    rule: dict[str, Any] = {
        "match": {"response_1": f"answer-{i} ", "response_2": f"answer-{j} "},
        "action": action,
    }
    rule.update(fields)
    return rule


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
class _Rule:
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


def _compile_rule(index: int, rule: object) -> _Rule:
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
    return _Rule(
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
class _FaultRate:
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


def _compile_fault_rates(rates: Mapping[str, float] | None) -> list[_FaultRate]:
    compiled = []
    for name, probability in (rates or {}).items():
        action, fields = parse_fault_action(name)
        if not (_is_number(probability) and 0 <= probability <= 1):
            raise ValueError(f"fault rate {name!r}: probability must be a number in [0, 1]")
        compiled.append(_FaultRate(name, action, fields, float(probability)))
    return compiled


# --------------------------------------------------------------------------------------------
# Replies


@dataclass(frozen=True, slots=True)
class FakeReply:
    """What an adapter must do for one request.

    ``respond``: after ``delay_s``, send status, headers and body. ``truncate``: after
    ``delay_s``, announce ``Content-Length: len(body)``, send only ``body[:sent_bytes]`` and break
    the connection. ``close``: after ``delay_s``, break the connection without replying.
    ``hang``: never reply; wait until the caller goes away. Tracked replies must be ended with
    :meth:`FakeJudge.end_request`.
    """

    kind: ReplyKind
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    action: str
    delay_s: float = 0.0
    tracked: bool = False

    @property
    def reason(self) -> str:
        try:
            return HTTPStatus(self.status).phrase
        except ValueError:
            return ""

    @property
    def sent_bytes(self) -> int:
        """How much of the body a ``truncate`` reply sends before breaking the connection."""
        return len(self.body) // 2


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def _body_bytes(value: Any) -> bytes:
    """A rule's ``body``: a string is sent exactly, anything else as compact JSON."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _json_reply(status: int, value: Any, action: str) -> FakeReply:
    return FakeReply(
        "respond", status, (("content-type", "application/json"),), _json_bytes(value), action
    )


def _error_reply(status: int, problem: str, action: str = "rejected") -> FakeReply:
    return _json_reply(status, {"error": {"message": f"fake judge: {problem}"}}, action)


def _tokens(text: str) -> int:
    # A rough four-characters-per-token count keeps ``usage`` plausible and deterministic.
    return (len(text) + 3) // 4


def _fenced(verdict: Mapping[str, Any]) -> str:
    return "```json\n" + json.dumps(dict(verdict)) + "\n```"


@dataclass(frozen=True, slots=True)
class _Call:
    """A checked judge call."""

    api: Api
    model: str
    response_1: str
    response_2: str
    principle: str | None
    prompt_chars: int
    prefix: bytes  # digest of the conversation before the two responses


def _chat_reply(
    call: _Call, number: int, content: str | None, finish_reason: str
) -> dict[str, Any]:
    completion = _tokens(content or "")
    prompt = _tokens("x" * call.prompt_chars)
    return {
        "id": f"chatcmpl-fake-{number}",
        "object": "chat.completion",
        "created": _CREATED,
        "model": call.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _responses_reply(
    call: _Call,
    number: int,
    text: str | None,
    status: str,
    *,
    with_message: bool = True,
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    # Every field a Responses-API client requires is present (ids, annotations, tool settings,
    # token details), so that clients that validate replies, such as NeMo Gym's model servers,
    # accept them.
    output: list[dict[str, Any]] = [
        {
            "id": f"rs-fake-{number}",
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": REASONING}],
        }
    ]
    if with_message:
        output.append(
            {
                "id": f"msg-fake-{number}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    reasoning = _tokens(REASONING)
    completion = _tokens(REASONING + (text or ""))
    prompt = _tokens("x" * call.prompt_chars)
    reply: dict[str, Any] = {
        "id": f"resp-fake-{number}",
        "object": "response",
        "created_at": _CREATED,
        "status": status,
        "model": call.model,
        "output": output,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + completion,
        },
    }
    if incomplete_reason is not None:
        reply["incomplete_details"] = {"reason": incomplete_reason}
    return reply


def _completion(call: _Call, number: int, action: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of a completed-looking reply for the actions that produce one."""
    chat = call.api == "chat_completions"
    if action == "verdict":
        verdict = {k: fields[k] for k in ("score_1", "score_2", "ranking") if k in fields}
        if chat:
            content = f"<think>{REASONING}</think>\n{_fenced(verdict)}"
            return _chat_reply(call, number, content, "stop")
        return _responses_reply(call, number, _fenced(verdict), "completed")
    if action == "text":
        if chat:
            return _chat_reply(call, number, fields["text"], fields.get("finish", "stop"))
        return _responses_reply(call, number, fields["text"], fields.get("finish", "completed"))
    if action == "empty":
        if chat:
            return _chat_reply(call, number, f"<think>{REASONING}</think>", "stop")
        return _responses_reply(call, number, "", "completed")
    if action == "null_content":
        if chat:
            return _chat_reply(call, number, None, "stop")
        return _responses_reply(call, number, None, "completed")
    if action == "finish":
        if chat:
            return _chat_reply(call, number, f"<think>{REASONING}</think>", fields["value"])
        return _responses_reply(call, number, None, fields["value"], with_message=False)
    if action == "budget_exhausted":
        if chat:
            return _chat_reply(call, number, f"<think>{UNFINISHED_REASONING}", "length")
        return _responses_reply(
            call,
            number,
            None,
            "incomplete",
            with_message=False,
            incomplete_reason="max_output_tokens",
        )
    raise AssertionError(f"action {action!r} has no completion body")


# --------------------------------------------------------------------------------------------
# Request checks (CL-11)


class _Rejected(Exception):
    def __init__(self, status: int, problem: str) -> None:
        super().__init__(problem)
        self.status = status
        self.problem = problem


def _check_chat(body: Mapping[str, Any]) -> tuple[str, str, str | None, int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _Rejected(400, "messages must be a non-empty array")
    roles: list[str] = []
    chars = 0
    for index, message in enumerate(messages):
        if not (
            isinstance(message, Mapping)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise _Rejected(
                400, f"messages[{index}] must be an object with string role and content"
            )
        roles.append(message["role"])
        chars += len(message["content"])
    if len(roles) < 2 or roles[-2:] != ["response_1", "response_2"]:
        raise _Rejected(400, "the last two messages must have roles response_1 then response_2")
    has_principle = len(roles) >= 3 and roles[-3] == "principle"
    head = roles[: -3 if has_principle else -2]
    for index, role in enumerate(head):
        if role not in _STANDARD_ROLES:
            raise _Rejected(400, f"messages[{index}] has unexpected role {role!r}")
    principle = messages[-3]["content"] if has_principle else None
    return messages[-2]["content"], messages[-1]["content"], principle, chars


def _check_responses(body: Mapping[str, Any]) -> tuple[str, str, str | None, int]:
    metadata = body.get("metadata")
    if not isinstance(metadata, Mapping):
        raise _Rejected(400, "metadata must be an object")
    for key in ("response_1", "response_2"):
        if not isinstance(metadata.get(key), str):
            raise _Rejected(400, f"metadata.{key} must be a string")
    principle = metadata.get("principle")
    if principle is not None and not isinstance(principle, str):
        raise _Rejected(400, "metadata.principle must be a string")
    history = body.get("input", [])
    if not isinstance(history, str | list):
        raise _Rejected(400, "input must be a string or an array")
    chars = len(json.dumps(history)) + sum(len(v) for v in metadata.values() if isinstance(v, str))
    return metadata["response_1"], metadata["response_2"], principle, chars


# --------------------------------------------------------------------------------------------
# The judge


@dataclass(slots=True)
class _Counters:
    requests_total: int = 0
    by_api: dict[str, int] = field(default_factory=lambda: dict.fromkeys(APIS, 0))
    by_action: dict[str, int] = field(default_factory=dict)
    max_in_flight: int = 0
    cancelled: int = 0
    prefix_hits: int = 0
    prefix_misses: int = 0


class FakeJudge:
    """An OpenAI-compatible pairwise judge whose verdicts follow from the answers' texts."""

    def __init__(
        self,
        *,
        seed: int = 0,
        model: str | None = None,
        api_key: str | None = None,
        latency: str = "none",
        position_bias: float = 0.0,
        tie_ranking: float = 3.5,
        rules: list[dict[str, Any]] | None = None,
        fault_rates: dict[str, float] | None = None,
        prefix_cache: str | None = None,
    ) -> None:
        self.seed = seed
        self.model = model
        self.api_key = api_key
        self.latency = parse_latency(latency)
        self.prefix_cache = parse_prefix_cache(prefix_cache)
        self._prefixes: OrderedDict[bytes, None] = OrderedDict()
        self.position_bias = float(position_bias)
        self.tie_ranking = float(tie_ranking)
        self._fault_rates = _compile_fault_rates(fault_rates)
        self._rules: list[_Rule] = []
        self.set_rules(rules or [])
        self._counters = _Counters()
        self._in_flight = 0
        self._recorded: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED_REQUESTS)
        self._observers: list[Callable[[], None]] = []

    # -- configuration -------------------------------------------------------------------

    @property
    def rules(self) -> list[dict[str, Any]]:
        return [dict(rule.source) for rule in self._rules]

    def set_rules(self, rules: Iterable[Mapping[str, Any]]) -> None:
        """Replace the rules; usage counts start afresh. Raises ``ValueError`` naming the
        first bad rule, leaving the previous rules in place."""
        if isinstance(rules, str | bytes | Mapping):
            raise ValueError("rules must be a list")
        self._rules = [_compile_rule(index, rule) for index, rule in enumerate(rules)]

    def reset(self) -> None:
        """Zero the counters, forget recorded requests and rule usage; rules stay (CL-18).

        ``in_flight`` is a gauge of requests still being answered, so it is kept.
        """
        self._counters = _Counters(max_in_flight=self._in_flight)
        self._recorded.clear()
        self._prefixes.clear()
        for rule in self._rules:
            rule.matched = 0
        self._notify()

    # -- observation ---------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """CL-18 statistics."""
        counters = self._counters
        stats: dict[str, Any] = {
            "requests_total": counters.requests_total,
            "by_api": dict(counters.by_api),
            "by_action": dict(counters.by_action),
            "in_flight": self._in_flight,
            "max_in_flight": counters.max_in_flight,
            "cancelled": counters.cancelled,
        }
        if self.prefix_cache is not None:
            stats["prefix_cache"] = {
                "hits": counters.prefix_hits,
                "misses": counters.prefix_misses,
            }
        return stats

    def requests(self, limit: int = MAX_RECORDED_REQUESTS) -> list[dict[str, Any]]:
        """The last ``limit`` recorded judge calls, oldest first.

        Each has ``index`` (0-based request number), ``path``, ``api``, ``headers`` (lower-case
        names; Authorization redacted), ``body`` (decoded JSON, or None), ``arrival_time`` (the
        clock reading passed to :meth:`handle`, the Trio clock in the adapters), ``action`` and
        ``delay_s`` (latency plus rule delay).
        """
        if limit <= 0:
            return []
        return [dict(entry) for entry in list(self._recorded)[-limit:]]

    def add_observer(self, observer: Callable[[], None]) -> Callable[[], None]:
        """Call ``observer()`` whenever a judge call starts or ends, or the judge is reset.
        Returns a function that removes it."""
        self._observers.append(observer)
        return lambda: self._observers.remove(observer)

    def _notify(self) -> None:
        for observer in list(self._observers):
            observer()

    def quality(self, text: str) -> float:
        return quality(text)

    def verdict(self, response_1: str, response_2: str) -> tuple[Number, Number, Number]:
        return quality_verdict(
            response_1,
            response_2,
            position_bias=self.position_bias,
            tie_ranking=self.tie_ranking,
        )

    def transport(self) -> TransportFactory:
        """The judge client's in-memory transport serving this judge (no sockets): pass it as
        ``JudgeClient(config, transport=...)`` or as a server's ``judge_transport``."""
        from genrm_trio.testing.memory_transport import memory_transport

        return memory_transport(self)

    # -- request handling ----------------------------------------------------------------

    def handle(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        *,
        now: float,
    ) -> FakeReply:
        """Decide the reply to one HTTP request (``target`` is path plus optional query)."""
        path, _, query = target.partition("?")
        header_map: dict[str, str] = {}
        for name, value in headers:
            name = name.lower()
            header_map[name] = f"{header_map[name]}, {value}" if name in header_map else value
        if path in (_CHAT_PATH, _RESPONSES_PATH):
            if method != "POST":
                return _error_reply(405, f"{path} accepts POST only", "route")
            api: Api = "chat_completions" if path == _CHAT_PATH else "responses"
            return self._judge_call(api, path, header_map, body, now)
        return self._control(method, path, query, body)

    def end_request(self, reply: FakeReply, *, cancelled: bool) -> None:
        """The adapter finished a tracked reply; ``cancelled`` if the caller went away first."""
        if not reply.tracked:
            return
        self._in_flight -= 1
        if cancelled:
            self._counters.cancelled += 1
        self._notify()

    def _rng(self, purpose: str, number: int) -> random.Random:
        return random.Random(f"{self.seed}/{purpose}/{number}")

    def _judge_call(
        self, api: Api, path: str, headers: Mapping[str, str], raw: bytes, now: float
    ) -> FakeReply:
        counters = self._counters
        number = counters.requests_total
        counters.requests_total += 1
        counters.by_api[api] += 1
        self._in_flight += 1
        counters.max_in_flight = max(counters.max_in_flight, self._in_flight)
        body: Any = None
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            body = None
        try:
            call = self._check(api, headers, raw, body)
        except _Rejected as rejected:
            reply = _error_reply(rejected.status, rejected.problem)
        else:
            reply = self._decide(call, number)
        reply = dataclasses.replace(reply, tracked=True)
        counters.by_action[reply.action] = counters.by_action.get(reply.action, 0) + 1
        recorded_headers = {
            name: REDACTED if name == "authorization" else value for name, value in headers.items()
        }
        self._recorded.append(
            {
                "index": number,
                "path": path,
                "api": api,
                "headers": recorded_headers,
                "body": body,
                "arrival_time": now,
                "action": reply.action,
                "delay_s": reply.delay_s,
            }
        )
        self._notify()
        return reply

    def _check(self, api: Api, headers: Mapping[str, str], raw: bytes, body: Any) -> _Call:
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            raise _Rejected(401, "missing or wrong API key")
        if body is None and raw.strip() != b"null":
            raise _Rejected(400, "body is not valid JSON")
        if not isinstance(body, dict):
            raise _Rejected(400, "body is not a JSON object")
        model = body.get("model")
        if self.model is not None and model != self.model:
            raise _Rejected(400, f"model {model!r} is not served here; expected {self.model!r}")
        if model is not None and not isinstance(model, str):
            raise _Rejected(400, "model must be a string")
        if api == "chat_completions":
            response_1, response_2, principle, chars = _check_chat(body)
            before = body["messages"][:-2]
        else:
            response_1, response_2, principle, chars = _check_responses(body)
            before = [body.get("input", []), principle]
        prefix = b""
        if self.prefix_cache is not None:
            encoded = json.dumps(before, sort_keys=True).encode()
            prefix = hashlib.blake2b(encoded, digest_size=16).digest()
        return _Call(
            api,
            model or self.model or DEFAULT_MODEL,
            response_1,
            response_2,
            principle,
            chars,
            prefix,
        )

    def _decide(self, call: _Call, number: int) -> FakeReply:
        action, fields, extra_delay = self._select(call, number)
        if action == "hang":
            return FakeReply("hang", 0, (), b"", action)
        delay_s = self.latency.draw(self._rng("latency", number)) + extra_delay
        delay_s += self._prefill_s(call.prefix)
        return dataclasses.replace(self._build(call, number, action, fields), delay_s=delay_s)

    def _prefill_s(self, prefix: bytes) -> float:
        """The prefix-cache model: extra latency for a prefix not served recently, which it
        now is."""
        model = self.prefix_cache
        if model is None:
            return 0.0
        cache = self._prefixes
        if prefix in cache:
            cache.move_to_end(prefix)
            self._counters.prefix_hits += 1
            return 0.0
        cache[prefix] = None
        if len(cache) > model.capacity:
            cache.popitem(last=False)
        self._counters.prefix_misses += 1
        return model.miss_s

    def _select(self, call: _Call, number: int) -> tuple[str, Mapping[str, Any], float]:
        """The action for a checked call: first applicable rule, else a fault, else a verdict.

        A rule's ``after`` and ``times`` count the calls its ``match`` applies to: it applies to
        matching calls number after+1 .. after+times, each with its ``probability``.
        """
        for index, rule in enumerate(self._rules):
            if not rule.matches(call.api, call.response_1, call.response_2, call.principle):
                continue
            rule.matched += 1
            if rule.matched <= rule.after:
                continue
            if rule.times is not None and rule.matched > rule.after + rule.times:
                continue
            if rule.probability < 1:
                if self._rng(f"rule-{index}", number).random() >= rule.probability:
                    continue
            return rule.action, rule.fields, rule.delay_s
        for index, fault in enumerate(self._fault_rates):
            if self._rng(f"fault-{index}", number).random() < fault.probability:
                return fault.action, fault.fields, 0.0
        score_1, score_2, ranking = self.verdict(call.response_1, call.response_2)
        return "verdict", {"score_1": score_1, "score_2": score_2, "ranking": ranking}, 0.0

    def _build(self, call: _Call, number: int, action: str, fields: Mapping[str, Any]) -> FakeReply:
        if action == "http_status":
            headers: list[tuple[str, str]] = [("content-type", "application/json")]
            if "retry_after" in fields:
                headers.append(("retry-after", str(fields["retry_after"])))
            body = _body_bytes(fields["body"]) if "body" in fields else INJECTED_ERROR_BODY
            return FakeReply("respond", fields["status"], tuple(headers), body, action)
        if action == "non_json":
            html = (("content-type", "text/html"),)
            return FakeReply("respond", 200, html, NON_JSON_BODY, action)
        if action == "raw":
            content_type = fields.get("content_type", "application/json")
            return FakeReply(
                "respond",
                fields.get("status", 200),
                (("content-type", content_type),),
                _body_bytes(fields["body"]),
                action,
            )
        if action == "close":
            return FakeReply("close", 0, (), b"", action)
        if action == "truncated_body":
            # The announced body is a normal verdict reply, so the cut lands inside valid JSON.
            score_1, score_2, ranking = self.verdict(call.response_1, call.response_2)
            verdict = {"score_1": score_1, "score_2": score_2, "ranking": ranking}
            full = _completion(call, number, "verdict", verdict)
            return FakeReply(
                "truncate", 200, (("content-type", "application/json"),), _json_bytes(full), action
            )
        return _json_reply(200, _completion(call, number, action, fields), action)

    def _control(self, method: str, path: str, query: str, body: bytes) -> FakeReply:
        """Routes that are not judge calls: models, health and the CL-18 control routes."""
        routes: dict[str, tuple[str, ...]] = {
            "/v1/models": ("GET",),
            "/healthz": ("GET",),
            "/_fake/stats": ("GET",),
            "/_fake/rules": ("GET", "PUT"),
            "/_fake/reset": ("POST",),
            "/_fake/requests": ("GET",),
        }
        if path not in routes:
            return _error_reply(404, f"no route {path}", "route")
        if method not in routes[path]:
            return _error_reply(405, f"{path} accepts {', '.join(routes[path])} only", "route")
        if path == "/v1/models":
            model = self.model or DEFAULT_MODEL
            listing = {
                "object": "list",
                "data": [
                    {"id": model, "object": "model", "created": _CREATED, "owned_by": "genrm-trio"}
                ],
            }
            return _json_reply(200, listing, "route")
        if path == "/healthz":
            return _json_reply(200, {"status": "ok"}, "route")
        if path == "/_fake/stats":
            return _json_reply(200, self.stats(), "route")
        if path == "/_fake/reset":
            self.reset()
            return _json_reply(200, self.stats(), "route")
        if path == "/_fake/requests":
            values = parse_qs(query).get("limit", [str(MAX_RECORDED_REQUESTS)])
            try:
                limit = int(values[-1])
            except ValueError:
                return _error_reply(400, "limit must be an integer", "route")
            return _json_reply(200, self.requests(limit), "route")
        if method == "GET":
            return _json_reply(200, self.rules, "route")
        try:
            rules = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            return _error_reply(400, "rules body is not valid JSON", "route")
        if not isinstance(rules, list):
            return _error_reply(400, "rules body must be a JSON array", "route")
        try:
            self.set_rules(rules)
        except ValueError as error:
            return _error_reply(400, str(error), "route")
        return _json_reply(200, self.rules, "route")
