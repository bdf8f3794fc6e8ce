"""Memory of answers waiting at a blocked judge (goal 3 in docs/performance.md): peak and current
resident memory of the server process, and the bytes it holds per waiting answer against the body
size.

Caveat: Linux only (/proc). Two processes besides this one: `genrm-trio serve` (the server under
test, as deployed: hypercorn, one Trio thread, default settings but group size 16) and
`genrm-trio fake-judge` with one rule, `hang`, so that no comparison ever finishes. This script
opens one TCP connection per answer, posts every member of every group and waits until the
server's CPU has gone idle with all groups active; then every answer is parked in the server,
its reply pending. Peak RSS is the server's VmHWM since it started, so it includes parsing
transients; the idle figure is read after one warm-up group (a different group size would not
change it). "Held per answer" is (RSS with all answers waiting - idle RSS) / answers: what the
server keeps per waiting answer, including the request's own body (the reply must echo it byte
for byte, W-21), hypercorn's and Quart's per-request objects and allocator slack. Bodies are
written by Python's json.dumps like the ones bench_request_cpu.py times (log-probs with 16-17
significant digits).

    python benchmarks/bench_memory.py            # 512 x 8,192 tokens, then 2,048 x 16,384
    python benchmarks/bench_memory.py --short    # 256 x 8,192, then 256 x 16,384
"""

from __future__ import annotations

import json
import os
import select
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BodyShape,
    Child,
    cpu_seconds,
    gib,
    machine_line,
    parser,
    peak_rss_bytes,
    rss_bytes,
    start_fake_judge,
    start_server,
    table,
    verify_body,
)

GROUP_SIZE = 16
_GID = "@@GROUP@@"


@dataclass(frozen=True)
class Scenario:
    answers: int
    generated_tokens: int
    target_gib: float | None

    @property
    def shape(self) -> BodyShape:
        # Prompts a quarter as long as the answers, as in bench_request_cpu.py.
        return BodyShape(
            generated_tokens=self.generated_tokens, prompt_tokens=self.generated_tokens // 4
        )


@dataclass(frozen=True)
class Result:
    scenario: Scenario
    body_bytes: float
    idle_rss: int
    loaded_rss: int
    peak_rss: int

    @property
    def held_per_answer(self) -> float:
        return (self.loaded_rss - self.idle_rss) / self.scenario.answers


def body_templates(shape: BodyShape) -> list[tuple[bytes, bytes]]:
    """Each slot's body, split where the group id goes (its token arrays differ by slot)."""
    templates = []
    for slot in range(GROUP_SIZE):
        body = verify_body(shape, seed=slot, group_id=_GID, slot=slot)
        # Every group shares one prompt, so the seed of the prompt must not vary by slot.
        prompt = verify_body(shape, seed=0, group_id=_GID, slot=slot)
        body = prompt[: prompt.index(b'"response"')] + body[body.index(b'"response"') :]
        head, tail = body.split(_GID.encode())
        templates.append((head, tail))
    return templates


async def post_and_park(port: int, request: bytes) -> trio.SocketStream:
    """Send one request and return its connection with the reply left unread."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request)
    return stream


def http_request(port: int, body: bytes) -> bytes:
    head = (
        f"POST /verify HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def answered(streams: Sequence[trio.SocketStream]) -> int:
    """How many of the connections have a reply (or a close) waiting to be read."""
    poller = select.poll()
    for stream in streams:
        poller.register(stream.socket.fileno(), select.POLLIN)
    return len(poller.poll(0))


async def health(client: httpx.AsyncClient) -> dict[str, int]:
    reply = await client.get("/healthz")
    counts: dict[str, int] = reply.json()
    return counts


async def settle(server: Child, client: httpx.AsyncClient, groups: int) -> None:
    """Wait until every group is active and the server has stopped spending CPU."""
    last = cpu_seconds(server.pid)
    while True:
        await trio.sleep(1.0)
        now = cpu_seconds(server.pid)
        counts = await health(client)
        if counts["active_groups"] >= groups and now - last < 0.02:
            return
        last = now


async def measure(scenario: Scenario, judge_url: str, round_name: str) -> Result:
    server = start_server(judge_url, GROUP_SIZE, (), "--log-level", "ERROR")
    streams: list[trio.SocketStream] = []
    try:
        templates = body_templates(scenario.shape)
        sizes = [len(head) + len(tail) + len(f"{round_name}-0") for head, tail in templates]
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            # One warm-up group loads every code path (and its imports) before the idle figure.
            warm = f"{round_name}-warm".encode()
            for head, tail in templates:
                request = http_request(server.port, head + warm + tail)
                streams.append(await post_and_park(server.port, request))
            await settle(server, client, 1)
            idle = rss_bytes(server.pid)
            limit = trio.CapacityLimiter(64)

            async def one(group: int, slot: int) -> None:
                head, tail = templates[slot]
                body = head + f"{round_name}-{group}".encode() + tail
                async with limit:
                    streams.append(
                        await post_and_park(server.port, http_request(server.port, body))
                    )

            groups = scenario.answers // GROUP_SIZE
            async with trio.open_nursery() as nursery:
                for group in range(groups):
                    for slot in range(GROUP_SIZE):
                        nursery.start_soon(one, group, slot)
            await settle(server, client, groups + 1)
            loaded = rss_bytes(server.pid)
            peak = peak_rss_bytes(server.pid)
            if early := answered(streams):
                # A reply (a 409 or 503, say) would free its request and flatter the figures.
                raise RuntimeError(f"{early} answers were not waiting when measured")
        return Result(scenario, sum(sizes) / len(sizes), idle, loaded, peak)
    finally:
        for stream in streams:
            await stream.aclose()
        server.stop()


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    if args.short:
        scenarios = [Scenario(256, 8_192, None), Scenario(256, 16_384, None)]
    else:
        scenarios = [Scenario(512, 8_192, 0.25), Scenario(2_048, 16_384, 1.2)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as rules:
        json.dump([{"action": "hang"}], rules)
    judge = start_fake_judge("--rules", rules.name)
    results = []
    try:
        for index, scenario in enumerate(scenarios):
            started = time.monotonic()
            results.append(trio.run(measure, scenario, judge.url, f"r{index}"))
            print(
                f"  measured {scenario.answers} x {scenario.generated_tokens:,} tokens in "
                f"{time.monotonic() - started:.0f} s",
                file=sys.stderr,
            )
    finally:
        judge.stop()
        os.unlink(rules.name)

    print(
        f"# Memory of answers waiting at a blocked judge ({'short' if args.short else 'full'} run)"
    )
    print(f"machine: {machine_line()}")
    print()
    rows = []
    for result in results:
        scenario = result.scenario
        target = "" if scenario.target_gib is None else f"{scenario.target_gib:.2f}"
        rows.append(
            [
                f"{scenario.answers:,} x {scenario.generated_tokens:,}",
                f"{result.body_bytes / 1024:,.0f}",
                gib(result.idle_rss),
                gib(result.loaded_rss),
                gib(result.peak_rss),
                target,
                f"{result.held_per_answer / 1024:,.0f}",
                f"{result.held_per_answer / result.body_bytes:.2f}",
            ]
        )
    print(
        table(
            [
                "answers x tokens",
                "body KiB",
                "idle RSS GiB",
                "RSS waiting GiB",
                "peak RSS GiB",
                "target GiB",
                "held KiB/answer",
                "held / body",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
