"""Benchmark several judge replicas (X-3, `judge_base_urls`): throughput and balance across
1, 2 and 4 replicas, group affinity against least-outstanding under a prefix-cache latency
model, and recovery when one replica is killed mid-run.

Caveat. Everything runs in one process on this machine: the genrm-trio app (driven in process
over ASGI), the fake judges and the load. Each replica's capacity is modelled by
`judge_replica_max_concurrency` (a GPU replica batches a bounded number of requests) and its
speed by the fake judge's fixed latency; the fake judges themselves cost almost no CPU.

1. *Scaling* (real clock, real HTTP/1.1 to fake judges on loopback): calls/s with 1, 2 and 4
   replicas, each capped at 8 attempts in flight with 100 ms latency, and the balance (the
   largest replica's share of calls over the smallest's; 1.00 is perfect).
2. *Affinity* (Trio's MockClock, in-memory judges, simulated seconds, so CPU does not enter):
   4 replicas, each with a prefix cache of 12 conversations; a call whose conversation is not
   cached waits 0.2 s more (prefill), on top of 0.1 s. 32 groups of 8 are in flight at a time.
   With affinity a replica serves about a quarter of the groups and keeps their prefixes; with
   least-outstanding alone every replica sees every group and evicts.
3. *Recovery* (real clock, loopback): 2 replicas; one is killed halfway through the run. Reports
   calls/s before and after, the attempts that failed on the dead replica, how long until it was
   ejected, and how many rollouts were masked (the goal: none, since every failed attempt had
   retries left).

    python benchmarks/bench_judge_replicas.py           # 256 groups per run
    python benchmarks/bench_judge_replicas.py --short   # 64 groups per run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import trio
import trio.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_line

from genrm_trio.fakes.memory_transport import MemoryTransport
from genrm_trio.http.app import GenRMApp, create_app
from genrm_trio.judge.transport import JudgeEndpoint, JudgeTransport
from genrm_trio.testing import FakeJudge, serve_fake_judge
from genrm_trio.testing.harness import member

GROUP_SIZE = 8
NO_DEADLINE_S = 1_000_000.0
BASE = {
    "judge_model": "judge",
    "num_rollouts_per_prompt": GROUP_SIZE,
    "genrm_parse_retries": 3,
    "genrm_parse_retry_sleep_s": 0.0,
    "judge_request_timeout_s": 60.0,
    "cohort_collection_timeout_s": NO_DEADLINE_S,
    "cohort_evaluation_timeout_s": NO_DEADLINE_S,
    "waiting_body_memory_bytes": None,
}


def group_bodies(g: int) -> list[bytes]:
    # Each group has its own prompt, so its comparisons share a conversation no other group has.
    return [
        msgspec.json.encode(member(i, 1 + (i * 7 + g) % 5, f"g{g}", 0, prompt=f"task {g}: 2+{g}?"))
        for i in range(GROUP_SIZE)
    ]


@asynccontextmanager
async def app_client(app: GenRMApp) -> AsyncIterator[httpx.AsyncClient]:
    async with app.test_app():
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://genrm.test") as client:
            yield client


class Load:
    """Sends groups with at most ``in_flight`` groups at once; records each group's time."""

    def __init__(self, client: httpx.AsyncClient, in_flight: int) -> None:
        self.client = client
        self.limit = trio.Semaphore(in_flight)
        self.group_seconds: list[float] = []
        self.masked = 0
        self.done_at: list[float] = []
        self.progress = trio.Event()  # set, and replaced, whenever a group finishes

    async def group(self, g: int) -> None:
        async with self.limit:
            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                for body in group_bodies(g):
                    nursery.start_soon(self._one, body)
            now = trio.current_time()
            self.group_seconds.append(now - started)
            self.done_at.append(now)
            progress, self.progress = self.progress, trio.Event()
            progress.set()

    async def _one(self, body: bytes) -> None:
        response = await self.client.post("/verify", content=body)
        row = response.json()
        if response.status_code != 200 or row.get("mask_sample"):
            self.masked += 1

    async def run(self, first: int, count: int) -> None:
        async with trio.open_nursery() as nursery:
            for g in range(first, first + count):
                nursery.start_soon(self.group, g)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# ---- 1. scaling ----------------------------------------------------------------------------


async def serve_replicas(
    nursery: trio.Nursery, judges: list[FakeJudge]
) -> tuple[list[str], list[trio.CancelScope]]:
    urls, scopes = [], []
    for judge in judges:
        scope = trio.CancelScope()

        async def serve(
            judge: FakeJudge = judge,
            scope: trio.CancelScope = scope,
            *,
            task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
        ) -> None:
            with scope:
                await serve_fake_judge(judge, "127.0.0.1", 0, task_status=task_status)

        port = await nursery.start(serve)
        urls.append(f"http://127.0.0.1:{port}/v1")
        scopes.append(scope)
    return urls, scopes


async def scaling(replicas: int, groups: int) -> tuple[float, float, list[int]]:
    judges = [FakeJudge(latency="fixed:0.1") for _ in range(replicas)]
    async with trio.open_nursery() as nursery:
        urls, _ = await serve_replicas(nursery, judges)
        config = {
            **BASE,
            "judge_base_urls": urls,
            "judge_max_concurrency": 64,
            "judge_replica_max_concurrency": 8,
        }
        async with app_client(create_app(config)) as client:
            load = Load(client, in_flight=32)
            started = time.perf_counter()
            await load.run(0, groups)
            elapsed = time.perf_counter() - started
        nursery.cancel_scope.cancel()
    calls = [judge.stats()["requests_total"] for judge in judges]
    assert load.masked == 0, "a rollout was masked"
    return sum(calls) / elapsed, max(calls) / min(calls), calls


# ---- 2. affinity under the prefix-cache model ----------------------------------------------


def memory_replicas(judges: dict[str, FakeJudge]) -> Callable[[JudgeEndpoint], JudgeTransport]:
    def factory(endpoint: JudgeEndpoint) -> JudgeTransport:
        base = endpoint.url.rsplit("/chat/completions", 1)[0]
        return MemoryTransport(judges[base], endpoint)

    return factory


def affinity_run(policy: str, groups: int) -> dict[str, Any]:
    urls = [f"http://judge-{index}/v1" for index in range(4)]
    judges = {url: FakeJudge(latency="fixed:0.1", prefix_cache="12:0.2") for url in urls}
    result: dict[str, Any] = {}

    async def main() -> None:
        config = {
            **BASE,
            "judge_base_urls": urls,
            "judge_balance": policy,
            "judge_max_concurrency": 64,
            "judge_replica_max_concurrency": 16,
        }
        app = create_app(config, judge_transport=memory_replicas(judges))
        async with app_client(app) as client:
            load = Load(client, in_flight=32)
            started = trio.current_time()
            await load.run(0, groups)
            result["elapsed"] = trio.current_time() - started
        result["load"] = load

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    hits = sum(judge.stats()["prefix_cache"]["hits"] for judge in judges.values())
    misses = sum(judge.stats()["prefix_cache"]["misses"] for judge in judges.values())
    load: Load = result["load"]
    assert load.masked == 0, "a rollout was masked"
    return {
        "median": statistics.median(load.group_seconds),
        "p95": percentile(load.group_seconds, 0.95),
        "elapsed": result["elapsed"],
        "hit_rate": hits / (hits + misses),
        "calls": hits + misses,
    }


# ---- 3. recovery -----------------------------------------------------------------------------


async def recovery(groups: int) -> dict[str, Any]:
    judges = [FakeJudge(latency="fixed:0.1") for _ in range(2)]
    async with trio.open_nursery() as nursery:
        urls, scopes = await serve_replicas(nursery, judges)
        config = {
            **BASE,
            "judge_base_urls": urls,
            "judge_max_concurrency": 64,
            "judge_replica_max_concurrency": 8,
            "judge_replica_eject_after": 3,
            "judge_replica_cooldown_s": 600.0,
        }
        app = create_app(config)
        async with app_client(app) as client:
            load = Load(client, in_flight=16)
            balancer = app.engine.judge.balancer
            started = trio.current_time()
            killed_at = ejected_at = 0.0
            calls_at_kill = 0

            async def kill_halfway() -> None:
                nonlocal killed_at, ejected_at, calls_at_kill
                while len(load.done_at) < groups // 2:
                    await load.progress.wait()
                scopes[0].cancel()
                killed_at = trio.current_time()
                calls_at_kill = sum(judge.stats()["requests_total"] for judge in judges)
                # The balancer is plain bookkeeping with nothing to wait on: polling every
                # millisecond bounds the error of the figure.
                while balancer.replicas[0].in_service:  # noqa: ASYNC110
                    await trio.sleep(0.001)
                ejected_at = trio.current_time()

            async with trio.open_nursery() as run:
                run.start_soon(kill_halfway)
                await load.run(0, groups)
            metrics = app.engine.metrics
        nursery.cancel_scope.cancel()
    end = max(load.done_at)
    calls = sum(judge.stats()["requests_total"] for judge in judges)
    failed = sum(
        count
        for (replica, outcome), count in metrics.judge_attempts.items()
        if outcome != "ok" and replica == urls[0].rstrip("/")
    )
    return {
        "calls_per_s_before": calls_at_kill / (killed_at - started),
        "calls_per_s_after": (calls - calls_at_kill) / (end - killed_at),
        "failed_attempts": failed,
        "ejected_after_s": ejected_at - killed_at,
        "masked": load.masked,
        "groups": len(load.done_at),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="64 groups per run")
    args = parser.parse_args()
    groups = 64 if args.short else 256
    print("caveat: one process on this machine; replica capacity modelled by a client-side cap")
    print(machine_line())
    print(f"groups per run: {groups} of {GROUP_SIZE} rollouts, circular ({GROUP_SIZE} calls each)")

    print("\n1. scaling (real clock, loopback HTTP, 100 ms judge latency, 8 in flight per replica)")
    baseline = 0.0
    for replicas in (1, 2, 4):
        rate, balance, calls = trio.run(scaling, replicas, groups)
        baseline = baseline or rate
        print(
            f"  replicas={replicas}: {rate:7.0f} calls/s ({rate / baseline:.2f}x of 1 replica), "
            f"balance max/min {balance:.2f}, calls per replica {calls}"
        )

    print("\n2. affinity vs least-outstanding (MockClock; 4 replicas, prefix cache 12, miss 0.2 s)")
    runs = {policy: affinity_run(policy, groups) for policy in ("least_outstanding", "affinity")}
    for policy, run in runs.items():
        print(
            f"  {policy:17s}: group time median {run['median']:.3f} s, p95 {run['p95']:.3f} s, "
            f"run {run['elapsed']:.2f} s, prefix-cache hit rate {run['hit_rate']:.2f}"
        )
    ratio = runs["affinity"]["median"] / runs["least_outstanding"]["median"]
    p95_ratio = runs["affinity"]["p95"] / runs["least_outstanding"]["p95"]
    print(f"  affinity / least-outstanding: median {ratio:.2f}, p95 {p95_ratio:.2f}")

    print("\n3. recovery (real clock, loopback; 2 replicas, one killed halfway)")
    figures = trio.run(recovery, groups)
    print(
        f"  calls/s before {figures['calls_per_s_before']:.0f}, after "
        f"{figures['calls_per_s_after']:.0f}; ejected {figures['ejected_after_s'] * 1000:.0f} ms "
        f"after the kill; failed attempts on the dead replica {figures['failed_attempts']}; "
        f"masked rollouts {figures['masked']} of {figures['groups'] * GROUP_SIZE}"
    )
    return 0 if figures["masked"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
