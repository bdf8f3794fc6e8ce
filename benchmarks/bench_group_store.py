"""Benchmark the Redis group store against the in-memory store, measured in the same run
(X-4): /verify per second, server CPU per /verify, Redis commands and round trips per
/verify, and bytes per finished group kept in Redis.

Caveat: a 2-core machine shared by every process of the run: the genrm-trio servers, the fake
judge (zero latency), Redis, the round-robin balancer (for two servers) and this script, the load
generator. Throughput therefore includes all of their CPU competing for two cores; server CPU per
/verify is read from /proc/<pid>/stat (utime + stime, 10 ms ticks) of the server processes alone,
before and after each round, and Redis's and the balancer's CPU are reported apart. Other work on
the machine moves the figures: the rounds of the three set-ups alternate and repeat, so compare
ratios within one run.

Set-ups: `memory-1`, one server with the in-memory store (the baseline); `redis-1`, one server
with the Redis store; `redis-2`, two servers sharing the Redis store behind the round-robin TCP
balancer (`python -m genrm_trio.testing._balancer`), so the 16 connections of one group alternate
between the two servers. Redis runs with append-only persistence (`--appendfsync`, default
everysec). Workload as in bench_http.py: `--in-flight` requests outstanding as groups of 16
posted at once on keep-alive connections, circular pairing (one judge call per /verify), every
row checked against the reward the fake judge's qualities predict.

Redis commands per /verify come from INFO commandstats before and after each round (they include
the other set-ups' idle sweeps, a few commands per process per second). Round trips
per /verify are counted in extra rounds whose servers reach Redis through a counting relay in this
process (a round trip is a send after the previous reply; a pipeline or MULTI/EXEC sent at once
is one); the relay slows those rounds, so they give counts, not speed. Bytes per group: MEMORY
USAGE of every key under the `redis-1` prefix after its rounds, divided by the groups it finished
(all of them retained: fewer than max_terminal_cohorts).

    python benchmarks/bench_group_store.py            # 3 rounds of 4,096 /verify per set-up
    python benchmarks/bench_group_store.py --short    # 1 round of 1,024
    python benchmarks/bench_group_store.py --appendfsync always
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import trio
from _common import (
    Child,
    cpu_seconds,
    machine_line,
    own_cpu_seconds,
    start_child,
    start_fake_judge,
    start_server,
    table,
)
from bench_http import (
    GROUP_SIZE,
    close_connections,
    open_connections,
    percentile,
    post_groups,
)

from genrm_trio.testing._balancer import RoundRobinBalancer
from genrm_trio.testing.redis_server import RedisServer

SETUPS = ("memory-1", "redis-1", "redis-2")
_ROW = msgspec.json.Decoder()


@dataclass
class Deployment:
    """The servers of one set-up and the port the load generator posts to."""

    name: str
    servers: list[Child]
    port: int
    prefix: str | None = None
    balancer: Child | None = None
    groups: int = 0

    def stop(self) -> None:
        for child in (*self.servers, *([self.balancer] if self.balancer else [])):
            child.stop()


@dataclass
class Round:
    setup: str
    requests: int
    wall_s: float
    server_cpu_s: float
    redis_cpu_s: float
    balancer_cpu_s: float
    loadgen_cpu_s: float
    commands: Counter[str]
    errors: int
    group_latencies_s: list[float]

    @property
    def rate(self) -> float:
        return self.requests / self.wall_s

    @property
    def server_ms(self) -> float:
        return 1000 * self.server_cpu_s / self.requests


def command_calls(redis: RedisServer) -> Counter[str]:
    """Calls per command so far (INFO commandstats), the INFO call that reads them excluded."""
    calls: Counter[str] = Counter()
    for key, value in redis.info("commandstats").items():
        fields = dict(part.split("=", 1) for part in value.split(","))
        calls[key.removeprefix("cmdstat_")] = int(fields["calls"])
    calls["info"] -= 1
    return calls


def expected_reward(slot: int) -> float:
    """verify_body_parts gives slot k the quality 1 + k % 5; circular pairing with the fake
    judge makes that the reward (CL-13)."""
    return float(1 + slot % 5)


async def verify_round(
    deployment: Deployment, redis: RedisServer, in_flight: int, requests: int, tokens: int
) -> Round:
    workers = in_flight // GROUP_SIZE
    groups_per_worker = max(1, requests // (workers * GROUP_SIZE))
    connections = await open_connections(deployment.port, workers * GROUP_SIZE)
    errors = 0

    def check(slot: int, status: int, reply: bytes) -> None:
        nonlocal errors
        if status != 200 or _ROW.decode(reply).get("reward") != expected_reward(slot):
            errors += 1

    pids = [child.pid for child in deployment.servers]
    lb = deployment.balancer.pid if deployment.balancer else None
    server_0 = sum(cpu_seconds(pid) for pid in pids)
    assert redis.pid is not None
    redis_0, lb_0 = cpu_seconds(redis.pid), cpu_seconds(lb) if lb else 0.0
    commands_0 = command_calls(redis)
    own_0, t_0 = own_cpu_seconds(), time.perf_counter()
    label = f"{deployment.name}-{uuid.uuid4().hex[:8]}"
    latencies = await post_groups(
        deployment.port, connections, groups_per_worker, tokens, label, check
    )
    wall = time.perf_counter() - t_0
    own = own_cpu_seconds() - own_0
    commands = command_calls(redis)
    commands.subtract(commands_0)
    await close_connections(connections)
    deployment.groups += workers * groups_per_worker
    return Round(
        deployment.name,
        workers * groups_per_worker * GROUP_SIZE,
        wall,
        sum(cpu_seconds(pid) for pid in pids) - server_0,
        cpu_seconds(redis.pid) - redis_0,
        (cpu_seconds(lb) - lb_0) if lb else 0.0,
        own,
        +commands,
        errors,
        latencies,
    )


def start_deployment(
    name: str, judge: Child, store_url: str | None, processes: int, run: str
) -> Deployment:
    prefix = f"bench.{run}.{name}." if store_url else None
    sets = [f"group_store={store_url}", f"group_store_key_prefix={prefix}"] if store_url else []
    servers = [start_server(judge.url, GROUP_SIZE, sets) for _ in range(processes)]
    if processes == 1:
        return Deployment(name, servers, servers[0].port, prefix)
    backends = [arg for server in servers for arg in ("--backend", f"127.0.0.1:{server.port}")]
    balancer = start_child(
        [sys.executable, "-m", "genrm_trio.testing._balancer", "--port", "0", *backends],
        "balancer listening on",
    )
    return Deployment(name, servers, balancer.port, prefix, balancer)


def bytes_per_group(redis: RedisServer, prefix: str, groups: int) -> tuple[float, float]:
    """(bytes, keys) per group under `prefix`: MEMORY USAGE of each key, summed."""
    total = keys = 0
    with redis.connect() as connection:
        cursor = b"0"
        while True:
            reply = connection.command("SCAN", cursor, "MATCH", f"{prefix}*", "COUNT", 1000)
            assert isinstance(reply, list)
            cursor, batch = reply
            assert isinstance(cursor, bytes) and isinstance(batch, list)
            for key in batch:
                assert isinstance(key, bytes)
                usage = connection.command("MEMORY", "USAGE", key, "SAMPLES", 0)
                total += usage if isinstance(usage, int) else 0
                keys += 1
            if cursor == b"0":
                break
    return total / groups, keys / groups


async def counted_round_trips(
    judge: Child, redis: RedisServer, processes: int, requests: int, tokens: int, run: str
) -> tuple[float, int]:
    """Round trips to Redis per /verify for `processes` servers, through a counting relay."""
    relay = RoundRobinBalancer([("127.0.0.1", redis.port)])
    async with trio.open_nursery() as nursery:
        relay_port = await nursery.start(relay.serve)
        url = f"redis://127.0.0.1:{relay_port}/0"
        # Started in a thread: the servers talk to Redis through the relay while they start.
        deployment = await trio.to_thread.run_sync(
            start_deployment, f"counted-{processes}", judge, url, processes, run
        )
        try:
            await verify_round(deployment, redis, GROUP_SIZE * 4, GROUP_SIZE * 4, tokens)
            turns_0 = relay.turns
            result = await verify_round(deployment, redis, GROUP_SIZE * 16, requests, tokens)
            turns = relay.turns - turns_0
        finally:
            await trio.to_thread.run_sync(deployment.stop)
        nursery.cancel_scope.cancel()
    return turns / result.requests, result.errors


async def run(args: argparse.Namespace, judge: Child, redis: RedisServer) -> int:
    version = redis.info("server").get("redis_version", "?")
    print(__doc__.split("\n\n")[1].strip() if __doc__ else "", flush=True)
    print(f"\n{machine_line()}")
    print(
        f"Redis {version} ({redis.binary}), appendonly yes, appendfsync {args.appendfsync}; "
        f"{args.in_flight} /verify in flight; {args.requests} per round; {args.rounds} rounds",
        flush=True,
    )
    run_id = uuid.uuid4().hex[:6]
    deployments = {
        "memory-1": start_deployment("memory-1", judge, None, 1, run_id),
        "redis-1": start_deployment("redis-1", judge, redis.url, 1, run_id),
        "redis-2": start_deployment("redis-2", judge, redis.url, 2, run_id),
    }
    rounds: dict[str, list[Round]] = {name: [] for name in SETUPS}
    try:
        for name in SETUPS:  # warm-up, not reported
            await verify_round(deployments[name], redis, args.in_flight, args.in_flight, 256)
        for _ in range(args.rounds):
            for name in SETUPS:
                result = await verify_round(
                    deployments[name], redis, args.in_flight, args.requests, args.tokens
                )
                rounds[name].append(result)
                print(
                    f"{name:<9} {result.requests:>5} /verify {result.wall_s:6.2f} s "
                    f"{result.rate:6.1f}/s  server {result.server_ms:5.2f} ms CPU/verify  "
                    f"redis {1000 * result.redis_cpu_s / result.requests:4.2f} ms  "
                    f"group p50 {1000 * percentile(result.group_latencies_s, 0.5):5.0f} ms"
                    + (f"  ERRORS {result.errors}" if result.errors else ""),
                    flush=True,
                )
        prefix = deployments["redis-1"].prefix
        assert prefix is not None
        per_group, keys = bytes_per_group(redis, prefix, deployments["redis-1"].groups)
    finally:
        for deployment in deployments.values():
            deployment.stop()

    counted = {
        processes: await counted_round_trips(
            judge, redis, processes, args.counted_requests, args.tokens, run_id
        )
        for processes in (1, 2)
    }

    def median(name: str, value: str) -> float:
        return statistics.median(getattr(r, value) for r in rounds[name])

    base_rate, base_cpu = median("memory-1", "rate"), median("memory-1", "server_ms")
    rows = []
    for name in SETUPS:
        requests = sum(r.requests for r in rounds[name])
        commands: Counter[str] = Counter()
        for r in rounds[name]:
            commands.update(r.commands)
        processes = 2 if name.endswith("-2") else 1
        rows.append(
            [
                name,
                f"{median(name, 'rate'):.0f}",
                f"{median(name, 'rate') / base_rate:.2f}x",
                f"{median(name, 'server_ms'):.2f}",
                f"{median(name, 'server_ms') / base_cpu:.2f}x",
                f"{1000 * sum(r.redis_cpu_s for r in rounds[name]) / requests:.2f}",
                f"{1000 * sum(r.balancer_cpu_s for r in rounds[name]) / requests:.2f}",
                f"{sum(commands.values()) / requests:.1f}" if name != "memory-1" else "-",
                f"{counted[processes][0]:.1f}" if name != "memory-1" else "-",
            ]
        )
    print()
    print(
        table(
            [
                "set-up",
                "/verify per s",
                "vs memory-1",
                "server ms CPU/verify",
                "vs memory-1",
                "redis ms CPU/verify",
                "balancer ms CPU/verify",
                "redis commands/verify",
                "round trips/verify",
            ],
            rows,
        )
    )
    for name in ("redis-1", "redis-2"):
        commands = Counter[str]()
        for r in rounds[name]:
            commands.update(r.commands)
        requests = sum(r.requests for r in rounds[name])
        top = ", ".join(f"{cmd} {n / requests:.2f}" for cmd, n in commands.most_common(8))
        print(f"{name} commands per /verify: {top}")
    print(
        f"bytes kept in Redis per finished group of {GROUP_SIZE} (redis-1, "
        f"{deployments['redis-1'].groups} groups): {per_group:.0f} bytes in {keys:.2f} keys"
    )
    errors = sum(r.errors for runs in rounds.values() for r in runs)
    errors += sum(errs for _, errs in counted.values())
    print(f"wrong or failed rows: {errors}", flush=True)
    return 1 if errors else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--short", action="store_true", help="one short round (CI)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--requests", type=int, default=None, help="/verify per round")
    parser.add_argument("--in-flight", type=int, default=256, help="a multiple of 16")
    parser.add_argument("--tokens", type=int, default=256, help="generated tokens per body")
    parser.add_argument("--appendfsync", choices=["always", "everysec", "no"], default="everysec")
    args = parser.parse_args(argv)
    if args.in_flight % GROUP_SIZE:
        parser.error(f"--in-flight must be a multiple of {GROUP_SIZE}")
    args.rounds = args.rounds or (1 if args.short else 3)
    args.requests = args.requests or (1024 if args.short else 4096)
    args.counted_requests = 512 if args.short else 1024
    judge = start_fake_judge()
    try:
        with RedisServer(appendfsync=args.appendfsync) as redis:
            return trio.run(run, args, judge, redis)
    finally:
        judge.stop()


if __name__ == "__main__":
    sys.exit(main())
