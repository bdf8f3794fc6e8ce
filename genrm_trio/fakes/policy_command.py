"""`genrm-trio fake-policy`: flags and the serving loop of the fake policy.
Prints `fake policy listening on http://<host>:<port>/v1` when ready; SIGINT/SIGTERM exit 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial

from genrm_trio.fakes.judge_command import EXIT_USAGE, latency_arg, port_arg, run_until_signal
from genrm_trio.fakes.policy import FakePolicy, parse_range, serve_fake_policy


def _range_arg(what: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        try:
            parse_range(value, what)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return value

    return check


def _rate_arg(value: str) -> float:
    try:
        rate = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {value!r}") from None
    if not 0 <= rate <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {value!r}")
    return rate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="listen address")
    parser.add_argument("--port", type=port_arg, default=8100, help="listen port; 0 = free port")
    parser.add_argument("--model", default=None, help="the only model name accepted")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    parser.add_argument(
        "--latency",
        type=latency_arg,
        default="lognormal:0.05:1.0",
        help="generation time: none, fixed:S, uniform:LO:HI or lognormal:MEDIAN:SIGMA (seconds)",
    )
    parser.add_argument(
        "--quality",
        type=_range_arg("quality"),
        default="1:5",
        help="answer quality LO:HI, integers drawn uniformly (the fake judge reads it)",
    )
    parser.add_argument(
        "--words", type=_range_arg("words"), default="4:24", help="filler words per answer LO:HI"
    )
    parser.add_argument(
        "--error-rate", type=_rate_arg, default=0.0, help="share of requests answered with 500"
    )


def policy_from_args(args: argparse.Namespace) -> FakePolicy:
    return FakePolicy(
        seed=args.seed,
        model=args.model,
        latency=args.latency,
        quality=args.quality,
        words=args.words,
        error_rate=args.error_rate,
    )


def run(args: argparse.Namespace) -> int:
    """Serve the fake policy until SIGINT or SIGTERM; return the exit status."""
    try:
        policy = policy_from_args(args)
    except ValueError as error:
        print(f"genrm-trio fake-policy: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return run_until_signal(
        "fake-policy",
        partial(serve_fake_policy, policy, args.host, args.port),
        lambda url: f"fake policy listening on {url}/v1",
    )
