"""Configuration through the app, the judge key, log lines, /healthz, /openapi.json and /metrics
as an operator observes them (AS-1, AS-6…AS-8, AS-163…AS-165, W-1)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio
import trio.testing

from genrm_trio.config import DEFAULT_PRINCIPLE, Config, ConfigError, load_config
from genrm_trio.fakes.memory_transport import MemoryTransport
from genrm_trio.http.app import GenRMApp, create_app
from genrm_trio.judge.transport import JudgeEndpoint, JudgeReply
from genrm_trio.testing import FakeJudge, pair_rule
from genrm_trio.testing.harness import JUDGE_URL, Server, member, running_server

LOGGER = "genrm_trio"
KEY_FROM_ENV = "sk-env-k1-3b8d0c"
KEY_FROM_CONFIG = "sk-cfg-k2-91e4a7"


class RecordingTransport(MemoryTransport):
    """Passes judge requests to a fake judge and keeps each request's Authorization header."""

    def __init__(
        self, judge: FakeJudge, endpoint: JudgeEndpoint, authorizations: list[str | None]
    ) -> None:
        super().__init__(judge, endpoint)
        headers = {name.lower(): value for name, value in endpoint.headers.items()}
        self.authorization = headers.get("authorization")
        self.authorizations = authorizations

    async def send(self, body: bytes) -> JudgeReply:
        self.authorizations.append(self.authorization)
        return await super().send(body)


@asynccontextmanager
async def serving(app: GenRMApp, judge: FakeJudge) -> AsyncIterator[Server]:
    """Run an app built by the test (lifespan included) and talk to it over ASGI."""
    async with app.test_app():
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://genrm.test") as client:
            yield Server(app, client, judge)


def judge_bodies(judge: FakeJudge) -> list[dict[str, Any]]:
    return [recorded["body"] for recorded in judge.requests()]


# --- AS-1: defaults through create_app ------------------------------------------------------


async def test_create_app_with_only_the_judge_gets_the_spec_defaults() -> None:
    # AS-1
    judge = FakeJudge()
    app = create_app(
        {"judge_base_url": JUDGE_URL, "judge_model": "judge"}, judge_transport=judge.transport()
    )
    config = app.engine.config
    assert config == Config(judge_base_url=JUDGE_URL, judge_model="judge")
    assert config.num_rollouts_per_prompt == 16
    assert config.comparison_strategy == "circular"
    assert config.num_judges_per_comparison == 1
    assert config.cohort_result_ttl_s == 3600.0
    assert config.max_terminal_cohorts == 4096
    assert config.use_principle is False
    assert config.default_principle == DEFAULT_PRINCIPLE
    assert config.aggregator_method == "simple_tiebreaker"
    assert (config.default_score, config.default_ranking) == (3.0, 3.5)
    assert config.cohort_collection_timeout_s == 1800.0
    assert config.cohort_evaluation_timeout_s == 1800.0
    assert config.judge_request_timeout_s == 1800.0
    assert config.judge_api == "chat_completions"
    assert config.judge_max_concurrency == 256

    async with serving(app, judge) as server:
        outside = await server.verify(member(16))
        assert (outside.status, outside.detail) == (
            422,
            "_ng_rollout_index must be in [0, 16); got 16",
        )
        rows = await server.complete("defaults", qualities=[1 + i % 5 for i in range(16)])
        assert [r.reward for r in rows] == [float(1 + i % 5) for i in range(16)]
        assert server.calls() == 16
    for recorded in judge.requests():
        assert recorded["path"] == "/v1/chat/completions"
        body = recorded["body"]
        assert body["model"] == "judge"
        assert [m["role"] for m in body["messages"]] == ["user", "response_1", "response_2"]
        assert (body["max_tokens"], body["temperature"], body["top_p"]) == (16384, 0.6, 0.95)


# --- AS-6: sampling keys the server owns ----------------------------------------------------


@pytest.mark.parametrize(("key", "value"), [("stream", True), ("model", "x")])
def test_create_app_rejects_server_owned_sampling_keys(key: str, value: Any) -> None:
    # AS-6
    with pytest.raises(ConfigError) as info:
        create_app(
            {
                "judge_base_url": JUDGE_URL,
                "judge_model": "judge",
                "genrm_responses_create_params": {"temperature": 0.6, key: value},
            }
        )
    assert info.value.lines == [
        f"invalid configuration: genrm_responses_create_params.{key}: set by the server; remove it"
    ]


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_configured_input_and_metadata_never_reach_the_judge(api: str) -> None:
    # AS-6
    sampling = {"max_output_tokens": 16384, "temperature": 0.6, "input": [], "metadata": {}}
    async with running_server(judge_api=api, genrm_responses_create_params=sampling) as server:
        rows = await server.complete(qualities=[4, 2])
        assert [r.reward for r in rows] == [4.0, 2.0]
        bodies = judge_bodies(server.judge)
    assert len(bodies) == 2
    for body in bodies:
        assert body["temperature"] == 0.6
        if api == "chat_completions":
            assert "input" not in body and "metadata" not in body
            assert body["messages"][0] == {"role": "user", "content": "2+2?"}
        else:
            assert body["input"] == [{"role": "user", "content": "2+2?", "type": "message"}]
            assert set(body["metadata"]) == {"response_1", "response_2"}
            assert body["max_output_tokens"] == 16384


# --- AS-7: file plus --set, then the app ----------------------------------------------------


async def test_file_and_set_overrides_shape_groups_and_judge_bodies(tmp_path: Path) -> None:
    # AS-7
    path = tmp_path / "genrm.yaml"
    path.write_text(
        f"judge_base_url: {JUDGE_URL}\n"
        "judge_model: judge\n"
        "num_rollouts_per_prompt: 16\n"
        "genrm_parse_retry_sleep_s: 0\n"
        "genrm_responses_create_params:\n"
        "  max_output_tokens: 16384\n"
        "  temperature: 0.7\n"
        "  top_p: 0.9\n",
        encoding="utf-8",
    )
    config = load_config(
        path,
        ["num_rollouts_per_prompt=4", "genrm_responses_create_params.max_output_tokens=1341"],
    )
    async with running_server(config) as server:
        outside = await server.verify(member(4))
        assert (outside.status, outside.detail) == (
            422,
            "_ng_rollout_index must be in [0, 4); got 4",
        )
        rows = await server.complete(qualities=[1, 2, 3, 4])
        assert [r.reward for r in rows] == [1.0, 2.0, 3.0, 4.0]
        assert server.calls() == 4
        bodies = judge_bodies(server.judge)
    for body in bodies:
        assert (body["max_tokens"], body["temperature"], body["top_p"]) == (1341, 0.7, 0.9)
        assert "max_output_tokens" not in body


# --- AS-8: the judge API key ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("env_key", "config_key", "sent"),
    [
        (KEY_FROM_ENV, None, KEY_FROM_ENV),
        (KEY_FROM_ENV, KEY_FROM_CONFIG, KEY_FROM_CONFIG),
        (None, KEY_FROM_CONFIG, KEY_FROM_CONFIG),
        (None, None, None),
        ("", None, None),
    ],
    ids=["env", "config-over-env", "config", "neither", "empty-env"],
)
async def test_api_key_source_decides_the_authorization_header(
    monkeypatch: pytest.MonkeyPatch, env_key: str | None, config_key: str | None, sent: str | None
) -> None:
    # AS-8
    if env_key is None:
        monkeypatch.delenv("GENRM_JUDGE_API_KEY", raising=False)
    else:
        monkeypatch.setenv("GENRM_JUDGE_API_KEY", env_key)
    judge = FakeJudge(api_key=sent)
    authorizations: list[str | None] = []
    recording = partial(RecordingTransport, judge, authorizations=authorizations)
    settings: dict[str, Any] = {
        "judge_base_url": JUDGE_URL,
        "judge_model": "judge",
        "num_rollouts_per_prompt": 2,
        "genrm_parse_retry_sleep_s": 0,
        "judge_api_key": config_key,
    }
    async with serving(create_app(settings, judge_transport=recording), judge) as server:
        rows = await server.complete(qualities=[4, 2])
        assert [(r.status, r.masked, r.reward) for r in rows] == [
            (200, False, 4.0),
            (200, False, 2.0),
        ]
    expected = None if sent is None else f"Bearer {sent}"
    assert authorizations == [expected, expected]
    if sent is None:
        assert all("authorization" not in r["headers"] for r in judge.requests())


async def test_api_key_never_appears_in_any_output(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # AS-8
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    monkeypatch.setenv("GENRM_JUDGE_API_KEY", KEY_FROM_ENV)
    echoing = {"action": "http_status", "status": 401, "body": f'{{"error": "{KEY_FROM_CONFIG}"}}'}
    judge = FakeJudge(
        api_key=KEY_FROM_CONFIG,
        rules=[
            {"match": {"response_1": "[[q=1]]"}, **echoing},
            pair_rule(1, 2, "http_status", status=500),
        ],
    )
    settings: dict[str, Any] = {
        "judge_base_url": JUDGE_URL,
        "judge_model": "judge",
        "judge_api_key": KEY_FROM_CONFIG,
        "num_rollouts_per_prompt": 4,
        "genrm_parse_retry_sleep_s": 0,
        "debug_logging": True,
        "log_level": "DEBUG",
    }
    outputs: list[bytes] = []
    async with serving(create_app(settings, judge_transport=judge.transport()), judge) as server:
        rows = await server.complete("partly", qualities=[3, 3, 3, 3])
        assert [r.masked for r in rows] == [False, True, True, False]
        rows += await server.complete("judge-echoes-key", qualities=[1, 1, 1, 1])
        assert all(r.masked for r in rows[4:])
        compare = await server.compare(
            {
                "conversation_history": [{"role": "user", "content": "2+2?"}],
                "response_objs": [member(0, q=1)["response"], member(1, q=1)["response"]],
            }
        )
        assert compare.status == 503
        outputs += [r.raw for r in rows] + [compare.raw]
        for path in ("/healthz", "/openapi.json"):
            reply = await server.get(path)
            assert reply.status == 200
            outputs.append(reply.raw)
    assert KEY_FROM_CONFIG in judge.rules[0]["body"]
    assert "HTTP 401" in rows[4].body["failure_reason"]
    for secret in (KEY_FROM_ENV, KEY_FROM_CONFIG):
        assert secret not in caplog.text
        for output in outputs:
            assert secret.encode() not in output


# --- AS-163: disposition lines --------------------------------------------------------------


def dispositions(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == LOGGER and "disposition=" in r.getMessage()
    ]


async def test_completed_and_timed_out_groups_log_their_disposition(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # AS-163
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with running_server() as server:
        await server.complete()
        assert (await server.verify(member(0))).reward == 3.0
        timed_out = await server.verify(member(0, g="t"))
        assert timed_out.status == 503
    assert dispositions(caplog) == [
        (
            "INFO",
            "GenRM cohort disposition=completed key='group_id::g::group_attempt::0' attempt=0 "
            "members=2 scored=2 masked=0 failed_comparisons=0/2",
        ),
        (
            "WARNING",
            "GenRM cohort disposition=failed key='group_id::t::group_attempt::0' attempt=0 "
            "members=1 kind=cohort reason=\"GenRM cohort 'group_id::t::group_attempt::0' did "
            'not collect 2 unique rollout indices within 5.0s"',
        ),
    ]


async def test_partly_masked_group_logs_a_warning_disposition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # AS-163 (O-7: WARNING when masked > 0)
    caplog.set_level(logging.INFO, logger=LOGGER)
    judge = FakeJudge(rules=[pair_rule(1, 2, "http_status", status=400)])
    async with running_server(num_rollouts_per_prompt=4, judge=judge) as server:
        rows = await server.complete("m")
    assert [r.masked for r in rows] == [False, True, True, False]
    assert dispositions(caplog) == [
        (
            "WARNING",
            "GenRM cohort disposition=completed key='group_id::m::group_attempt::0' attempt=0 "
            "members=4 scored=2 masked=2 failed_comparisons=1/4",
        )
    ]


async def test_judge_kind_failure_reason_is_cut_to_500_code_points(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # AS-163 (O-7: judge kind, reason = first 500 code points of the recorded text)
    caplog.set_level(logging.INFO, logger=LOGGER)
    judge = FakeJudge(rules=[{"action": "http_status", "status": 400, "body": "é" * 900}])
    async with running_server(judge=judge) as server:
        rows = await server.complete("j")
    failure = rows[0].body["failure_reason"]
    assert failure.startswith(
        "GenRM cohort 'group_id::j::group_attempt::0' failed: every rollout was masked "
        "(2 of 2 comparisons failed); first failure: GenRM judge "
        "http://fake-judge/v1/chat/completions pair=(0, 1) judge=0 attempt=1/4 deadline=2.0s: "
        "HTTPStatusError: HTTP 400; response=éé"
    )
    assert len(failure) > 500
    assert dispositions(caplog) == [
        (
            "WARNING",
            "GenRM cohort disposition=failed key='group_id::j::group_attempt::0' attempt=0 "
            f'members=2 kind=judge reason="{failure[:500]}"',
        )
    ]


async def test_long_keys_are_cut_to_160_code_points_in_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # AS-163 (§9.1: keys truncated to 160 code points in logs)
    caplog.set_level(logging.INFO, logger=LOGGER)
    group_id = "k" * 300
    async with running_server() as server:
        rows = await server.complete(group_id)
    assert [r.reward for r in rows] == [3.0, 3.0]
    key = f"group_id::{group_id}::group_attempt::0"
    assert dispositions(caplog) == [
        (
            "INFO",
            f"GenRM cohort disposition=completed key='{key[:160]}' attempt=0 members=2 scored=2 "
            "masked=0 failed_comparisons=0/2",
        )
    ]


# --- AS-164: /healthz counts ----------------------------------------------------------------


def health(
    active: int,
    retained: int,
    watermarks: int,
    in_flight: int = 0,
    attempts: int = 0,
    in_memory: int = 0,
) -> dict[str, Any]:
    return {
        "status": "ok",
        "active_groups": active,
        "retained_records": retained,
        "watermarks": watermarks,
        "judge_in_flight": in_flight,
        "legacy_resends_collecting": 0,
        "judge_attempts_total": attempts,
        "group_store": "memory",
        "group_store_available": True,
        "body_bytes_receiving": 0,
        "body_bytes_in_memory": in_memory,
        "body_bytes_spooled": 0,
        "num_rollouts_per_prompt": 2,
        "comparison_strategy": "circular",
        # The harness's judge is in memory: the network probe does not reach it (probing off).
        "judge_replicas": [
            {"url": JUDGE_URL, "reachable": None, "last_probe_at": None, "last_error": None}
        ],
    }


async def test_healthz_counts_follow_a_group_through_its_life(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # AS-164
    async with running_server(judge=FakeJudge(latency="fixed:1")) as server:
        reply = await server.get("/healthz")
        assert (reply.status, reply.body) == (200, health(0, 0, 0))
        async with trio.open_nursery() as nursery:
            first = server.start_verify(nursery, member(0))
            await trio.testing.wait_all_tasks_blocked()
            # The waiting request's body is held in memory, within the budget.
            size = len(msgspec.json.encode(member(0)))
            assert (await server.get("/healthz")).body == health(1, 0, 1, in_memory=size)
            second = server.start_verify(nursery, member(1))
            await trio.sleep(0.5)
            both = size + len(msgspec.json.encode(member(1)))
            assert (await server.get("/healthz")).body == health(
                1, 0, 1, 2, attempts=2, in_memory=both
            )
            assert [(await p.result()).reward for p in (first, second)] == [3.0, 3.0]
        assert (await server.get("/healthz")).body == health(0, 1, 1, attempts=2)

        await trio.sleep(3600)
        async with trio.open_nursery() as nursery:
            # A legacy member prunes on arrival and leaves no watermark of its own.
            legacy = server.start_verify(nursery, member(0, g=None, a=None))
            await trio.testing.wait_all_tasks_blocked()
            size = len(msgspec.json.encode(member(0, g=None, a=None)))
            assert (await server.get("/healthz")).body == health(
                1, 0, 0, attempts=2, in_memory=size
            )
            await server.verify(member(1, g=None, a=None))
            assert (await legacy.result()).reward == 3.0
        assert (await server.get("/healthz")).body == health(0, 0, 0, attempts=4)


# --- AS-165 and W-1: routes -----------------------------------------------------------------


async def test_openapi_document_lists_routes_and_status_codes() -> None:
    # AS-165
    async with running_server() as server:
        response = await server.client.get("/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    document = response.json()
    assert document["openapi"].startswith("3.1")
    paths = document["paths"]
    assert {"/verify", "/compare", "/healthz"} <= set(paths)
    assert {"200", "400", "409", "413", "422", "503"} <= set(paths["/verify"]["post"]["responses"])
    assert {"200", "422", "503"} <= set(paths["/compare"]["post"]["responses"])
    assert "200" in paths["/healthz"]["get"]["responses"]
    assert "requestBody" in paths["/verify"]["post"]
    assert "requestBody" in paths["/compare"]["post"]


async def test_every_route_answers_and_an_unknown_one_is_a_json_404() -> None:
    # W-1, O-10
    async with running_server() as server:
        metrics = await server.client.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        assert "# TYPE genrm_verify_requests_total counter" in metrics.text
        response = await server.client.get("/metric")
        assert response.status_code == 404
        assert response.headers["content-type"].startswith("application/json")
        body = response.json()
        assert list(body) == ["detail"] and isinstance(body["detail"], str)
        assert (await server.get("/healthz")).status == 200
        assert (await server.get("/openapi.json")).status == 200
        assert (
            await server.verify(member(0, g=None, a=None, _ng_rollout_index=None))
        ).status == 422
        assert (await server.compare({"conversation_history": [], "response_objs": []})).body == {
            "rewards": [],
            "comparison_results": None,
            "metrics": None,
        }
        assert server.calls() == 0
