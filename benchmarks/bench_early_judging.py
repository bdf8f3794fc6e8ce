"""Benchmark early judging (X-2, config `early_judging`) against wait-for-all judging: a
simulated policy with long-tailed generation times posts each rollout once it is generated.

Caveat: by default every time printed is simulated seconds on Trio's MockClock (autojump), with
the in-process server (`genrm_trio.testing.harness.running_server`) and the in-process fake judge.
Generation times and judge latencies are sleeps on that clock, and the server's own CPU time does
not advance it, so the figures show scheduling effects only (when comparisons can start, how they
queue at `judge_max_concurrency`), not the CPU cost of either mode. `--real-clock` runs a smaller
workload on the real clock over loopback HTTP (hypercorn, TCP fake judge) as a sanity check; its
times include CPU and loopback I/O on this machine and vary from run to run.

Both modes run the same seeded workload: the same generation time and answer quality for every
rollout, and the same seeded sequence of judge latencies (drawn by judge request number, so in
the two modes a given draw may land on a different comparison). Each run checks that every reply
is scored, that both modes made the same number of judge calls and that every reward is identical.
Trio shuffles the order of tasks that wake at the same instant (capped rollouts all arrive at the
cap), so a repeated run of the same seed moves some figures by about a hundredth of a ratio.

Group completion latency is measured two ways: from the group's LAST member arrival to its
publication (what early judging can shorten: the judging left after the straggler arrives), and
from the group's FIRST member arrival to its publication (the group's whole time in the server).
Percentiles interpolate linearly between the closest ranks.

    python benchmarks/bench_early_judging.py            # 6 simulated settings, 256 groups each
    python benchmarks/bench_early_judging.py --short    # 64 groups each, for CI-size machines
    python benchmarks/bench_early_judging.py --real-clock [--short]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
import msgspec
import trio
import trio.testing

from genrm_trio.config import config_from_mapping
from genrm_trio.testing import FakeJudge, serve_fake_judge
from genrm_trio.testing.harness import member, running_server

GROUP_SIZE = 16
# Deadlines far beyond any run: nothing may time out, so both modes judge every comparison.
NO_DEADLINE_S = 1_000_000.0


@dataclass(frozen=True)
class Setting:
    """One workload: how rollouts are generated and how much judge capacity there is."""

    name: str
    groups: int
    judge_slots: int  # judge_max_concurrency
    judge_latency_median_s: float
    judge_latency_sigma: float  # lognormal sigma of one judge call's latency
    generation_median_s: float
    generation_sigma: float  # lognormal sigma of one rollout's generation time
    generation_cap_s: float  # the policy's max-token limit, as a time

    @property
    def judge_latency(self) -> str:
        """The fake judge's latency setting."""
        return f"lognormal:{self.judge_latency_median_s:g}:{self.judge_latency_sigma:g}"

    def judge_work_s(self) -> float:
        """How long the judge needs for the whole step with every slot busy (mean latency)."""
        mean = self.judge_latency_median_s * math.exp(self.judge_latency_sigma**2 / 2)
        return self.groups * GROUP_SIZE * mean / self.judge_slots

    def describe(self) -> str:
        return (
            f"{self.groups} groups x {GROUP_SIZE}; generation lognormal median "
            f"{self.generation_median_s:g} s sigma {self.generation_sigma:g}, capped at "
            f"{self.generation_cap_s:g} s; judge {self.judge_slots} slots, latency lognormal "
            f"median {self.judge_latency_median_s:g} s sigma {self.judge_latency_sigma:g} "
            f"(the step's judging alone needs {self.judge_work_s():.3g} s at full capacity)"
        )


@dataclass(frozen=True)
class Workload:
    """Per group and slot: when the rollout is generated and the quality of its answer."""

    arrivals: list[list[float]]
    qualities: list[list[int]]


def make_workload(setting: Setting, seed: int) -> Workload:
    """All prompts of one training step go to the policy at time 0; each rollout is posted
    once its own generation finishes."""
    rng = random.Random(f"early-judging/{seed}")
    mu = math.log(setting.generation_median_s)
    arrivals = [
        [
            min(rng.lognormvariate(mu, setting.generation_sigma), setting.generation_cap_s)
            for _ in range(GROUP_SIZE)
        ]
        for _ in range(setting.groups)
    ]
    qualities = [[rng.randint(1, 5) for _ in range(GROUP_SIZE)] for _ in range(setting.groups)]
    return Workload(arrivals, qualities)


@dataclass
class Run:
    """What one mode did with one workload (times relative to the policy's start)."""

    sent: list[list[float]]
    replied: list[list[float]]
    rewards: list[list[float]]
    calls: int = 0
    max_judge_in_flight: int = 0
    cpu_s: float = 0.0

    def after_last(self) -> list[float]:
        return [max(r) - max(s) for s, r in zip(self.sent, self.replied, strict=True)]

    def after_first(self) -> list[float]:
        return [max(r) - min(s) for s, r in zip(self.sent, self.replied, strict=True)]

    def makespan(self) -> float:
        return max(max(r) for r in self.replied)


Post = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]]]


@dataclass
class Policy:
    """Posts every rollout of the workload at its generation time and records the replies."""

    workload: Workload
    post: Post
    start: float = 0.0
    sent: list[list[float]] = field(default_factory=list)
    replied: list[list[float]] = field(default_factory=list)
    rewards: list[list[float]] = field(default_factory=list)

    async def run(self) -> None:
        groups = len(self.workload.arrivals)
        self.sent = [[math.nan] * GROUP_SIZE for _ in range(groups)]
        self.replied = [[math.nan] * GROUP_SIZE for _ in range(groups)]
        self.rewards = [[math.nan] * GROUP_SIZE for _ in range(groups)]
        self.start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for group, times in enumerate(self.workload.arrivals):
                for slot, at in enumerate(times):
                    nursery.start_soon(self._rollout, group, slot, at)

    async def _rollout(self, group: int, slot: int, at: float) -> None:
        await trio.sleep_until(self.start + at)
        body = member(slot, self.workload.qualities[group][slot], f"step-0/prompt-{group}", 0)
        self.sent[group][slot] = trio.current_time() - self.start
        status, reply = await self.post(body)
        self.replied[group][slot] = trio.current_time() - self.start
        if status != 200 or reply.get("mask_sample") or "reward" not in reply:
            raise RuntimeError(f"group {group} slot {slot}: not scored: {status} {reply}")
        self.rewards[group][slot] = float(reply["reward"])


def _finished(policy: Policy, judge_stats: dict[str, Any]) -> Run:
    return Run(
        policy.sent,
        policy.replied,
        policy.rewards,
        calls=int(judge_stats["requests_total"]),
        max_judge_in_flight=int(judge_stats["max_in_flight"]),
    )


def _server_settings(setting: Setting, early: bool) -> dict[str, Any]:
    return {
        "num_rollouts_per_prompt": GROUP_SIZE,
        "comparison_strategy": "circular",
        "num_judges_per_comparison": 1,
        "early_judging": early,
        "judge_max_concurrency": setting.judge_slots,
        "cohort_collection_timeout_s": NO_DEADLINE_S,
        "cohort_evaluation_timeout_s": NO_DEADLINE_S,
        "judge_request_timeout_s": NO_DEADLINE_S,
        "max_terminal_cohorts": max(4096, setting.groups),
    }


# ---- simulated time ---------------------------------------------------------------------------


async def _simulated(setting: Setting, workload: Workload, early: bool, seed: int) -> Run:
    judge = FakeJudge(seed=seed, latency=setting.judge_latency)
    async with running_server(_server_settings(setting, early), judge=judge) as server:

        async def post(body: dict[str, Any]) -> tuple[int, Any]:
            reply = await server.verify(body)
            return reply.status, reply.body

        policy = Policy(workload, post)
        await policy.run()
        stats = judge.stats()
    return _finished(policy, stats)


def run_simulated(setting: Setting, workload: Workload, early: bool, seed: int) -> Run:
    clock = trio.testing.MockClock(autojump_threshold=0)
    return _timed(partial(_simulated, setting, workload, early, seed), clock=clock)


def _timed(run: Callable[[], Awaitable[Run]], clock: trio.abc.Clock | None = None) -> Run:
    """``run`` under its own trio.run, with the process CPU time it took."""
    cpu = time.process_time()
    result = trio.run(run, clock=clock)
    result.cpu_s = time.process_time() - cpu
    return result


# ---- real clock over loopback HTTP ------------------------------------------------------------


async def _real_clock(setting: Setting, workload: Workload, early: bool, seed: int) -> Run:
    from hypercorn.trio import serve as hypercorn_serve

    from genrm_trio.http.app import create_app
    from genrm_trio.serve import hypercorn_settings

    judge = FakeJudge(seed=seed, latency=setting.judge_latency)
    async with trio.open_nursery() as nursery:
        judge_port = await nursery.start(serve_fake_judge, judge, "127.0.0.1", 0)
        config = config_from_mapping(
            {
                "judge_base_url": f"http://127.0.0.1:{judge_port}/v1",
                "judge_model": "judge",
                "port": 0,
                **_server_settings(setting, early),
            }
        )
        app = create_app(config)
        stop = trio.Event()
        binds = await nursery.start(
            partial(hypercorn_serve, app, hypercorn_settings(config), shutdown_trigger=stop.wait)
        )
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(
            base_url=binds[0], timeout=None, limits=limits, trust_env=False
        ) as client:

            async def post(body: dict[str, Any]) -> tuple[int, Any]:
                response = await client.post("/verify", content=msgspec.json.encode(body))
                return response.status_code, msgspec.json.decode(response.content)

            policy = Policy(workload, post)
            await policy.run()
        stats = judge.stats()
        stop.set()
        nursery.cancel_scope.cancel()
    return _finished(policy, stats)


def run_real_clock(setting: Setting, workload: Workload, early: bool, seed: int) -> Run:
    return _timed(partial(_real_clock, setting, workload, early, seed))


# ---- report -----------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile, interpolating linearly between the closest ranks."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * p / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Figure:
    label: str
    measure: Callable[[Run], float]


FIGURES = (
    Figure("group latency after LAST arrival, p50", lambda r: percentile(r.after_last(), 50)),
    Figure("group latency after LAST arrival, p95", lambda r: percentile(r.after_last(), 95)),
    Figure("group latency after FIRST arrival, p50", lambda r: percentile(r.after_first(), 50)),
    Figure("group latency after FIRST arrival, p95", lambda r: percentile(r.after_first(), 95)),
    Figure("makespan (policy start to last reply)", Run.makespan),
)


def _ratio(early: float, wait: float) -> float:
    return early / wait if wait > 0 else math.nan


def check_same_work(setting: Setting, wait: Run, early: Run) -> None:
    """Both modes must have judged the same comparisons and published the same rewards."""
    if wait.calls != early.calls:
        raise RuntimeError(f"{setting.name}: judge calls differ: {wait.calls} vs {early.calls}")
    if wait.rewards != early.rewards:
        raise RuntimeError(f"{setting.name}: rewards differ between the modes")


def table(
    setting: Setting, wait: Run, early: Run, unit: str, simulated: tuple[Run, Run] | None
) -> list[str]:
    """One setting's figures; `simulated` adds the simulated ratio of the same workload."""
    header = f"| figure ({unit}) | wait-for-all | early | early / wait-for-all |"
    rule = "|---|---:|---:|---:|"
    if simulated is not None:
        header += " same workload simulated: early / wait-for-all |"
        rule += "---:|"
    lines = [f"### {setting.name}", "", setting.describe(), "", header, rule]
    for figure in FIGURES:
        w, e = figure.measure(wait), figure.measure(early)
        line = f"| {figure.label} | {w:.2f} | {e:.2f} | {_ratio(e, w):.2f} |"
        if simulated is not None:
            sw, se = (figure.measure(run) for run in simulated)
            line += f" {_ratio(se, sw):.2f} |"
        lines.append(line)
    blank = " |" if simulated is not None else ""
    calls_ratio = _ratio(early.calls, wait.calls)
    for label, w_text, e_text, ratio in (
        ("judge calls", f"{wait.calls}", f"{early.calls}", f"{calls_ratio:.2f}"),
        ("judge max in flight", f"{wait.max_judge_in_flight}", f"{early.max_judge_in_flight}", ""),
        ("process CPU of the run (s)", f"{wait.cpu_s:.2f}", f"{early.cpu_s:.2f}", ""),
    ):
        lines.append(f"| {label} | {w_text} | {e_text} | {ratio} |{blank}")
    lines.append("")
    return lines


def summary(results: list[tuple[Setting, Run, Run]]) -> list[str]:
    """early / wait-for-all for every setting in one table."""
    lines = [
        "### Summary: early / wait-for-all",
        "",
        "| setting | after last p50 | after last p95 | after first p50 | after first p95 "
        "| makespan | judge calls (each mode) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for setting, wait, early in results:
        ratios = " | ".join(
            f"{_ratio(figure.measure(early), figure.measure(wait)):.2f}" for figure in FIGURES
        )
        lines.append(f"| {setting.name} | {ratios} | {wait.calls} |")
    lines.append("")
    return lines


def settings_for(short: bool, real_clock: bool) -> list[Setting]:
    """The sweep: three judge capacities against a light and a heavy generation tail.

    The judge's median latency is a tenth of the median generation time. Capacity is given per
    group so that the load does not depend on the workload's size: 1 slot per 4 groups (the judge
    is overloaded), 1 per 2 groups (the ratio of the defaults: 256 slots, 512 prompts per step),
    and 4 per group (the judge keeps up with any arrival burst). On the real clock three of the
    settings run 100 times faster with few groups, so that a run takes seconds.
    """
    groups = (4 if short else 8) if real_clock else (64 if short else 256)
    scale = 0.01 if real_clock else 1.0
    capacities = (
        ("1 slot per 4 groups", max(groups // 4, 1)),
        ("1 slot per 2 groups", max(groups // 2, 1)),
        ("4 slots per group", 4 * groups),
    )
    tails = (("heavy tail", 1.0), ("light tail", 0.25))
    settings = [
        Setting(
            f"{capacity}, {tail}",
            groups,
            slots,
            judge_latency_median_s=6.0 * scale,
            judge_latency_sigma=0.5,
            generation_median_s=60.0 * scale,
            generation_sigma=sigma,
            generation_cap_s=600.0 * scale,
        )
        for capacity, slots in capacities
        for tail, sigma in tails
    ]
    if real_clock:
        kept = {
            "1 slot per 2 groups, heavy tail",
            "1 slot per 2 groups, light tail",
            "4 slots per group, heavy tail",
        }
        settings = [setting for setting in settings if setting.name in kept]
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark early judging against wait-for-all.")
    parser.add_argument("--short", action="store_true", help="smaller workloads (CI machines)")
    parser.add_argument(
        "--real-clock",
        action="store_true",
        help="a smaller workload on the real clock over loopback HTTP (sanity check)",
    )
    parser.add_argument("--seed", type=int, default=1, help="workload and judge seed")
    args = parser.parse_args(argv)
    print("# Early judging vs wait-for-all")
    print()
    if args.real_clock:
        print("Real clock over loopback HTTP (hypercorn + TCP fake judge): times are real seconds")
        print("including CPU and I/O on this machine and vary between runs. The last column runs")
        print("the same workload on Trio's MockClock, as the default mode does.")
        print(f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}.")
    else:
        print("Times are simulated seconds on Trio's MockClock (autojump) with the in-process")
        print("server and fake judge: they show scheduling effects, not CPU cost.")
    print(f"Seed {args.seed}; circular comparisons, 1 judge pass, N={GROUP_SIZE}.")
    print()
    unit = "real seconds" if args.real_clock else "simulated seconds"
    results: list[tuple[Setting, Run, Run]] = []
    for setting in settings_for(args.short, args.real_clock):
        workload = make_workload(setting, args.seed)
        simulated: tuple[Run, Run] | None = None
        if args.real_clock:
            wait = run_real_clock(setting, workload, False, args.seed)
            early = run_real_clock(setting, workload, True, args.seed)
            simulated = (
                run_simulated(setting, workload, False, args.seed),
                run_simulated(setting, workload, True, args.seed),
            )
            check_same_work(setting, *simulated)
        else:
            wait = run_simulated(setting, workload, False, args.seed)
            early = run_simulated(setting, workload, True, args.seed)
        check_same_work(setting, wait, early)
        results.append((setting, wait, early))
        print("\n".join(table(setting, wait, early, unit, simulated)), flush=True)
    print("\n".join(summary(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
