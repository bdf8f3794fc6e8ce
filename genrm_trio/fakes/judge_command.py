"""`genrm-trio fake-judge`: flags, rules file loading and the serving loop (CL-10).
Prints `fake judge listening on http://<host>:<port>/v1` when ready; SIGINT/SIGTERM exit 0.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio
import yaml

from genrm_trio.fakes.judge import (
    FakeJudge,
    parse_fault_action,
    parse_latency,
    parse_prefix_cache,
)
from genrm_trio.fakes.judge_http import serve_fake_judge

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2


def latency_arg(value: str) -> str:
    try:
        parse_latency(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _prefix_cache_arg(value: str) -> str:
    try:
        parse_prefix_cache(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _fault_rate_arg(value: str) -> tuple[str, float]:
    name, sep, rate = value.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected ACTION=P, got {value!r}")
    try:
        parse_fault_action(name)
        probability = float(rate)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not 0 <= probability <= 1:
        raise argparse.ArgumentTypeError(f"{value!r}: P must be a number in [0, 1]")
    return name, probability


def port_arg(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {port}")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `fake-judge` flags of CL-10 to ``parser``."""
    parser.add_argument("--host", default="127.0.0.1", help="listen address")
    parser.add_argument("--port", type=port_arg, default=9000, help="listen port; 0 = free port")
    parser.add_argument("--model", default=None, help="the only model name accepted")
    parser.add_argument("--api-key", default=None, help="require Authorization: Bearer <K>")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    parser.add_argument(
        "--latency",
        type=latency_arg,
        default="none",
        help="none, fixed:S, uniform:LO:HI or lognormal:MEDIAN:SIGMA (seconds)",
    )
    parser.add_argument(
        "--prefix-cache",
        type=_prefix_cache_arg,
        default="none",
        metavar="CAPACITY:MISS_S",
        help="prefix-cache latency model: a call whose conversation is not among the last "
        "CAPACITY served takes MISS_S seconds longer (default none)",
    )
    parser.add_argument("--position-bias", type=float, default=0.0, help="added to score_1")
    parser.add_argument("--tie-ranking", type=float, default=3.5, help="ranking of a tie")
    parser.add_argument("--rules", type=Path, default=None, help="rules file, YAML or JSON")
    parser.add_argument(
        "--fault-rate",
        type=_fault_rate_arg,
        action="append",
        default=[],
        metavar="ACTION=P",
        help="take ACTION with probability P after rules, e.g. http_status:503=0.01",
    )


def load_rules(path: Path) -> list[dict[str, Any]]:
    """Read a rules file: a YAML or JSON list of rules, or a mapping with a ``rules`` list."""
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    if isinstance(loaded, dict) and set(loaded) == {"rules"}:
        loaded = loaded["rules"]
    if loaded is None:
        return []
    if not isinstance(loaded, list):
        raise ValueError("expected a list of rules")
    return loaded


def judge_from_args(args: argparse.Namespace) -> FakeJudge:
    """Build the judge the flags describe; raises ``ValueError``/``OSError`` for bad input."""
    rules = load_rules(args.rules) if args.rules is not None else None
    return FakeJudge(
        seed=args.seed,
        model=args.model,
        api_key=args.api_key,
        latency=args.latency,
        position_bias=args.position_bias,
        tie_ranking=args.tie_ranking,
        rules=rules,
        fault_rates=dict(args.fault_rate),
        prefix_cache=args.prefix_cache,
    )


def listening_line(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"fake judge listening on http://{shown}:{port}/v1"


async def _serve_until_signal(
    serve: Callable[..., Awaitable[None]], ready_line: Callable[[Any], str]
) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(serve)
            print(ready_line(bound), flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def run_until_signal(
    command: str, serve: Callable[..., Awaitable[None]], ready_line: Callable[[Any], str]
) -> int:
    """Run a fake server (started with ``nursery.start(serve)``, which reports where it is
    bound) until SIGINT or SIGTERM; print ``ready_line(bound)`` once it listens. The exit
    status."""
    status = EXIT_OK
    try:
        trio.run(_serve_until_signal, serve, ready_line)
    except* OSError as group:
        for failure in group.exceptions:
            print(f"genrm-trio {command}: cannot listen: {failure}", file=sys.stderr)
        status = EXIT_RUNTIME
    return status


def run(args: argparse.Namespace) -> int:
    """Serve the fake judge until SIGINT or SIGTERM; return the exit status."""
    try:
        judge = judge_from_args(args)
    except (OSError, ValueError, yaml.YAMLError) as error:
        print(f"genrm-trio fake-judge: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return run_until_signal(
        "fake-judge",
        partial(serve_fake_judge, judge, args.host, args.port),
        partial(listening_line, args.host),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="genrm-trio fake-judge", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
