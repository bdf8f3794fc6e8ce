"""Benchmark how the group engine's time and memory grow with the work (goal 6 in
docs/performance.md): groups in flight, group size, circular against all_pairs, and retained
finished groups.

Caveat: a 2-core machine, one process. Requests go straight to the engine (`Engine.verify` on
bodies parsed by `parse_verify_body`, so parsing and the fingerprint are included); there is no
HTTP layer (see bench_http.py for that), and the judge is the fake judge's in-process transport
with zero latency, so each judge call costs the judge client's attempt loop and the fake judge's
own work, both on this process's CPU. Times are this process's CPU time (`time.process_time`),
which other load on the machine disturbs much less than wall time, taken with Python's cyclic
garbage collector paused (`gc.disable()`) so that a collection landing in one row does not
blur it; what the collector costs as state grows is its own column, the time of one full
collection (`gc.collect()`) with that state alive. Memory is what `tracemalloc` sees allocated
by Python (a separate run, since tracing slows everything down), not RSS.

Tables:
1. groups in flight (N = 16, circular): G groups each get 15 of their 16 members, which wait;
   then every group gets its last member and is judged. Cost per arrival while collecting, cost
   per request of the judged phase, and memory held per waiting member (the request's parsed
   body kept by its waiting task, plus the engine's compact member) against the body size.
2. group size N from 2 to 64, circular and all_pairs, with the same number of rollouts
   (4,096) in every row: judge calls, CPU per rollout and per comparison.
3. retained finished groups (explicit groups of N = 2, results kept: TTL null,
   max_terminal_cohorts above the count): the cost of one more group and the entries pruning
   inspects per arrival stay flat as the retained count grows; then with a count cap that
   evicts one record per new group (`prune_visits` from `Engine.statistics()`).

    python benchmarks/bench_scaling.py            # G up to 4,096; up to 100,000 retained
    python benchmarks/bench_scaling.py --short    # G up to 1,024; up to 10,000 retained
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import msgspec
import trio
import trio.testing

from genrm_trio.config import Config
from genrm_trio.core.outcomes import Scored
from genrm_trio.runtime.engine import Engine
from genrm_trio.testing import FakeJudge
from genrm_trio.wire.bodies import VerifyRequest
from genrm_trio.wire.parsing import parse_verify_body

NO_DEADLINE_S = 1_000_000.0


def body(group: str, slot: int, tokens: int) -> bytes:
    """One member's /verify body: a short prompt, an answer and `tokens` generated tokens."""
    return msgspec.json.encode(
        {
            "responses_create_params": {"input": [{"role": "user", "content": "Sum of odds?"}]},
            "response": {
                "id": f"resp-{group}-{slot}",
                "output": [
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [
                            {"type": "output_text", "text": f"answer-{slot} [[q={1 + slot % 5}]]"}
                        ],
                    }
                ],
                "generation_token_ids": [(13 * k + slot) % 151_000 for k in range(tokens)],
                "generation_log_probs": [-((k * 37 + slot) % 1000) / 997.0 for k in range(tokens)],
            },
            "_ng_group_id": group,
            "_ng_group_attempt": 0,
            "_ng_rollout_index": slot,
        }
    )


def make_config(size: int, strategy: str = "circular", **overrides: Any) -> Config:
    fields: dict[str, Any] = {
        "judge_base_url": "http://fake-judge/v1",
        "judge_model": "judge",
        "num_rollouts_per_prompt": size,
        "comparison_strategy": strategy,
        "genrm_parse_retry_sleep_s": 0.0,
        "cohort_collection_timeout_s": NO_DEADLINE_S,
        "cohort_evaluation_timeout_s": NO_DEADLINE_S,
        "judge_request_timeout_s": NO_DEADLINE_S,
        "cohort_result_ttl_s": None,
        "max_terminal_cohorts": 1_000_000,
        "log_level": "WARNING",
    }
    fields.update(overrides)
    return Config(**fields)


@contextmanager
def collector_paused() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def full_collection_ms() -> float:
    started = time.process_time()
    gc.collect()
    return 1000 * (time.process_time() - started)


class Driver:
    """An engine in the server nursery, fed parsed requests; counts what it answered."""

    def __init__(self, config: Config, nursery: trio.Nursery) -> None:
        self.config = config
        self.judge = FakeJudge()
        self.engine = Engine(config, judge_transport=self.judge.transport())
        self.nursery = nursery
        self.scored = 0
        self.other = 0
        self.done = 0
        self.changed = trio.Event()

    async def start(self) -> None:
        await self.nursery.start(self.engine.run)

    def parse(self, raw: bytes) -> VerifyRequest:
        return parse_verify_body(raw, self.config)

    def post(self, request: VerifyRequest) -> None:
        self.nursery.start_soon(self._verify, request)

    async def _verify(self, request: VerifyRequest) -> None:
        async with self.engine.verify(request) as verified:
            outcome = verified.outcome
        if isinstance(outcome, Scored):
            self.scored += 1
        else:
            self.other += 1
        self.done += 1
        self.changed.set()

    async def wait_done(self, count: int) -> None:
        while self.done < count:
            self.changed = trio.Event()
            await self.changed.wait()

    async def settle(self) -> None:
        """Let every posted request reach its wait."""
        await trio.testing.wait_all_tasks_blocked()

    async def close(self) -> None:
        await self.engine.shutdown()


async def in_flight_row(groups: int, tokens: int, trace: bool) -> dict[str, float]:
    size = 16
    config = make_config(size)
    raws = [[body(f"g{g}", slot, tokens) for slot in range(size)] for g in range(groups)]
    body_bytes = len(raws[0][0])
    async with trio.open_nursery() as nursery:
        driver = Driver(config, nursery)
        await driver.start()
        gc.collect()
        if trace:
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
        with collector_paused():
            cpu_0 = time.process_time()
            for g in range(groups):
                for slot in range(size - 1):
                    driver.post(driver.parse(raws[g][slot]))
            await driver.settle()
            collect_cpu = time.process_time() - cpu_0
        held = tracemalloc.get_traced_memory()[0] - before if trace else 0
        assert driver.engine.statistics().waiters == groups * (size - 1)
        full_gc = 0.0 if trace else full_collection_ms()
        with collector_paused():
            cpu_1 = time.process_time()
            for g in range(groups):
                driver.post(driver.parse(raws[g][size - 1]))
            await driver.wait_done(groups * size)
            judge_cpu = time.process_time() - cpu_1
        if trace:
            tracemalloc.stop()
        assert driver.scored == groups * size, (driver.scored, driver.other)
        await driver.close()
        nursery.cancel_scope.cancel()
    waiting = groups * (size - 1)
    return {
        "arrival_us": 1e6 * collect_cpu / waiting,
        "judged_us": 1e6 * judge_cpu / groups / size,
        "held_per_member": held / waiting,
        "body_bytes": body_bytes,
        "full_gc_ms": full_gc,
    }


async def size_row(size: int, strategy: str, rollouts: int, tokens: int) -> dict[str, float]:
    groups = max(1, rollouts // size)
    config = make_config(size, strategy)
    async with trio.open_nursery() as nursery:
        driver = Driver(config, nursery)
        await driver.start()
        raws = [[body(f"g{g}", slot, tokens) for slot in range(size)] for g in range(groups)]
        with collector_paused():
            cpu_0 = time.process_time()
            for g in range(groups):
                for slot in range(size):
                    driver.post(driver.parse(raws[g][slot]))
            await driver.wait_done(groups * size)
            cpu = time.process_time() - cpu_0
        assert driver.scored == groups * size
        calls = driver.judge.stats()["requests_total"]
        await driver.close()
        nursery.cancel_scope.cancel()
    return {
        "groups": groups,
        "calls": calls,
        "rollout_us": 1e6 * cpu / (groups * size),
        "comparison_us": 1e6 * cpu / calls,
    }


async def retained_rows(counts: list[int], probe: int, tokens: int) -> list[dict[str, float]]:
    """One engine; retained results grow through ``counts``; ``probe`` groups are timed at each."""
    config = make_config(2)
    rows = []
    async with trio.open_nursery() as nursery:
        driver = Driver(config, nursery)
        await driver.start()
        made = 0

        async def run_groups(count: int) -> None:
            nonlocal made
            start = driver.done
            for _ in range(count):
                for slot in range(2):
                    driver.post(driver.parse(body(f"r{made}", slot, tokens)))
                made += 1
            await driver.wait_done(start + 2 * count)

        for count in counts:
            await run_groups(count - driver.engine.statistics().retained_records)
            stats_0 = driver.engine.statistics()
            with collector_paused():
                cpu_0 = time.process_time()
                await run_groups(probe)
                cpu = time.process_time() - cpu_0
            stats_1 = driver.engine.statistics()
            rows.append(
                {
                    "retained": stats_0.retained_records,
                    "group_us": 1e6 * cpu / probe,
                    "visits_per_arrival": (stats_1.prune_visits - stats_0.prune_visits)
                    / (2 * probe),
                    "full_gc_ms": full_collection_ms(),
                }
            )
        await driver.close()
        nursery.cancel_scope.cancel()
    return rows


async def capped_row(cap: int, groups: int, tokens: int) -> dict[str, float]:
    """Count eviction: every new group beyond ``cap`` evicts the oldest result."""
    config = make_config(2, max_terminal_cohorts=cap)
    async with trio.open_nursery() as nursery:
        driver = Driver(config, nursery)
        await driver.start()
        for g in range(cap):
            for slot in range(2):
                driver.post(driver.parse(body(f"c{g}", slot, tokens)))
        await driver.wait_done(2 * cap)
        stats_0 = driver.engine.statistics()
        with collector_paused():
            cpu_0 = time.process_time()
            for g in range(cap, cap + groups):
                for slot in range(2):
                    driver.post(driver.parse(body(f"c{g}", slot, tokens)))
            await driver.wait_done(2 * (cap + groups))
            cpu = time.process_time() - cpu_0
        stats_1 = driver.engine.statistics()
        await driver.close()
        nursery.cancel_scope.cancel()
    return {
        "cap": cap,
        "retained": stats_1.retained_records,
        "group_us": 1e6 * cpu / groups,
        "visits_per_arrival": (stats_1.prune_visits - stats_0.prune_visits) / (2 * groups),
    }


async def run(args: argparse.Namespace) -> int:
    print(__doc__.split("\n\n")[1].strip() if __doc__ else "", flush=True)
    in_flight = [16, 64, 256, 1024] if args.short else [16, 64, 256, 1024, 4096]
    print(f"\n1. Groups in flight (N = 16, circular, {args.tokens} generated tokens per body)")
    print(
        f"{'groups':>7} {'waiting':>8} {'us/arrival':>11} {'us/request judged':>18} "
        f"{'full GC ms':>11} {'bytes held/waiting member':>26} {'body bytes':>11}"
    )
    for groups in in_flight:
        timed = await in_flight_row(groups, args.tokens, trace=False)
        traced = await in_flight_row(groups, args.tokens, trace=True)
        print(
            f"{groups:>7} {groups * 15:>8} {timed['arrival_us']:>11.0f} "
            f"{timed['judged_us']:>18.0f} {timed['full_gc_ms']:>11.1f} "
            f"{traced['held_per_member']:>26.0f} "
            f"{traced['body_bytes']:>11.0f}",
            flush=True,
        )

    rollouts = 1024 if args.short else 4096
    print(f"\n2. Group size ({rollouts} rollouts per row)")
    print(
        f"{'N':>3} {'strategy':<10} {'groups':>6} {'judge calls':>12} {'us/rollout':>11} "
        f"{'us/comparison':>14}"
    )
    for size in [2, 4, 8, 16, 32, 64]:
        for strategy in ("circular", "all_pairs"):
            row = await size_row(size, strategy, rollouts, args.tokens)
            print(
                f"{size:>3} {strategy:<10} {row['groups']:>6.0f} {row['calls']:>12.0f} "
                f"{row['rollout_us']:>11.0f} {row['comparison_us']:>14.0f}",
                flush=True,
            )

    counts = [0, 1_000, 10_000] if args.short else [0, 1_000, 10_000, 100_000]
    probe = 200 if args.short else 500
    print(f"\n3. Retained finished groups (N = 2; {probe} more groups timed at each size)")
    print(
        f"{'retained':>9} {'us/group':>9} {'entries pruning inspects per arrival':>37} "
        f"{'full GC ms':>11}"
    )
    for row in await retained_rows(counts, probe, args.tokens):
        print(
            f"{row['retained']:>9.0f} {row['group_us']:>9.0f} "
            f"{row['visits_per_arrival']:>37.2f} {row['full_gc_ms']:>11.1f}",
            flush=True,
        )
    print("with a count cap (max_terminal_cohorts), each new group evicting the oldest result:")
    print(f"{'cap':>9} {'us/group':>9} {'entries pruning inspects per arrival':>37}")
    for cap in [100, 10_000] if args.short else [100, 10_000, 100_000]:
        row = await capped_row(cap, probe, args.tokens)
        print(
            f"{row['cap']:>9.0f} {row['group_us']:>9.0f} {row['visits_per_arrival']:>37.2f}",
            flush=True,
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--short", action="store_true", help="smaller rows (CI)")
    parser.add_argument("--tokens", type=int, default=256, help="generated tokens per body")
    args = parser.parse_args(argv)
    return trio.run(run, args)


if __name__ == "__main__":
    sys.exit(main())
