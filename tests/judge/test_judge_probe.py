"""The probe loop and `serve --wait-for-judge`'s wait on the mock clock, with the fake judge in
memory: when probes go out, and what a wait finds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx
import trio
import trio.testing

from genrm_trio.config import config_from_mapping
from genrm_trio.http.app import create_app
from genrm_trio.judge import wait_for_judge
from genrm_trio.testing import FakeJudge
from genrm_trio.testing.harness import JUDGE_URL


class RecordingJudge(FakeJudge):
    """The fake judge, noting when each request came and where it went."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[float, str, str]] = []

    def handle(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        *,
        now: float,
    ) -> Any:
        self.seen.append((now, method, target))
        return super().handle(method, target, headers, body, now=now)


def config(**settings: Any) -> Any:
    return config_from_mapping({"judge_base_url": JUDGE_URL, "judge_model": "judge", **settings})


async def test_probes_go_out_at_start_and_then_once_per_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = RecordingJudge()
    transport = judge.transport()
    app = create_app(
        config(judge_probe_interval_s=10.0),
        judge_transport=transport,
        judge_probe_transport=transport,
    )
    async with app.test_app():
        start = trio.current_time()
        await trio.sleep(35.0)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
            base_url="http://genrm.test",
        )
        async with client:
            ready = await client.get("/readyz")
    assert [(round(t - start, 6), m, p) for t, m, p in judge.seen] == [
        (0.0, "GET", "/v1/models"),
        (10.0, "GET", "/v1/models"),
        (20.0, "GET", "/v1/models"),
        (30.0, "GET", "/v1/models"),
    ]
    assert ready.status_code == 200
    assert ready.json()["judge_replicas"][0]["reachable"] is True
    assert judge.stats()["requests_total"] == 0  # no judge call among them


async def test_a_wait_ends_at_the_first_answer(autojump_clock: trio.testing.MockClock) -> None:
    judge = RecordingJudge()
    start = trio.current_time()
    readiness = await wait_for_judge(config(), 30.0, judge.transport())
    assert readiness.answering()
    assert trio.current_time() == start
    assert len(judge.seen) == 1


async def test_a_wait_of_zero_seconds_still_probes_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = RecordingJudge()
    readiness = await wait_for_judge(config(), 0.0, judge.transport())
    assert readiness.answering()
    assert len(judge.seen) == 1


async def test_a_wait_that_never_gets_an_answer_reports_the_last_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = RecordingJudge()
    start = trio.current_time()
    readiness = await wait_for_judge(config(judge_probe_path="/absent"), 3.0, judge.transport())
    assert not readiness.answering()
    assert trio.current_time() == start + 3.0
    # About one probe a second while it waits, none at the deadline itself.
    assert [round(t - start, 6) for t, _, _ in judge.seen] == [0.0, 1.0, 2.0]
    [replica] = readiness.replicas
    assert (replica.url, replica.reachable, replica.last_error) == (JUDGE_URL, False, "HTTP 404")
