"""Benchmark /verify throughput over real loopback HTTP through hypercorn, against the ceiling of
the same stack's bare echo endpoint measured in the same run (goal 2 in docs/performance.md).

Caveat: a 2-core machine. Three processes share the two cores: the server under test
(`genrm-trio serve`, hypercorn + quart-trio, one Trio thread), the fake judge (`genrm-trio
fake-judge`, zero latency) and this script, the load generator. Each echo ceiling (and each
extra server) is a process of its own, idle while another is measured. Throughput therefore
includes the judge's and the load generator's CPU competing with the server's; server CPU per
request is read from /proc/<pid>/stat (utime + stime, 10 ms ticks) before and after each round
and excludes both. Other work on the machine moves the figures: the rounds of each server
alternate and repeat, so compare ratios within a run, not one absolute number across runs.

Workload: every round keeps `--in-flight` requests (default 1,024) outstanding as groups of 16
posted at once, one keep-alive connection per request in flight. A group worker posts all 16
members of a fresh explicit group concurrently, waits for the 16 rows (they all come when the
group's last comparison is judged), checks them, and starts its next group. Circular pairing
with N = 16 makes one judge call per /verify. The echo ceiling is a quart-trio app on hypercorn
(with the server's own hypercorn settings) that decodes the same body with msgspec and writes it
back (`quart-echo`, the ceiling goal 2 names), and the same work as a bare ASGI callable
(`asgi-echo`, hypercorn and Trio alone); both are driven by the same number of connections,
each posting back to back.

    python benchmarks/bench_http.py            # 3 rounds per server of 16,384 requests each
    python benchmarks/bench_http.py --short    # 2 rounds per server of 4,096 requests each
    python benchmarks/bench_http.py --baseline-source DIR   # also a server from another tree
    python benchmarks/bench_http.py --variant wide:judge_max_concurrency=1024
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import trio
from _common import (
    Child,
    cpu_seconds,
    own_cpu_seconds,
    rss_bytes,
    start_child,
    start_fake_judge,
    start_server,
)

GROUP_SIZE = 16
ECHOES = ("quart-echo", "asgi-echo")
_GID = b"@@GROUP@@"
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]+)", re.IGNORECASE)
_RECEIVE = 1 << 16


# ---- processes ----------------------------------------------------------------------------------


# ---- the echo ceiling -----------------------------------------------------------------------


def serve_echo(kind: str) -> None:
    """An echo ceiling on hypercorn with `genrm-trio serve`'s hypercorn and garbage-collector
    settings (runs in a child).

    ``quart``: a quart-trio route that decodes the body with msgspec and writes it back (the
    ceiling of goal 2). ``asgi``: the same work as a bare ASGI callable, without Quart's request
    machinery; the floor that hypercorn itself sets.
    """
    from hypercorn.trio import serve
    from quart import Response, request
    from quart_trio import QuartTrio

    from genrm_trio.config import Config
    from genrm_trio.process_tuning import prepare_collector
    from genrm_trio.serve import hypercorn_settings

    decoder = msgspec.json.Decoder()
    encoder = msgspec.json.Encoder()
    quart_app = QuartTrio("echo")

    @quart_app.post("/echo")
    async def echo() -> Response:
        body = await request.get_data(cache=False, as_text=False)
        assert isinstance(body, bytes)
        return Response(
            encoder.encode(decoder.decode(body)), status=200, content_type="application/json"
        )

    async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        reply = encoder.encode(decoder.decode(b"".join(chunks)))
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(reply))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": reply})

    settings = hypercorn_settings(
        Config(judge_base_url="http://127.0.0.1:1/v1", judge_model="echo", port=0)
    )

    prepare_collector()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            app = quart_app if kind == "quart" else asgi_app
            binds = await nursery.start(serve, app, settings)
            print(f"echo listening on {binds[0]}", flush=True)

    trio.run(main)


# ---- bodies ---------------------------------------------------------------------------------


def verify_body_parts(slot: int, tokens: int) -> list[bytes]:
    """One member's /verify body, split where the group id goes."""
    prompt = "Explain, step by step, why the sum of two odd integers is always even. " * 3
    text = f"answer-{slot} 2a+1 plus 2b+1 is 2(a+b+1), which is even. [[q={1 + slot % 5}]]"
    body = {
        "responses_create_params": {
            "input": [{"role": "user", "content": prompt}],
            "temperature": 1.0,
            "max_output_tokens": 4096,
        },
        "response": {
            "id": f"resp-{_GID.decode()}-{slot}",
            "object": "response",
            "model": "policy",
            "output": [
                {
                    "type": "reasoning",
                    "id": f"rs-{slot}",
                    "summary": [{"type": "summary_text", "text": "Write both as 2k+1."}],
                },
                {
                    "type": "message",
                    "id": f"msg-{slot}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                },
            ],
            "prompt_token_ids": [(7 * k + slot) % 151_000 for k in range(tokens // 4)],
            "generation_token_ids": [(13 * k + slot) % 151_000 for k in range(tokens)],
            "generation_log_probs": [-((k * 37 + slot) % 1000) / 997.0 for k in range(tokens)],
        },
        "_ng_group_id": _GID.decode(),
        "_ng_group_attempt": 0,
        "_ng_rollout_index": slot,
        "_ng_task_index": 0,
        "instance_config": {"task": "parity"},
    }
    return msgspec.json.encode(body).split(_GID)


def http_request(path: str, port: int, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


# ---- the load generator -----------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 client connection; replies framed by Content-Length only.

    Like any keep-alive client it reopens a connection that the server closed while idle
    (hypercorn's keep-alive timeout) and sends the request again; ``reconnects`` counts that.
    """

    reconnects = 0

    def __init__(self, port: int) -> None:
        self.port = port
        self.stream: trio.SocketStream | None = None
        self.buffer = bytearray()

    async def open(self) -> None:
        self.stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        self.buffer.clear()

    async def post(self, request: bytes) -> tuple[int, bytes]:
        try:
            return await self._exchange(request)
        except (ConnectionError, trio.BrokenResourceError):
            if self.buffer:
                raise
        Connection.reconnects += 1
        await self.aclose()
        await self.open()
        return await self._exchange(request)

    async def _exchange(self, request: bytes) -> tuple[int, bytes]:
        assert self.stream is not None
        await self.stream.send_all(request)
        buffer = self.buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            await self._fill()
        head = bytes(buffer[:end])
        match = _CONTENT_LENGTH.search(head)
        if match is None:
            raise RuntimeError(f"reply without Content-Length: {head[:200]!r}")
        total = end + 4 + int(match.group(1))
        while len(buffer) < total:
            await self._fill()
        body = bytes(buffer[end + 4 : total])
        del buffer[:total]
        return int(head[9:12]), body

    async def _fill(self) -> None:
        assert self.stream is not None
        data = await self.stream.receive_some(_RECEIVE)
        if not data:
            raise ConnectionError("server closed the connection")
        self.buffer += data

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None


async def open_connections(port: int, count: int) -> list[Connection]:
    connections = [Connection(port) for _ in range(count)]
    limit = trio.CapacityLimiter(32)

    async def one(connection: Connection) -> None:
        async with limit:
            await connection.open()

    async with trio.open_nursery() as nursery:
        for connection in connections:
            nursery.start_soon(one, connection)
    return connections


async def close_connections(connections: list[Connection]) -> None:
    for connection in connections:
        await connection.aclose()


@dataclass
class Round:
    """One measured round: requests answered, wall time and each process's CPU."""

    kind: str
    requests: int
    wall_s: float
    server_cpu_s: float
    judge_cpu_s: float = 0.0
    loadgen_cpu_s: float = 0.0
    errors: int = 0
    masked: int = 0
    group_latencies_s: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.requests / self.wall_s

    @property
    def server_ms_per_request(self) -> float:
        return 1000 * self.server_cpu_s / self.requests


async def echo_round(kind: str, server: Child, in_flight: int, requests: int, tokens: int) -> Round:
    body = b"bench-echo".join(verify_body_parts(3, tokens))
    request = http_request("/echo", server.port, body)
    connections = await open_connections(server.port, in_flight)
    per_connection = requests // in_flight
    errors = 0

    async def worker(connection: Connection) -> None:
        nonlocal errors
        for _ in range(per_connection):
            status, reply = await connection.post(request)
            if status != 200 or len(reply) != len(body):
                errors += 1

    cpu_0, own_0, t_0 = cpu_seconds(server.pid), own_cpu_seconds(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for connection in connections:
            nursery.start_soon(worker, connection)
    wall = time.perf_counter() - t_0
    result = Round(
        kind,
        per_connection * in_flight,
        wall,
        cpu_seconds(server.pid) - cpu_0,
        loadgen_cpu_s=own_cpu_seconds() - own_0,
        errors=errors,
    )
    await close_connections(connections)
    return result


async def post_groups(
    port: int,
    connections: list[Connection],
    groups_per_worker: int,
    tokens: int,
    label: str,
    check: Callable[[int, int, bytes], None],
) -> list[float]:
    """Each 16 connections make a worker that posts `groups_per_worker` fresh groups one after
    another, all 16 members of a group at once; `check(slot, status, reply)` sees every reply.
    Returns the wall time of every group."""
    parts = [verify_body_parts(slot, tokens) for slot in range(GROUP_SIZE)]
    latencies: list[float] = []

    async def post(connection: Connection, slot: int, group_id: bytes) -> None:
        status, reply = await connection.post(
            http_request("/verify", port, group_id.join(parts[slot]))
        )
        check(slot, status, reply)

    async def worker(number: int, mine: list[Connection]) -> None:
        for k in range(groups_per_worker):
            group_id = f"{label}-{number}-{k}".encode()
            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for slot, connection in enumerate(mine):
                    nursery.start_soon(post, connection, slot, group_id)
            latencies.append(time.perf_counter() - started)

    async with trio.open_nursery() as nursery:
        for number in range(len(connections) // GROUP_SIZE):
            mine = connections[number * GROUP_SIZE : (number + 1) * GROUP_SIZE]
            nursery.start_soon(worker, number, mine)
    return latencies


async def verify_round(
    server: Child, judge: Child, in_flight: int, requests: int, tokens: int
) -> Round:
    workers = in_flight // GROUP_SIZE
    groups_per_worker = requests // (workers * GROUP_SIZE)
    connections = await open_connections(server.port, workers * GROUP_SIZE)
    errors = 0
    masked = 0

    def check(slot: int, status: int, reply: bytes) -> None:
        nonlocal errors, masked
        if status != 200 or b'"reward":' not in reply:
            errors += 1
        elif b'"mask_sample":true' in reply:
            masked += 1

    cpu_0, judge_0 = cpu_seconds(server.pid), cpu_seconds(judge.pid)
    own_0, t_0 = own_cpu_seconds(), time.perf_counter()
    label = f"bench-{uuid.uuid4().hex[:8]}"
    latencies = await post_groups(server.port, connections, groups_per_worker, tokens, label, check)
    wall = time.perf_counter() - t_0
    result = Round(
        "verify",
        groups_per_worker * workers * GROUP_SIZE,
        wall,
        cpu_seconds(server.pid) - cpu_0,
        judge_cpu_s=cpu_seconds(judge.pid) - judge_0,
        loadgen_cpu_s=own_cpu_seconds() - own_0,
        errors=errors,
        masked=masked,
        group_latencies_s=latencies,
    )
    await close_connections(connections)
    return result


async def single_group_latencies(server: Child, repeats: int, tokens: int) -> list[float]:
    """Wall time of one group of 16 posted at once on an otherwise idle server."""
    parts = [verify_body_parts(slot, tokens) for slot in range(GROUP_SIZE)]
    connections = await open_connections(server.port, GROUP_SIZE)
    run = uuid.uuid4().hex[:8]
    latencies: list[float] = []
    for k in range(repeats):
        group_id = f"single-{run}-{k}".encode()

        async def post(connection: Connection, slot: int, group_id: bytes = group_id) -> None:
            status, _ = await connection.post(
                http_request("/verify", server.port, group_id.join(parts[slot]))
            )
            if status != 200:
                raise RuntimeError(f"/verify answered {status}")

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for slot, connection in enumerate(connections):
                nursery.start_soon(post, connection, slot)
        latencies.append(time.perf_counter() - started)
    await close_connections(connections)
    return latencies


# ---- report -----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def describe(round_: Round) -> str:
    text = (
        f"{round_.kind:<10} {round_.requests:>6} req  {round_.wall_s:6.2f} s  "
        f"{round_.rate:7.1f} req/s  server {round_.server_ms_per_request:5.2f} ms CPU/req  "
        f"loadgen {1000 * round_.loadgen_cpu_s / round_.requests:4.2f} ms/req"
    )
    if round_.kind == "verify":
        text += f"  judge {1000 * round_.judge_cpu_s / round_.requests:4.2f} ms/req"
        text += (
            f"  group p50 {1000 * percentile(round_.group_latencies_s, 0.5):5.0f} ms"
            f" p99 {1000 * percentile(round_.group_latencies_s, 0.99):5.0f} ms"
        )
    if round_.errors or round_.masked:
        text += f"  ERRORS {round_.errors} masked {round_.masked}"
    return text


async def run(args: argparse.Namespace, children: dict[str, Child], judge: Child) -> int:
    kinds = args.kinds.split(",")
    body_size = len(b"x".join(verify_body_parts(0, args.tokens)))
    print(__doc__.split("\n\n")[1].strip() if __doc__ else "", flush=True)
    print(
        f"\n/verify body {body_size} bytes ({args.tokens} generated tokens); "
        f"{args.in_flight} in flight; {args.requests} requests per round; "
        f"server settings: {' '.join(args.set) or 'defaults'}",
        flush=True,
    )
    if args.baseline_source:
        print(f"verify-baseline: the server run from {args.baseline_source}", flush=True)
    for name, settings in args.variants.items():
        print(f"verify-{name}: the server with {' '.join(settings)}", flush=True)

    async def one_round(kind: str, requests: int) -> Round:
        child = children[kind]
        if kind.startswith("verify"):
            result = await verify_round(child, judge, args.in_flight, requests, args.tokens)
            result.kind = kind
            return result
        return await echo_round(kind, child, args.in_flight, requests, args.tokens)

    # Warm-up: imports, first connections and code paths; not reported.
    for kind in kinds:
        await one_round(kind, args.in_flight)
    rounds: dict[str, list[Round]] = {kind: [] for kind in kinds}
    for _ in range(args.rounds):
        for kind in kinds:
            rounds[kind].append(await one_round(kind, args.requests))
            print(describe(rounds[kind][-1]), flush=True)
    print()
    rates = {kind: statistics.median(r.rate for r in rounds[kind]) for kind in kinds}
    for kind in kinds:
        cpu = statistics.median(r.server_ms_per_request for r in rounds[kind])
        print(f"median {kind:<15} {rates[kind]:7.1f} req/s, {cpu:.2f} ms server CPU/req")
    for kind in kinds:
        if not kind.startswith("verify"):
            continue
        for other in kinds:
            if other != kind:
                print(f"{kind} is {rates[kind] / rates[other]:.0%} of {other} (req/s)")
        singles = await single_group_latencies(
            children[kind], 20 if args.short else 50, args.tokens
        )
        print(
            f"{kind}: one group of 16 alone: p50 {1000 * percentile(singles, 0.5):.1f} ms, "
            f"p90 {1000 * percentile(singles, 0.9):.1f} ms over {len(singles)} groups; "
            f"server RSS after the run {rss_bytes(children[kind].pid) / 2**20:.0f} MiB"
        )
    failures = sum(r.errors + r.masked for runs in rounds.values() for r in runs)
    print(
        f"errors and masked rows: {failures}; reconnects after idle closes: "
        f"{Connection.reconnects}",
        flush=True,
    )
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--short", action="store_true", help="fewer, shorter rounds (CI)")
    parser.add_argument("--rounds", type=int, default=None, help="echo and /verify rounds each")
    parser.add_argument("--requests", type=int, default=None, help="requests per round")
    parser.add_argument("--in-flight", type=int, default=1024, help="a multiple of 16")
    parser.add_argument("--tokens", type=int, default=256, help="generated tokens per body")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="server setting"
    )
    parser.add_argument(
        "--kinds",
        default=None,
        help="rounds to run, in order (default quart-echo,asgi-echo,verify[,verify-baseline])",
    )
    parser.add_argument(
        "--baseline-source",
        default=None,
        metavar="DIR",
        help="also run a server whose genrm_trio package is imported from DIR (verify-baseline)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="also run a server with these settings added (rounds named verify-NAME)",
    )
    parser.add_argument("--serve-echo", choices=["quart", "asgi"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.variants = {}
    for variant in args.variant:
        name, _, settings = variant.partition(":")
        args.variants[name] = [*args.set, *settings.split(",")]
    if args.serve_echo:
        serve_echo(args.serve_echo)
        return 0
    if args.in_flight % GROUP_SIZE:
        parser.error(f"--in-flight must be a multiple of {GROUP_SIZE}")
    if args.rounds is None:
        args.rounds = 2 if args.short else 3
    if args.requests is None:
        args.requests = 4096 if args.short else 16_384
    if args.kinds is None:
        args.kinds = ",".join(
            [
                *ECHOES,
                "verify",
                *(["verify-baseline"] if args.baseline_source else []),
                *(f"verify-{name}" for name in args.variants),
            ]
        )
    kinds = args.kinds.split(",")
    judge = start_fake_judge()
    children: dict[str, Child] = {}
    try:
        me = [sys.executable, str(Path(__file__).resolve()), "--serve-echo"]
        for kind in kinds:
            if kind in ECHOES:
                children[kind] = start_child([*me, kind.removesuffix("-echo")], "echo")
            elif kind == "verify":
                children[kind] = start_server(judge.url, GROUP_SIZE, args.set)
            elif kind == "verify-baseline" and args.baseline_source:
                children[kind] = start_server(
                    judge.url, GROUP_SIZE, args.set, source=args.baseline_source
                )
            elif kind.removeprefix("verify-") in args.variants:
                children[kind] = start_server(judge.url, GROUP_SIZE, args.variants[kind[7:]])
            else:
                parser.error(f"unknown round kind {kind!r}")
        return trio.run(run, args, children, judge)
    finally:
        for child in (*children.values(), judge):
            child.stop()


if __name__ == "__main__":
    sys.exit(main())
