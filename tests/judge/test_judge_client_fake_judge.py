"""The judge client against the built-in fake judge, over real loopback HTTP for every failure
class, and in process (mock clock) where exact times matter."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from genrm_trio import __version__
from genrm_trio.config import Config
from genrm_trio.core.verdicts import Verdict
from genrm_trio.judge.client import JudgeClient, JudgeFailure, JudgeTask, JudgeVerdict
from genrm_trio.testing import FakeJudge, pair_rule, serve_fake_judge

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
INJECTED_500 = 'HTTPStatusError: HTTP 500; response={"error":"injected"}'


def make_config(base_url: str, **overrides: Any) -> Config:
    fields: dict[str, Any] = {
        "judge_base_url": base_url,
        "judge_model": "judge-m",
        "judge_request_timeout_s": 2.0,
        "genrm_parse_retry_sleep_s": 0.0,
    }
    fields.update(overrides)
    return Config(**fields)


@pytest.fixture
def fake() -> FakeJudge:
    return FakeJudge()


@pytest.fixture
async def base_url(fake: FakeJudge, nursery: trio.Nursery) -> str:
    port = await nursery.start(serve_fake_judge, fake, "127.0.0.1", 0)
    return f"http://127.0.0.1:{port}/v1"


async def judge_over_tcp(
    base_url: str, task: JudgeTask = TASK, **overrides: Any
) -> JudgeVerdict | JudgeFailure:
    client = JudgeClient(make_config(base_url, **overrides))
    try:
        return await client.judge(task)
    finally:
        await client.aclose()


def calls(fake: FakeJudge) -> int:
    return int(fake.stats()["requests_total"])


def error_prefix(base_url: str, attempt: str, api_path: str = "/chat/completions") -> str:
    return f"GenRM judge {base_url}{api_path} pair=(0, 1) judge=0 attempt={attempt} deadline=2.0s: "


# --- success and request shape ----------------------------------------------------------


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_verdict_from_the_fake_judge(api: str, fake: FakeJudge, base_url: str) -> None:
    result = await judge_over_tcp(base_url, judge_api=api)
    assert result == JudgeVerdict(verdict=V421, fallback=False, attempts=1)
    assert fake.stats()["by_api"][api] == 1


async def test_recorded_request_carries_only_the_j8_headers(fake: FakeJudge, base_url: str) -> None:
    await judge_over_tcp(base_url)
    headers = fake.requests()[0]["headers"]
    assert {name for name in headers} == {
        "host",
        "content-length",
        "content-type",
        "accept",
        "user-agent",
    }
    assert headers["content-type"] == "application/json"
    assert headers["accept"] == "application/json"
    assert headers["user-agent"] == f"genrm-trio/{__version__}"


async def test_recorded_chat_body(fake: FakeJudge, base_url: str) -> None:
    await judge_over_tcp(base_url)
    assert fake.requests()[0]["body"] == {
        "model": "judge-m",
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "response_1", "content": "answer-0 [[q=4]]"},
            {"role": "response_2", "content": "answer-1 [[q=2]]"},
        ],
        "max_tokens": 16384,
        "temperature": 0.6,
        "top_p": 0.95,
    }


async def test_judge_requiring_a_key_accepts_the_configured_key(base_url: str) -> None:
    fake = FakeJudge(api_key="sk-test")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_fake_judge, fake, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}/v1"
        accepted = await judge_over_tcp(url, judge_api_key="sk-test")
        refused = await judge_over_tcp(url, judge_api_key="sk-wrong")
        nursery.cancel_scope.cancel()
    assert accepted == JudgeVerdict(verdict=V421, fallback=False, attempts=1)
    assert isinstance(refused, JudgeFailure)
    assert refused.attempts == 1
    assert "HTTPStatusError: HTTP 401; response=" in refused.text
    assert "sk-wrong" not in refused.text
    assert "sk-test" not in refused.text


async def test_user_info_never_reaches_the_judge_or_the_error_text(
    fake: FakeJudge, base_url: str
) -> None:
    fake.set_rules([pair_rule(0, 1, "http_status", status=500)])
    with_user = base_url.replace("http://", "http://user:pw@")
    result = await judge_over_tcp(with_user)
    assert result == JudgeFailure(text=error_prefix(base_url, "4/4") + INJECTED_500, attempts=4)
    assert "authorization" not in fake.requests()[0]["headers"]


# --- transient, fatal and parse failures over TCP --------------------------------------------


async def test_transient_status_once_then_normal_takes_two_calls(
    fake: FakeJudge, base_url: str
) -> None:
    fake.set_rules([pair_rule(0, 1, "http_status", status=503, times=1)])
    result = await judge_over_tcp(base_url)
    assert result == JudgeVerdict(verdict=V421, fallback=False, attempts=2)
    assert calls(fake) == 2


async def test_persistent_500_makes_three_calls_with_two_retries(
    fake: FakeJudge, base_url: str
) -> None:
    fake.set_rules([pair_rule(0, 1, "http_status", status=500)])
    result = await judge_over_tcp(base_url, genrm_parse_retries=2)
    assert calls(fake) == 3
    assert result == JudgeFailure(text=error_prefix(base_url, "3/3") + INJECTED_500, attempts=3)


@pytest.mark.parametrize("code", [400, 401, 403, 404])
async def test_fatal_status_makes_one_call(code: int, fake: FakeJudge, base_url: str) -> None:
    fake.set_rules([pair_rule(0, 1, "http_status", status=code)])
    result = await judge_over_tcp(base_url)
    assert calls(fake) == 1
    assert result == JudgeFailure(
        text=error_prefix(base_url, "1/4")
        + f'HTTPStatusError: HTTP {code}; response={{"error":"injected"}}',
        attempts=1,
    )


async def test_truncated_body_once_then_normal_takes_two_calls(
    fake: FakeJudge, base_url: str
) -> None:
    fake.set_rules([pair_rule(0, 1, "truncated_body", times=1)])
    result = await judge_over_tcp(base_url)
    assert result == JudgeVerdict(verdict=V421, fallback=False, attempts=2)
    assert calls(fake) == 2


@pytest.mark.parametrize("action", ["truncated_body", "close"])
async def test_broken_connection_every_time_fails_naming_the_transport_error(
    action: str, fake: FakeJudge, base_url: str
) -> None:
    fake.set_rules([pair_rule(0, 1, action)])
    result = await judge_over_tcp(base_url)
    assert calls(fake) == 4
    assert isinstance(result, JudgeFailure)
    assert result.attempts == 4
    assert result.text.startswith(error_prefix(base_url, "4/4") + "RemoteProtocolError: the judge ")


async def test_closed_port_fails_with_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}/v1"
    result = await judge_over_tcp(base_url, judge_request_timeout_s=0.2)
    assert isinstance(result, JudgeFailure)
    assert result.attempts == 4
    assert " deadline=0.2s: ConnectError: cannot connect to 127.0.0.1:" in result.text
    assert result.text.endswith(": Connection refused")


async def test_non_json_reply_fails_after_one_call(fake: FakeJudge, base_url: str) -> None:
    fake.set_rules([pair_rule(0, 1, "non_json")])
    result = await judge_over_tcp(base_url)
    assert calls(fake) == 1
    assert result == JudgeFailure(
        text=error_prefix(base_url, "1/4")
        + "JSONDecodeError: judge reply is not valid JSON: <html>not json</html>",
        attempts=1,
    )


async def test_valid_body_with_another_content_type_is_accepted(
    fake: FakeJudge, base_url: str
) -> None:
    body = (
        '{"choices": [{"message": {"content": "{\\"score_1\\": 4, \\"score_2\\": 2,'
        ' \\"ranking\\": 1}"}, "finish_reason": "stop"}]}'
    )
    fake.set_rules([pair_rule(0, 1, "raw", body=body, content_type="text/plain")])
    assert await judge_over_tcp(base_url) == JudgeVerdict(verdict=V421, fallback=False, attempts=1)


async def test_hanging_judge_fails_at_the_per_request_deadline(
    fake: FakeJudge, base_url: str
) -> None:
    fake.set_rules([pair_rule(0, 1, "hang")])
    result = await judge_over_tcp(base_url, judge_request_timeout_s=0.2)
    assert result == JudgeFailure(
        text=(
            f"GenRM judge {base_url}/chat/completions pair=(0, 1) judge=0 attempt=1/4"
            " deadline=0.2s: TimeoutError: no complete reply within 0.2s"
        ),
        attempts=1,
    )
    assert calls(fake) == 1
    # The abandoned connection reaches the server through the kernel; there is no event to
    # wait on, so poll its gauge (fail_after only guards against a hang).
    with trio.fail_after(5):
        while fake.stats()["in_flight"]:  # noqa: ASYNC110
            await trio.sleep(0.01)
    assert fake.stats()["cancelled"] == 1


@pytest.mark.parametrize(
    ("api", "path", "problem"),
    [
        ("chat_completions", "/chat/completions", "finish_reason=length"),
        ("responses", "/responses", "status=incomplete"),
    ],
)
async def test_budget_exhaustion_over_tcp(
    api: str,
    path: str,
    problem: str,
    fake: FakeJudge,
    base_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.set_rules([pair_rule(0, 1, "budget_exhausted")])
    result = await judge_over_tcp(
        base_url,
        judge_api=api,
        genrm_parse_retries=1,
        genrm_responses_create_params={"max_output_tokens": 1341},
    )
    assert calls(fake) == 2
    assert result == JudgeFailure(
        text=error_prefix(base_url, "2/2", path)
        + "Judge returned no completed answer after 2 attempts (2 of them exhausted"
        " max_output_tokens=1341 without emitting a verdict; raise the budget or constrain the"
        f" judge's reasoning); last reply: {problem}",
        attempts=2,
    )
    exhausted = [r.getMessage() for r in caplog.records if "budget exhausted" in r.getMessage()]
    assert [line.split(":")[0] for line in exhausted] == [
        "GenRM output budget exhausted for pair (0, 1) (attempt 1/2, max_output_tokens=1341)",
        "GenRM output budget exhausted for pair (0, 1) (attempt 2/2, max_output_tokens=1341)",
    ]


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ({"action": "raw", "body": "null"}, "not a JSON object"),
        ({"action": "raw", "body": "{}"}, "no choices"),
        ({"action": "raw", "body": '{"choices": []}'}, "no choices"),
        ({"action": "null_content"}, "content is not a string"),
        ({"action": "empty"}, "empty verdict text"),
        ({"action": "finish", "value": "content_filter"}, "finish_reason=content_filter"),
        (
            {"action": "text", "text": '<think> {"score_1": 5, "score_2": 1, "ranking": 1}'},
            "unfinished reasoning",
        ),
    ],
)
async def test_unusable_replies_fail_with_no_completed_answer(
    rule: dict[str, Any], problem: str, fake: FakeJudge, base_url: str
) -> None:
    fake.set_rules([{"match": {"response_1": "answer-0 "}, **rule}])
    result = await judge_over_tcp(base_url)
    assert calls(fake) == 4
    assert result == JudgeFailure(
        text=error_prefix(base_url, "4/4")
        + f"Judge returned no completed answer after 4 attempts; last reply: {problem}",
        attempts=4,
    )


@pytest.mark.parametrize("status", ["failed", "cancelled", "in_progress"])
async def test_responses_with_unfinished_status_fail(
    status: str, fake: FakeJudge, base_url: str
) -> None:
    fake.set_rules([pair_rule(0, 1, "finish", value=status)])
    result = await judge_over_tcp(base_url, judge_api="responses")
    assert isinstance(result, JudgeFailure)
    assert result.text.endswith(
        f"no completed answer after 4 attempts; last reply: status={status}"
    )


async def test_unparseable_replies_fall_back_to_default_scores(
    fake: FakeJudge, base_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake.set_rules([pair_rule(0, 1, "text", text="I prefer the first one.")])
    result = await judge_over_tcp(base_url)
    assert result == JudgeVerdict(verdict=DEFAULT, fallback=True, attempts=4)
    assert calls(fake) == 4
    assert (
        "GenRM judge reply unparseable for pair (0, 1) judge 0 after 4 attempts;"
        " using default scores"
    ) in [r.getMessage() for r in caplog.records]


async def test_malformed_then_503_fails_without_fallback(fake: FakeJudge, base_url: str) -> None:
    fake.set_rules(
        [
            pair_rule(0, 1, "text", text="I prefer the first one.", times=1),
            pair_rule(0, 1, "http_status", status=503),
        ]
    )
    result = await judge_over_tcp(base_url, genrm_parse_retries=1)
    assert calls(fake) == 2
    assert result == JudgeFailure(
        text=error_prefix(base_url, "2/2")
        + 'HTTPStatusError: HTTP 503; response={"error":"injected"}',
        attempts=2,
    )


async def test_concurrency_limit_holds_against_a_slow_judge(base_url: str) -> None:
    fake = FakeJudge(latency="fixed:0.05")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_fake_judge, fake, "127.0.0.1", 0)
        client = JudgeClient(make_config(f"http://127.0.0.1:{port}/v1", judge_max_concurrency=3))
        results: list[JudgeVerdict | JudgeFailure] = []

        async def one() -> None:
            results.append(await client.judge(TASK))

        async with trio.open_nursery() as comparisons:
            for _ in range(8):
                comparisons.start_soon(one)
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert fake.stats()["max_in_flight"] == 3
    assert results == [JudgeVerdict(verdict=V421, fallback=False, attempts=1)] * 8


# --- in process with the mock clock --------------------------------------------------------


@pytest.fixture
async def in_process(fake: FakeJudge) -> AsyncIterator[JudgeClient]:
    client = JudgeClient(make_config("http://judge/v1"), transport=fake.transport())
    yield client
    await client.aclose()


async def test_retry_after_from_the_fake_judge_is_honoured(
    fake: FakeJudge, in_process: JudgeClient, autojump_clock: trio.testing.MockClock
) -> None:
    fake.set_rules([pair_rule(0, 1, "http_status", status=429, retry_after=1, times=1)])
    result = await in_process.judge(TASK)
    assert result == JudgeVerdict(verdict=V421, fallback=False, attempts=2)
    first, second = (entry["arrival_time"] for entry in fake.requests())
    assert second - first >= 1.0


async def test_retry_after_beyond_the_enclosing_deadline_fails_at_once(
    fake: FakeJudge, in_process: JudgeClient, autojump_clock: trio.testing.MockClock
) -> None:
    fake.set_rules([pair_rule(0, 1, "http_status", status=429, retry_after=60)])
    result = await in_process.judge(TASK, deadline=trio.current_time() + 2.0)
    assert calls(fake) == 1
    assert trio.current_time() < 1.0
    assert isinstance(result, JudgeFailure)
    assert result.text.endswith(
        'HTTP 429; response={"error":"injected"} (no time left to retry before the deadline)'
    )


async def test_slot_wait_is_not_counted_against_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeJudge(latency="fixed:0.3")
    config = make_config("http://judge/v1", judge_max_concurrency=1, judge_request_timeout_s=0.5)
    client = JudgeClient(config, transport=fake.transport())
    results: list[JudgeVerdict | JudgeFailure] = []

    async def one() -> None:
        results.append(await client.judge(TASK))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(one)
    await client.aclose()
    assert results == [JudgeVerdict(verdict=V421, fallback=False, attempts=1)] * 4
    assert fake.stats()["max_in_flight"] == 1


# --- connection reuse (J-34, J-34a) ---------------------------------------------------------


class OpenedConnections:
    """Every TCP connection the client opens, seen by wrapping trio.open_tcp_stream."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.streams: list[trio.SocketStream] = []
        real_open = trio.open_tcp_stream

        async def open_and_record(*args: Any, **kwargs: Any) -> trio.SocketStream:
            stream = await real_open(*args, **kwargs)
            self.streams.append(stream)
            return stream

        monkeypatch.setattr(trio, "open_tcp_stream", open_and_record)

    @property
    def count(self) -> int:
        return len(self.streams)

    def open_now(self) -> int:
        return sum(1 for stream in self.streams if stream.socket.fileno() != -1)


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> OpenedConnections:
    return OpenedConnections(monkeypatch)


async def test_sequential_attempts_reuse_one_connection(
    base_url: str, opened: OpenedConnections
) -> None:
    client = JudgeClient(make_config(base_url))
    results = [await client.judge(TASK) for _ in range(5)]
    assert results == [JudgeVerdict(verdict=V421, fallback=False, attempts=1)] * 5
    assert opened.count == 1
    await client.aclose()
    assert opened.open_now() == 0


async def test_connections_never_exceed_the_concurrency_limit(
    opened: OpenedConnections,
) -> None:
    fake = FakeJudge(latency="fixed:0.02")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_fake_judge, fake, "127.0.0.1", 0)
        client = JudgeClient(make_config(f"http://127.0.0.1:{port}/v1", judge_max_concurrency=3))
        async with trio.open_nursery() as comparisons:
            for _ in range(12):
                comparisons.start_soon(client.judge, TASK)
        assert opened.count == 3
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert fake.stats()["requests_total"] == 12
    assert opened.open_now() == 0


@pytest.mark.parametrize("action", ["close", "truncated_body"])
async def test_a_broken_connection_is_replaced_not_reused(
    action: str, fake: FakeJudge, base_url: str, opened: OpenedConnections
) -> None:
    fake.set_rules([pair_rule(0, 1, action, times=1)])
    client = JudgeClient(make_config(base_url))
    assert await client.judge(TASK) == JudgeVerdict(verdict=V421, fallback=False, attempts=2)
    assert await client.judge(TASK) == JudgeVerdict(verdict=V421, fallback=False, attempts=1)
    assert opened.count == 2
    assert opened.open_now() == 1
    await client.aclose()


async def test_an_abandoned_attempt_closes_its_connection(
    fake: FakeJudge, base_url: str, opened: OpenedConnections
) -> None:
    fake.set_rules([pair_rule(0, 1, "hang", times=1)])
    client = JudgeClient(make_config(base_url, judge_request_timeout_s=0.2))
    first = await client.judge(TASK)
    assert isinstance(first, JudgeFailure)
    assert opened.open_now() == 0
    assert await client.judge(TASK) == JudgeVerdict(verdict=V421, fallback=False, attempts=1)
    assert opened.count == 2
    await client.aclose()


async def test_error_replies_read_in_full_keep_the_connection(
    fake: FakeJudge, base_url: str, opened: OpenedConnections
) -> None:
    fake.set_rules([pair_rule(0, 1, "http_status", status=500, times=2)])
    client = JudgeClient(make_config(base_url))
    assert await client.judge(TASK) == JudgeVerdict(verdict=V421, fallback=False, attempts=3)
    assert opened.count == 1
    await client.aclose()


async def test_oversized_error_body_is_cut_and_its_connection_dropped(
    fake: FakeJudge, base_url: str, opened: OpenedConnections
) -> None:
    fake.set_rules([pair_rule(0, 1, "http_status", status=500, body="x" * 200_000, times=1)])
    client = JudgeClient(make_config(base_url, genrm_parse_retries=0))
    first = await client.judge(TASK)
    assert first == JudgeFailure(
        text=error_prefix(base_url, "1/1") + "HTTPStatusError: HTTP 500; response=" + "x" * 1000,
        attempts=1,
    )
    assert await client.judge(TASK) == JudgeVerdict(verdict=V421, fallback=False, attempts=1)
    assert opened.count == 2
    await client.aclose()


async def test_a_connection_the_judge_closed_while_idle_is_not_used_again(
    opened: OpenedConnections,
) -> None:
    fake = FakeJudge()
    async with trio.open_nursery() as first_server:
        port = await first_server.start(serve_fake_judge, fake, "127.0.0.1", 0)
        client = JudgeClient(make_config(f"http://127.0.0.1:{port}/v1"))
        assert await client.judge(TASK) == JudgeVerdict(verdict=V421, fallback=False, attempts=1)
        first_server.cancel_scope.cancel()
    async with trio.open_nursery() as second_server:
        await second_server.start(serve_fake_judge, fake, "127.0.0.1", port)
        assert await client.judge(TASK) == JudgeVerdict(verdict=V421, fallback=False, attempts=1)
        await client.aclose()
        second_server.cancel_scope.cancel()
    assert opened.count == 2
    assert fake.stats()["requests_total"] == 2
