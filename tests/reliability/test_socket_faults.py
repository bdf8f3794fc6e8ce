"""Faults on real loopback sockets: a judge that refuses or breaks connections, clients that
hang up while their group collects or is judged, and SIGTERM while many requests wait.

The server runs under hypercorn (in process, or as a `genrm-trio serve` process for signals);
the judge is the fake judge's TCP server. Everything here uses the real clock.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import pytest
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from genrm_trio.config import config_from_mapping
from genrm_trio.http.app import GenRMApp, create_app
from genrm_trio.testing import FakeJudge, pair_rule, serve_fake_judge, wait_for_stats
from genrm_trio.testing.harness import SCENARIO_DEFAULTS, member

# Guards against a hung test only; no assertion depends on it.
SAFETY_S = 20.0
SHUTTING_DOWN = "GenRM server is shutting down"
API_PATHS = {"chat_completions": "chat/completions", "responses": "responses"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def client(base_url: str) -> httpx.AsyncClient:
    """A client of its own: each request below travels over a connection nobody else uses."""
    return httpx.AsyncClient(base_url=base_url, timeout=SAFETY_S, trust_env=False)


async def until(condition: Callable[[], bool]) -> None:
    """Poll: the engine's statistics have no change notification."""
    with trio.fail_after(SAFETY_S):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.01)


@dataclass
class Served:
    url: str
    app: GenRMApp

    def stats(self) -> Any:
        return self.app.engine.statistics()


@asynccontextmanager
async def fake_judge_on_tcp(judge: FakeJudge) -> AsyncIterator[str]:
    """The fake judge on a loopback port; yields its base URL."""
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_fake_judge, judge, "127.0.0.1", 0)
        yield f"http://127.0.0.1:{port}/v1"
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def serving(**settings: Any) -> AsyncIterator[Served]:
    """The app under hypercorn on a loopback port, as `genrm-trio serve` runs it."""
    config = config_from_mapping({**SCENARIO_DEFAULTS, **settings})
    app = create_app(config)
    hypercorn = HypercornConfig()
    hypercorn.bind = ["127.0.0.1:0"]
    hypercorn.accesslog = None
    hypercorn.errorlog = None
    hypercorn.graceful_timeout = config.shutdown_grace_s
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            partial(hypercorn_serve, app, hypercorn, shutdown_trigger=stop.wait)
        )
        try:
            yield Served(binds[0], app)
        finally:
            stop.set()  # a graceful stop, which runs the app's shutdown


@dataclass
class Waiting:
    """A /verify sent in the background over its own connection; cancel to hang up."""

    scope: trio.CancelScope
    response: httpx.Response | None = None


def send_verify(nursery: trio.Nursery, url: str, body: Any) -> Waiting:
    waiting = Waiting(trio.CancelScope())

    async def run() -> None:
        with waiting.scope:
            async with client(url) as http:
                waiting.response = await http.post("/verify", content=json.dumps(body))

    nursery.start_soon(run)
    return waiting


async def verify(url: str, body: Any) -> httpx.Response:
    async with client(url) as http:
        return await http.post("/verify", content=json.dumps(body))


async def verify_all(url: str, bodies: list[Any]) -> list[httpx.Response]:
    replies: dict[int, httpx.Response] = {}

    async def one(index: int) -> None:
        replies[index] = await verify(url, bodies[index])

    async with trio.open_nursery() as nursery:
        for index in range(len(bodies)):
            nursery.start_soon(one, index)
    return [replies[index] for index in range(len(bodies))]


# ---------------------------------------------------------------------------------------------
# The judge's side of the connection fails


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_a_judge_on_a_closed_port_masks_both_rows_naming_connect_error(
    api: str, caplog: pytest.LogCaptureFixture
) -> None:
    # J-21, J-40, M-3: refused connections are transient, retried, then the rollouts are masked
    caplog.set_level(logging.INFO, logger="genrm_trio")
    judge_url = f"http://127.0.0.1:{free_port()}/v1"
    async with serving(
        judge_base_url=judge_url,
        judge_api=api,
        judge_request_timeout_s=0.2,
        genrm_parse_retry_sleep_s=0.05,
    ) as served:
        started = trio.current_time()
        replies = await verify_all(served.url, [member(0), member(1)])
        elapsed = trio.current_time() - started
        assert served.stats().judge_in_flight == 0
    assert elapsed < 2.0
    first_failure = (
        f"GenRM judge {judge_url}/{API_PATHS[api]} pair=(0, 1) judge=0 attempt=4/4 "
        "deadline=0.2s: ConnectError: cannot connect to "
    )
    for reply in replies:
        row = reply.json()
        assert reply.status_code == 200
        assert (row["mask_sample"], row["failure_kind"], row["reward"]) == (
            True,
            "judge_failed",
            0.0,
        )
        assert row["failure_reason"].startswith(
            "GenRM cohort 'group_id::g::group_attempt::0' failed: every rollout was masked "
            "(2 of 2 comparisons failed); first failure: " + first_failure
        )
        assert row["failure_reason"] == row["_ng_failure_judge_error"]
    retries = [r.getMessage() for r in caplog.records if "GenRM judge retry pair" in r.getMessage()]
    assert len(retries) == 6  # three retries for each of the two comparisons
    assert all(" after ConnectError; sleeping " in line for line in retries)


@pytest.mark.parametrize("action", ["truncated_body", "close"])
async def test_a_judge_that_breaks_every_connection_is_retried_then_masked(action: str) -> None:
    # J-21, J-23, J-40: a body cut short or a connection closed without a reply is transient
    judge = FakeJudge(rules=[{"action": action}])
    async with fake_judge_on_tcp(judge) as judge_url, serving(judge_base_url=judge_url) as served:
        replies = await verify_all(served.url, [member(0), member(1)])
        assert served.stats().judge_in_flight == 0
    stats = judge.stats()
    assert stats["requests_total"] == 8  # two comparisons, four attempts each
    assert stats["by_action"] == {action: 8}
    assert stats["in_flight"] == 0
    cause = {
        "truncated_body": "RemoteProtocolError: the judge closed the connection after 190 of 380 "
        "body bytes",
        "close": "RemoteProtocolError: the judge closed the connection before replying",
    }[action]
    for reply in replies:
        row = reply.json()
        assert reply.status_code == 200 and row["mask_sample"] is True
        assert (
            f"first failure: GenRM judge {judge_url}/chat/completions pair=(0, 1) judge=0 "
            f"attempt=4/4 deadline=2.0s: {cause}"
        ) in row["failure_reason"]


@pytest.mark.parametrize("action", ["truncated_body", "close"])
async def test_one_broken_connection_is_retried_on_a_fresh_one(action: str) -> None:
    # J-21, J-22, J-34: after a broken reply the next attempt succeeds; nothing is masked
    judge = FakeJudge(rules=[pair_rule(0, 1, action, times=1), pair_rule(1, 0, action, times=1)])
    async with fake_judge_on_tcp(judge) as judge_url, serving(judge_base_url=judge_url) as served:
        replies = await verify_all(served.url, [member(0, 4), member(1, 2)])
    assert [r.status_code for r in replies] == [200, 200]
    assert [r.json()["reward"] for r in replies] == [4.0, 2.0]
    assert [r.json()["mask_sample"] for r in replies] == [False, False]
    assert [r.json()["genrm_failed_comparison_rate_per_group"] for r in replies] == [0.0, 0.0]
    assert judge.stats()["requests_total"] == 4
    assert judge.stats()["by_action"] == {action: 2, "verdict": 2}


# ---------------------------------------------------------------------------------------------
# Clients hang up


async def test_hanging_up_while_collecting_keeps_the_member_for_a_retry() -> None:
    # C-51, C-52: a disconnect removes only its waiter; an identical retry reattaches
    judge = FakeJudge()
    async with fake_judge_on_tcp(judge) as judge_url, serving(judge_base_url=judge_url) as served:
        async with trio.open_nursery() as nursery:
            first = send_verify(nursery, served.url, member(0))
            await until(lambda: served.stats().waiters == 1)
            first.scope.cancel()
        await until(lambda: served.stats().waiters == 0)
        assert first.response is None
        assert (served.stats().collecting, served.stats().evaluating) == (1, 0)
        conflict = await verify(served.url, member(0, regenerated=True))
        assert conflict.status_code == 409
        assert "already has a different response for rollout_index=0" in conflict.json()["detail"]
        replies = await verify_all(served.url, [member(0), member(1)])
        assert [(r.status_code, r.json()["reward"]) for r in replies] == [(200, 3.0), (200, 3.0)]
        assert judge.stats()["requests_total"] == 2


async def test_a_group_everyone_left_still_expires_at_its_collection_deadline() -> None:
    # C-53, §5.15: the collection deadline fires with no request present
    async with serving(
        judge_base_url=f"http://127.0.0.1:{free_port()}/v1", cohort_collection_timeout_s=0.3
    ) as served:
        async with trio.open_nursery() as nursery:
            gone = send_verify(nursery, served.url, member(0))
            await until(lambda: served.stats().waiters == 1)
            gone.scope.cancel()
        await until(lambda: served.stats().waiters == 0)
        await until(lambda: served.stats().retained_records == 1)
        assert served.stats().active_groups == 0
        late = await verify(served.url, member(1))
    assert late.status_code == 503
    assert late.json() == {
        "detail": "GenRM cohort 'group_id::g::group_attempt::0' did not collect 2 unique "
        "rollout indices within 0.3s"
    }


async def test_hanging_up_while_judged_and_retrying_reattaches() -> None:
    # C-52, AS-149 [TCP]: the client closes its socket during judging; the retry gets the reward
    judge = FakeJudge(latency="fixed:1.0")
    async with fake_judge_on_tcp(judge) as judge_url, serving(judge_base_url=judge_url) as served:
        async with trio.open_nursery() as nursery:
            first = send_verify(nursery, served.url, member(0, 5))
            second = send_verify(nursery, served.url, member(1, 1))
            await until(lambda: judge.stats()["in_flight"] == 2)
            first.scope.cancel()
            await until(lambda: served.stats().waiters == 1)
            assert served.stats().evaluating == 1
            retry = await verify(served.url, member(0, 5))
        assert second.response is not None
    assert (retry.status_code, retry.json()["reward"]) == (200, 5.0)
    assert (second.response.status_code, second.response.json()["reward"]) == (200, 1.0)
    assert judge.stats()["requests_total"] == 2
    assert judge.stats()["cancelled"] == 0


async def test_a_group_everyone_left_during_judging_completes_and_replays() -> None:
    # C-53, AS-150 [TCP]: judging goes on with no requester; replays cost no judge call
    judge = FakeJudge(latency="fixed:1.0")
    async with fake_judge_on_tcp(judge) as judge_url, serving(judge_base_url=judge_url) as served:
        async with trio.open_nursery() as nursery:
            waiting = [send_verify(nursery, served.url, member(i, 2 + i)) for i in range(2)]
            await until(lambda: judge.stats()["in_flight"] == 2)
            for request in waiting:
                request.scope.cancel()
        await until(lambda: served.stats().waiters == 0)
        assert served.stats().evaluating == 1  # both left while their group was being judged
        await until(lambda: served.stats().retained_records == 1)
        assert served.stats().active_groups == 0
        assert judge.stats()["cancelled"] == 0
        replays = await verify_all(served.url, [member(0, 2), member(1, 3)])
    assert [(r.status_code, r.json()["reward"]) for r in replays] == [(200, 2.0), (200, 3.0)]
    assert judge.stats()["requests_total"] == 2


# ---------------------------------------------------------------------------------------------
# SIGTERM with many requests waiting


@dataclass
class ServeProcess:
    process: trio.Process
    url: str
    stderr: bytearray


@asynccontextmanager
async def genrm_serve(nursery: trio.Nursery, *args: str) -> AsyncIterator[ServeProcess]:
    """`genrm-trio serve --port 0 <args>` as a child process, killed by its id if it outlives
    the test."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "genrm_trio.cli", "serve", "--port", "0", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    stderr = bytearray()
    try:
        assert process.stdout is not None and process.stderr is not None

        async def drain(stream: trio.abc.ReceiveStream) -> None:
            async for chunk in stream:
                stderr.extend(chunk)

        nursery.start_soon(drain, process.stderr)
        line = b""
        with trio.fail_after(SAFETY_S):
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(1)
                assert chunk, stderr.decode()
                line += chunk
        found = re.fullmatch(r"genrm-trio listening on (http://127\.0\.0\.1:\d+)\n", line.decode())
        assert found is not None, line
        yield ServeProcess(process, found[1], stderr)
    finally:
        if process.returncode is None:
            process.kill()
        with trio.move_on_after(SAFETY_S, shield=True):
            await process.wait()


async def test_sigterm_answers_every_waiting_client_and_exits_in_time() -> None:
    # CL-4, C-96…C-98, AS-153: 503 or a connection error for each, exit 0 within grace + 2 s
    grace = 2.0
    evaluating, collecting = 20, 10
    judge = FakeJudge(rules=[{"match": {"response_1": "hold"}, "action": "hang"}])
    outcomes: list[tuple[int, Any] | Exception] = []

    async def wait_for_reply(url: str, body: Any) -> None:
        try:
            async with client(url) as http:
                reply = await http.post("/verify", content=json.dumps(body))
                outcomes.append((reply.status_code, reply.json()))
        except httpx.TimeoutException:
            raise
        except httpx.TransportError as exc:
            outcomes.append(exc)

    async with trio.open_nursery() as outer:
        async with fake_judge_on_tcp(judge) as judge_url:
            async with genrm_serve(
                outer,
                "--set", f"judge_base_url={judge_url}",
                "--set", "judge_model=genrm",
                "--set", "num_rollouts_per_prompt=2",
                "--set", f"shutdown_grace_s={grace}",
            ) as served:  # fmt: skip
                bodies = [member(i, g=f"e{k}") for k in range(evaluating) for i in range(2)]
                for body in bodies:
                    body["response"]["output"][0]["content"][0]["text"] += " hold"
                bodies += [member(0, g=f"c{k}") for k in range(collecting)]
                async with trio.open_nursery() as clients:
                    for body in bodies:
                        clients.start_soon(wait_for_reply, served.url, body)
                    async with client(served.url) as health:
                        with trio.fail_after(SAFETY_S):
                            active = evaluating + collecting
                            # /healthz is all a separate process offers to watch.
                            while (await health.get("/healthz")).json()["active_groups"] < active:  # noqa: ASYNC110
                                await trio.sleep(0.02)
                    with trio.fail_after(SAFETY_S):
                        await wait_for_stats(judge, lambda s: s["in_flight"] == 2 * evaluating)

                    started = trio.current_time()
                    served.process.send_signal(signal.SIGTERM)
                    with trio.fail_after(SAFETY_S):
                        status = await served.process.wait()
                    elapsed = trio.current_time() - started
                with trio.fail_after(1.0):
                    await wait_for_stats(judge, lambda s: s["in_flight"] == 0)
                with pytest.raises(httpx.ConnectError):
                    await verify(served.url, member(1, g="c0"))
                log = served.stderr.decode()

    assert status == 0
    assert elapsed <= grace + 2.0
    assert len(outcomes) == len(bodies)
    for outcome in outcomes:
        if not isinstance(outcome, Exception):
            assert outcome == (503, {"detail": SHUTTING_DOWN})
    # C-98: the groups fail before hypercorn drains, so open connections get the answer.
    assert sum(not isinstance(outcome, Exception) for outcome in outcomes) >= 1
    assert judge.stats()["cancelled"] == 2 * evaluating
    assert "GenRM server shutting down" in log
    assert "GenRM server shut down" in log
