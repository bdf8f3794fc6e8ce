"""The client asks the server's `/readyz` before its first group and raises `ServerNotReady`,
naming the server and what is wrong, when the server does not become ready in time.

The loopback tests run the client against a stand-in for the server that answers `/readyz` and
`/verify_group` as the server's contract says (testing/_stand_in_server.py): readiness states
that take a dead judge or a restart to reach for real are one table entry there.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import pytest
import trio

from genrm_trio.client import (
    JUDGE_FAILED,
    VERIFY_FAILED,
    BlockingGenRMClient,
    GenRMClient,
    RolloutResult,
    ServerNotReady,
)
from genrm_trio.client._readiness import NoReadiness, NotReady, Ready, readiness
from genrm_trio.client._results import unreachable
from genrm_trio.testing._stand_in_server import stand_in_server

N = 2
DEAD_REPLICA = "judge replica http://127.0.0.1:9/v1 unreachable: ConnectError: Connection refused"
NOT_READY = (
    503,
    {
        "status": "not_ready",
        "reasons": [DEAD_REPLICA],
        "judge_replicas": [
            {
                "url": "http://127.0.0.1:9/v1",
                "reachable": False,
                "last_probe_at": 1.0,
                "last_error": "ConnectError: Connection refused",
            }
        ],
        "group_store_available": True,
    },
)
READY = (200, {"status": "ready", "judge_replicas": [], "group_store_available": True})
ROWS = (
    200,
    {
        "rows": [
            {"_ng_rollout_index": slot, "reward": 2.0 + slot, "mask_sample": False}
            for slot in range(N)
        ]
    },
)


def test_readyz_answers_mean_ready_not_ready_or_no_check() -> None:
    assert readiness(200, b'{"status": "ready"}') == Ready()
    body = b'{"status": "not_ready", "reasons": ["a", "b"], "group_store_available": false}'
    assert readiness(503, body) == NotReady(("a", "b"))
    assert readiness(503, b'{"status": "shutting_down", "reasons": []}') == NotReady(
        ("the server is shutting down",)
    )
    assert readiness(502, b"<html>bad gateway</html>") == NotReady(
        ("GET /readyz answered 502: <html>bad gateway</html>",)
    )
    assert isinstance(readiness(404, b'{"detail": "Not Found"}'), NoReadiness)


def test_only_a_rollout_the_judge_or_the_server_could_not_reach_counts_as_unreachable() -> None:
    dead = (
        "GenRM cohort 'k' failed: every rollout was masked (2 of 2 comparisons failed); first"
        " failure: GenRM judge http://127.0.0.1:9/v1/chat/completions pair=(0, 1) judge=0"
        " attempt=1/1 deadline=120.0s: ConnectError: cannot connect to 127.0.0.1:9: refused"
    )

    def masked(kind: str, reason: str) -> RolloutResult:
        return RolloutResult(
            reward=None, mask_sample=True, failure_kind=kind, failure_reason=reason
        )

    assert unreachable(masked(JUDGE_FAILED, dead))
    assert unreachable(masked(VERIFY_FAILED, "no answer after 8 resends; last: ConnectError: x"))
    assert unreachable(masked(VERIFY_FAILED, "no results within the deadline of 5.0s"))
    assert not unreachable(masked(JUDGE_FAILED, dead.replace("ConnectError", "HTTPStatusError")))
    assert not unreachable(masked(VERIFY_FAILED, "POST /verify_group answered 409: conflict"))
    assert not unreachable(RolloutResult(reward=1.0, mask_sample=False))


def test_a_server_that_stays_not_ready_raises_naming_it_and_its_reasons() -> None:
    with stand_in_server({"GET /readyz": [NOT_READY]}) as server:
        client = BlockingGenRMClient(server.url, ready_wait_s=2.0)
        with pytest.raises(ServerNotReady) as raised:
            client.score_group("2+2?", ["4", "5"])
    error = raised.value
    assert error.url == server.url
    assert error.reasons == (DEAD_REPLICA,)
    assert str(error) == f"genrm-trio server {server.url} is not ready (waited 2s): {DEAD_REPLICA}"
    # It asked more than once while it waited, and sent no group.
    assert server.requests.count("GET /readyz") >= 2
    assert "POST /verify_group" not in server.requests


def test_the_client_waits_for_a_server_that_becomes_ready_and_asks_only_once() -> None:
    answers: dict[str, Any] = {
        "GET /readyz": [NOT_READY, NOT_READY, READY],
        "POST /verify_group": [ROWS],
    }
    with stand_in_server(answers) as server:
        client = BlockingGenRMClient(server.url, ready_wait_s=30.0)
        first = client.score_group("2+2?", ["4", "5"])
        second = client.score_group("2+2?", ["4", "5"])
    expected = [
        RolloutResult(reward=2.0, mask_sample=False),
        RolloutResult(reward=3.0, mask_sample=False),
    ]
    assert first == second == expected
    assert server.requests == ["GET /readyz"] * 3 + ["POST /verify_group"] * 2


def test_an_unreachable_server_url_raises_with_the_connection_error() -> None:
    client = BlockingGenRMClient("http://127.0.0.1:9", ready_wait_s=0.6)
    with pytest.raises(ServerNotReady) as raised:
        client.score_groups([("2+2?", ["4", "5"])])
    assert str(raised.value).startswith(
        "genrm-trio server http://127.0.0.1:9 is not ready (waited 0.6s): no answer: ConnectError:"
    )


def test_the_async_client_checks_under_trio_and_under_asyncio() -> None:
    with stand_in_server({"GET /readyz": [NOT_READY]}) as server:

        async def score() -> None:
            async with GenRMClient(server.url, ready_wait_s=0) as client:
                await client.score_group("2+2?", ["4", "5"])

        for run in (lambda: trio.run(score), lambda: asyncio.run(score())):
            with pytest.raises(ServerNotReady, match=re.escape(DEAD_REPLICA)):
                run()
    assert server.requests == ["GET /readyz"] * 2


def test_a_server_without_readyz_is_used_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with stand_in_server({"POST /verify_group": [ROWS]}) as server:
        client = BlockingGenRMClient(server.url)
        with caplog.at_level(logging.WARNING, logger="genrm_trio.client"):
            results = client.score_group("2+2?", ["4", "5"])
    assert [r.reward for r in results] == [2.0, 3.0]
    assert server.requests == ["GET /readyz", "POST /verify_group"]
    assert f"genrm-trio server {server.url}: GET /readyz answered 404" in caplog.text


def test_no_check_when_it_is_turned_off() -> None:
    with stand_in_server({"GET /readyz": [NOT_READY], "POST /verify_group": [ROWS]}) as server:
        results = BlockingGenRMClient(server.url, ready_wait_s=None).score_group("q", ["a", "b"])
    assert [r.reward for r in results] == [2.0, 3.0]
    assert server.requests == ["POST /verify_group"]


@pytest.mark.parametrize("wait", [-1.0, float("nan"), float("inf")])
def test_a_bad_wait_is_refused(wait: float) -> None:
    with pytest.raises(ValueError, match="ready_wait_s"):
        BlockingGenRMClient("http://127.0.0.1:9", ready_wait_s=wait)
