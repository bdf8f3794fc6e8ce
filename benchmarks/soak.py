"""Long race soak: seeded scenarios until the requested number of groups has run; prints the
count of every outcome and every invariant violation, with a minimal reproduction for each.

Caveat: a correctness soak, not a speed benchmark. Every scenario runs on Trio's MockClock, so
deadlines, TTLs and retries cost no wall time and the figures do not depend on the machine;
the run time printed is for planning only. Each seed replays exactly (same seed, same shape,
same code), so a failure printed here can be rerun with --seed N --seeds 1.

    python benchmarks/soak.py --groups 100000            # the long soak (1,000 seeds x 100)
    python benchmarks/soak.py --short                    # 2,000 groups, under a minute
    python benchmarks/soak.py --shape as160 --seeds 20   # the AS-160 load shape
    python benchmarks/soak.py --via http --short         # through the HTTP app (slower)
    python benchmarks/soak.py --replay scenario.json     # one printed reproduction
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from genrm_trio.testing.scenarios import (
    AS160_SHAPE,
    Scenario,
    ScenarioReport,
    Shape,
    Via,
    run_scenario,
    run_seeds,
)

SHAPES = {"default": Shape(groups=100, window=6), "small": Shape(), "as160": AS160_SHAPE}


def machine_line() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.machine()}, load {load:.2f}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=100_000, help="stop after this many")
    parser.add_argument("--short", action="store_true", help="2,000 groups in 10-group seeds")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="default")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--seeds", type=int, default=None, help="run exactly this many seeds")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--via", choices=("engine", "http"), default="engine")
    parser.add_argument("--replay", type=Path, help="play one scenario JSON and report it")
    return parser.parse_args(argv)


def replay(path: Path, via: Via) -> int:
    scenario = Scenario.from_json(path.read_text())
    report = run_scenario(scenario, via=via)
    print(report.summary())
    if not report.ok:
        print(report.reproduction())
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print("caveat: correctness soak on a mock clock; run time is for planning only")
    print(machine_line())
    via: Via = "http" if args.via == "http" else "engine"
    if args.replay is not None:
        return replay(args.replay, via)
    shape = SHAPES["small" if args.short and args.shape == "default" else args.shape]
    groups_wanted = 2_000 if args.short else args.groups
    seeds = args.seeds if args.seeds is not None else -(-groups_wanted // shape.groups)
    print(
        f"soak: {seeds} seeds from {args.seed}, {shape.groups} groups each, via {via}, "
        f"{args.workers} worker(s)"
    )
    totals: Counter[str] = Counter()
    failed: list[ScenarioReport] = []
    done = {"seeds": 0, "groups": 0, "steps": 0}
    started = time.perf_counter()
    every = max(1, seeds // 20)

    def note(report: ScenarioReport) -> None:
        done["seeds"] += 1
        done["groups"] += report.groups
        done["steps"] += report.steps_run
        totals.update(report.counts)
        if not report.ok:
            failed.append(report)
            print(f"  seed {report.scenario.seed}: {report.violations[0]}", flush=True)
        if done["seeds"] % every == 0 or done["seeds"] == seeds:
            elapsed = time.perf_counter() - started
            print(
                f"  {done['seeds']}/{seeds} seeds, {done['groups']} groups, "
                f"{len(failed)} failing, {elapsed:.1f}s",
                flush=True,
            )

    run_seeds(
        range(args.seed, args.seed + seeds),
        replace(shape),
        via=via,
        workers=args.workers,
        on_report=note,
    )
    elapsed = time.perf_counter() - started
    print(
        f"ran {done['seeds']} seeds, {done['groups']} groups, {done['steps']} steps "
        f"in {elapsed:.1f}s ({done['groups'] / elapsed:.0f} groups/s)"
    )
    print("outcomes:")
    for name, count in sorted(totals.items()):
        print(f"  {name:32} {count:>10}")
    print(f"violations: {sum(len(r.violations) for r in failed)} in {len(failed)} seed(s)")
    for report in failed[:3]:
        print()
        print(report.reproduction())
    if len(failed) > 3:
        print(f"(and seeds {[r.scenario.seed for r in failed[3:]]})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
