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

With the memory budget for waiting bodies (`waiting_body_memory_bytes`), bodies beyond it wait
in spool files; the budgets table runs 512 answers of 65,536 tokens (about 1 GiB of bodies)
under budgets of 256 MiB and 1 GiB and with no budget, one server each, in the same run, and
adds the server's CPU per /verify (process CPU from /proc, all threads, from idle until every
answer waits, divided by the answers) and the spool files on disk. The spool directory is the
default private temporary one.

    python benchmarks/bench_memory.py            # 512 x 8,192 tokens, then 2,048 x 16,384,
                                                 # then the budgets table
    python benchmarks/bench_memory.py --short    # 256 x 8,192, then 256 x 16,384, budgets at
                                                 # 128 x 65,536 with 64 MiB, 256 MiB, none
    python benchmarks/bench_memory.py --budgets  # the budgets table only
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
    GIB,
    MIB,
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
    budget_bytes: int | None = None  # waiting_body_memory_bytes; None: no budget

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
    cpu_per_answer_s: float = 0.0
    spool_files: int = 0

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


def spool_files(pid: int) -> int:
    """Spool files the server ``pid`` has in its private spool directory."""
    parent = tempfile.gettempdir()
    return sum(
        len(os.listdir(os.path.join(parent, name)))
        for name in os.listdir(parent)
        if name.startswith(f"genrm-trio-spool-{pid}-")
    )


async def measure(scenario: Scenario, judge_url: str, round_name: str) -> Result:
    budget = "null" if scenario.budget_bytes is None else str(scenario.budget_bytes)
    sets = (f"waiting_body_memory_bytes={budget}",)
    server = start_server(judge_url, GROUP_SIZE, sets, "--log-level", "ERROR")
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
            idle_cpu = cpu_seconds(server.pid)
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
            cpu = (cpu_seconds(server.pid) - idle_cpu) / scenario.answers
            files = spool_files(server.pid)
            if early := answered(streams):
                # A reply (a 409 or 503, say) would free its request and flatter the figures.
                raise RuntimeError(f"{early} answers were not waiting when measured")
        return Result(scenario, sum(sizes) / len(sizes), idle, loaded, peak, cpu, files)
    finally:
        for stream in streams:
            await stream.aclose()
        server.stop()


def main() -> None:
    arguments = parser(__doc__.splitlines()[0])
    arguments.add_argument("--budgets", action="store_true", help="only the budgets table")
    args = arguments.parse_args()
    if args.short:
        scenarios = [Scenario(256, 8_192, None, None), Scenario(256, 16_384, None, None)]
        budgets = [Scenario(128, 65_536, None, b) for b in (64 * MIB, 256 * MIB, None)]
    else:
        scenarios = [Scenario(512, 8_192, 0.25, None), Scenario(2_048, 16_384, 1.2, None)]
        budgets = [Scenario(512, 65_536, None, b) for b in (256 * MIB, GIB, None)]
    if args.budgets:
        scenarios = []
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as rules:
        json.dump([{"action": "hang"}], rules)
    judge = start_fake_judge("--rules", rules.name)
    results = []
    budget_results = []
    try:
        for index, scenario in enumerate([*scenarios, *budgets]):
            started = time.monotonic()
            result = trio.run(measure, scenario, judge.url, f"r{index}")
            (results if index < len(scenarios) else budget_results).append(result)
            print(
                f"  measured {scenario.answers} x {scenario.generated_tokens:,} tokens "
                f"(budget {budget_text(scenario.budget_bytes)}) in "
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
    if results:
        print_results(results)
    if budget_results:
        print_budgets(budget_results)


def budget_text(budget: int | None) -> str:
    if budget is None:
        return "none"
    return f"{budget / GIB:g} GiB" if budget >= GIB else f"{budget // MIB} MiB"


def print_results(results: list[Result]) -> None:
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
    print()


def print_budgets(results: list[Result]) -> None:
    """Peak RSS against budget + idle, and CPU per /verify against the run without a budget."""
    unbudgeted = [r for r in results if r.scenario.budget_bytes is None]
    base_cpu = unbudgeted[0].cpu_per_answer_s if unbudgeted else 0.0
    rows = []
    for result in results:
        scenario = result.scenario
        budget = scenario.budget_bytes
        over = "" if budget is None else gib(result.peak_rss - result.idle_rss - budget)
        rows.append(
            [
                f"{scenario.answers:,} x {scenario.generated_tokens:,}",
                budget_text(budget),
                f"{result.body_bytes / 1024:,.0f}",
                gib(result.body_bytes * scenario.answers),
                gib(result.idle_rss),
                gib(result.loaded_rss),
                gib(result.peak_rss),
                over,
                str(result.spool_files),
                f"{result.cpu_per_answer_s * 1e3:.2f}",
                f"{result.cpu_per_answer_s / base_cpu:.2f}" if base_cpu else "",
            ]
        )
    print(
        table(
            [
                "answers x tokens",
                "budget",
                "body KiB",
                "bodies GiB",
                "idle RSS GiB",
                "RSS waiting GiB",
                "peak RSS GiB",
                "peak - idle - budget GiB",
                "spool files",
                "CPU ms per /verify",
                "CPU vs no budget",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
