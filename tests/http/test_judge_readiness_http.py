"""Judge readiness over real loopback: the server probes each judge replica (a fake judge on a
loopback port, or a closed port), and /readyz, /healthz, /metrics and the log say what it found.

Probes use the server's own network transport; the server is reached in process through httpx's
ASGI transport. Probe intervals are short so that each test takes about a second.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import msgspec
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from genrm_trio.http.app import create_app
from genrm_trio.testing import FakeJudge
from genrm_trio.testing._loopback_judge import LoopbackJudge
from genrm_trio.testing.harness import member

# Only guards against a hung test; no assertion depends on it.
SAFETY_S = 30
# The bound: an unreachable judge shows on /readyz within 5 s of start.
READY_WITHIN_S = 5.0
INTERVAL_S = 0.1
N = 2

pytestmark = pytest.mark.stores(
    "memory", why="the judge probe and its reports do not depend on where groups live"
)


class RecordingJudge(FakeJudge):
    """The fake judge, noting every request's method, path and Authorization header."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[str, str, str | None]] = []

    def handle(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        *,
        now: float,
    ) -> Any:
        headers = list(headers)
        authorization = next((v for k, v in headers if k.lower() == "authorization"), None)
        self.seen.append((method, target, authorization))
        return super().handle(method, target, headers, body, now=now)

    def probes(self) -> int:
        return sum(
            1 for method, target, _ in self.seen if (method, target) == ("GET", "/v1/models")
        )


def closed_port_url() -> str:
    """A loopback URL nobody listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@asynccontextmanager
async def genrm(urls: list[str], **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    config = {
        "judge_base_urls": urls,
        "judge_model": "judge",
        "num_rollouts_per_prompt": N,
        "genrm_parse_retries": 0,
        "judge_request_timeout_s": 5.0,
        "judge_probe_interval_s": INTERVAL_S,
        "judge_probe_timeout_s": 2.0,
        **settings,
    }
    app = create_app(config)
    async with app.test_app():
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://genrm.test") as client:
            yield client


async def readyz_until(client: httpx.AsyncClient, status: int) -> dict[str, Any]:
    """Ask /readyz until it answers ``status``; its body."""
    while True:
        reply = await client.get("/readyz")
        if reply.status_code == status:
            body: dict[str, Any] = reply.json()
            return body
        await trio.sleep(0.02)


def probe_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "GenRM judge" in r.getMessage()]


async def test_an_unreachable_judge_is_not_ready_and_logs_one_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = closed_port_url()
    caplog.set_level(logging.INFO, logger="genrm_trio")
    with trio.fail_after(SAFETY_S):
        async with genrm([url]) as client:
            with trio.fail_after(READY_WITHIN_S):
                while True:
                    reply = await client.get("/readyz")
                    assert reply.status_code == 503
                    body = reply.json()
                    if body["judge_replicas"][0]["reachable"] is not None:
                        break
                    await trio.sleep(0.02)
            assert body["status"] == "not_ready"
            assert body["group_store_available"] is True
            [reason] = body["reasons"]
            assert reason.startswith(f"judge replica {url} unreachable: ConnectError: ")
            assert "Connection refused" in reason
            [replica] = body["judge_replicas"]
            assert replica["url"] == url
            assert replica["reachable"] is False
            assert replica["last_error"] == reason.split(" unreachable: ", 1)[1]
            assert isinstance(replica["last_probe_at"], float)
            # Several more rounds find the same, and say nothing more.
            await trio.sleep(5 * INTERVAL_S)
            later = (await client.get("/readyz")).json()["judge_replicas"][0]
            assert later["last_probe_at"] > replica["last_probe_at"]
            health = await client.get("/healthz")
            assert health.status_code == 200  # alive, though not ready
            assert health.json()["judge_replicas"][0]["reachable"] is False
    [error] = probe_records(caplog)
    assert error.levelno == logging.ERROR
    assert f"GET {url}/models (ConnectError: " in error.getMessage()


async def test_a_live_judge_is_ready_and_only_its_probe_path_is_probed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    secret = "sk-probe-7d1e"
    with trio.fail_after(SAFETY_S):
        async with trio.open_nursery() as nursery:
            replica = LoopbackJudge(nursery, RecordingJudge())
            await replica.start()
            async with genrm([replica.url], judge_api_key=secret) as client:
                body = await readyz_until(client, 200)
                assert body == {
                    "status": "ready",
                    "judge_replicas": [
                        {
                            "url": replica.url,
                            "reachable": True,
                            "last_probe_at": body["judge_replicas"][0]["last_probe_at"],
                            "last_error": None,
                        }
                    ],
                    "group_store_available": True,
                }
                await trio.sleep(3 * INTERVAL_S)
            nursery.cancel_scope.cancel()
    assert replica.judge.probes() >= 3
    # Every probe went to the probe path, with the judge's own key; none was a judge call.
    assert set(replica.judge.seen) == {("GET", "/v1/models", f"Bearer {secret}")}
    assert replica.judge.stats()["requests_total"] == 0
    assert probe_records(caplog) == []


async def test_readiness_follows_the_judge_going_away_and_coming_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    with trio.fail_after(SAFETY_S):
        async with trio.open_nursery() as nursery:
            replica = LoopbackJudge(nursery, RecordingJudge())
            await replica.start()
            async with genrm([replica.url]) as client:
                await readyz_until(client, 200)
                replica.stop()
                gone = await readyz_until(client, 503)
                assert gone["reasons"][0].startswith(f"judge replica {replica.url} unreachable: ")
                await replica.start()  # the same port
                back = await readyz_until(client, 200)
                assert back["judge_replicas"][0]["last_error"] is None
            nursery.cancel_scope.cancel()
    lines = [(r.levelno, r.getMessage()) for r in probe_records(caplog)]
    assert len(lines) == 2
    assert lines[0][0] == logging.WARNING
    assert lines[0][1].startswith(f"GenRM judge replica {replica.url} unreachable: ")
    assert lines[1] == (logging.INFO, f"GenRM judge replica {replica.url} answers again")


async def test_one_replica_answering_is_enough() -> None:
    dead = closed_port_url()
    with trio.fail_after(SAFETY_S):
        async with trio.open_nursery() as nursery:
            replica = LoopbackJudge(nursery, RecordingJudge())
            await replica.start()
            async with genrm([dead, replica.url]) as client:
                while True:
                    body = await readyz_until(client, 200)
                    if body["judge_replicas"][0]["reachable"] is not None:
                        break
                assert [r["reachable"] for r in body["judge_replicas"]] == [False, True]
                assert "reasons" not in body
            nursery.cancel_scope.cancel()


def gauges(text: str) -> dict[tuple[str, str], float]:
    return {
        (sample.name, sample.labels["replica"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("genrm_judge_replica_")
        and sample.name.endswith(("_reachable", "_last_probe_timestamp_seconds"))
    }


async def test_metrics_have_a_reachable_gauge_and_a_probe_time_per_replica() -> None:
    dead = closed_port_url()
    with trio.fail_after(SAFETY_S):
        async with trio.open_nursery() as nursery:
            replica = LoopbackJudge(nursery, RecordingJudge())
            await replica.start()
            async with genrm([dead, replica.url]) as client:
                while True:
                    body = await readyz_until(client, 200)
                    if body["judge_replicas"][0]["reachable"] is not None:
                        break
                found = gauges((await client.get("/metrics")).text)
            nursery.cancel_scope.cancel()
    assert found[("genrm_judge_replica_reachable", dead)] == 0
    assert found[("genrm_judge_replica_reachable", replica.url)] == 1
    for url in (dead, replica.url):
        stamp = found[("genrm_judge_replica_last_probe_timestamp_seconds", url)]
        assert abs(stamp - time.time()) < SAFETY_S  # Unix seconds, not the event loop's clock


async def test_probing_off_reports_unknown_replicas_and_sends_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    dead = closed_port_url()
    with trio.fail_after(SAFETY_S):
        async with trio.open_nursery() as nursery:
            replica = LoopbackJudge(nursery, RecordingJudge())
            await replica.start()
            async with genrm([dead, replica.url], judge_probe_path=None) as client:
                await trio.sleep(3 * INTERVAL_S)
                ready = await client.get("/readyz")
                health = (await client.get("/healthz")).json()
                metrics = gauges((await client.get("/metrics")).text)
            nursery.cancel_scope.cancel()
    assert ready.status_code == 200
    unknown = [
        {"url": url, "reachable": None, "last_probe_at": None, "last_error": None}
        for url in (dead, replica.url)
    ]
    assert ready.json() == {
        "status": "ready",
        "judge_replicas": unknown,
        "group_store_available": True,
    }
    assert health["judge_replicas"] == unknown
    assert metrics == {}
    assert replica.judge.seen == []
    assert probe_records(caplog) == []


async def test_healthz_reports_the_group_size_and_the_strategy() -> None:
    with trio.fail_after(SAFETY_S):
        async with genrm([closed_port_url()], comparison_strategy="all_pairs") as client:
            grouped = (await client.get("/healthz")).json()
        async with genrm([closed_port_url()], num_rollouts_per_prompt=1) as client:
            single = (await client.get("/healthz")).json()
    assert (grouped["num_rollouts_per_prompt"], grouped["comparison_strategy"]) == (
        N,
        "all_pairs",
    )
    assert (single["num_rollouts_per_prompt"], single["comparison_strategy"]) == (
        None,
        "circular",
    )


async def test_readyz_says_shutting_down_once_shutdown_begins() -> None:
    with trio.fail_after(SAFETY_S):
        async with trio.open_nursery() as nursery:
            replica = LoopbackJudge(nursery, RecordingJudge())
            await replica.start()
            config = {
                "judge_base_url": replica.url,
                "judge_model": "judge",
                "judge_probe_interval_s": INTERVAL_S,
            }
            app = create_app(config)
            async with app.test_app():
                transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
                async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                    await readyz_until(client, 200)
                    app.engine.begin_shutdown()
                    reply = await client.get("/readyz")
            nursery.cancel_scope.cancel()
    assert reply.status_code == 503
    assert reply.json()["status"] == "shutting_down"
    assert reply.json()["reasons"] == ["GenRM server is shutting down"]


async def run_groups(client: httpx.AsyncClient, groups: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    async def one(g: int, i: int) -> None:
        body = msgspec.json.encode(member(i, 1 + (i + g) % 5, f"g{g}", 0))
        response = await client.post("/verify", content=body)
        assert response.status_code == 200, response.text
        rows.append(response.json())

    async with trio.open_nursery() as nursery:
        for g in range(groups):
            for i in range(N):
                nursery.start_soon(one, g, i)
    return sorted(rows, key=lambda row: (row["_ng_group_id"], row["_ng_rollout_index"]))


async def test_a_healthy_run_gets_the_same_rows_and_judge_calls_with_probes_on() -> None:
    results: dict[str | None, tuple[list[dict[str, Any]], int, set[tuple[str, str]]]] = {}
    for path in ("/models", None):
        with trio.fail_after(SAFETY_S):
            async with trio.open_nursery() as nursery:
                replica = LoopbackJudge(nursery, RecordingJudge())
                await replica.start()
                async with genrm([replica.url], judge_probe_path=path) as client:
                    if path is not None:
                        await readyz_until(client, 200)
                    rows = await run_groups(client, 4)
                    health = (await client.get("/healthz")).json()
                nursery.cancel_scope.cancel()
        calls = replica.judge.stats()["requests_total"]
        assert health["judge_attempts_total"] == calls  # probes are not judge attempts
        routes = {(method, target) for method, target, _ in replica.judge.seen}
        results[path] = (rows, calls, routes)
    with_probes, without = results["/models"], results[None]
    assert with_probes[0] == without[0]
    assert with_probes[1] == without[1] > 0
    assert with_probes[2] == {("POST", "/v1/chat/completions"), ("GET", "/v1/models")}
    assert without[2] == {("POST", "/v1/chat/completions")}
