"""The `genrm-trio` console script: `serve`, `fake-judge`, `demo`, `collect` and `fake-policy`.

Logs go to stderr; stdout carries only the documented lines. Exit 0 success, 1 runtime failure,
2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence

from genrm_trio._version import __version__
from genrm_trio.config import ConfigError
from genrm_trio.fakes import judge_command, policy_command
from genrm_trio.gym_config import load_serve_config
from genrm_trio.logs import configure_logging
from genrm_trio.serve import run_serve


def _parser() -> argparse.ArgumentParser:
    # The collector's own modules (and tqdm) load only when `collect` runs.
    from genrm_trio.collect import add_arguments as add_collect_arguments

    parser = argparse.ArgumentParser(prog="genrm-trio", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"genrm-trio {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve /verify and /compare")
    serve.add_argument(
        "--config", help="YAML configuration file, or a NeMo Gym resources-server config file"
    )
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one configuration key (value parsed as YAML); repeatable",
    )
    serve.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.add_argument(
        "--workers",
        type=int,
        help="worker processes sharing the listening socket and the groups (key `workers`)",
    )
    serve.add_argument(
        "--wait-for-judge",
        type=_seconds,
        metavar="SECONDS",
        help="listen only once a judge replica answers its probe (judge_probe_path); exit 1 "
        "naming each replica's error if none has within SECONDS",
    )

    judge = commands.add_parser("fake-judge", help="serve the built-in fake judge")
    judge_command.add_arguments(judge)

    demo = commands.add_parser("demo", help="judge built-in groups on the fake judge")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument(
        "--judge-api", choices=["chat_completions", "responses"], default="chat_completions"
    )
    demo.add_argument("--json", action="store_true", help="print the /verify rows as JSON")

    collect = commands.add_parser("collect", help="generate, judge and write rollouts of tasks")
    add_collect_arguments(collect)

    policy = commands.add_parser("fake-policy", help="serve the built-in fake policy")
    policy_command.add_arguments(policy)
    return parser


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0 (got {value})")
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve_command(args)
    if args.command == "fake-judge":
        return judge_command.run(args)
    if args.command == "collect":
        from genrm_trio.collect import run as run_collect

        return run_collect(args)
    if args.command == "fake-policy":
        return policy_command.run(args)
    from genrm_trio.demo import run_demo

    configure_logging("ERROR")
    try:
        return run_demo(seed=args.seed, judge_api=args.judge_api, as_json=args.json)
    except BrokenPipeError:
        # The reader went away (`demo | head`); nothing left to report.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _serve_command(args: argparse.Namespace) -> int:
    sets = list(args.sets)
    if args.log_level:
        sets.append(f"log_level={args.log_level}")
    if args.workers is not None:
        sets.append(f"workers={args.workers}")
    try:
        config, notes = load_serve_config(args.config, sets, host=args.host, port=args.port)
    except ConfigError as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        return 2
    wait = args.wait_for_judge
    if wait is not None and config.judge_probe_path is None:
        print(
            "genrm-trio: --wait-for-judge needs judge_probe_path, which is null (probing off)",
            file=sys.stderr,
        )
        return 2
    if config.workers > 1:
        from genrm_trio.workers import run_workers

        return run_workers(config, notes, wait_for_judge_s=wait)
    return run_serve(config, notes, wait_for_judge_s=wait)


if __name__ == "__main__":
    sys.exit(main())
