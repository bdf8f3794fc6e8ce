"""Benchmark the trainer-facing ways in at trainer scale: a whole step scored through
`GenRMClient` (`POST /verify_group`, one request per group), the same step as individual
`/verify` posts (the baseline), and OpenRLHF's one-sample-per-request `POST
/openrlhf/get_reward`, each against its own `genrm-trio serve` on the fake judge, in one run.

Client: one `GenRMClient` under Trio, every group of the step submitted at once (`score_group`
per group, all concurrently). Each response is a Responses-API object with NeMo Gym's training
fields (token ids and log-probabilities of the stated length), so a group carries the same bytes
as its 16 `/verify` bodies, and slot k's answer text carries `[[q=1 + k % 5]]`. Baseline: the
same step posted as one `/verify` per rollout on fresh connections, all at once, exactly as
bench_burst.py posts it. OpenRLHF: one aiohttp request per sample (`query` = prompt + response
text of about 4 characters per token, `prompts`, `labels`), every sample of the step at once, as
OpenRLHF's rollout workers send them; the server groups them by prompt in arrival order.

Every result is checked: the fake judge scores each answer by its `[[q=N]]` and circular pairing
makes a rollout's reward its own quality, whatever slot it lands in; a masked row, a wrong
reward, a failed group or an exception is an error, counted by kind.

Per run: rollouts checked correct, errors by kind, wall time from the first submission to the
last result, rollouts per s, server CPU per rollout (/proc/<pid>/stat), the server's peak RSS
(VmHWM, reset before the step), the load generator's CPU per rollout, and the request bytes
the step put on the wire.

Memory budget (`waiting_body_memory_bytes`, default 1 GiB): `/verify_group` counts a group's
body against it by its Content-Length before reading it, and beyond it the body waits unread
(the client's upload waits with it) until an admitted group has been answered. `/verify` counts
a body once it has read and parsed it and spools what does not fit, so bodies still arriving are
not counted. `/openrlhf/get_reward` bodies (one sample each) are read by Quart and not counted.
The 64k-token rows show each in the server's peak RSS.

Caveat: a 2-core machine. The server (one Trio thread), the fake judge (zero latency) and this
script share the two cores, so rates include the load generator's and the judge's CPU competing
with the server's; each one's CPU is reported on its own. Compare modes within a run, not
absolute figures across runs.

    python benchmarks/bench_trainers.py           # 8,192 rollouts of 1k tokens and 1,024 of
                                                  # 64k (client and /verify); 8,192 OpenRLHF
    python benchmarks/bench_trainers.py --short   # 1,024 of 1k, 64 of 64k, 1,024 OpenRLHF

Needs aiohttp: `pip install -e '.[bench]'`.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
import trio
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
    response_object,
    rss_bytes,
    start_fake_judge,
    start_server,
    table,
)
from bench_burst import Result as BurstResult
from bench_burst import aiohttp, burst, expected_reward, raise_own_file_limit, step_bodies

from genrm_trio.client import GenRMClient
from genrm_trio.client._bodies import group_body
from genrm_trio.config import Config

GROUP_SIZE = 16
PROMPT_TOKENS = 512
# OpenRLHF sends decoded text: about this many characters per token.
CHARS_PER_TOKEN = 4
FULL_STEPS = ((8192, 1024), (1024, 65536))
SHORT_STEPS = ((1024, 1024), (64, 65536))
FULL_OPENRLHF = 8192
SHORT_OPENRLHF = 1024
RUN_LIMIT_S = 600.0
BUDGET = "waiting_body_memory_bytes"


class _OpenRLHFReply(msgspec.Struct):
    rewards: list[float]
    extra_logs: dict[str, list[float]]


_OPENRLHF_REPLY = msgspec.json.Decoder(_OpenRLHFReply)


@dataclass
class Run:
    mode: str
    rollouts: int
    tokens: int
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    judge_cpu_s: float = 0.0
    peak_rss: int = 0
    idle_rss: int = 0
    request_bytes: int = 0
    resends: int = 0

    @property
    def rate(self) -> float:
        return self.rollouts / self.wall_s if self.wall_s > 0 else 0.0


class Meter:
    """CPU of the server, the judge and this process, and the server's peak RSS, over a step."""

    def __init__(self, server: Child, judge: Child, run: Run) -> None:
        self.server, self.judge, self.run = server, judge, run

    def __enter__(self) -> Meter:
        self.run.idle_rss = rss_bytes(self.server.pid)
        reset_peak_rss(self.server.pid)
        self.cpu = (cpu_seconds(self.server.pid), cpu_seconds(self.judge.pid), own_cpu_seconds())
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        run = self.run
        run.wall_s = time.perf_counter() - self.started
        server, judge, own = self.cpu
        run.server_cpu_s = cpu_seconds(self.server.pid) - server
        run.judge_cpu_s = cpu_seconds(self.judge.pid) - judge
        run.client_cpu_s = own_cpu_seconds() - own
        run.peak_rss = peak_rss_bytes(self.server.pid)


# ---- GenRMClient, one /verify_group per group ---------------------------------------------------


def client_step(judge: Child, rollouts: int, tokens: int) -> Run:
    run = Run("GenRMClient /verify_group", rollouts, tokens)
    shape = BodyShape(generated_tokens=tokens, prompt_tokens=PROMPT_TOKENS)
    # One object per slot, shared by every group: the load generator's memory stays that of the
    # encoded bodies, as a trainer's would.
    responses = [response_object(shape, seed=0, slot=slot) for slot in range(GROUP_SIZE)]
    prompt = [
        {"role": "system", "content": "You are a careful mathematician."},
        {"role": "user", "content": "Show that the sum of two odd integers is even."},
    ]
    groups = rollouts // GROUP_SIZE
    run.request_bytes = groups * len(group_body(prompt, responses, "g" * 40, 0))
    server = start_server(judge.url, GROUP_SIZE)
    try:

        async def step() -> None:
            async with GenRMClient(server.url) as client:

                async def one(group: int) -> None:
                    try:
                        results = await client.score_group(
                            prompt, responses, group_id=f"trl-{rollouts}-{tokens}-{group:05d}"
                        )
                    except Exception as exc:
                        run.errors[type(exc).__name__] += GROUP_SIZE
                        return
                    for slot, result in enumerate(results):
                        if result.mask_sample:
                            reason = (result.failure_reason or "")[:60]
                            run.errors[f"{result.failure_kind}: {reason}"] += 1
                        elif result.reward != expected_reward(slot):
                            run.errors["wrong reward"] += 1
                        else:
                            run.ok += 1

                with trio.move_on_after(RUN_LIMIT_S) as limit, Meter(server, judge, run):
                    async with trio.open_nursery() as nursery:
                        for group in range(groups):
                            nursery.start_soon(one, group)
                if limit.cancelled_caught:
                    run.errors["no result within the run limit"] += (
                        rollouts - run.ok - sum(run.errors.values())
                    )
                run.resends = client.resends

        trio.run(step)
    finally:
        server.stop()
    return run


# ---- the baseline: one /verify per rollout ------------------------------------------------------


def verify_step(judge: Child, rollouts: int, tokens: int) -> Run:
    run = Run("/verify per rollout", rollouts, tokens)
    bodies = step_bodies(rollouts, tokens, f"verify-{rollouts}-{tokens}")
    run.request_bytes = sum(len(body) for _, _, body in bodies)
    server = start_server(judge.url, GROUP_SIZE)
    result = BurstResult("fresh", rollouts, tokens)
    try:
        run.idle_rss = rss_bytes(server.pid)
        asyncio.run(burst(server, judge, bodies, keep_alive=False, result=result))
    finally:
        server.stop()
    run.ok, run.errors, run.wall_s = result.ok, result.errors, result.wall_s
    run.server_cpu_s, run.client_cpu_s = result.server_cpu_s, result.client_cpu_s
    run.judge_cpu_s, run.peak_rss = result.judge_cpu_s, result.peak_rss
    return run


# ---- OpenRLHF: one sample per request -----------------------------------------------------------


def openrlhf_samples(samples: int, tokens: int) -> list[tuple[bytes, float]]:
    """(request body, expected reward) per sample: prompts of 16 samples each, interleaved the
    way a step's samples finish generating (not prompt by prompt)."""
    rng = random.Random(7)
    words = ("the", "sum", "of", "two", "odd", "integers", "is", "even", "because", "2k+1")
    filler = " ".join(rng.choice(words) for _ in range(tokens * CHARS_PER_TOKEN // 5))
    filler = filler[: tokens * CHARS_PER_TOKEN]
    encoder = msgspec.json.Encoder()
    prompts = samples // GROUP_SIZE
    out = []
    for index in range(samples):
        prompt_number, member = index % prompts, index // prompts
        prompt = f"<|user|>Problem {prompt_number}: show that the sum of two odd integers is even."
        quality = 1 + member % 5
        text = f"<|assistant|>answer {member} [[q={quality}]] {filler}"
        body = encoder.encode(
            {"query": [prompt + text], "prompts": [prompt], "labels": [f"label {prompt_number}"]}
        )
        out.append((body, float(quality)))
    return out


def openrlhf_step(judge: Child, samples: int, tokens: int) -> Run:
    run = Run("OpenRLHF /openrlhf/get_reward", samples, tokens)
    bodies = openrlhf_samples(samples, tokens)
    run.request_bytes = sum(len(body) for body, _ in bodies)
    server = start_server(judge.url, GROUP_SIZE)
    url = server.url.rstrip("/") + "/openrlhf/get_reward"
    assert aiohttp is not None

    async def step() -> None:
        connector = aiohttp.TCPConnector(limit=samples, limit_per_host=samples)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout()
        ) as session:

            async def post(body: bytes, expected: float) -> None:
                try:
                    async with session.post(
                        url, data=body, headers={"content-type": "application/json"}
                    ) as reply:
                        text = await reply.read()
                        if reply.status != 200:
                            run.errors[f"HTTP {reply.status}"] += 1
                            return
                except Exception as exc:
                    run.errors[type(exc).__name__] += 1
                    return
                answer = _OPENRLHF_REPLY.decode(text)
                if answer.extra_logs["genrm_masked"] != [0.0]:
                    run.errors["masked sample"] += 1
                elif answer.rewards != [expected]:
                    run.errors["wrong reward"] += 1
                else:
                    run.ok += 1

            with Meter(server, judge, run):
                tasks = [asyncio.create_task(post(body, want)) for body, want in bodies]
                _, pending = await asyncio.wait(tasks, timeout=RUN_LIMIT_S)
                for task in pending:
                    task.cancel()
                run.errors["no reply within the run limit"] += len(pending)
            run.errors = +run.errors

    try:
        asyncio.run(step())
    finally:
        server.stop()
    return run


# ---- report -------------------------------------------------------------------------------------

HEADERS = [
    "mode",
    "rollouts",
    "tokens",
    "correct",
    "errors",
    "wall s",
    "rollouts per s",
    "server CPU ms per rollout",
    "server peak RSS MiB",
    "client CPU ms per rollout",
    "request MiB",
]


def row(run: Run) -> list[str]:
    errors = ", ".join(f"{kind}: {count}" for kind, count in run.errors.most_common()) or "0"
    if run.resends:
        errors += f" ({run.resends} resends)"
    per = 1e3 / max(run.rollouts, 1)
    return [
        run.mode,
        f"{run.rollouts:,}",
        f"{run.tokens // 1024}k",
        f"{run.ok:,}",
        errors,
        f"{run.wall_s:.1f}",
        f"{run.rate:,.0f}",
        f"{run.server_cpu_s * per:.2f}",
        mib(run.peak_rss),
        f"{run.client_cpu_s * per:.2f}",
        mib(run.request_bytes),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args_parser = parser(__doc__.splitlines()[0] if __doc__ else "")
    args = args_parser.parse_args(argv)
    if aiohttp is None:
        print("bench_trainers needs aiohttp: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    steps = SHORT_STEPS if args.short else FULL_STEPS
    samples = SHORT_OPENRLHF if args.short else FULL_OPENRLHF
    limit = raise_own_file_limit()
    print(machine_line())
    print(f"load generator: aiohttp {aiohttp.__version__}, open-file limit {limit}")
    judge = start_fake_judge()
    runs: list[Run] = []

    def record(run: Run) -> None:
        runs.append(run)
        print(table(HEADERS, [row(run)]).splitlines()[-1], flush=True)

    try:
        for rollouts, tokens in steps:
            record(client_step(judge, rollouts, tokens))
            record(verify_step(judge, rollouts, tokens))
        record(openrlhf_step(judge, samples, 1024))
    finally:
        judge.stop()
    print()
    print(table(HEADERS, [row(run) for run in runs]))
    print()
    for client, verify in zip(runs[0::2], runs[1::2], strict=False):
        if client.mode.startswith("GenRMClient") and verify.rate > 0:
            print(
                f"{client.rollouts:,} rollouts of {client.tokens // 1024}k tokens: GenRMClient "
                f"reaches {client.rate / verify.rate:.2f}x the /verify rate, "
                f"{client.server_cpu_s / max(verify.server_cpu_s, 1e-9):.2f}x its server CPU, "
                f"{client.peak_rss / max(verify.peak_rss, 1):.2f}x its server peak RSS"
            )
    budget = next(f.default for f in msgspec.structs.fields(Config) if f.name == BUDGET)
    counted = {
        "GenRMClient": "counted before it is read; beyond it the body waits unread",
        "/verify": "counted before it is read; beyond it the body waits unread for a spool slot",
    }
    for run in runs:
        if run.tokens >= 65536:
            print(
                f"{run.mode}, {run.rollouts:,} x {run.tokens // 1024}k: {mib(run.request_bytes)} "
                f"MiB of bodies against a waiting_body_memory_bytes of {mib(budget or 0)} MiB "
                f"({counted[run.mode.split()[0]]}); server RSS {mib(run.idle_rss)} MiB idle, "
                f"{mib(run.peak_rss)} MiB peak"
            )
    print(f"load average after the runs: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    failed = any(run.errors for run in runs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
