"""Benchmark judge fan-out: judge calls per second through the server's judge client, and the
latency of each attempt when hundreds of comparisons are released at once (goal 4 in
docs/performance.md; J-33, J-34, J-34a).

Caveat: a 2-core machine. The judge client runs in this process, the fake judge (`genrm-trio
fake-judge`, h11 on Trio) in another; each is one Trio thread, so the two share the two cores
with whatever else runs on the machine. A judge call's cost is split between the two processes:
both CPU figures are read from /proc (10 ms ticks). Latencies are wall-clock, so other load on
the machine stretches them; every variant runs against the same judge in the same run, in
alternation, and each measurement is repeated.

Variants, each a real `JudgeClient` (the server's judge client) with the same configuration,
differing only in the judge transport handed to it (judge_transports.py):
- `genrm`: the server's own network transport (judge/http11.py, `judge_transport=None`);
- `h11`: the same connection stack with h11 doing the HTTP/1.1 framing instead of the
  hand-written framing (the measurement behind judge/http11.py's choice);
- `httpx-pool`: httpx's client over its own pooled transport (`httpx.AsyncHTTPTransport` with
  `judge_max_concurrency` connections, httpcore's pool), the baseline that J-34a warns
  about.

Throughput: `--calls` comparisons made by `2 x judge_max_concurrency` workers, each starting its
next comparison when the last one ends (so half of them wait for a slot at any time); each makes
exactly one attempt against a judge that never fails. A sampler records the attempts in flight
(never above the limit), the comparisons waiting for a slot and the client's open sockets (the
connection pool's size).
Bursts: `--burst` comparisons released in the same instant with `judge_max_concurrency` equal to
the burst, so no comparison waits for a slot and its latency is its one attempt's latency, from
taking the slot to the end of the reply. Each client first makes one unreported burst, so the
measured bursts find a warm pool of idle keep-alive connections (the case of J-34a). The
judge's own latency is an attempt made alone; "judge CPU" is the CPU the fake judge spent
serving the burst, the least time a single-threaded judge needs to answer all of it.

    python benchmarks/bench_judge_fanout.py            # 20,000 calls; bursts of 256 and 1,024
    python benchmarks/bench_judge_fanout.py --short    # 4,000 calls; bursts of 256
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import trio
import trio.testing
from _common import Child, cpu_seconds, own_cpu_seconds, start_fake_judge
from bench_http import percentile
from judge_transports import H11Transport, HttpxPoolTransport

from genrm_trio.config import Config
from genrm_trio.judge.client import JudgeClient, JudgeTask, JudgeVerdict
from genrm_trio.judge.transport import TransportFactory

VARIANTS = ("genrm", "h11", "httpx-pool")
HISTORY = [{"role": "user", "content": "Is the sum of two odd integers always even? Explain."}]


def judge_tasks(count: int) -> list[JudgeTask]:
    """Distinct comparisons, as a group's engine would hand them to the client."""
    tasks = []
    for k in range(count):
        i, j = k % 16, (k + 1) % 16
        tasks.append(
            JudgeTask(
                history=HISTORY,
                principle=None,
                text_1=f"answer-{i} 2a+1 plus 2b+1 is 2(a+b+1). [[q={1 + i % 5}]]",
                text_2=f"answer-{j} Yes, because odd plus odd is even. [[q={1 + j % 5}]]",
                pair=(i, j),
                judge_pass=0,
            )
        )
    return tasks


def make_client(variant: str, judge_url: str, concurrency: int) -> JudgeClient:
    config = Config(
        judge_base_url=judge_url,
        judge_model="judge",
        judge_max_concurrency=concurrency,
        judge_request_timeout_s=60.0,
        genrm_parse_retries=0,
    )
    transport: TransportFactory | None = None
    if variant == "h11":
        transport = H11Transport
    elif variant == "httpx-pool":
        transport = partial(HttpxPoolTransport, connections=concurrency)
    return JudgeClient(config, transport=transport)


def open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            pass
    return count


@dataclass
class Throughput:
    variant: str
    calls: int
    wall_s: float
    client_cpu_s: float
    judge_cpu_s: float
    failures: int
    max_in_flight: int = 0
    max_waiting: int = 0
    max_sockets: int = 0
    latencies_s: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.calls / self.wall_s

    def describe(self, limit: int) -> str:
        return (
            f"{self.variant:<10} {self.calls:>6} calls {self.wall_s:6.2f} s {self.rate:7.0f} "
            f"calls/s  client {1000 * self.client_cpu_s / self.calls:.3f} ms CPU/call  judge "
            f"{1000 * self.judge_cpu_s / self.calls:.3f} ms CPU/call  in flight max "
            f"{self.max_in_flight}/{limit}  waiting max {self.max_waiting}  sockets max "
            f"{self.max_sockets}  call p50 {1000 * percentile(self.latencies_s, 0.5):.1f} ms "
            f"max {1000 * max(self.latencies_s):.1f} ms  failures {self.failures}"
        )


async def throughput(
    variant: str, judge: Child, calls: int, concurrency: int, tasks: list[JudgeTask]
) -> Throughput:
    client = make_client(variant, judge.url, concurrency)
    workers = 2 * concurrency
    started = 0
    finished = 0
    failures = 0
    latencies: list[float] = []
    result = Throughput(variant, calls, 0.0, 0.0, 0.0, 0)

    async def worker(number: int) -> None:
        nonlocal started, finished, failures
        for k in range(number, calls, workers):
            started += 1
            began = time.perf_counter()
            verdict = await client.judge(tasks[k % len(tasks)])
            latencies.append(time.perf_counter() - began)
            if not isinstance(verdict, JudgeVerdict) or verdict.fallback:
                failures += 1
            finished += 1

    async def sample(stop: trio.Event) -> None:
        ticks = 0
        while not stop.is_set():
            in_flight = client.in_flight
            result.max_in_flight = max(result.max_in_flight, in_flight)
            result.max_waiting = max(result.max_waiting, started - finished - in_flight)
            if ticks % 10 == 0:
                result.max_sockets = max(result.max_sockets, open_sockets())
            ticks += 1
            await trio.sleep(0.01)

    try:
        cpu_0, judge_0, t_0 = own_cpu_seconds(), cpu_seconds(judge.pid), time.perf_counter()
        stop = trio.Event()
        async with trio.open_nursery() as sampler:
            sampler.start_soon(sample, stop)
            async with trio.open_nursery() as nursery:
                for number in range(workers):
                    nursery.start_soon(worker, number)
            stop.set()
        result.wall_s = time.perf_counter() - t_0
        result.client_cpu_s = own_cpu_seconds() - cpu_0
        result.judge_cpu_s = cpu_seconds(judge.pid) - judge_0
    finally:
        await client.aclose()
    result.failures = failures
    result.latencies_s = latencies
    return result


@dataclass
class Burst:
    variant: str
    size: int
    attempts_s: list[float]
    makespan_s: float
    judge_cpu_s: float
    failures: int


async def bursts(
    variant: str, judge: Child, size: int, repeats: int, tasks: list[JudgeTask]
) -> list[Burst]:
    """Release ``size`` comparisons at once with as many slots, ``repeats`` times on one client;
    a first, unreported burst opens the connections, so the measured ones find a warm pool."""
    client = make_client(variant, judge.url, size)
    results = []
    try:
        for number in range(repeats + 1):
            attempts: list[float] = []
            failures = 0
            release = trio.Event()

            async def one(
                task: JudgeTask,
                release: trio.Event = release,
                attempts: list[float] = attempts,
            ) -> None:
                nonlocal failures
                await release.wait()
                began = time.perf_counter()
                verdict = await client.judge(task)
                attempts.append(time.perf_counter() - began)
                if not isinstance(verdict, JudgeVerdict) or verdict.fallback:
                    failures += 1

            async with trio.open_nursery() as nursery:
                for k in range(size):
                    nursery.start_soon(one, tasks[k % len(tasks)])
                await trio.testing.wait_all_tasks_blocked()
                judge_0, t_0 = cpu_seconds(judge.pid), time.perf_counter()
                release.set()
            makespan = time.perf_counter() - t_0
            judge_cpu = cpu_seconds(judge.pid) - judge_0
            if number:
                results.append(Burst(variant, size, attempts, makespan, judge_cpu, failures))
    finally:
        await client.aclose()
    return results


async def alone(variant: str, judge: Child, count: int, tasks: list[JudgeTask]) -> list[float]:
    """Attempts made one at a time on a warm connection: the judge's own latency."""
    client = make_client(variant, judge.url, 1)
    latencies = []
    try:
        for k in range(count + 1):
            began = time.perf_counter()
            await client.judge(tasks[k % len(tasks)])
            if k:
                latencies.append(time.perf_counter() - began)
    finally:
        await client.aclose()
    return latencies


def ms(seconds: float) -> str:
    return f"{1000 * seconds:7.1f}"


async def run(args: argparse.Namespace, judges: dict[str, Child]) -> int:
    print(__doc__.split("\n\n")[1].strip() if __doc__ else "", flush=True)
    tasks = judge_tasks(256)
    failures = 0
    zero = judges["none"]
    print(
        f"\nThroughput: {args.calls} calls, judge_max_concurrency {args.concurrency}, "
        "zero-latency fake judge",
        flush=True,
    )
    variants = args.variant or VARIANTS
    for variant in variants:  # warm-up: imports, first connections
        await throughput(variant, zero, args.concurrency, args.concurrency, tasks)
    results: dict[str, list[Throughput]] = {variant: [] for variant in variants}
    for _ in range(args.rounds):
        for variant in variants:
            result = await throughput(variant, zero, args.calls, args.concurrency, tasks)
            results[variant].append(result)
            failures += result.failures
            print(result.describe(args.concurrency), flush=True)
    for variant in variants:
        rate = statistics.median(r.rate for r in results[variant])
        cpu = statistics.median(1000 * r.client_cpu_s / r.calls for r in results[variant])
        print(f"median {variant:<10} {rate:7.0f} calls/s, client {cpu:.3f} ms CPU/call")

    for latency, judge in judges.items():
        print(
            f"\nBursts against the fake judge with latency {latency}: attempt latency in ms "
            "(the slot is already held; one attempt per comparison)",
            flush=True,
        )
        own = await alone("genrm", judge, 50, tasks)
        print(
            f"judge's own latency (one attempt alone): p50 {ms(percentile(own, 0.5))}  "
            f"max {ms(max(own))}"
        )
        print(
            f"{'variant':<10} {'burst':>5}  {'p50':>7} {'p99':>7} {'max':>7}  {'all done':>8}"
            f"  {'judge CPU':>9}"
        )
        for size in args.burst:
            for variant in variants:
                for shot in await bursts(variant, judge, size, args.rounds, tasks):
                    failures += shot.failures
                    print(
                        f"{variant:<10} {size:>5}  {ms(percentile(shot.attempts_s, 0.5))} "
                        f"{ms(percentile(shot.attempts_s, 0.99))} {ms(max(shot.attempts_s))}"
                        f"  {ms(shot.makespan_s)}  {ms(shot.judge_cpu_s)}"
                        + (f"  FAILURES {shot.failures}" if shot.failures else ""),
                        flush=True,
                    )
    print(f"\nfailed or fallback comparisons: {failures}")
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--short", action="store_true", help="fewer calls and bursts (CI)")
    parser.add_argument(
        "--variant",
        choices=VARIANTS,
        action="append",
        default=None,
        help="repeatable (default: all)",
    )
    parser.add_argument("--calls", type=int, default=None, help="calls per throughput round")
    parser.add_argument("--concurrency", type=int, default=256, help="judge_max_concurrency")
    parser.add_argument("--rounds", type=int, default=None, help="repeats of each measurement")
    parser.add_argument(
        "--burst", type=int, action="append", default=None, help="burst size (repeatable)"
    )
    parser.add_argument(
        "--slow-latency",
        default="fixed:0.1",
        help="the second judge's --latency for bursts ('' to skip)",
    )
    args = parser.parse_args(argv)
    if args.calls is None:
        args.calls = 4000 if args.short else 20_000
    if args.rounds is None:
        args.rounds = 2 if args.short else 3
    if args.burst is None:
        args.burst = [256] if args.short else [256, 1024]
    judges: dict[str, Child] = {}
    try:
        judges["none"] = start_fake_judge()
        if args.slow_latency:
            judges[args.slow_latency] = start_fake_judge("--latency", args.slow_latency)
        return trio.run(run, args, judges)
    finally:
        for judge in judges.values():
            judge.stop()


if __name__ == "__main__":
    sys.exit(main())
