"""What `serve` holds per waiting connection: N /verify posted at once on fresh connections, each
the first member of its own group of 16, so that every request waits; against the server of
another source tree in the same run, the trees taking turns.

Caveat: Linux only (/proc). The server (`genrm-trio serve`, one Trio thread) and this script, the
load generator, share the machine with whatever else runs on it. The judge is never called (no
group completes; its URL is a closed port). Resident memory (VmRSS) is read once every request
waits and the server has settled, so it holds N connections, their requests and their groups;
the difference between two trees is what their servers hold differently per connection, without
the noise of a burst whose groups are judged and answered while others arrive. Server CPU is
from the first post until every request waits, divided by N: accepting, reading, parsing and
admitting a request. Bodies: 1,024 generated tokens each (about 6 KB).

    python benchmarks/bench_waiting_connections.py --baseline-source DIR       # 8,192, 3 rounds
    python benchmarks/bench_waiting_connections.py --baseline-source DIR --rounds 6
    python benchmarks/bench_waiting_connections.py --short                     # 1,024, 1 round
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
import urllib.request

import trio
from _common import Child, cpu_seconds, machine_line, parser, rss_bytes, start_server, table

GROUP_SIZE = 16
TOKENS = 1024
# No judge listens here: no group completes, so none is ever called.
NO_JUDGE = "http://127.0.0.1:9/v1"


def request(group: int) -> bytes:
    body = {
        "responses_create_params": {"input": "2+2?"},
        "response": {
            "id": f"r-{group}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"[[q=3]] answer {group}"}],
                }
            ],
            "generation_token_ids": list(range(group, group + TOKENS)),
        },
        "_ng_group_id": f"g{group}",
        "_ng_group_attempt": 0,
        "_ng_rollout_index": 0,
    }
    data = json.dumps(body).encode()
    head = (
        b"POST /verify HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(data)
    )
    return head + data


def active_groups(server: Child) -> int:
    with urllib.request.urlopen(f"{server.url}/healthz", timeout=30) as reply:
        return int(json.load(reply)["active_groups"])


async def hold(server: Child, requests: list[bytes]) -> tuple[float, float]:
    """Post every request at once, each on its own connection, and wait until all wait: the
    server's CPU seconds per request, and its resident memory then."""
    streams: list[trio.SocketStream] = []
    started = cpu_seconds(server.pid)

    async def post(data: bytes) -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.send_all(data)
        streams.append(stream)

    async with trio.open_nursery() as nursery:
        for data in requests:
            nursery.start_soon(post, data)
    # The server's own count is the only sign that every request waits: poll it.
    while await trio.to_thread.run_sync(active_groups, server) < len(requests):  # noqa: ASYNC110
        await trio.sleep(0.1)
    used = cpu_seconds(server.pid) - started
    await trio.sleep(1.0)  # settled: nothing left to run
    resident = rss_bytes(server.pid)
    for stream in streams:
        await stream.aclose()
    return used / len(requests), resident


def run(source: str | None, connections: int) -> tuple[float, float]:
    server = start_server(
        NO_JUDGE,
        GROUP_SIZE,
        ["cohort_collection_timeout_s=3600", "log_level=WARNING"],
        source=source,
    )
    try:
        requests = [request(group) for group in range(connections)]
        return trio.run(hold, server, requests)
    finally:
        server.stop()


def main() -> int:
    arguments = parser(__doc__.splitlines()[0])
    arguments.add_argument("--connections", type=int, default=8192)
    arguments.add_argument("--rounds", type=int, default=3)
    arguments.add_argument(
        "--baseline-source", metavar="DIR", help="also run the server of another source tree"
    )
    args = arguments.parse_args()
    connections, rounds = (1024, 1) if args.short else (args.connections, args.rounds)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(machine_line())
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    if args.baseline_source:
        trees.append(("baseline", args.baseline_source))
    results: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in trees}
    rows = []
    for number in range(rounds):
        # The trees take turns at going first.
        for name, source in trees if number % 2 == 0 else trees[::-1]:
            cpu, resident = run(source, connections)
            results[name].append((cpu, resident))
            rows.append(
                [
                    str(number + 1),
                    name,
                    f"{connections:,}",
                    f"{cpu * 1e6:,.0f}",
                    f"{resident / 2**20:.1f}",
                ]
            )
            print(table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)
            time.sleep(1.0)
    print()
    print(table(HEADERS, rows))
    print()
    for name, figures in results.items():
        cpus = [cpu * 1e6 for cpu, _ in figures]
        residents = [resident / 2**20 for _, resident in figures]
        print(
            f"{name}: {statistics.mean(cpus):,.0f} us of server CPU per request "
            f"({min(cpus):,.0f}-{max(cpus):,.0f}), resident {statistics.mean(residents):.1f} MiB "
            f"({min(residents):.1f}-{max(residents):.1f})"
        )
    if args.baseline_source:
        mine, theirs = (
            statistics.mean(r for _, r in results[n]) for n in ("this tree", "baseline")
        )
        held = (mine - theirs) / connections
        print(f"held per connection, this tree less the baseline: {held:+,.0f} bytes")
    return 0


HEADERS = ["round", "server", "waiting connections", "server CPU us per request", "VmRSS MiB"]

if __name__ == "__main__":
    sys.exit(main())
