"""Several judge replicas over real loopback HTTP (X-3): one is killed halfway through a run,
every group is still scored, /metrics shows the ejection, and the replica comes back into
service through a probe once it is up again after its cool-down."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import msgspec
import trio
from prometheus_client.parser import text_string_to_metric_families

from genrm_trio.http.app import create_app
from genrm_trio.testing import FakeJudge, wait_for_stats
from genrm_trio.testing._loopback_judge import LoopbackJudge
from genrm_trio.testing.harness import member

# Only guards against a hung test; no assertion depends on it.
SAFETY_S = 60
N = 4
COOLDOWN_S = 3.0


@asynccontextmanager
async def genrm(urls: list[str]) -> AsyncIterator[httpx.AsyncClient]:
    config = {
        "judge_base_urls": urls,
        "judge_model": "judge",
        "num_rollouts_per_prompt": N,
        "genrm_parse_retries": 3,
        "genrm_parse_retry_sleep_s": 0.0,
        "judge_request_timeout_s": 10.0,
        "judge_replica_eject_after": 2,
        "judge_replica_cooldown_s": COOLDOWN_S,
    }
    app = create_app(config)
    async with app.test_app():
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://genrm.test") as client:
            yield client


async def run_groups(client: httpx.AsyncClient, first: int, count: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    async def one(g: int, i: int) -> None:
        body = msgspec.json.encode(member(i, 1 + (i + g) % 5, f"g{g}", 0))
        response = await client.post("/verify", content=body)
        assert response.status_code == 200, response.text
        rows.append(response.json())

    async with trio.open_nursery() as nursery:
        for g in range(first, first + count):
            for i in range(N):
                nursery.start_soon(one, g, i)
    return rows


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = (await client.get("/metrics")).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def series(samples: dict[Any, float], name: str, **labels: str) -> float:
    return sum(
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and set(labels.items()) <= set(sample_labels)
    )


async def test_a_replica_killed_halfway_is_ejected_and_every_group_is_scored() -> None:
    with trio.fail_after(SAFETY_S):
        async with trio.open_nursery() as nursery:
            a, b = (LoopbackJudge(nursery, FakeJudge(latency="fixed:0.005")) for _ in range(2))
            await a.start()
            await b.start()
            async with genrm([a.url, b.url]) as client:
                before = await run_groups(client, 0, 16)
                served = [a.judge.stats()["requests_total"], b.judge.stats()["requests_total"]]
                # Groups spread over both replicas while both serve.
                assert min(served) > 0 and sum(served) == 16 * N

                # Kill replica a while it is answering: start groups, cut a mid-reply.
                async with trio.open_nursery() as run:
                    rows: list[dict[str, Any]] = []

                    async def second_half() -> None:
                        rows.extend(await run_groups(client, 16, 16))

                    run.start_soon(second_half)
                    await wait_for_stats(a.judge, lambda stats: stats["in_flight"] > 0)
                    a.stop()
                during = await scrape(client)
                assert all(not row.get("mask_sample") for row in before + rows)
                assert len(before + rows) == 32 * N

                # Every comparison ended with exactly one good reply; each failed attempt on a
                # was retried, on b.
                ok = series(during, "genrm_judge_attempts_total", outcome="ok")
                failed_on_a = series(
                    during, "genrm_judge_attempts_total", outcome="transport", replica=a.url
                )
                assert ok == 32 * N
                assert failed_on_a >= 2  # judge_replica_eject_after
                assert series(during, "genrm_judge_attempts_total") == ok + failed_on_a
                assert series(during, "genrm_judge_retries_total", reason="transport") == (
                    failed_on_a
                )
                assert series(during, "genrm_comparisons_total", outcome="verdict") == 32 * N
                assert series(during, "genrm_comparisons_total", outcome="failed") == 0
                assert series(during, "genrm_verify_requests_total", outcome="scored") == 32 * N
                assert series(during, "genrm_groups_finished_total", disposition="completed") == 32
                assert series(during, "genrm_judge_replica_ejections_total", replica=a.url) == 1
                assert series(during, "genrm_judge_replica_ejections_total", replica=b.url) == 0
                assert series(during, "genrm_judge_replica_up", replica=a.url) == 0
                assert series(during, "genrm_judge_replica_up", replica=b.url) == 1
                b_ok = series(during, "genrm_judge_attempts_total", outcome="ok", replica=b.url)
                assert b_ok == b.judge.stats()["requests_total"]

                # Replica a comes back; after its cool-down one probe puts it back in service.
                await a.start()
                await trio.sleep(COOLDOWN_S)
                served_by_a = a.judge.stats()["requests_total"]
                after = await run_groups(client, 32, 16)
                assert all(not row.get("mask_sample") for row in after)
                later = await scrape(client)
                assert series(later, "genrm_judge_replica_up", replica=a.url) == 1
                assert series(later, "genrm_judge_replica_ejections_total", replica=a.url) == 1
                assert a.judge.stats()["requests_total"] > served_by_a
            nursery.cancel_scope.cancel()
