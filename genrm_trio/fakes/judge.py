"""The fake judge's logic: quality, verdicts, the order of its decisions, statistics and
recordings. What it can be told to do (latency, prefix cache, rules, faults) is parsed in
``_judge_rules``; the replies it builds and the request checks are in ``_judge_replies``.
Adapters in ``judge_http`` feed it requests and carry out the reply it decides (§8.2).

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
from typing import Any
from urllib.parse import parse_qs

from genrm_trio.fakes._judge_replies import (
    CREATED,
    Call,
    FakeReply,
    RequestRejected,
    body_bytes,
    check_chat,
    check_responses,
    completion,
    error_reply,
    json_bytes,
    json_reply,
)
from genrm_trio.fakes._judge_rules import (
    ACTIONS,
    APIS,
    Api,
    Latency,
    PrefixCacheModel,
    Rule,
    compile_fault_rates,
    compile_rule,
    parse_fault_action,
    parse_latency,
    parse_prefix_cache,
)
from genrm_trio.fakes.memory_transport import memory_transport
from genrm_trio.judge.transport import TransportFactory

__all__ = [
    "ACTIONS",
    "APIS",
    "FakeJudge",
    "FakeReply",
    "Latency",
    "PrefixCacheModel",
    "pair_rule",
    "parse_fault_action",
    "parse_latency",
    "parse_prefix_cache",
    "quality",
    "quality_verdict",
    "verdict_for_qualities",
]

Number = int | float

DEFAULT_MODEL = "fake-judge"

INJECTED_ERROR_BODY = b'{"error":"injected"}'

NON_JSON_BODY = b"<html>not json</html>"

REDACTED = "<redacted>"

MAX_RECORDED_REQUESTS = 1000

_CHAT_PATH = "/v1/chat/completions"

_RESPONSES_PATH = "/v1/responses"

_QUALITY_DIRECTIVE = re.compile(r"\[\[q=([+-]?(?:\d+(?:\.\d*)?|\.\d+))\]\]")


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
    """The rule "pair (i, j) fails with ``action``" of §10 (every matching call).

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
        self._fault_rates = compile_fault_rates(fault_rates)
        self._rules: list[Rule] = []
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
        self._rules = [compile_rule(index, rule) for index, rule in enumerate(rules)]

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
                return error_reply(405, f"{path} accepts POST only", "route")
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
        except RequestRejected as rejected:
            reply = error_reply(rejected.status, rejected.problem)
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

    def _check(self, api: Api, headers: Mapping[str, str], raw: bytes, body: Any) -> Call:
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            raise RequestRejected(401, "missing or wrong API key")
        if body is None and raw.strip() != b"null":
            raise RequestRejected(400, "body is not valid JSON")
        if not isinstance(body, dict):
            raise RequestRejected(400, "body is not a JSON object")
        model = body.get("model")
        if self.model is not None and model != self.model:
            raise RequestRejected(
                400, f"model {model!r} is not served here; expected {self.model!r}"
            )
        if model is not None and not isinstance(model, str):
            raise RequestRejected(400, "model must be a string")
        if api == "chat_completions":
            response_1, response_2, principle, chars = check_chat(body)
            before = body["messages"][:-2]
        else:
            response_1, response_2, principle, chars = check_responses(body)
            before = [body.get("input", []), principle]
        prefix = b""
        if self.prefix_cache is not None:
            encoded = json.dumps(before, sort_keys=True).encode()
            prefix = hashlib.blake2b(encoded, digest_size=16).digest()
        return Call(
            api,
            model or self.model or DEFAULT_MODEL,
            response_1,
            response_2,
            principle,
            chars,
            prefix,
        )

    def _decide(self, call: Call, number: int) -> FakeReply:
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

    def _select(self, call: Call, number: int) -> tuple[str, Mapping[str, Any], float]:
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

    def _build(self, call: Call, number: int, action: str, fields: Mapping[str, Any]) -> FakeReply:
        if action == "http_status":
            headers: list[tuple[str, str]] = [("content-type", "application/json")]
            if "retry_after" in fields:
                headers.append(("retry-after", str(fields["retry_after"])))
            body = body_bytes(fields["body"]) if "body" in fields else INJECTED_ERROR_BODY
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
                body_bytes(fields["body"]),
                action,
            )
        if action == "close":
            return FakeReply("close", 0, (), b"", action)
        if action == "truncated_body":
            # The announced body is a normal verdict reply, so the cut lands inside valid JSON.
            score_1, score_2, ranking = self.verdict(call.response_1, call.response_2)
            verdict = {"score_1": score_1, "score_2": score_2, "ranking": ranking}
            full = completion(call, number, "verdict", verdict)
            return FakeReply(
                "truncate", 200, (("content-type", "application/json"),), json_bytes(full), action
            )
        return json_reply(200, completion(call, number, action, fields), action)

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
            return error_reply(404, f"no route {path}", "route")
        if method not in routes[path]:
            return error_reply(405, f"{path} accepts {', '.join(routes[path])} only", "route")
        if path == "/v1/models":
            model = self.model or DEFAULT_MODEL
            listing = {
                "object": "list",
                "data": [
                    {"id": model, "object": "model", "created": CREATED, "owned_by": "genrm-trio"}
                ],
            }
            return json_reply(200, listing, "route")
        if path == "/healthz":
            return json_reply(200, {"status": "ok"}, "route")
        if path == "/_fake/stats":
            return json_reply(200, self.stats(), "route")
        if path == "/_fake/reset":
            self.reset()
            return json_reply(200, self.stats(), "route")
        if path == "/_fake/requests":
            values = parse_qs(query).get("limit", [str(MAX_RECORDED_REQUESTS)])
            try:
                limit = int(values[-1])
            except ValueError:
                return error_reply(400, "limit must be an integer", "route")
            return json_reply(200, self.requests(limit), "route")
        if method == "GET":
            return json_reply(200, self.rules, "route")
        try:
            rules = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            return error_reply(400, "rules body is not valid JSON", "route")
        if not isinstance(rules, list):
            return error_reply(400, "rules body must be a JSON array", "route")
        try:
            self.set_rules(rules)
        except ValueError as error:
            return error_reply(400, str(error), "route")
        return json_reply(200, self.rules, "route")
