"""The judge client's attempt loop against a scripted judge behind the transport seam.

Each scripted reply is a `BodyReply` (the in-memory transport's reply), so the client's own
reading, decoding and classification run; time is Trio's mock clock (autojump), so deadlines,
sleeps and gaps are exact. The network transport's side of the same cases is in
test_transport_conformance.py and test_judge_client_fake_judge.py.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from genrm_trio import __version__
from genrm_trio.config import Config
from genrm_trio.core.verdicts import Verdict
from genrm_trio.fakes.memory_transport import BodyReply
from genrm_trio.judge.client import (
    MAX_REPLY_BYTES,
    JudgeClient,
    JudgeFailure,
    JudgeTask,
    JudgeVerdict,
)
from genrm_trio.judge.transport import (
    CLOSED_BEFORE_REPLY,
    ConnectError,
    ConnectTimedOut,
    JudgeEndpoint,
    JudgeReply,
    JudgeTransport,
    JudgeTransportError,
    ReadError,
    RemoteProtocolError,
    TransportStatistics,
    closed_in_body,
)

URL = "http://127.0.0.1:9/v1/chat/completions"
INJECTED = b'{"error":"injected"}'
FENCED_421 = '```json\n{"score_1": 4, "score_2": 2, "ranking": 1}\n```'
V421 = Verdict(4.0, 2.0, 1.0)
DEFAULT = Verdict(3.0, 3.0, 3.5)
TASK = JudgeTask(
    history=[{"role": "user", "content": "2+2?"}],
    principle=None,
    text_1="answer-0 [[q=4]]",
    text_2="answer-1 [[q=2]]",
    pair=(0, 1),
    judge_pass=0,
)


@dataclass(frozen=True)
class Call:
    """One request as the transport received it."""

    url: str
    headers: dict[str, str]  # lower-case names
    content: bytes


Reply = Callable[[Call], Awaitable[JudgeReply]]


def make_config(**overrides: Any) -> Config:
    fields: dict[str, Any] = {
        "judge_base_url": "http://127.0.0.1:9/v1",
        "judge_model": "judge-m",
        "judge_request_timeout_s": 2.0,
        "genrm_parse_retry_sleep_s": 0.0,
    }
    fields.update(overrides)
    return Config(**fields)


def chat_body(content: Any, finish: Any = "stop") -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def respond(status: int, body: bytes, headers: dict[str, str] | None = None) -> Reply:
    async def reply(call: Call) -> JudgeReply:
        return BodyReply(status, list((headers or {}).items()), [body])

    return reply


def chat(content: Any, finish: Any = "stop") -> Reply:
    return respond(200, json.dumps(chat_body(content, finish)).encode())


VERDICT = chat(FENCED_421)
MALFORMED = chat("I prefer the first one.")
EMPTY = chat("")


def status(code: int, body: bytes = INJECTED, **headers: str) -> Reply:
    return respond(code, body, {name.replace("_", "-"): v for name, v in headers.items()})


def fail_with(exc: JudgeTransportError) -> Reply:
    async def reply(call: Call) -> JudgeReply:
        raise exc

    return reply


def truncated() -> Reply:
    async def reply(call: Call) -> JudgeReply:
        cut = RemoteProtocolError(closed_in_body(13, 400))
        return BodyReply(200, [], [b'{"choices": ['], then=cut)

    return reply


def stalled_body() -> Reply:
    async def reply(call: Call) -> JudgeReply:
        return BodyReply(200, [], [b'{"choices": ['], then="stall")

    return reply


def after(delay_s: float, then: Reply) -> Reply:
    async def reply(call: Call) -> JudgeReply:
        await trio.sleep(delay_s)
        return await then(call)

    return reply


def hang() -> Reply:
    async def reply(call: Call) -> JudgeReply:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    return reply


class ScriptedJudge:
    """Answers the n-th call with the n-th reply (the last one repeats) and records every call."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.calls: list[Call] = []
        self.call_times: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.cancelled = 0

    async def answer(self, call: Call) -> JudgeReply:
        self.calls.append(call)
        self.call_times.append(trio.current_time())
        reply = self.replies[min(len(self.calls), len(self.replies)) - 1]
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await reply(call)
        except trio.Cancelled:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1

    def transport(self) -> Callable[[JudgeEndpoint], JudgeTransport]:
        return lambda endpoint: _ScriptedTransport(self, endpoint)


class _ScriptedTransport(JudgeTransport):
    def __init__(self, judge: ScriptedJudge, endpoint: JudgeEndpoint) -> None:
        self.judge = judge
        self.endpoint = endpoint

    async def send(self, body: bytes) -> JudgeReply:
        headers = {name.lower(): value for name, value in self.endpoint.headers.items()}
        return await self.judge.answer(Call(self.endpoint.url, headers, body))

    async def aclose(self) -> None:
        pass

    def statistics(self) -> TransportStatistics:
        return TransportStatistics(connections_opened=0, idle_connections=0)


def client_for(judge: ScriptedJudge, **overrides: Any) -> JudgeClient:
    return JudgeClient(make_config(**overrides), transport=judge.transport())


async def judge_once(judge: ScriptedJudge, **overrides: Any) -> JudgeVerdict | JudgeFailure:
    client = client_for(judge, **overrides)
    try:
        return await client.judge(TASK)
    finally:
        await client.aclose()


# --- success and request shape ----------------------------------------------------------


async def test_verdict_in_one_call(autojump_clock: trio.testing.MockClock) -> None:
    judge = ScriptedJudge(VERDICT)
    client = client_for(judge)
    result = await client.judge(TASK)
    assert result == JudgeVerdict(verdict=V421, fallback=False, attempts=1)
    assert len(judge.calls) == 1
    assert client.attempts_total == 1
    assert client.in_flight == 0
    await client.aclose()


async def test_chat_request_url_body_and_headers() -> None:
    judge = ScriptedJudge(VERDICT)
    sampling = {"max_output_tokens": 16384, "temperature": 0.6, "chat_template_kwargs": {"x": 1}}
    await judge_once(judge, genrm_responses_create_params=sampling)
    request = judge.calls[0]
    assert request.url == URL
    assert json.loads(request.content) == {
        "model": "judge-m",
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "response_1", "content": "answer-0 [[q=4]]"},
            {"role": "response_2", "content": "answer-1 [[q=2]]"},
        ],
        "max_tokens": 16384,
        "temperature": 0.6,
        "chat_template_kwargs": {"x": 1},
    }
    assert request.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "user-agent": f"genrm-trio/{__version__}",
    }


async def test_responses_request_and_reply() -> None:
    reply = {
        "object": "response",
        "status": None,
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]},
            {"type": "message", "content": [{"type": "output_text", "text": FENCED_421}]},
        ],
    }
    judge = ScriptedJudge(respond(200, json.dumps(reply).encode()))
    result = await judge_once(judge, judge_api="responses", use_principle=True)
    assert result == JudgeVerdict(verdict=V421, fallback=False, attempts=1)
    request = judge.calls[0]
    assert request.url == "http://127.0.0.1:9/v1/responses"
    assert json.loads(request.content) == {
        "model": "judge-m",
        "input": [{"role": "user", "content": "2+2?", "type": "message"}],
        "metadata": {"response_1": "answer-0 [[q=4]]", "response_2": "answer-1 [[q=2]]"},
        "max_output_tokens": 16384,
        "temperature": 0.6,
        "top_p": 0.95,
    }


async def test_principle_is_sent_when_enabled() -> None:
    judge = ScriptedJudge(VERDICT)
    client = client_for(judge, use_principle=True)
    task = JudgeTask(
        history=[], principle="Be brief", text_1="a", text_2="None", pair=(0, 1), judge_pass=0
    )
    await client.judge(task)
    await client.aclose()
    assert json.loads(judge.calls[0].content)["messages"] == [
        {"role": "principle", "content": "Be brief"},
        {"role": "response_1", "content": "a"},
        {"role": "response_2", "content": "None"},
    ]


async def test_api_key_from_configuration_is_sent_as_bearer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GENRM_JUDGE_API_KEY", "from-env")
    judge = ScriptedJudge(VERDICT)
    await judge_once(judge, judge_api_key="from-config")
    assert judge.calls[0].headers["authorization"] == "Bearer from-config"


async def test_api_key_from_environment_is_sent_as_bearer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GENRM_JUDGE_API_KEY", "from-env")
    judge = ScriptedJudge(VERDICT)
    await judge_once(judge)
    assert judge.calls[0].headers["authorization"] == "Bearer from-env"


async def test_empty_environment_key_sends_no_authorization(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GENRM_JUDGE_API_KEY", "")
    judge = ScriptedJudge(VERDICT)
    await judge_once(judge)
    assert "authorization" not in judge.calls[0].headers


async def test_api_key_is_read_once_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENRM_JUDGE_API_KEY", "first")
    judge = ScriptedJudge(VERDICT)
    client = client_for(judge)
    monkeypatch.setenv("GENRM_JUDGE_API_KEY", "second")
    await client.judge(TASK)
    await client.aclose()
    assert judge.calls[0].headers["authorization"] == "Bearer first"


async def test_user_info_is_stripped_from_request_and_error_text() -> None:
    judge = ScriptedJudge(status(500))
    result = await judge_once(
        judge, judge_base_url="http://user:pw@127.0.0.1:9/v1", genrm_parse_retries=0
    )
    assert judge.calls[0].url == URL
    assert "authorization" not in judge.calls[0].headers
    assert isinstance(result, JudgeFailure)
    assert "user" not in result.text
    assert "pw" not in result.text
    assert result.text.startswith(f"GenRM judge {URL} ")


async def test_api_key_echoed_by_the_judge_is_redacted_from_the_error_text() -> None:
    async def echo(call: Call) -> JudgeReply:
        body = json.dumps({"error": f"bad {call.headers['authorization']}"}, separators=(",", ":"))
        return BodyReply(401, [], [body.encode()])

    judge = ScriptedJudge(echo)
    result = await judge_once(judge, judge_api_key="sk-secret")
    assert isinstance(result, JudgeFailure)
    assert "sk-secret" not in result.text
    assert result.text.endswith('HTTP 401; response={"error":"bad Bearer <redacted>"}')


# --- J-21 classification through the loop --------------------------------------------------


@pytest.mark.parametrize("code", [408, 429, 500, 503, 599])
async def test_transient_status_then_success_takes_two_calls(
    code: int, autojump_clock: trio.testing.MockClock
) -> None:
    judge = ScriptedJudge(status(code), VERDICT)
    assert await judge_once(judge) == JudgeVerdict(verdict=V421, fallback=False, attempts=2)
    assert len(judge.calls) == 2


@pytest.mark.parametrize(
    "error",
    [
        ConnectError("cannot connect to 127.0.0.1:9: Connection refused"),
        ReadError("connection to the judge broken: Connection reset by peer"),
        RemoteProtocolError(CLOSED_BEFORE_REPLY),
    ],
    ids=lambda error: type(error).__name__,
)
async def test_transport_error_then_success_takes_two_calls(
    error: JudgeTransportError, autojump_clock: trio.testing.MockClock
) -> None:
    judge = ScriptedJudge(fail_with(error), VERDICT)
    assert await judge_once(judge) == JudgeVerdict(verdict=V421, fallback=False, attempts=2)


async def test_persistent_500_makes_three_calls_with_two_retries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(status(500))
    result = await judge_once(judge, genrm_parse_retries=2)
    assert len(judge.calls) == 3
    assert result == JudgeFailure(
        text=(
            f"GenRM judge {URL} pair=(0, 1) judge=0 attempt=3/3 deadline=2.0s:"
            ' HTTPStatusError: HTTP 500; response={"error":"injected"}'
        ),
        attempts=3,
    )


async def test_persistent_500_with_default_retries_matches_the_acceptance_text(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(status(500))
    result = await judge_once(judge, judge_base_url="http://user:pw@127.0.0.1:9/v1")
    assert result == JudgeFailure(
        text=(
            "GenRM judge http://127.0.0.1:9/v1/chat/completions pair=(0, 1) judge=0 attempt=4/4"
            ' deadline=2.0s: HTTPStatusError: HTTP 500; response={"error":"injected"}'
        ),
        attempts=4,
    )


@pytest.mark.parametrize("code", [400, 401, 403, 404, 302])
async def test_fatal_status_ends_after_one_call(code: int) -> None:
    judge = ScriptedJudge(status(code, location="http://elsewhere/"), VERDICT)
    result = await judge_once(judge)
    assert len(judge.calls) == 1
    assert result == JudgeFailure(
        text=(
            f"GenRM judge {URL} pair=(0, 1) judge=0 attempt=1/4 deadline=2.0s:"
            f' HTTPStatusError: HTTP {code}; response={{"error":"injected"}}'
        ),
        attempts=1,
    )


async def test_truncated_body_once_then_success(autojump_clock: trio.testing.MockClock) -> None:
    judge = ScriptedJudge(truncated(), VERDICT)
    assert await judge_once(judge) == JudgeVerdict(verdict=V421, fallback=False, attempts=2)


async def test_truncated_body_every_time_fails_naming_the_transport_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(truncated())
    result = await judge_once(judge)
    assert len(judge.calls) == 4
    assert result == JudgeFailure(
        text=(
            f"GenRM judge {URL} pair=(0, 1) judge=0 attempt=4/4 deadline=2.0s:"
            " RemoteProtocolError: the judge closed the connection after 13 of 400 body bytes"
        ),
        attempts=4,
    )


async def test_error_status_with_a_broken_body_keeps_its_status() -> None:
    async def reply(call: Call) -> JudgeReply:
        broken = ReadError("connection to the judge broken: Connection reset by peer")
        return BodyReply(404, [], [b'{"error":'], then=broken)

    judge = ScriptedJudge(reply)
    result = await judge_once(judge)
    assert isinstance(result, JudgeFailure)
    assert result.text.endswith('HTTPStatusError: HTTP 404; response={"error":')
    assert len(judge.calls) == 1


async def test_non_json_reply_fails_after_one_call() -> None:
    judge = ScriptedJudge(respond(200, b"<html>not json</html>", {"content-type": "text/html"}))
    result = await judge_once(judge)
    assert result == JudgeFailure(
        text=(
            f"GenRM judge {URL} pair=(0, 1) judge=0 attempt=1/4 deadline=2.0s:"
            " JSONDecodeError: judge reply is not valid JSON: <html>not json</html>"
        ),
        attempts=1,
    )


async def test_valid_reply_served_as_text_plain_is_accepted() -> None:
    body = json.dumps(chat_body(FENCED_421)).encode()
    judge = ScriptedJudge(respond(200, body, {"content-type": "text/plain"}))
    assert await judge_once(judge) == JudgeVerdict(verdict=V421, fallback=False, attempts=1)


# --- hostile bodies -----------------------------------------------------------------------


async def test_deeply_nested_reply_is_a_non_json_failure() -> None:
    judge = ScriptedJudge(respond(200, b"[" * 200_000 + b"]" * 200_000))
    result = await judge_once(judge)
    assert isinstance(result, JudgeFailure)
    assert result.text.endswith("JSONDecodeError: judge reply is not valid JSON: " + "[" * 200)
    assert result.attempts == 1


async def test_invalid_utf8_reply_is_a_non_json_failure_shown_with_replacements() -> None:
    judge = ScriptedJudge(respond(200, b'{"choices": "\xff\xfe"}'))
    result = await judge_once(judge)
    assert isinstance(result, JudgeFailure)
    assert result.text.endswith('not valid JSON: {"choices": "\ufffd\ufffd"}')


async def test_oversized_reply_is_refused_without_being_held() -> None:
    chunk = b" " * (1024 * 1024)

    class Endless(JudgeReply):
        async def next_part(self) -> bytes:
            await trio.lowlevel.checkpoint()
            return chunk

        async def release(self) -> None:
            pass

    async def reply(call: Call) -> JudgeReply:
        return Endless(200, [])

    judge = ScriptedJudge(reply)
    result = await judge_once(judge)
    assert isinstance(result, JudgeFailure)
    assert result.text.endswith(f"ReplyTooLarge: judge reply exceeds {MAX_REPLY_BYTES} bytes")
    assert result.attempts == 1


async def test_huge_error_body_is_shown_as_its_first_1000_code_points(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(status(500, "€".encode() * 1_000_000))
    result = await judge_once(judge, genrm_parse_retries=0)
    assert isinstance(result, JudgeFailure)
    assert result.text.endswith("HTTP 500; response=" + "€" * 1000)


# --- parse failures, fallback and budget exhaustion (J-13…J-15, J-24) -------------------------


async def test_unparseable_but_usable_replies_fall_back_to_default_scores(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    judge = ScriptedJudge(MALFORMED)
    result = await judge_once(judge)
    assert result == JudgeVerdict(verdict=DEFAULT, fallback=True, attempts=4)
    assert len(judge.calls) == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "GenRM judge reply unparseable for pair (0, 1) judge 0 after 4 attempts;"
        " using default scores"
    ]


@pytest.mark.parametrize("order", [(MALFORMED, EMPTY), (EMPTY, MALFORMED)], ids=["me", "em"])
async def test_fallback_does_not_depend_on_the_order_of_attempts(
    order: tuple[Reply, Reply], autojump_clock: trio.testing.MockClock
) -> None:
    judge = ScriptedJudge(*order)
    result = await judge_once(judge, genrm_parse_retries=1)
    assert result == JudgeVerdict(verdict=DEFAULT, fallback=True, attempts=2)
    assert len(judge.calls) == 2


async def test_malformed_then_verdict_uses_the_verdict(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(MALFORMED, VERDICT)
    assert await judge_once(judge) == JudgeVerdict(verdict=V421, fallback=False, attempts=2)


async def test_malformed_then_503_fails_without_fallback(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(MALFORMED, status(503))
    result = await judge_once(judge, genrm_parse_retries=1)
    assert len(judge.calls) == 2
    assert result == JudgeFailure(
        text=(
            f"GenRM judge {URL} pair=(0, 1) judge=0 attempt=2/2 deadline=2.0s:"
            ' HTTPStatusError: HTTP 503; response={"error":"injected"}'
        ),
        attempts=2,
    )


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (respond(200, b"null"), "not a JSON object"),
        (respond(200, b"{}"), "no choices"),
        (respond(200, b'{"choices": []}'), "no choices"),
        (chat(None), "content is not a string"),
        (EMPTY, "empty verdict text"),
        (chat('<think> {"score_1": 5, "score_2": 1, "ranking": 1}'), "unfinished reasoning"),
        (chat(FENCED_421, finish="content_filter"), "finish_reason=content_filter"),
    ],
)
async def test_unusable_replies_fail_with_no_completed_answer(
    reply: Reply, problem: str, autojump_clock: trio.testing.MockClock
) -> None:
    judge = ScriptedJudge(reply)
    result = await judge_once(judge)
    assert len(judge.calls) == 4
    assert result == JudgeFailure(
        text=(
            f"GenRM judge {URL} pair=(0, 1) judge=0 attempt=4/4 deadline=2.0s:"
            f" Judge returned no completed answer after 4 attempts; last reply: {problem}"
        ),
        attempts=4,
    )


BUDGET_TEXT = (
    "Judge returned no completed answer after 2 attempts (2 of them exhausted"
    " max_output_tokens=1341 without emitting a verdict; raise the budget or constrain the"
    " judge's reasoning); last reply: "
)


async def test_chat_budget_exhaustion_fails_with_suffix_and_logs_each_attempt(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    judge = ScriptedJudge(chat("<think>comparing the two responses, weighing", finish="length"))
    result = await judge_once(
        judge, genrm_parse_retries=1, genrm_responses_create_params={"max_output_tokens": 1341}
    )
    assert len(judge.calls) == 2
    assert json.loads(judge.calls[0].content)["max_tokens"] == 1341
    assert result == JudgeFailure(
        text=(
            f"GenRM judge {URL} pair=(0, 1) judge=0 attempt=2/2 deadline=2.0s: "
            + BUDGET_TEXT
            + "finish_reason=length"
        ),
        attempts=2,
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "GenRM output budget exhausted for pair (0, 1) (attempt 1/2, max_output_tokens=1341):"
        " reply finished with finish_reason=length and contains no verdict",
        "GenRM output budget exhausted for pair (0, 1) (attempt 2/2, max_output_tokens=1341):"
        " reply finished with finish_reason=length and contains no verdict",
    ]


async def test_responses_budget_exhaustion_fails_with_suffix_and_logs_each_attempt(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    reply = {
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
        "output": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]}],
    }
    judge = ScriptedJudge(respond(200, json.dumps(reply).encode()))
    result = await judge_once(
        judge,
        judge_api="responses",
        genrm_parse_retries=1,
        genrm_responses_create_params={"max_output_tokens": 1341},
    )
    assert json.loads(judge.calls[0].content)["max_output_tokens"] == 1341
    assert result == JudgeFailure(
        text=(
            "GenRM judge http://127.0.0.1:9/v1/responses pair=(0, 1) judge=0 attempt=2/2"
            " deadline=2.0s: " + BUDGET_TEXT + "status=incomplete"
        ),
        attempts=2,
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "GenRM output budget exhausted for pair (0, 1) (attempt 1/2, max_output_tokens=1341):"
        " response is incomplete (reason=max_output_tokens) and contains no verdict",
        "GenRM output budget exhausted for pair (0, 1) (attempt 2/2, max_output_tokens=1341):"
        " response is incomplete (reason=max_output_tokens) and contains no verdict",
    ]


async def test_budget_exhaustion_without_configured_budget_says_unset(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(chat(None, finish="length"))
    result = await judge_once(
        judge, genrm_parse_retries=0, genrm_responses_create_params={"temperature": 0.6}
    )
    assert isinstance(result, JudgeFailure)
    assert "(1 of them exhausted max_output_tokens=unset without emitting a verdict;" in (
        result.text
    )


async def test_length_finish_with_a_verdict_is_accepted_in_one_call() -> None:
    judge = ScriptedJudge(chat(FENCED_421, finish="length"))
    assert await judge_once(judge) == JudgeVerdict(verdict=V421, fallback=False, attempts=1)


async def test_retry_is_logged_at_info(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    judge = ScriptedJudge(status(500), VERDICT)
    await judge_once(judge)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == [
        "GenRM judge retry pair (0, 1) judge 0 attempt 1/4 after HTTP 500; sleeping 0.0s"
    ]


# --- J-27 per-request deadline ------------------------------------------------------------


async def test_hanging_judge_fails_at_the_per_request_deadline_after_one_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(hang())
    client = client_for(judge, judge_request_timeout_s=0.2)
    result = await client.judge(TASK)
    assert trio.current_time() == pytest.approx(0.2)
    assert result == JudgeFailure(
        text=(
            f"GenRM judge {URL} pair=(0, 1) judge=0 attempt=1/4 deadline=0.2s:"
            " TimeoutError: no complete reply within 0.2s"
        ),
        attempts=1,
    )
    assert len(judge.calls) == 1
    assert judge.cancelled == 1
    assert client.in_flight == 0
    await client.aclose()


async def test_deadline_covers_reading_the_body(autojump_clock: trio.testing.MockClock) -> None:
    judge = ScriptedJudge(stalled_body())
    result = await judge_once(judge, judge_request_timeout_s=0.2)
    assert isinstance(result, JudgeFailure)
    assert result.text.endswith("TimeoutError: no complete reply within 0.2s")
    assert trio.current_time() == pytest.approx(0.2)


async def test_transport_connect_timeout_counts_as_the_per_request_deadline() -> None:
    judge = ScriptedJudge(fail_with(ConnectTimedOut("no connection to 127.0.0.1:9 within 0.2s")))
    result = await judge_once(judge, judge_request_timeout_s=0.2)
    assert isinstance(result, JudgeFailure)
    assert result.text.endswith(
        "attempt=1/4 deadline=0.2s: TimeoutError: no complete reply within 0.2s"
    )
    assert len(judge.calls) == 1


async def test_slow_reply_inside_the_deadline_succeeds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(after(1.9, VERDICT))
    assert await judge_once(judge) == JudgeVerdict(verdict=V421, fallback=False, attempts=1)


# --- J-30…J-32 sleeps -----------------------------------------------------------------------


async def test_retry_after_is_honoured(autojump_clock: trio.testing.MockClock) -> None:
    judge = ScriptedJudge(status(429, retry_after="1"), VERDICT)
    result = await judge_once(judge)
    assert result == JudgeVerdict(verdict=V421, fallback=False, attempts=2)
    assert judge.call_times[1] - judge.call_times[0] >= 1.0


async def test_retry_after_on_500_is_ignored(autojump_clock: trio.testing.MockClock) -> None:
    judge = ScriptedJudge(status(500, retry_after="30"), VERDICT)
    await judge_once(judge)
    assert judge.call_times[1] - judge.call_times[0] == 0.0


async def test_backoff_gaps_are_full_jitter_draws_within_the_growing_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(status(503))
    config = make_config(genrm_parse_retry_sleep_s=0.1, judge_retry_max_sleep_s=0.15)
    client = JudgeClient(config, transport=judge.transport(), rng=random.Random(11))
    result = await client.judge(TASK)
    await client.aclose()
    assert isinstance(result, JudgeFailure)
    gaps = [b - a for a, b in zip(judge.call_times, judge.call_times[1:], strict=False)]
    expected = random.Random(11)
    draws = [expected.uniform(0, bound) for bound in (0.1, 0.15, 0.15)]
    assert gaps == pytest.approx(draws)
    assert [gap <= bound for gap, bound in zip(gaps, (0.1, 0.15, 0.15), strict=True)] == [
        True,
        True,
        True,
    ]


async def test_no_time_left_to_retry_fails_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(status(429, retry_after="60"), VERDICT)
    client = client_for(judge)
    result = await client.judge(TASK, deadline=trio.current_time() + 2.0)
    await client.aclose()
    assert len(judge.calls) == 1
    assert trio.current_time() == 0.0
    assert result == JudgeFailure(
        text=(
            f"GenRM judge {URL} pair=(0, 1) judge=0 attempt=1/4 deadline=2.0s:"
            ' HTTPStatusError: HTTP 429; response={"error":"injected"}'
            " (no time left to retry before the deadline)"
        ),
        attempts=1,
    )


async def test_sleep_that_fits_before_the_deadline_is_taken(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(status(429, retry_after="1"), VERDICT)
    client = client_for(judge)
    result = await client.judge(TASK, deadline=trio.current_time() + 2.0)
    await client.aclose()
    assert result == JudgeVerdict(verdict=V421, fallback=False, attempts=2)


async def test_no_time_left_is_checked_before_every_retry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(status(503, retry_after="5"), EMPTY, status(503, retry_after="5"))
    client = client_for(judge)
    result = await client.judge(TASK, deadline=trio.current_time() + 6.0)
    await client.aclose()
    assert len(judge.calls) == 3
    assert isinstance(result, JudgeFailure)
    assert result.text.endswith(
        'attempt=3/4 deadline=2.0s: HTTPStatusError: HTTP 503; response={"error":"injected"}'
        " (no time left to retry before the deadline)"
    )


# --- J-33 concurrency -----------------------------------------------------------------------


async def test_concurrency_limit_caps_attempts_in_flight(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(after(0.2, VERDICT))
    client = client_for(judge, judge_max_concurrency=3)
    results: list[JudgeVerdict | JudgeFailure] = []
    finished: list[float] = []
    observed: list[int] = []

    async def one() -> None:
        results.append(await client.judge(TASK))
        finished.append(trio.current_time())

    async def watch() -> None:
        while len(results) < 8:
            observed.append(client.in_flight)
            await trio.sleep(0.05)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        for _ in range(8):
            nursery.start_soon(one)
    await client.aclose()
    assert judge.max_in_flight == 3
    assert max(observed) == 3
    assert results == [JudgeVerdict(verdict=V421, fallback=False, attempts=1)] * 8
    assert finished == pytest.approx([0.2] * 3 + [0.4] * 3 + [0.6] * 2)
    assert client.in_flight == 0
    assert client.attempts_total == 8


async def test_waiting_for_a_slot_does_not_count_against_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(after(0.3, VERDICT))
    client = client_for(judge, judge_max_concurrency=1, judge_request_timeout_s=0.5)
    results: list[JudgeVerdict | JudgeFailure] = []

    async def one() -> None:
        results.append(await client.judge(TASK))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(one)
    await client.aclose()
    assert results == [JudgeVerdict(verdict=V421, fallback=False, attempts=1)] * 4
    assert trio.current_time() == pytest.approx(1.2)


async def test_slots_are_granted_first_come_first_served(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order: list[str] = []

    async def reply(request: Call) -> JudgeReply:
        order.append(json.loads(request.content)["messages"][-2]["content"])
        await trio.sleep(0.1)
        return await VERDICT(request)

    judge = ScriptedJudge(reply)
    client = client_for(judge, judge_max_concurrency=1)

    async def one(name: str) -> None:
        task = JudgeTask(
            history=[], principle=None, text_1=name, text_2="b", pair=(0, 1), judge_pass=0
        )
        await client.judge(task)

    async with trio.open_nursery() as nursery:
        for name in ("t0", "t1", "t2", "t3", "t4"):
            nursery.start_soon(one, name)
            await trio.testing.wait_all_tasks_blocked()
    await client.aclose()
    assert order == ["t0", "t1", "t2", "t3", "t4"]


async def test_retry_sleep_does_not_hold_a_slot(autojump_clock: trio.testing.MockClock) -> None:
    calls: list[tuple[str, float]] = []

    async def reply(request: Call) -> JudgeReply:
        name = json.loads(request.content)["messages"][-2]["content"]
        calls.append((name, trio.current_time()))
        if name == "slow" and len([c for c in calls if c[0] == "slow"]) == 1:
            return await status(503, retry_after="1")(request)
        return await VERDICT(request)

    judge = ScriptedJudge(reply)
    client = client_for(judge, judge_max_concurrency=1)

    async def one(name: str) -> None:
        task = JudgeTask(
            history=[], principle=None, text_1=name, text_2="b", pair=(0, 1), judge_pass=0
        )
        await client.judge(task)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "slow")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(one, "other")
    await client.aclose()
    assert calls == [("slow", 0.0), ("other", 0.0), ("slow", 1.0)]


# --- cancellation ---------------------------------------------------------------------------


async def test_cancellation_propagates_and_aborts_the_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(hang())
    client = client_for(judge, judge_request_timeout_s=10.0)
    with trio.move_on_after(1.0) as scope:
        await client.judge(TASK)
    assert scope.cancelled_caught
    assert judge.cancelled == 1
    assert client.in_flight == 0
    await client.aclose()


async def test_cancellation_during_a_retry_sleep_makes_no_further_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(status(503, retry_after="5"), VERDICT)
    client = client_for(judge)
    with trio.move_on_after(1.0) as scope:
        await client.judge(TASK)
    assert scope.cancelled_caught
    await trio.sleep(10)
    assert len(judge.calls) == 1
    await client.aclose()


async def test_without_an_enclosing_deadline_any_retry_after_is_waited_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = ScriptedJudge(status(503, retry_after="3600"), VERDICT)
    result = await judge_once(judge)
    assert result == JudgeVerdict(verdict=V421, fallback=False, attempts=2)
    assert trio.current_time() == pytest.approx(3600.0)
