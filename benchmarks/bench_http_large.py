"""Server CPU of one multi-MB /verify over HTTP against the same request's own work done in
process, measured in the same run (goal: at most 2x).

Caveat: CPU time, not wall time. Over HTTP: `genrm-trio serve` in its own process (group size 2,
default settings, the fake judge answering at once), posted one group at a time (both members at
once, each on its own connection, as a trainer does), its process CPU from /proc (all threads)
divided by the requests; it includes hypercorn and h11, reading and joining the body, validation,
judging the pair, writing the reply, and keeping each member's fingerprint once the group is
done. In process, this script's thread CPU for the steps Engine.verify and the reply run for a
new member ("own work": validation, prompt digest, scoring texts, the group's history once per
group, the row's parts as the server writes them: views of the request's bytes, not one joined
copy), and the same plus keeping the fingerprint a finished group needs for replays
("own work + fingerprint kept": the raw digest and the canonical fingerprint). Not in either:
the group bookkeeping and the pair's one judge call (small next to a 2 MB body). The in-process
steps run under the process settings `serve` makes (glibc's fixed mmap threshold, the
collector's thresholds), so fresh pages a step takes from the kernel count on both sides.
Every group here completes and keeps its members' fingerprints, as every group of a training
step does, so the goal compares the HTTP figure with the second (the first is printed too).
Rounds alternate between the two, so other load on the machine touches both alike; the medians
of the rounds are compared. Bodies are what NeMo Gym sends (bench_request_cpu.py's shape:
generated tokens, a quarter as many prompt tokens, log-probs with 16-17 significant digits).

    python benchmarks/bench_http_large.py                 # 65,536 tokens (about 2 MB), 6 rounds
    python benchmarks/bench_http_large.py --short         # 3 rounds of fewer requests
    python benchmarks/bench_http_large.py --tokens 16384
"""

from __future__ import annotations

import http.client
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BodyShape,
    cpu_seconds,
    machine_line,
    parser,
    start_fake_judge,
    start_server,
    table,
    verify_body,
)

from genrm_trio.config import Config
from genrm_trio.core.canonical import digest_hex
from genrm_trio.core.identity import ResponseIdentity
from genrm_trio.core.texts import convert_history, extract_scoring_text
from genrm_trio.process_tuning import prepare_collector, return_large_blocks_to_the_system
from genrm_trio.wire.parsing import parse_verify_body
from genrm_trio.wire.rendering import scored_row_parts

METRICS = {
    "genrm_failed_comparison_rate_per_group": 0.0,
    "genrm_masked_rollout_rate_per_group": 0.0,
    "mean_individual_score": 3.0,
    "std_individual_score": 1.25,
    "tiebreak_usage_rate": 0.0625,
}


_PLACEHOLDER = b"GROUP-PLACEHOLDER"


def own_work(body: bytes, config: Config, *, keep: bool, first: bool) -> None:
    """What the server does in process for a new member, then its reply; with ``keep``, also
    the fingerprint a finished group keeps; ``first``: the group's first member, whose history
    the group converts (C-32)."""
    parsed = parse_verify_body(body, config)
    response, prompt = parsed.take_scoring()
    identity = ResponseIdentity(parsed.response_view())
    digest_hex({"input": prompt, "principle": parsed.principle})
    extract_scoring_text(response)
    if first:
        convert_history(prompt)
    del response, prompt
    scored_row_parts(parsed, 3.5, METRICS)
    if keep:
        identity.settle()


def in_process_ms(body: bytes, config: Config, count: int, *, keep: bool) -> float:
    started = time.thread_time()
    for index in range(count):
        own_work(body, config, keep=keep, first=index % 2 == 0)
    return (time.thread_time() - started) * 1e3 / count


def post(port: int, body: bytes, statuses: list[int]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port)
    try:
        connection.request(
            "POST", "/verify", body=body, headers={"content-type": "application/json"}
        )
        reply = connection.getresponse()
        reply.read()
        statuses.append(reply.status)
    finally:
        connection.close()


def over_http_ms(port: int, pid: int, templates: list[list[bytes]], groups: int, tag: str) -> float:
    statuses: list[int] = []
    before = cpu_seconds(pid)
    for group in range(groups):
        gid = f"{tag}-{group}".encode()
        threads = [
            threading.Thread(target=post, args=(port, gid.join(parts), statuses))
            for parts in templates
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    spent = cpu_seconds(pid) - before
    if set(statuses) != {200}:
        raise RuntimeError(f"replies other than 200: {sorted(set(statuses))}")
    return spent * 1e3 / (groups * len(templates))


def main() -> None:
    arguments = parser(__doc__.splitlines()[0])
    arguments.add_argument("--tokens", type=int, default=65_536, help="generated tokens")
    args = arguments.parse_args()
    shape = BodyShape(generated_tokens=args.tokens, prompt_tokens=args.tokens // 4)
    rounds, groups = (3, 10) if args.short else (6, 25)
    templates = [
        verify_body(shape, seed=1, group_id=_PLACEHOLDER.decode(), slot=slot).split(_PLACEHOLDER)
        for slot in range(2)
    ]
    body = b"g-0".join(templates[0])
    config = Config(judge_base_url="http://127.0.0.1:1/v1", judge_model="judge")
    return_large_blocks_to_the_system()
    prepare_collector()
    judge = start_fake_judge()
    server = start_server(judge.url, 2, (), "--log-level", "ERROR")
    http_rounds: list[float] = []
    own_rounds: list[float] = []
    kept_rounds: list[float] = []
    try:
        over_http_ms(server.port, server.pid, templates, 2, "warm")
        for index in range(rounds):
            http_rounds.append(
                over_http_ms(server.port, server.pid, templates, groups, f"r{index}")
            )
            own_rounds.append(in_process_ms(body, config, 2 * groups, keep=False))
            kept_rounds.append(in_process_ms(body, config, 2 * groups, keep=True))
    finally:
        server.stop()
        judge.stop()
    over_http = statistics.median(http_rounds)
    own = statistics.median(own_rounds)
    kept = statistics.median(kept_rounds)
    print(f"# Server CPU of one /verify of {args.tokens:,} tokens ({len(body) / 1e6:.2f} MB)")
    print(f"machine: {machine_line()}")
    print()
    rows = [
        ["over HTTP (server process CPU)", f"{over_http:.2f}", "1.00x", ""],
        ["own work in process", f"{own:.2f}", f"{over_http / own:.2f}x", ""],
        [
            "own work + fingerprint kept, in process",
            f"{kept:.2f}",
            f"{over_http / kept:.2f}x",
            "2.00x",
        ],
    ]
    print(table(["", "CPU ms per /verify (median)", "HTTP over this", "goal"], rows))
    print()
    spread = ", ".join(f"{value:.2f}" for value in http_rounds)
    print(f"over HTTP by round: {spread} ms")


if __name__ == "__main__":
    main()
