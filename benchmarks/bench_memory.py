"""Memory of a whole step posted at once at a judge that holds every comparison (goal 3 in
docs/performance.md): peak and resident memory of the server process, the bytes it holds per
waiting answer against the body size, where the bodies' bytes are, and every answer checked once
the judge lets go.

Caveat: Linux only (/proc). Two processes besides this one: `genrm-trio serve` (the server under
test, as deployed: hypercorn, one Trio thread, default settings but group size 16) and
`genrm-trio fake-judge --latency fixed:HOLD`, which answers every comparison HOLD seconds after
it arrives. This script opens one TCP connection per answer and sends every body at once, as a
trainer posts a step (no limit on how many are in flight: the server's own admission decides
what it reads); then it waits until every group is active and the server's CPU has gone idle,
reads the resident memory and /healthz's split of body bytes (being received, in memory,
spooled), and finally reads every reply and checks it: status 200, not masked, and the reward
circular pairing gives its slot. Peak RSS is the server's VmHWM since it started, so it counts
receiving, parsing, spooling and the replies. The idle figure is read after one warm-up group.
"Held per answer" is (RSS with all answers waiting - idle RSS) / answers. Bodies are written by
Python's json.dumps like the ones bench_request_cpu.py times (log-probs with 16-17 significant
digits), prompts a quarter as long as the answers.

The budgets table runs 1,024 answers of 65,536 tokens (about 2 GiB of bodies) under budgets of
256 MiB and 1 GiB and with no budget, one server each, in the same run, and adds the server's CPU
per /verify (process CPU from /proc, all threads, from idle until every answer waits, divided by
the answers; the fingerprints a finished group keeps are computed after the replies and are not
in it) and the spool files on disk. The server may have every comparison at the judge at once
(judge_max_concurrency above the answers), so each group's hold is the same. HOLD must outlast
posting the step; a reply that arrives before the measurement stops the run. The warm-up group's
replies come HOLD seconds after it, whenever that is; they are checked too.

    python benchmarks/bench_memory.py            # 512 x 8,192 tokens, then 2,048 x 16,384,
                                                 # then the budgets table (HOLD 150 s)
    python benchmarks/bench_memory.py --short    # 256 x 8,192, then 256 x 16,384, budgets at
                                                 # 128 x 65,536 with 64 MiB, 256 MiB, none
    python benchmarks/bench_memory.py --budgets  # the budgets table only
    python benchmarks/bench_memory.py --budgets --answers 512 --hold-s 90
"""

from __future__ import annotations

import json
import os
import resource
import select
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
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
    # /healthz while every answer waits: bytes being received, in memory, spooled.
    split: tuple[int, int, int] = (0, 0, 0)
    wrong: Counter[str] = field(default_factory=Counter)

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


async def read_reply(stream: trio.SocketStream) -> tuple[int, bytes]:
    """(status, body) of the one reply a connection carries."""
    data = bytearray()
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise RuntimeError("connection closed before the reply's head")
        data += chunk
    head, _, rest = bytes(data).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")[1:]
        if line.lower().startswith(b"content-length:")
    )
    body = bytearray(rest)
    while len(body) < length:
        chunk = await stream.receive_some(1 << 20)
        if not chunk:
            raise RuntimeError("connection closed inside the reply's body")
        body += chunk
    return status, bytes(body)


def check_reply(status: int, body: bytes, slot: int) -> str | None:
    """What is wrong with a reply, or None: 200, not masked, and the slot's reward."""
    if status != 200:
        return f"HTTP {status}"
    row = json.loads(body)
    if row.get("mask_sample"):
        return "masked row"
    # The bodies give slot k the quality 1 + k % 5; circular pairing with the fake judge makes
    # that the reward.
    if row.get("reward") != float(1 + slot % 5):
        return "wrong reward"
    return None


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


async def waiters(client: httpx.AsyncClient) -> int:
    """/verify requests waiting for their group, from /metrics."""
    reply = await client.get("/metrics")
    for line in reply.text.splitlines():
        if line.startswith("genrm_waiters "):
            return int(float(line.split()[1]))
    raise RuntimeError("/metrics has no genrm_waiters")


async def settle(server: Child, client: httpx.AsyncClient, answers: int) -> dict[str, int]:
    """Wait until ``answers`` requests wait and the server has stopped spending CPU; /healthz
    then."""
    last = cpu_seconds(server.pid)
    while True:
        await trio.sleep(1.0)
        now = cpu_seconds(server.pid)
        if await waiters(client) >= answers and now - last < 0.02:
            return await health(client)
        last = now


def spool_files(pid: int) -> int:
    """Spool files the server ``pid`` has in its private spool directory."""
    parent = tempfile.gettempdir()
    return sum(
        len(os.listdir(os.path.join(parent, name)))
        for name in os.listdir(parent)
        if name.startswith(f"genrm-trio-spool-{pid}-")
    )


def raise_own_file_limit() -> None:
    """One socket per answer: the load generator needs its soft limit raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def measure(scenario: Scenario, judge_url: str, round_name: str) -> Result:
    budget = "null" if scenario.budget_bytes is None else str(scenario.budget_bytes)
    # Every comparison at the judge at once, so that the hold is the same for every group.
    sets = (
        f"waiting_body_memory_bytes={budget}",
        f"judge_max_concurrency={scenario.answers + 2 * GROUP_SIZE}",
    )
    server = start_server(judge_url, GROUP_SIZE, sets, "--log-level", "ERROR")
    slots: dict[trio.SocketStream, int] = {}
    warm_slots: dict[trio.SocketStream, int] = {}
    try:
        templates = body_templates(scenario.shape)
        sizes = [len(head) + len(tail) + len(f"{round_name}-0") for head, tail in templates]
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            # One warm-up group loads every code path (and its imports) before the idle figure.
            warm = f"{round_name}-warm".encode()
            for slot, (head, tail) in enumerate(templates):
                request = http_request(server.port, head + warm + tail)
                warm_slots[await post_and_park(server.port, request)] = slot
            await settle(server, client, GROUP_SIZE)
            idle = rss_bytes(server.pid)
            idle_cpu = cpu_seconds(server.pid)

            async def one(group: int, slot: int) -> None:
                head, tail = templates[slot]
                body = head + f"{round_name}-{group}".encode() + tail
                stream = await post_and_park(server.port, http_request(server.port, body))
                slots[stream] = slot

            groups = scenario.answers // GROUP_SIZE
            async with trio.open_nursery() as nursery:
                for group in range(groups):
                    for slot in range(GROUP_SIZE):
                        nursery.start_soon(one, group, slot)
            counts = await settle(server, client, scenario.answers)
            loaded = rss_bytes(server.pid)
            cpu = (cpu_seconds(server.pid) - idle_cpu) / scenario.answers
            files = spool_files(server.pid)
            if early := answered(list(slots)):
                # A reply (a 409 or 503, or the judge's hold ending) would free its request and
                # flatter the figures.
                raise RuntimeError(f"{early} answers were not waiting when measured")
            wrong: Counter[str] = Counter()

            async def check(stream: trio.SocketStream, slot: int) -> None:
                status, body = await read_reply(stream)
                problem = check_reply(status, body, slot)
                if problem is not None:
                    wrong[problem] += 1

            async with trio.open_nursery() as nursery:
                for stream, slot in [*slots.items(), *warm_slots.items()]:
                    nursery.start_soon(check, stream, slot)
            peak = peak_rss_bytes(server.pid)
        split = (
            counts["body_bytes_receiving"],
            counts["body_bytes_in_memory"],
            counts["body_bytes_spooled"],
        )
        return Result(
            scenario, sum(sizes) / len(sizes), idle, loaded, peak, cpu, files, split, wrong
        )
    finally:
        for stream in [*slots, *warm_slots]:
            await stream.aclose()
        server.stop()


def main() -> None:
    arguments = parser(__doc__.splitlines()[0])
    arguments.add_argument("--budgets", action="store_true", help="only the budgets table")
    arguments.add_argument(
        "--answers", type=int, default=None, help="answers of 65,536 tokens in the budgets table"
    )
    arguments.add_argument(
        "--hold-s", type=float, default=150.0, help="how long the judge holds each comparison"
    )
    args = arguments.parse_args()
    if args.short:
        scenarios = [Scenario(256, 8_192, None, None), Scenario(256, 16_384, None, None)]
        large = args.answers or 128
        budgets = [Scenario(large, 65_536, None, b) for b in (64 * MIB, 256 * MIB, None)]
    else:
        scenarios = [Scenario(512, 8_192, 0.25, None), Scenario(2_048, 16_384, 1.2, None)]
        large = args.answers or 1_024
        budgets = [Scenario(large, 65_536, None, b) for b in (256 * MIB, GIB, None)]
    if args.budgets:
        scenarios = []
    raise_own_file_limit()
    judge = start_fake_judge("--latency", f"fixed:{args.hold_s:g}")
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

    print(
        f"# Memory of a whole step posted at once at a judge holding every comparison "
        f"{args.hold_s:g} s ({'short' if args.short else 'full'} run)"
    )
    print(f"machine: {machine_line()}")
    print()
    if results:
        print_results(results)
    if budget_results:
        print_budgets(budget_results)
    shape = (budgets or scenarios)[0].shape
    print()
    print(f"What one body of {shape.generated_tokens:,} tokens costs held in memory:")
    print()
    print(table(["form", "KiB", "vs its bytes"], parsed_costs(shape)))


def parsed_costs(shape: BodyShape) -> list[list[str]]:
    """What one body costs in memory as bytes, as a decoded tree (msgspec, Python's json), and
    as what a waiting request keeps of it after validation (the bytes aside), by tracemalloc."""
    from genrm_trio.config import Config
    from genrm_trio.wire.parsing import parse_verify_body

    body = verify_body(shape, seed=1, group_id="g-0", slot=1)
    config = Config(judge_base_url="http://judge.invalid/v1", judge_model="m")

    def retained(build: Callable[[], object]) -> int:
        tracemalloc.start()
        kept = build()
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del kept
        return size

    def waiting_request() -> object:
        request = parse_verify_body(body, config)
        request.take_scoring()  # what the engine takes (and compacts) when the request arrives
        return request

    rows = [
        ("the body's bytes", len(body)),
        ("decoded by msgspec.json.decode", retained(lambda: msgspec.json.decode(body))),
        ("decoded by json.loads", retained(lambda: json.loads(body))),
        ("a waiting request besides the bytes", retained(waiting_request)),
    ]
    return [[name, f"{size / 1024:,.1f}", f"{size / len(body):.3f}"] for name, size in rows]


def wrong_text(result: Result) -> str:
    """Replies that were not the right scored row, by what was wrong; 0 when all were right."""
    if not result.wrong:
        return "0"
    return ", ".join(f"{count} {what}" for what, count in sorted(result.wrong.items()))


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
                wrong_text(result),
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
                "rows wrong",
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
                " / ".join(gib(part) for part in result.split),
                str(result.spool_files),
                f"{result.cpu_per_answer_s * 1e3:.2f}",
                f"{result.cpu_per_answer_s / base_cpu:.2f}" if base_cpu else "",
                wrong_text(result),
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
                "receiving / in memory / spooled GiB",
                "spool files",
                "CPU ms per /verify",
                "CPU vs no budget",
                "rows wrong",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
