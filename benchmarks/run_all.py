"""Run every benchmark in benchmarks/ (each `bench_*.py`, in name order) and summarise.

Caveat: the benchmarks measure CPU and wall time on the machine they run on; each prints its own
caveat and its raw figures, and each compares against a baseline measured in the same run.
Running them one after another keeps them from competing with each other, not with whatever
else the machine is doing.

    python benchmarks/run_all.py            # full size
    python benchmarks/run_all.py --short    # CI-size machines: --short is passed to each
    python benchmarks/run_all.py --only http --only scaling
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent


def discover(only: Sequence[str]) -> list[Path]:
    """The benchmark scripts, optionally those whose name contains one of ``only``."""
    scripts = sorted(HERE.glob("bench_*.py"))
    if only:
        scripts = [s for s in scripts if any(word in s.stem for word in only)]
    return scripts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--short", action="store_true", help="pass --short to every benchmark")
    parser.add_argument(
        "--only", action="append", default=[], metavar="WORD", help="run matching scripts only"
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    scripts = discover(args.only)
    if args.list:
        for script in scripts:
            print(script.name)
        return 0
    if not scripts:
        print("no benchmark matched", file=sys.stderr)
        return 2
    results: list[tuple[str, int, float]] = []
    for script in scripts:
        command = [sys.executable, str(script), *(["--short"] if args.short else [])]
        print(f"\n=== {script.name} {'--short' if args.short else ''}".rstrip(), flush=True)
        started = time.monotonic()
        status = subprocess.run(command, cwd=HERE.parent, check=False).returncode
        results.append((script.name, status, time.monotonic() - started))
    print("\n=== summary")
    for name, status, seconds in results:
        verdict = "ok" if status == 0 else f"FAILED (exit {status})"
        print(f"{name:<28} {seconds:7.1f} s  {verdict}")
    return 0 if all(status == 0 for _, status, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
