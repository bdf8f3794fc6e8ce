"""Benchmark a trainer's burst: a whole step of /verify posted at once on fresh connections, against
the same step over keep-alive connections opened beforehand, measured in the same run.

The client behaves like NeMo Gym's agent: an aiohttp session (`ClientSession` with a
`TCPConnector` whose limit covers the whole step, a 15 s keep-alive expiry, TCP keep-alive on
every socket, no timeout, no cookies) and one task per rollout, all started at once. Fresh: a new
session per run, so every rollout opens its own connection. Keep-alive: the session first opens
as many connections as the step has rollouts (one GET /healthz each) before the clock starts.

Caveat: a 2-core machine. The server under test (`genrm-trio serve`, one Trio thread), the fake
judge (zero latency) and this script, the load generator, share the two cores, so the rate
includes the judge's and the load generator's CPU competing with the server's; each one's CPU is
reported on its own. Listen-queue overflows are the kernel's machine-wide counters
(TcpExtListenOverflows and TcpExtListenDrops in /proc/net/netstat) before and after each run:
another program overflowing a listen queue at the same time would show up here too. Compare
fresh against keep-alive within a run rather than absolute figures across runs.

Per run: rollouts answered 200 with a reward, errors by kind (exception class or HTTP status,
and masked rows), overflows, /verify per s (the step's rollouts over the time from the first
post to the last reply), the p50 and p99 of each reply's latency after its group's last member
was sent, server CPU per /verify (/proc/<pid>/stat), the server's peak RSS (VmHWM) and the load
generator's own CPU per /verify; and, sampled every 0.25 s while the step runs, the server's
resident memory at its highest, the most request-body bytes /healthz reported being received,
waiting in memory and waiting in spool files, and the resident memory once every reply is in.

    python benchmarks/bench_burst.py            # 1,024 / 4,096 / 8,192 rollouts of 1k tokens,
                                                # 1,024 of 16k and of 64k tokens
    python benchmarks/bench_burst.py --short    # 256 rollouts of 1k tokens
    python benchmarks/bench_burst.py --runs 8192x1024
    python benchmarks/bench_burst.py --runs 4096x1024 --baseline-source DIR   # another tree too
    python benchmarks/bench_burst.py --group-store redis --processes 1 2 4 \
        --runs 1024x1024 --runs 4096x1024 --runs 8192x1024
    python benchmarks/bench_burst.py --group-store redis --processes 2 4 --runs 1024x1024 \
        --judge-latency fixed:0.02 --set judge_max_concurrency=32 --baseline-source DIR

With `--group-store redis`, each step is posted at once on fresh connections to one server on the
in-memory store (the baseline) and then to K servers sharing one Redis (append-only file,
`--appendfsync`, default everysec) for each K of `--processes`: the members of each group
alternate between the K servers as a trainer behind a plain load balancer spreads them
(`--split client`), or all go through the round-robin TCP balancer (`--split balancer`, whose CPU
counts as the load generator's). Every reply's reward is checked against the one the fake judge's
qualities predict (under circular pairing a rollout's reward is its own quality, 1 + slot % 5),
and the judge's own count of calls against the step's required comparisons. Server CPU per
/verify adds up every server process; Redis CPU and commands per /verify come from
/proc/<pid>/stat and INFO commandstats before and after the step. Each step also reports the
judge calls each server made (its /healthz judge_attempts_total: the groups it evaluated) and
the most calls the fake judge had in flight at once. `--baseline-source DIR` runs the K servers
from another source tree too, `--judge-latency` gives the fake judge a latency and `--set` gives
every server a setting.

Needs aiohttp: `pip install -e '.[bench]'`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import socket
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from _common import (
    BodyShape,
    Child,
    cpu_seconds,
    machine_line,
    mib,
    own_cpu_seconds,
    parser,
    peak_rss_bytes,
    reset_peak_rss,
    rss_bytes,
    start_child,
    start_fake_judge,
    start_server,
    table,
    verify_body,
)

from genrm_trio.testing.redis_server import RedisServer

try:
    import aiohttp
except ImportError:  # pragma: no cover - reported to the user
    aiohttp = None

GROUP_SIZE = 16
PROMPT_TOKENS = 512
# The goal (docs/performance.md): at 8,192 fresh connections, zero errors, zero overflows and at
# least this many /verify per s.
GOAL_ROLLOUTS = 8192
GOAL_RATE = 600.0
# Only a hung run is cut off: a burst that does not finish in this long is reported, not waited.
RUN_LIMIT_S = 600.0
_PLACEHOLDER = "GROUP-PLACEHOLDER"


class _Reward(msgspec.Struct):
    """What the check reads of a row: msgspec skips the echoed rollout without building it, so
    checking a 64k-token reply costs the load generator little."""

    reward: float
    mask_sample: bool


_ROW = msgspec.json.Decoder(_Reward)
FULL_RUNS = ((1024, 1024), (4096, 1024), (8192, 1024), (1024, 16384), (1024, 65536))
SHORT_RUNS = ((256, 1024),)


# ---- the machine ---------------------------------------------------------------------------


def listen_counters() -> dict[str, int]:
    """TcpExt ListenOverflows and ListenDrops from /proc/net/netstat (machine-wide)."""
    with open("/proc/net/netstat", encoding="ascii") as netstat:
        lines = netstat.read().splitlines()
    counters: dict[str, int] = {}
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            for name, value in zip(names.split()[1:], values.split()[1:], strict=True):
                if name in ("ListenOverflows", "ListenDrops"):
                    counters[name] = int(value)
    return counters


def raise_own_file_limit() -> int:
    """Thousands of client sockets at once: the load generator needs its soft limit raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


def keepalive_socket(addr_info: Any) -> socket.socket:
    """Sockets as NeMo Gym's agent makes them: TCP keep-alive probes on every connection."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 5)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    return sock


def agent_session(limit: int, sent: dict[int, float]) -> Any:
    """A session as NeMo Gym's agent opens one; `sent` gets the moment each request's body was
    handed to the connection (keyed by the request's `trace_request_ctx`)."""
    assert aiohttp is not None

    async def chunk_sent(_session: Any, context: Any, _params: Any) -> None:
        index = context.trace_request_ctx
        if index is not None:
            sent[index] = time.perf_counter()

    tracing = aiohttp.TraceConfig()
    tracing.on_request_chunk_sent.append(chunk_sent)
    connector = aiohttp.TCPConnector(
        limit=limit,
        limit_per_host=limit,
        keepalive_timeout=15.0,
        socket_factory=keepalive_socket,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(),
        cookie_jar=aiohttp.DummyCookieJar(),
        trace_configs=[tracing],
    )


# ---- bodies --------------------------------------------------------------------------------


def step_bodies(rollouts: int, tokens: int, run: str) -> list[tuple[int, int, bytes]]:
    """(group, slot, body) for a whole step: 16 members per group, each group's own id."""
    shape = BodyShape(generated_tokens=tokens, prompt_tokens=PROMPT_TOKENS)
    templates = [
        verify_body(shape, seed=0, group_id=_PLACEHOLDER, slot=slot).split(_PLACEHOLDER.encode())
        for slot in range(GROUP_SIZE)
    ]
    bodies = []
    for group in range(rollouts // GROUP_SIZE):
        gid = f"{run}-{group:05d}".encode()
        for slot in range(GROUP_SIZE):
            bodies.append((group, slot, gid.join(templates[slot])))
    return bodies


# ---- one run -------------------------------------------------------------------------------


@dataclass
class Result:
    mode: str
    rollouts: int
    tokens: int
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    overflows: int = 0
    drops: int = 0
    wall_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    server_cpu_s: float = 0.0
    judge_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    peak_rss: int = 0
    setup: str = "memory x1"
    digests: dict[int, bytes] = field(default_factory=dict)
    worker_peak_rss: int = 0
    redis_cpu_s: float = 0.0
    redis_commands: int = 0
    judge_calls: int = 0
    # Sampled while the step runs: the servers' resident memory (summed) at its highest, the
    # most body bytes being received, waiting in memory and spooled (summed over servers), and
    # the resident memory once every reply is in.
    sampled_rss: int = 0
    body_split: tuple[int, int, int] = (0, 0, 0)
    rss_after: int = 0
    judge_peak: int = 0  # the most judge calls the fake judge had in flight at once
    judge_calls_by_server: list[int] = field(default_factory=list)
    cpu_by_server: list[float] = field(default_factory=list)
    budget_exchanges: int = 0  # exchanges with the shared judge budget (HGETALL, one each)

    @property
    def rate(self) -> float:
        return self.rollouts / self.wall_s if self.wall_s > 0 else 0.0


async def burst(
    server: Child,
    judge: Child,
    bodies: list[tuple[int, int, bytes]],
    *,
    keep_alive: bool,
    result: Result,
    others: Sequence[Child] = (),
    redis: RedisServer | None = None,
    front: Child | None = None,
    process_pids: Sequence[int] = (),
    redis_pid: int | None = None,
    keep_digests: bool = False,
) -> None:
    """Post every body at once and fill `result` with the replies, their latencies and the CPU
    each process spent meanwhile (keep-alive connections are opened before any of it counts).
    With `others`, request i goes to server i mod (1 + len(others)): a group's members alternate
    between the servers; with `front` (a balancer), every request goes there instead. Every reward
    is checked against the one the fake judge predicts."""
    assert aiohttp is not None
    sent: dict[int, float] = {}
    done: dict[int, float] = {}
    group_of: dict[int, int] = {}
    servers = [server, *others]
    urls = [child.url.rstrip("/") for child in ([front] if front else servers)]
    url = urls[0]
    async with agent_session(len(bodies), sent) as session:
        if keep_alive:
            # Open one connection per rollout before the clock starts.
            async def warm() -> None:
                async with session.get(f"{url}/healthz") as reply:
                    await reply.read()

            await asyncio.gather(*(warm() for _ in bodies))

        async def post(index: int, group: int, slot: int, payload: bytes) -> None:
            group_of[index] = group
            try:
                async with session.post(
                    f"{urls[index % len(urls)]}/verify",
                    data=payload,
                    headers={"content-type": "application/json"},
                    trace_request_ctx=index,
                ) as reply:
                    text = await reply.read()
                    done[index] = time.perf_counter()
                    if keep_digests:
                        result.digests[index] = hashlib.blake2b(text, digest_size=16).digest()
                    if reply.status != 200:
                        result.errors[f"HTTP {reply.status}"] += 1
                    elif b'"mask_sample":false' not in text:
                        result.errors["masked row"] += 1
                    elif _ROW.decode(text).reward != expected_reward(slot):
                        result.errors["wrong reward"] += 1
                    else:
                        result.ok += 1
            except Exception as exc:
                result.errors[type(exc).__name__] += 1

        # `process_pids`: the processes of one `serve --workers` (parent and workers) instead.
        pids = list(process_pids) or [child.pid for child in servers]
        if redis is not None and redis.pid:
            redis_pid = redis.pid
        for pid in pids:
            reset_peak_rss(pid)
        cpu_each = [cpu_seconds(pid) for pid in pids]
        exchanges = command_calls(redis, "hgetall") if redis is not None else 0
        judge_cpu = cpu_seconds(judge.pid)
        reset_judge(judge)  # its peak of calls in flight counts from here
        calls_before = judge_calls(judge)
        server_calls = [judge_attempts(child) for child in servers]
        redis_cpu = cpu_seconds(redis_pid) if redis_pid is not None else 0.0
        commands = redis_command_calls(redis) if redis is not None else 0
        client_cpu = own_cpu_seconds()
        before = listen_counters()
        started = time.perf_counter()
        tasks = [
            asyncio.create_task(post(index, group, slot, payload))
            for index, (group, slot, payload) in enumerate(bodies)
        ]
        health_urls = [child.url.rstrip("/") for child in servers]
        sampler = asyncio.create_task(sample_memory(pids, health_urls, result))
        _, pending = await asyncio.wait(tasks, timeout=RUN_LIMIT_S)
        sampler.cancel()
        for task in pending:
            task.cancel()
        if pending:
            result.errors["no reply within the run limit"] += len(pending)
        result.wall_s = time.perf_counter() - started
        after = listen_counters()
        result.client_cpu_s = own_cpu_seconds() - client_cpu
        result.cpu_by_server = [cpu_seconds(pid) - b for pid, b in zip(pids, cpu_each, strict=True)]
        result.server_cpu_s = sum(result.cpu_by_server)
        if redis is not None:
            result.budget_exchanges = command_calls(redis, "hgetall") - exchanges
        result.judge_cpu_s = cpu_seconds(judge.pid) - judge_cpu
        result.judge_calls = judge_calls(judge) - calls_before
        result.judge_peak = judge_stats(judge)["max_in_flight"]
        if not process_pids:
            result.judge_calls_by_server = [
                judge_attempts(child) - before
                for child, before in zip(servers, server_calls, strict=True)
            ]
        if redis_pid is not None:
            result.redis_cpu_s = cpu_seconds(redis_pid) - redis_cpu
        if redis is not None:
            result.redis_commands = redis_command_calls(redis) - commands
        result.peak_rss = max(peak_rss_bytes(pid) for pid in pids)
        result.rss_after = sum(rss_bytes(pid) for pid in pids)
    result.overflows = after.get("ListenOverflows", 0) - before.get("ListenOverflows", 0)
    result.drops = after.get("ListenDrops", 0) - before.get("ListenDrops", 0)
    # A group's last member arrived when the last of its bodies was written (the server cannot
    # answer any member before that); each reply's latency is counted from there.
    group_sent: dict[int, float] = {}
    for index, moment in sent.items():
        group = group_of[index]
        group_sent[group] = max(group_sent.get(group, moment), moment)
    result.latencies = [
        done[i] - group_sent[group_of[i]] for i in done if group_of[i] in group_sent
    ]


SAMPLE_EVERY_S = 0.25


async def sample_memory(pids: Sequence[int], health_urls: Sequence[str], result: Result) -> None:
    """Until cancelled: the servers' resident memory and /healthz's body bytes, highest seen."""
    receiving = in_memory = spooled = 0
    while True:
        result.sampled_rss = max(result.sampled_rss, sum(rss_bytes(pid) for pid in pids))
        try:
            counts = await asyncio.gather(*(health_counts(url) for url in health_urls))
        except OSError:
            # A server too busy to accept one more connection is skipped for this sample.
            await asyncio.sleep(SAMPLE_EVERY_S)
            continue
        receiving = max(receiving, sum(c.get("body_bytes_receiving", 0) for c in counts))
        in_memory = max(in_memory, sum(c.get("body_bytes_in_memory", 0) for c in counts))
        spooled = max(spooled, sum(c.get("body_bytes_spooled", 0) for c in counts))
        result.body_split = (receiving, in_memory, spooled)
        await asyncio.sleep(SAMPLE_EVERY_S)


async def health_counts(url: str) -> dict[str, Any]:
    """/healthz of one server, read on a connection of its own (not the step's session)."""
    reader, writer = await asyncio.open_connection(*url.removeprefix("http://").split(":"))
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: s\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        counts: dict[str, Any] = json.loads(await reader.readexactly(length))
    finally:
        writer.close()
    return counts


def judge_passes(settings: Sequence[str]) -> int:
    """num_judges_per_comparison among the servers' settings (1 unless set)."""
    passes = 1
    for setting in settings:
        key, _, value = setting.partition("=")
        if key == "num_judges_per_comparison":
            passes = int(value)
    return passes


def expected_reward(slot: int) -> float:
    """The bodies give slot k the quality 1 + k % 5; circular pairing with the fake judge makes
    that the reward (CL-13)."""
    return float(1 + slot % 5)


def judge_stats(judge: Child) -> dict[str, Any]:
    """The fake judge's statistics (calls served, in flight, the most in flight at once)."""
    base = judge.url.rstrip("/").removesuffix("/v1")
    with urllib.request.urlopen(f"{base}/_fake/stats", timeout=30) as reply:
        stats: dict[str, Any] = json.loads(reply.read())
        return stats


def judge_calls(judge: Child) -> int:
    """The fake judge's count of the calls it has served so far."""
    return int(judge_stats(judge)["requests_total"])


def reset_judge(judge: Child) -> None:
    base = judge.url.rstrip("/").removesuffix("/v1")
    request = urllib.request.Request(f"{base}/_fake/reset", method="POST")
    with urllib.request.urlopen(request, timeout=30) as reply:
        reply.read()


def judge_attempts(server: Child) -> int:
    """The judge calls a server has started (its /healthz judge_attempts_total)."""
    with urllib.request.urlopen(f"{server.url.rstrip('/')}/healthz", timeout=30) as reply:
        return int(json.loads(reply.read())["judge_attempts_total"])


def command_calls(redis: RedisServer, command: str) -> int:
    """How many times Redis has run one command so far (scripts' commands included)."""
    stats = redis.info("commandstats").get(f"cmdstat_{command}")
    if stats is None:
        return 0
    return int(dict(part.split("=", 1) for part in stats.split(","))["calls"])


def redis_command_calls(redis: RedisServer) -> int:
    """Commands Redis has run so far (INFO commandstats), the INFO call that reads them excluded."""
    total = 0
    for value in redis.info("commandstats").values():
        fields = dict(part.split("=", 1) for part in value.split(","))
        total += int(fields["calls"])
    return total - 1


def run_store(
    judge: Child,
    redis: RedisServer | None,
    rollouts: int,
    tokens: int,
    *,
    processes: int,
    split: str,
    tag: str,
    replay: bool = False,
    settings: Sequence[str] = (),
    source: str | None = None,
) -> list[Result]:
    """One step posted at once on fresh connections to `processes` servers on one store; with
    `replay`, every server is then SIGKILLed, started again on the same store, and the whole step
    posted again: each reply must be byte for byte the first one, with no judge call. `source`
    runs the servers from another source tree (the set-up is then marked "baseline")."""
    store = "memory" if redis is None else "redis"
    setup = f"{store} x{processes}" + (f" ({split})" if processes > 1 else "")
    if source is not None:
        setup += " baseline"
    bodies = step_bodies(rollouts, tokens, f"{tag}-{store}-{processes}-{split}-{bool(source)}")
    sets = list(settings)
    if redis is not None:
        prefix = f"burst.{tag}.{processes}.{'b' if source else 'n'}."
        sets += [f"group_store={redis.url}", f"group_store_key_prefix={prefix}"]
    results = []
    first: dict[int, bytes] | None = None
    for label in ("", " replayed") if replay and redis is not None else ("",):
        result = Result("fresh", rollouts, tokens, setup=setup + label)
        servers = [
            start_server(judge.url, GROUP_SIZE, sets, source=source) for _ in range(processes)
        ]
        balancer = None
        try:
            if split == "balancer" and processes > 1:
                backends = [
                    a for server in servers for a in ("--backend", f"127.0.0.1:{server.port}")
                ]
                balancer = start_child(
                    [
                        sys.executable,
                        "-m",
                        "genrm_trio.testing._balancer",
                        "--port",
                        "0",
                        *backends,
                    ],
                    "balancer listening on",
                )
            asyncio.run(
                burst(
                    servers[0],
                    judge,
                    bodies,
                    keep_alive=False,
                    result=result,
                    others=servers[1:],
                    redis=redis,
                    front=balancer,
                    keep_digests=replay,
                )
            )
        finally:
            if first is None and replay:
                for child in servers:
                    child.process.kill()  # SIGKILL: nothing is cleaned up
            for child in (*servers, *([balancer] if balancer else [])):
                child.stop()
        if first is None:
            first = result.digests
            # Circular pairing: one comparison per rollout, judged once per judge pass.
            required = rollouts * judge_passes(sets)
            if result.judge_calls != required:
                result.errors[f"judge calls {result.judge_calls} for {required} comparisons"] += 1
        else:
            differ = sum(1 for i, d in result.digests.items() if first.get(i) != d)
            if differ:
                result.errors["row not byte-identical to the first answer"] += differ
            if result.judge_calls:
                result.errors[f"judge calls {result.judge_calls} on replay"] += 1
        results.append(result)
    return results


def process_children(pid: int) -> list[int]:
    """Every child of `pid`, whichever of its threads started it."""
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as listing:
            found += [int(child) for child in listing.read().split()]
    return found


def is_store_server(pid: int) -> bool:
    # The executable, not the command line: Redis rewrites its process title.
    return os.path.basename(os.readlink(f"/proc/{pid}/exe")) in ("redis-server", "valkey-server")


def run_workers(judge: Child, rollouts: int, tokens: int, *, workers: int, tag: str) -> Result:
    """One step posted at once on fresh connections to `serve --workers K` (its own store)."""
    result = Result("fresh", rollouts, tokens, setup=f"--workers {workers}")
    bodies = step_bodies(rollouts, tokens, f"{tag}-workers-{workers}")
    server = start_server(judge.url, GROUP_SIZE, (), "--workers", str(workers))
    try:
        children = process_children(server.pid)
        stores = [pid for pid in children if is_store_server(pid)]
        workers_pids = [pid for pid in children if pid not in stores]
        asyncio.run(
            burst(
                server,
                judge,
                bodies,
                keep_alive=False,
                result=result,
                # One worker: the process itself serves. More: the parent only supervises.
                process_pids=[server.pid, *workers_pids],
                redis_pid=stores[0] if stores else None,
            )
        )
        result.worker_peak_rss = max(
            (peak_rss_bytes(pid) for pid in workers_pids), default=result.peak_rss
        )
    finally:
        server.stop()
    if result.judge_calls != rollouts:
        result.errors[f"judge calls {result.judge_calls} for {rollouts} comparisons"] += 1
    return result


WORKER_HEADERS = [
    "set-up",
    "rollouts",
    "tokens",
    "200 rows",
    "errors",
    "/verify per s",
    "vs --workers 1",
    "p99 ms",
    "server CPU ms per /verify",
    "Redis CPU ms per /verify",
    "judge calls",
    "peak RSS per worker MiB",
    "client CPU ms per /verify",
]


def worker_row(result: Result, baseline: Result) -> list[str]:
    per = 1e3 / max(result.rollouts, 1)
    return [
        *compared_cells(result, baseline),
        f"{result.judge_calls:,}",
        mib(result.worker_peak_rss),
        f"{result.client_cpu_s * per:.2f}",
    ]


def workers_runs(args: argparse.Namespace, runs: list[tuple[int, int]]) -> int:
    """Each step against `serve --workers K` for each K, in the same run."""
    judge = start_fake_judge()
    rows: list[list[str]] = []
    try:
        for number, (rollouts, tokens) in enumerate(runs):
            baseline: Result | None = None
            for workers in args.workers:
                result = run_workers(judge, rollouts, tokens, workers=workers, tag=f"r{number}")
                baseline = baseline or result
                rows.append(worker_row(result, baseline))
                print(table(WORKER_HEADERS, [rows[-1]]).splitlines()[-1], flush=True)
    finally:
        judge.stop()
    print()
    print(table(WORKER_HEADERS, rows))
    print(f"load average after the runs: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


def run_one(
    judge: Child,
    rollouts: int,
    tokens: int,
    *,
    keep_alive: bool,
    tag: str,
    source: str | None = None,
) -> Result:
    mode = ("keep-alive" if keep_alive else "fresh") + (" (baseline)" if source else "")
    result = Result(mode, rollouts, tokens)
    bodies = step_bodies(rollouts, tokens, f"{tag}-{mode.split()[0]}-{bool(source)}")
    server = start_server(judge.url, GROUP_SIZE, source=source)
    try:
        asyncio.run(burst(server, judge, bodies, keep_alive=keep_alive, result=result))
    finally:
        server.stop()
    return result


# ---- report --------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(result: Result) -> list[str]:
    errors = ", ".join(f"{kind}: {count}" for kind, count in result.errors.most_common()) or "0"
    per = 1e3 / max(result.rollouts, 1)
    return [
        result.mode,
        f"{result.rollouts:,}",
        f"{result.tokens // 1024}k",
        f"{result.ok:,}",
        errors,
        f"{result.overflows} / {result.drops}",
        f"{result.rate:,.0f}",
        f"{percentile(result.latencies, 0.5) * 1e3:,.0f}",
        f"{percentile(result.latencies, 0.99) * 1e3:,.0f}",
        f"{result.server_cpu_s * per:.2f}",
        mib(result.peak_rss),
        mib(result.sampled_rss),
        " / ".join(mib(part) for part in result.body_split),
        mib(result.rss_after),
        f"{result.client_cpu_s * per:.2f}",
        f"{result.judge_cpu_s * per:.2f}",
    ]


HEADERS = [
    "connections",
    "rollouts",
    "tokens",
    "200 rows",
    "errors",
    "overflows / drops",
    "/verify per s",
    "p50 ms",
    "p99 ms",
    "server CPU ms per /verify",
    "server peak RSS MiB",
    "RSS while waiting MiB",
    "most bytes receiving / in memory / spooled MiB",
    "RSS after MiB",
    "client CPU ms per /verify",
    "judge CPU ms per /verify",
]


def parse_runs(texts: Sequence[str]) -> list[tuple[int, int]]:
    runs = []
    for text in texts:
        rollouts, _, tokens = text.partition("x")
        runs.append((int(rollouts), int(tokens)))
    return runs


STORE_HEADERS = [
    "set-up",
    "rollouts",
    "tokens",
    "200 rows",
    "errors",
    "/verify per s",
    "vs memory",
    "p99 ms",
    "server CPU ms per /verify",
    "Redis CPU ms per /verify",
    "Redis commands per /verify",
    "judge calls",
    "judge calls per server",
    "server CPU s each",
    "judge budget exchanges per judge call",
    "judge peak in flight",
    "peak RSS per server MiB",
]


def compared_cells(result: Result, baseline: Result) -> list[str]:
    """The columns the store and worker tables share, the rate against `baseline`'s."""
    errors = ", ".join(f"{kind}: {count}" for kind, count in result.errors.most_common()) or "0"
    per = 1e3 / max(result.rollouts, 1)
    return [
        result.setup,
        f"{result.rollouts:,}",
        f"{result.tokens // 1024}k",
        f"{result.ok:,}",
        errors,
        f"{result.rate:,.0f}",
        f"{result.rate / baseline.rate:.2f}x" if baseline.rate > 0 else "-",
        f"{percentile(result.latencies, 0.99) * 1e3:,.0f}",
        f"{result.server_cpu_s * per:.2f}",
        f"{result.redis_cpu_s * per:.2f}",
    ]


def store_row(result: Result, baseline: Result) -> list[str]:
    return [
        *compared_cells(result, baseline),
        f"{result.redis_commands / max(result.rollouts, 1):.1f}",
        f"{result.judge_calls:,}",
        " / ".join(f"{calls:,}" for calls in result.judge_calls_by_server),
        " / ".join(f"{cpu:.2f}" for cpu in result.cpu_by_server),
        f"{result.budget_exchanges / max(result.judge_calls, 1):.2f}",
        f"{result.judge_peak:,}",
        mib(result.peak_rss),
    ]


def store_runs(args: argparse.Namespace, runs: list[tuple[int, int]]) -> int:
    """Each step on the memory store, then on K servers sharing one Redis (and from the
    baseline source tree too, if given), in the same run."""
    judge = start_fake_judge(*judge_arguments(args))
    redis = RedisServer(appendfsync=args.appendfsync)
    redis.start()
    print(f"Redis {redis.info('server').get('redis_version', '?')}, appendfsync {args.appendfsync}")
    rows: list[list[str]] = []
    try:
        for number, (rollouts, tokens) in enumerate(runs):
            (baseline,) = run_store(
                judge,
                None,
                rollouts,
                tokens,
                processes=1,
                split="client",
                tag=f"r{number}",
                settings=args.set,
            )
            rows.append(store_row(baseline, baseline))
            print(table(STORE_HEADERS, [rows[-1]]).splitlines()[-1], flush=True)
            for processes in args.processes:
                for source in (None, args.baseline_source) if args.baseline_source else (None,):
                    for result in run_store(
                        judge,
                        redis,
                        rollouts,
                        tokens,
                        processes=processes,
                        split=args.split,
                        tag=f"r{number}",
                        replay=args.replay,
                        settings=args.set,
                        source=source,
                    ):
                        rows.append(store_row(result, baseline))
                        print(table(STORE_HEADERS, [rows[-1]]).splitlines()[-1], flush=True)
    finally:
        judge.stop()
        redis.close()
    print()
    print(table(STORE_HEADERS, rows))
    print(f"load average after the runs: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


def judge_arguments(args: argparse.Namespace) -> list[str]:
    return [] if args.judge_latency is None else ["--latency", args.judge_latency]


def main(argv: Sequence[str] | None = None) -> int:
    args_parser = parser(__doc__.splitlines()[0] if __doc__ else "")
    args_parser.add_argument(
        "--runs",
        action="append",
        default=[],
        metavar="ROLLOUTSxTOKENS",
        help="a step size and body size to run (repeatable), e.g. 8192x1024",
    )
    args_parser.add_argument(
        "--baseline-source",
        metavar="DIR",
        help="also run each fresh-connection burst (with --group-store redis, the K servers) "
        "against the server of another source tree",
    )
    args_parser.add_argument(
        "--group-store",
        choices=("memory", "redis"),
        default="memory",
        help="redis: each step on the memory store and on K servers sharing one Redis",
    )
    args_parser.add_argument(
        "--processes",
        type=int,
        nargs="+",
        default=[1],
        metavar="K",
        help="server counts sharing the Redis store (with --group-store redis)",
    )
    args_parser.add_argument(
        "--split",
        choices=("client", "balancer"),
        default="client",
        help="how a group's members reach K servers: alternating by the client, or through "
        "the round-robin TCP balancer",
    )
    args_parser.add_argument(
        "--appendfsync", choices=("always", "everysec", "no"), default="everysec"
    )
    args_parser.add_argument(
        "--replay",
        action="store_true",
        help="after each Redis step, SIGKILL the servers, start them again and post the whole "
        "step again: every row must come back byte-identical with no judge call",
    )
    args_parser.add_argument(
        "--judge-latency",
        metavar="SPEC",
        help="the fake judge's --latency (default: none), e.g. fixed:0.02",
    )
    args_parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for every server (repeatable), e.g. judge_max_concurrency=32",
    )
    args_parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        metavar="K",
        help="run each step against `serve --workers K` for each K (the first is the baseline)",
    )
    args = args_parser.parse_args(argv)
    if aiohttp is None:
        print("bench_burst needs aiohttp: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    runs = parse_runs(args.runs) if args.runs else list(SHORT_RUNS if args.short else FULL_RUNS)
    limit = raise_own_file_limit()
    print(machine_line())
    print(f"load generator: aiohttp {aiohttp.__version__}, open-file limit {limit}")
    if args.group_store == "redis":
        return store_runs(args, runs)
    if args.workers:
        return workers_runs(args, runs)
    judge = start_fake_judge()
    results: list[tuple[Result, Result]] = []
    baselines: list[Result] = []
    try:
        for number, (rollouts, tokens) in enumerate(runs):
            pair = []
            for keep_alive in (True, False):
                result = run_one(judge, rollouts, tokens, keep_alive=keep_alive, tag=f"r{number}")
                print(table(HEADERS, [row(result)]).splitlines()[-1], flush=True)
                pair.append(result)
            results.append((pair[0], pair[1]))
            if args.baseline_source:
                result = run_one(
                    judge,
                    rollouts,
                    tokens,
                    keep_alive=False,
                    tag=f"r{number}",
                    source=args.baseline_source,
                )
                print(table(HEADERS, [row(result)]).splitlines()[-1], flush=True)
                baselines.append(result)
    finally:
        judge.stop()
    print()
    print(
        table(
            HEADERS,
            [row(result) for pair in results for result in pair]
            + [row(result) for result in baselines],
        )
    )
    print()
    for kept, fresh in results:
        print(
            f"{fresh.rollouts:,} rollouts of {fresh.tokens // 1024}k tokens: fresh connections "
            f"reach {fresh.rate / kept.rate:.2f}x the keep-alive rate"
            if kept.rate > 0
            else "keep-alive run failed"
        )
    for _, fresh in results:
        if fresh.rollouts == GOAL_ROLLOUTS:
            met = not fresh.errors and fresh.overflows == 0 and fresh.rate >= GOAL_RATE
            print(
                f"goal at {GOAL_ROLLOUTS:,} fresh connections (0 errors, 0 overflows, "
                f">= {GOAL_RATE:.0f} /verify per s): {'met' if met else 'NOT met'}"
            )
    print(f"load average after the runs: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
