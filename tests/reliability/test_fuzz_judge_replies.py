"""Property-based fuzzing of judge replies: the client ends every comparison in a verdict or a
judge failure with a J-40 text, never raises, and never makes more attempts than its budget.

Replies come from a scripted transport behind the judge transport seam (mock clock) and from a
raw TCP server that writes arbitrary bytes to the production connection pool (real clock). A
reference reading of §3.2…§3.4 predicts the exact result wherever the reply's meaning is
fixed by the spec.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from genrm_trio.config import Config
from genrm_trio.core.verdicts import Verdict
from genrm_trio.fakes.memory_transport import BodyReply
from genrm_trio.judge.client import JudgeClient, JudgeFailure, JudgeTask, JudgeVerdict
from genrm_trio.judge.transport import (
    ConnectError,
    ConnectTimedOut,
    JudgeEndpoint,
    JudgeReply,
    JudgeTransport,
    JudgeTransportError,
    ReadError,
    RemoteProtocolError,
    TransportFactory,
    TransportStatistics,
)

BASE_URL = "http://judge.test/v1"
ATTEMPTS = 4  # genrm_parse_retries 3
DEADLINE_S = 30.0  # the enclosing (evaluation) deadline handed to the client
TIMEOUT_S = 2.0
API_PATHS = {"chat_completions": "chat/completions", "responses": "responses"}
VERDICT_421 = Verdict(4.0, 2.0, 1.0)
DEFAULT = Verdict(3.0, 3.0, 3.5)
FENCED_421 = '```json\n{"score_1": 4, "score_2": 2, "ranking": 1}\n```'
NO_TIME_LEFT = " (no time left to retry before the deadline)"
TASK = JudgeTask(
    history=[{"role": "user", "content": "2+2?"}],
    principle=None,
    text_1="answer-0 [[q=4]]",
    text_2="answer-1 [[q=2]]",
    pair=(0, 1),
    judge_pass=0,
)
J40 = re.compile(
    r"GenRM judge (?P<url>\S+) pair=\(0, 1\) judge=0 attempt=(?P<a>\d+)/4 "
    r"deadline=(?P<t>\d+\.\d+)s: (?P<cause>.*)",
    re.DOTALL,
)
CAUSES = re.compile(
    r"HTTPStatusError: HTTP \d{3}; response=.*"
    r"|TimeoutError: no complete reply within \d+\.\d+s"
    r"|JSONDecodeError: judge reply is not valid JSON: .*"
    r"|Judge returned no completed answer after \d attempts.*; last reply: .*"
    r"|[A-Z][A-Za-z]*(Error|Exception|Timeout|Large)?: .*",
    re.DOTALL,
)

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
)


def make_config(api: str, **overrides: Any) -> Config:
    fields: dict[str, Any] = {
        "judge_base_url": BASE_URL,
        "judge_model": "judge",
        "judge_api": api,
        "genrm_parse_retries": ATTEMPTS - 1,
        "genrm_parse_retry_sleep_s": 0.05,
        "judge_retry_max_sleep_s": 0.1,
        "judge_request_timeout_s": TIMEOUT_S,
    }
    fields.update(overrides)
    return Config(**fields)


# ---------------------------------------------------------------------------------------------
# What one attempt amounts to, per the spec (J-21): known when the generator knows it.


@dataclass(frozen=True)
class Success:
    verdict: Verdict


@dataclass(frozen=True)
class Transient:
    cause: str
    retry_after_s: float = 0.0


@dataclass(frozen=True)
class Fatal:
    cause: str


@dataclass(frozen=True)
class Unusable:
    problem: str
    exhausted: bool = False


@dataclass(frozen=True)
class Unparseable:
    problem: str = "no verdict found"


@dataclass(frozen=True)
class Unknown:
    """The spec leaves this reply's class to the implementation (or the verdict parser)."""


Meaning = Success | Transient | Fatal | Unusable | Unparseable | Unknown


@dataclass
class Reply:
    """One scripted judge reply and what it means."""

    label: str
    meaning: Meaning
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    error: Exception | None = None  # raised by the transport instead of replying
    cut_after: bytes | None = None  # the body breaks off after these bytes
    stall: bool = False  # headers, then the body never comes
    delay_s: float = 0.0


def non_json(body: bytes) -> Fatal:
    shown = body.decode("utf-8", errors="replace")[:200]
    return Fatal(f"JSONDecodeError: judge reply is not valid JSON: {shown}")


def http_cause(status: int, body: bytes) -> str:
    return f"HTTPStatusError: HTTP {status}; response={body.decode('utf-8', 'replace')[:1000]}"


def strict_json(body: bytes) -> Any:
    """The body as standard JSON (J-10), or raises ValueError."""

    def refuse(name: str) -> Any:
        raise ValueError(name)

    return json.loads(body.decode("utf-8"), parse_constant=refuse)


THINKING = "<think>weighing both</think>\n"
UNFINISHED = "<think> still going"
CONTENTS = [FENCED_421, THINKING + FENCED_421, "I prefer the first one.", "", "  \n\t", UNFINISHED]
# What a verdict text (after J-12's think-stripping in chat, as is in responses) amounts to;
# any other text is left to the verdict parser (S-20).
KNOWN_TEXTS: dict[str, Meaning] = {
    FENCED_421: Success(VERDICT_421),
    "\n" + FENCED_421: Success(VERDICT_421),
    THINKING + FENCED_421: Success(VERDICT_421),
    "I prefer the first one.": Unparseable(),
    UNFINISHED: Unparseable(),
    "": Unusable("empty verdict text"),
    "  \n\t": Unusable("empty verdict text"),
}


def text_meaning(text: str) -> Meaning:
    return KNOWN_TEXTS.get(text, Unknown())


def chat_verdict_text(content: str) -> str | None:
    """J-12: None for unfinished reasoning."""
    last_open = content.rfind("<think>")
    if last_open != -1 and content.find("</think>", last_open) == -1:
        return None
    return content.rpartition("</think>")[2]


def chat_meaning(reply: Any) -> Meaning:
    """J-11…J-13 for a decoded chat-completions reply."""
    if not isinstance(reply, dict):
        return Unusable("not a JSON object")
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices:
        return Unusable("no choices")
    first = choices[0]
    message = first.get("message") if isinstance(first, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    finish = first.get("finish_reason") if isinstance(first, dict) else None
    text = chat_verdict_text(content) if isinstance(content, str) else None
    if finish == "length":
        meaning = text_meaning(text) if text is not None else None
        if isinstance(meaning, Success | Unknown):
            return meaning
        return Unusable("finish_reason=length", exhausted=True)
    if finish is not None and finish != "stop":
        return Unusable(f"finish_reason={finish}") if isinstance(finish, str) else Unknown()
    if not isinstance(content, str):
        return Unusable("content is not a string")
    if text is None:
        return Unusable("unfinished reasoning")
    return text_meaning(text)


def responses_meaning(reply: Any) -> Meaning:
    """J-14, J-15 for a decoded responses reply."""
    if not isinstance(reply, dict):
        return Unusable("not a JSON object")
    status = reply.get("status")
    details = reply.get("incomplete_details")
    if status == "incomplete" and isinstance(details, dict):
        if details.get("reason") == "max_output_tokens":
            return Unusable("status=incomplete", exhausted=True)
    if status is not None and status != "completed":
        return Unusable(f"status={status}") if isinstance(status, str) else Unknown()
    texts: list[str] = []
    output = reply.get("output")
    for item in output if isinstance(output, list) else []:
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        content = item.get("content")
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "output_text":
                if isinstance(part.get("text"), str):
                    texts.append(part["text"])
    return text_meaning("".join(texts))


def body_meaning(api: str, body: bytes) -> Meaning:
    if body.startswith(b"\xef\xbb\xbf"):
        return Unknown()  # J-10 does not say whether a byte-order mark may precede the JSON
    try:
        reply = strict_json(body)
    except (ValueError, RecursionError):
        return non_json(body)
    return chat_meaning(reply) if api == "chat_completions" else responses_meaning(reply)


# ---------------------------------------------------------------------------------------------
# The attempt loop, per the spec (J-20…J-25, J-32)


@dataclass(frozen=True)
class Expected:
    result: JudgeVerdict | JudgeFailure | None  # None: only the general properties apply


def failure_text(api: str, attempt: int, cause: str) -> str:
    return (
        f"GenRM judge {BASE_URL}/{API_PATHS[api]} pair=(0, 1) judge=0 "
        f"attempt={attempt}/{ATTEMPTS} deadline=2.0s: {cause}"
    )


def expected_result(api: str, script: list[Reply]) -> Expected:
    outcomes: list[Meaning] = []
    elapsed = 0.0
    for attempt in range(1, ATTEMPTS + 1):
        meaning = script[min(attempt, len(script)) - 1].meaning
        outcomes.append(meaning)
        if isinstance(meaning, Unknown):
            return Expected(None)
        if isinstance(meaning, Success):
            return Expected(JudgeVerdict(meaning.verdict, fallback=False, attempts=attempt))
        if isinstance(meaning, Fatal):
            return Expected(JudgeFailure(failure_text(api, attempt, meaning.cause), attempt))
        if attempt == ATTEMPTS:
            break
        # Jittered backoff is at most 0.1 s a retry, far below the deadline; only a Retry-After
        # can outlast it (the scripts use delays of at most 3 s or at least 100 s).
        if isinstance(meaning, Transient) and elapsed + meaning.retry_after_s > DEADLINE_S:
            text = failure_text(api, attempt, meaning.cause + NO_TIME_LEFT)
            return Expected(JudgeFailure(text, attempt))
        elapsed += meaning.retry_after_s if isinstance(meaning, Transient) else 0.0
    last = outcomes[-1]
    if isinstance(last, Transient):
        return Expected(JudgeFailure(failure_text(api, ATTEMPTS, last.cause), ATTEMPTS))
    if any(isinstance(o, Unparseable) for o in outcomes):
        return Expected(JudgeVerdict(DEFAULT, fallback=True, attempts=ATTEMPTS))
    parse_failures = [o for o in outcomes if isinstance(o, Unusable)]
    cause = f"Judge returned no completed answer after {ATTEMPTS} attempts"
    exhausted = sum(o.exhausted for o in parse_failures)
    if exhausted:
        cause += (
            f" ({exhausted} of them exhausted max_output_tokens=16384 without emitting a verdict;"
            " raise the budget or constrain the judge's reasoning)"
        )
    cause += f"; last reply: {parse_failures[-1].problem}"
    return Expected(JudgeFailure(failure_text(api, ATTEMPTS, cause), ATTEMPTS))


# ---------------------------------------------------------------------------------------------
# Strategies

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
)
json_values = st.recursive(
    json_scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "id", "output", "text", "é"]), kids, max_size=3),
    ),
    max_leaves=8,
)
texts = st.sampled_from(CONTENTS)


def chat_reply(content: Any, finish: Any = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5},
    }


def responses_reply(text: Any, status: Any = "completed") -> dict[str, Any]:
    return {
        "id": "resp-1",
        "object": "response",
        "status": status,
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "weighing"}]},
            {
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text}],
            },
        ],
    }


CHAT_PATHS: list[tuple[str | int, ...]] = [
    (),
    ("choices",),
    ("choices", 0),
    ("choices", 0, "message"),
    ("choices", 0, "message", "content"),
    ("choices", 0, "message", "role"),
    ("choices", 0, "finish_reason"),
    ("choices", 0, "index"),
    ("choices", 1),
    ("id",),
    ("usage",),
]
RESPONSES_PATHS: list[tuple[str | int, ...]] = [
    (),
    ("status",),
    ("incomplete_details",),
    ("output",),
    ("output", 0),
    ("output", 1),
    ("output", 1, "type"),
    ("output", 1, "content"),
    ("output", 1, "content", 0),
    ("output", 1, "content", 0, "type"),
    ("output", 1, "content", 0, "text"),
    ("output", 1, "content", 1),
    ("output", 2),
    ("id",),
]


def put(value: Any, path: tuple[str | int, ...], new: Any, remove: bool) -> Any:
    """``value`` with ``new`` at ``path`` (or the key removed); missing parents are left alone."""
    if not path:
        return new
    parent = value
    for step in path[:-1]:
        if isinstance(parent, dict) and isinstance(step, str) and step in parent:
            parent = parent[step]
        elif isinstance(parent, list) and isinstance(step, int) and step < len(parent):
            parent = parent[step]
        else:
            return value
    step = path[-1]
    if isinstance(parent, dict) and isinstance(step, str):
        if remove:
            parent.pop(step, None)
        else:
            parent[step] = new
    elif isinstance(parent, list) and isinstance(step, int):
        if step < len(parent):
            if remove:
                del parent[step]
            else:
                parent[step] = new
        elif not remove:
            parent.append(new)
    return value


@st.composite
def shaped_replies(draw: st.DrawFn, api: str) -> Reply:
    """A well-formed reply with wrong types, odd values or missing keys at some positions."""
    text = draw(texts)
    if api == "chat_completions":
        finish = draw(st.sampled_from(["stop", None, "length", "content_filter", "tool_calls"]))
        value: Any = chat_reply(text, finish)
        paths = CHAT_PATHS
    else:
        status = draw(st.sampled_from(["completed", None, "incomplete", "failed", "in_progress"]))
        value = responses_reply(text, status)
        if status == "incomplete" and draw(st.booleans()):
            value["incomplete_details"] = {"reason": "max_output_tokens"}
        paths = RESPONSES_PATHS
    for _ in range(draw(st.integers(0, 3))):
        new = draw(st.one_of(json_values, texts, st.sampled_from([None, [], {}, 0, "stop"])))
        value = put(value, draw(st.sampled_from(paths)), new, remove=draw(st.booleans()))
    body = json.dumps(value).encode()
    content_type = draw(st.sampled_from(["application/json", "text/plain", "text/html", ""]))
    headers = [("content-type", content_type)] if content_type else []
    status_code = draw(st.sampled_from([200, 200, 200, 201, 203, 299]))
    return Reply("shaped", body_meaning(api, body), status_code, headers, body)


@st.composite
def random_json_replies(draw: st.DrawFn, api: str) -> Reply:
    body = json.dumps(draw(json_values)).encode()
    return Reply("random JSON", body_meaning(api, body), body=body)


@st.composite
def random_byte_replies(draw: st.DrawFn, api: str) -> Reply:
    body = draw(st.binary(max_size=300))
    return Reply("random bytes", body_meaning(api, body), body=body)


INVALID_UTF8 = [b"\xff", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82"]


@st.composite
def invalid_utf8_replies(draw: st.DrawFn, api: str) -> Reply:
    value = chat_reply(FENCED_421) if api == "chat_completions" else responses_reply(FENCED_421)
    body = json.dumps(value).encode()
    spot = draw(st.integers(0, len(body)))
    body = body[:spot] + draw(st.sampled_from(INVALID_UTF8)) + body[spot:]
    return Reply("invalid UTF-8", non_json(body), body=body)


@st.composite
def literal_replies(draw: st.DrawFn, api: str) -> Reply:
    """A reply whose verdict holds NaN or Infinity as JSON literals: not standard JSON (J-10)."""
    literal = draw(st.sampled_from(["NaN", "Infinity", "-Infinity"]))
    value = {"choices": [{"message": {"content": FENCED_421}, "finish_reason": "stop"}], "x": 0}
    body = json.dumps(value).encode().replace(b'"x": 0', b'"x": ' + literal.encode())
    return Reply("non-standard literal", non_json(body), body=body)


RETRY_AFTER = st.sampled_from(
    [None, "0", "1", "3", "1.5", "100", "1000000", "soon", "-1", "1e3", "", "Wed, 21 Oct 2015"]
)


def retry_after_s(status: int, value: str | None) -> float:
    """J-31 for the scripted values; 0 when the header is absent, ignored or unparseable."""
    if status not in (429, 503) or value is None:
        return 0.0
    return {"0": 0.0, "1": 1.0, "3": 3.0, "1.5": 1.5, "100": 100.0, "1000000": 1e6}.get(value, 0.0)


@st.composite
def status_replies(draw: st.DrawFn, api: str) -> Reply:
    status = draw(
        st.one_of(
            st.sampled_from([100, 301, 304, 400, 401, 403, 404, 408, 418, 429, 500, 502, 503, 599]),
            st.integers(100, 199),
            st.integers(300, 599),
        )
    )
    body = draw(
        st.one_of(
            st.just(b'{"error":"injected"}'),
            st.binary(max_size=64),
            st.text(max_size=1200).map(lambda t: t.encode()),
            st.integers(900, 1100).map(lambda n: "é".encode() * n),
        )
    )
    retry_after = draw(RETRY_AFTER)
    headers = [("content-type", draw(st.sampled_from(["application/json", "text/html"])))]
    if retry_after is not None:
        headers.append(("retry-after", retry_after))
    cause = http_cause(status, body)
    meaning: Meaning
    if status in (408, 429) or 500 <= status <= 599:
        meaning = Transient(cause, retry_after_s(status, retry_after))
    else:
        meaning = Fatal(cause)
    return Reply(f"HTTP {status}", meaning, status, headers, body)


TRANSPORT_ERRORS: list[Callable[[str], JudgeTransportError]] = [
    ConnectError,
    ReadError,
    RemoteProtocolError,
]
TIMEOUTS: list[Callable[[str], JudgeTransportError]] = [ConnectTimedOut]


@st.composite
def transport_replies(draw: st.DrawFn, api: str) -> Reply:
    message = draw(st.text(max_size=1100))
    kind = draw(st.sampled_from(["error", "timeout", "cut", "stall", "slow"]))
    body = json.dumps(
        chat_reply(FENCED_421) if api == "chat_completions" else responses_reply(FENCED_421)
    ).encode()
    if kind == "error":
        error = draw(st.sampled_from(TRANSPORT_ERRORS))(message)
        cause = f"{type(error).__name__}: {message[:1000]}"
        return Reply("transport error", Transient(cause), error=error)
    if kind == "timeout":
        error = draw(st.sampled_from(TIMEOUTS))(message)
        return Reply(
            "client timeout", Fatal("TimeoutError: no complete reply within 2.0s"), error=error
        )
    if kind == "cut":
        cut = body[: draw(st.integers(0, len(body) - 1))]
        cause = f"RemoteProtocolError: {message[:1000]}"
        return Reply(
            "cut body",
            Transient(cause),
            body=body,
            cut_after=cut,
            error=RemoteProtocolError(message),
        )
    if kind == "stall":
        return Reply(
            "stalled body",
            Fatal("TimeoutError: no complete reply within 2.0s"),
            body=body,
            stall=True,
        )
    delay = draw(st.sampled_from([0.5, 1.9, 2.5]))
    meaning: Meaning = (
        Success(VERDICT_421)
        if delay < TIMEOUT_S
        else Fatal("TimeoutError: no complete reply within 2.0s")
    )
    return Reply("slow reply", meaning, body=body, delay_s=delay)


@st.composite
def encoding_replies(draw: st.DrawFn, api: str) -> Reply:
    """Headers that lie about the body: the spec leaves the class open; only never crash."""
    value = chat_reply(FENCED_421) if api == "chat_completions" else responses_reply(FENCED_421)
    body = json.dumps(value).encode()
    encoding = draw(st.sampled_from(["gzip", "deflate", "br", "zstd", "identity", "x-unknown"]))
    headers = [
        ("content-encoding", encoding),
        ("content-type", "application/json; charset=latin-1"),
    ]
    return Reply(f"content-encoding {encoding}", Unknown(), headers=headers, body=body)


@st.composite
def big_replies(draw: st.DrawFn, api: str) -> Reply:
    kind = draw(st.sampled_from(["long content", "deep extra", "long status"]))
    if kind == "long content":
        padding = "x" * draw(st.sampled_from([10_000, 1_000_000]))
        content = padding + "\n" + FENCED_421
        value = chat_reply(content) if api == "chat_completions" else responses_reply(content)
        return Reply(kind, Success(VERDICT_421), body=json.dumps(value).encode())
    if kind == "long status":
        hostile = "s" * 100_000
        value = (
            chat_reply(FENCED_421, hostile)
            if api == "chat_completions"
            else (responses_reply(FENCED_421, hostile))
        )
        return Reply(kind, Unknown(), body=json.dumps(value).encode())
    depth = draw(st.sampled_from([50, 5_000, 100_000]))
    value = chat_reply(FENCED_421) if api == "chat_completions" else responses_reply(FENCED_421)
    body = json.dumps(value).encode()[:-1] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"
    meaning: Meaning = Success(VERDICT_421) if depth == 50 else Unknown()
    return Reply(kind, meaning, body=body)


def replies(api: str) -> st.SearchStrategy[Reply]:
    return st.one_of(
        shaped_replies(api),
        shaped_replies(api),
        shaped_replies(api),
        status_replies(api),
        transport_replies(api),
        random_json_replies(api),
        random_byte_replies(api),
        invalid_utf8_replies(api),
        literal_replies(api),
        status_replies(api),
        transport_replies(api),
        encoding_replies(api),
        big_replies(api),
    )


def scripts(api: str) -> st.SearchStrategy[list[Reply]]:
    """The replies of successive attempts; the last one repeats."""
    return st.lists(replies(api), min_size=1, max_size=ATTEMPTS)


# ---------------------------------------------------------------------------------------------
# Running a comparison


def body_reply(reply: Reply) -> JudgeReply:
    if reply.cut_after is not None:
        assert isinstance(reply.error, JudgeTransportError)
        return BodyReply(reply.status, reply.headers, [reply.cut_after], then=reply.error)
    if reply.stall:
        return BodyReply(reply.status, reply.headers, [reply.body[:10]], then="stall")
    return BodyReply(reply.status, reply.headers, [reply.body])


class _ScriptedTransport(JudgeTransport):
    def __init__(self, script: list[Reply], requests: list[str], endpoint: JudgeEndpoint) -> None:
        self.script = script
        self.requests = requests
        self.url = endpoint.url

    async def send(self, body: bytes) -> JudgeReply:
        self.requests.append(self.url)
        reply = self.script[min(len(self.requests), len(self.script)) - 1]
        if reply.delay_s:
            await trio.sleep(reply.delay_s)
        else:
            await trio.lowlevel.checkpoint()
        if reply.error is not None and reply.cut_after is None:
            raise reply.error
        return body_reply(reply)

    async def aclose(self) -> None:
        pass

    def statistics(self) -> TransportStatistics:
        return TransportStatistics(connections_opened=0, idle_connections=0)


def scripted_transport(script: list[Reply], requests: list[str]) -> TransportFactory:
    """The judge transport answering the n-th attempt with script[n]; records the URL of each."""
    return lambda endpoint: _ScriptedTransport(script, requests, endpoint)


def check_result(result: object, attempts_made: int, api: str) -> None:
    """The properties every comparison has, whatever the judge sent."""
    assert isinstance(result, JudgeVerdict | JudgeFailure), result
    assert 1 <= result.attempts <= ATTEMPTS
    assert result.attempts == attempts_made
    if isinstance(result, JudgeFailure):
        match = J40.fullmatch(result.text)
        assert match is not None, result.text[:300]
        assert match["url"] == f"{BASE_URL}/{API_PATHS[api]}"
        assert int(match["a"]) == result.attempts
        cause = match["cause"].removesuffix(NO_TIME_LEFT)
        assert CAUSES.fullmatch(cause) is not None, cause[:300]
    elif result.fallback:
        assert result.verdict == DEFAULT


def outcome_event(result: JudgeVerdict | JudgeFailure) -> str:
    if isinstance(result, JudgeVerdict):
        return "default verdict" if result.fallback else "verdict"
    cause = result.text.partition("s: ")[2]
    return "failure: " + cause.split(":")[0][:60]


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
@FUZZ
@given(script=st.data())
def test_hostile_replies_end_in_a_verdict_or_a_judge_failure(api: str, script: Any) -> None:
    # J-10…J-32, J-40: never an exception, never more than genrm_parse_retries + 1 attempts
    attempts = script.draw(scripts(api), label="script")
    expected = expected_result(api, attempts)

    async def run() -> None:
        requests: list[str] = []
        config = make_config(api)
        client = JudgeClient(
            config, transport=scripted_transport(attempts, requests), rng=random.Random(0)
        )
        try:
            result = await client.judge(TASK, deadline=trio.current_time() + DEADLINE_S)
            assert client.in_flight == 0
        finally:
            await client.aclose()
        check_result(result, len(requests), api)
        event(outcome_event(result))
        event("predicted exactly" if expected.result is not None else "general properties only")
        if expected.result is not None:
            assert result == expected.result
        for url in requests:
            assert url == f"{BASE_URL}/{API_PATHS[api]}"

    trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_a_reply_too_large_to_hold_is_refused_without_reading_it_all(
    api: str, autojump_clock: Any
) -> None:
    # J-21: the client stops reading a 2xx body that would not fit in memory
    chunk = b" " * (1 << 20)
    served: list[int] = []  # chunks taken from each attempt's 64 MiB body

    class Endless(BodyReply):
        async def next_part(self) -> bytes:
            await trio.lowlevel.checkpoint()
            if served[-1] == 64:
                return b""
            served[-1] += 1
            return chunk

    class EndlessTransport(_ScriptedTransport):
        async def send(self, body: bytes) -> JudgeReply:
            served.append(0)
            return Endless(200, [], [])

    client = JudgeClient(
        make_config(api), transport=lambda endpoint: EndlessTransport([], [], endpoint)
    )
    try:
        result = await client.judge(TASK)
    finally:
        await client.aclose()
    assert isinstance(result, JudgeFailure)
    check_result(result, len(served), api)
    assert max(served) < 64


# ---------------------------------------------------------------------------------------------
# Raw bytes over TCP, read by the production connection pool (real clock)

REAL_TIMEOUT_S = 1.0
RAW = settings(FUZZ, max_examples=80)


def verdict_body(api: str) -> bytes:
    value = chat_reply(FENCED_421) if api == "chat_completions" else responses_reply(FENCED_421)
    return json.dumps(value).encode()


STATUS_LINES = [
    b"HTTP/1.1 200 OK",
    b"HTTP/1.1 200",
    b"HTTP/1.0 200 OK",
    b"HTTP/1.1 503 Busy",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK",
    b"HTTP/1.1 99 Odd",
    b"HTTP/1.1 2000 Odd",
    b"HTTP/1.1 abc Odd",
    b"HTTP/2 200 OK",
    b"ICY 200 OK",
    b"HTTP/1.1 200 \xff\xfe",
    b"",
]


@st.composite
def raw_responses(draw: st.DrawFn, api: str) -> tuple[bytes, Meaning]:
    """Bytes a judge might write back: sometimes a clean reply, mostly broken HTTP."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=200)), Unknown()
    body = draw(st.sampled_from([verdict_body(api), b"", b"<html>oops</html>", b'{"choices": [']))
    status_line = draw(st.sampled_from(STATUS_LINES))
    length = str(len(body)).encode()
    header_pool = [
        b"content-length: " + length,
        b"content-length: " + str(len(body) + 7).encode(),
        b"content-length: " + str(max(len(body) - 7, 0)).encode(),
        b"content-length: abc",
        b"content-length: -1",
        b"content-length: 99999999999999999999999",
        b"content-length: 1\r\ncontent-length: 2",
        b"transfer-encoding: chunked",
        b"transfer-encoding: gzip, chunked",
        b"content-encoding: gzip",
        b"content-type: application/json",
        b"content-type: \xff\xfe",
        b"retry-after: 0",
        b"connection: close",
        b"connection: keep-alive",
        b"no colon here",
        b"x-null: a\x00b",
        b" folded: continuation",
        b"x-huge: " + b"h" * 70_000,
    ]
    headers = draw(st.lists(st.sampled_from(header_pool), max_size=4, unique=True))
    clean = not headers and status_line == b"HTTP/1.1 200 OK"
    if clean and draw(st.booleans()):
        headers = [b"content-length: " + length]
    if b"transfer-encoding: chunked" in headers and draw(st.booleans()):
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
    data = status_line + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    meaning: Meaning = Unknown()
    if clean and cut is None and body == verdict_body(api):
        # A complete 200: with Content-Length, or delimited by the close (RFC 9112 §6.3).
        meaning = Success(VERDICT_421)
    return (data if cut is None else data[:cut]), meaning


async def serve_raw(
    script: list[bytes],
    seen: dict[str, int],
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer each judge request with the script's next bytes, then close the connection."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port: int = listeners[0].socket.getsockname()[1]

    async def answer(stream: trio.SocketStream) -> None:
        seen["connections"] += 1
        try:
            received = b""
            while b"\r\n\r\n" not in received:
                data = await stream.receive_some(65536)
                if not data:
                    return
                received += data
            head, _, rest = received.partition(b"\r\n\r\n")
            found = re.search(rb"(?i)content-length: *(\d+)", head)
            length = int(found[1]) if found else 0
            while len(rest) < length:
                data = await stream.receive_some(65536)
                if not data:
                    return
                rest += data
            seen["requests"] += 1
            await stream.send_all(script[min(seen["requests"], len(script)) - 1])
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, answer, listeners)
        task_status.started(port)


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
@RAW
@given(data=st.data())
def test_raw_bytes_from_the_judge_socket_never_crash_the_client(api: str, data: Any) -> None:
    # J-21, J-34: over a real connection, whatever bytes come back, a verdict or a judge failure
    drawn = data.draw(st.lists(raw_responses(api), min_size=1, max_size=ATTEMPTS), label="script")
    script = [raw for raw, _ in drawn]

    async def run() -> None:
        seen = {"connections": 0, "requests": 0}
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_raw, script, seen)
            config = make_config(
                api,
                judge_base_url=f"http://127.0.0.1:{port}/v1",
                judge_request_timeout_s=REAL_TIMEOUT_S,
                genrm_parse_retry_sleep_s=0.0,
            )
            client = JudgeClient(config)
            try:
                with trio.fail_after(ATTEMPTS * REAL_TIMEOUT_S + 5):
                    result = await client.judge(TASK)
                assert client.in_flight == 0
            finally:
                await client.aclose()
            nursery.cancel_scope.cancel()
        assert isinstance(result, JudgeVerdict | JudgeFailure), result
        assert 1 <= result.attempts <= ATTEMPTS
        # Every attempt uses at most one connection and sends at most one request.
        assert seen["connections"] <= result.attempts
        assert seen["requests"] <= result.attempts
        event(outcome_event(result))
        if isinstance(result, JudgeFailure):
            match = J40.fullmatch(result.text)
            assert match is not None, result.text[:300]
            assert int(match["a"]) == result.attempts
            assert CAUSES.fullmatch(match["cause"]) is not None, match["cause"][:300]
        if isinstance(drawn[0][1], Success):
            assert result == JudgeVerdict(VERDICT_421, fallback=False, attempts=1)

    trio.run(run)
