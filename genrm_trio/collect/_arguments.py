"""The flags of `genrm-trio collect`. Kept apart from the command so that building the
parser loads none of the collector's own modules."""

from __future__ import annotations

import argparse
from pathlib import Path

POLICY_APIS = ("responses", "chat_completions")


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def _count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count >= 0, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected a count >= 0, got {value!r}")
    return number


def _seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {value!r}")
    return number


def _classes(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `collect` flags to ``parser``."""
    parser.add_argument("--policy-url", required=True, help="the policy's /v1 URL")
    parser.add_argument("--server-url", required=True, help="the genrm-trio server's URL")
    parser.add_argument("--input", type=Path, required=True, help="tasks, one JSON row a line")
    parser.add_argument(
        "--repeats",
        type=_positive_int,
        required=True,
        help="rollouts per task: the server's num_rollouts_per_prompt",
    )
    parser.add_argument("--output", type=Path, required=True, help="scored rows (JSON lines)")
    parser.add_argument(
        "--resume", action="store_true", help="continue a run: redo only incomplete groups"
    )
    parser.add_argument(
        "--concurrency", type=_positive_int, default=4, help="groups in flight (default 4)"
    )
    parser.add_argument(
        "--count-failure-classes-as-zero",
        type=_classes,
        default=[],
        metavar="CLASS,...",
        help="failure classes whose rows count as reward 0 in the metrics (never in the rows)",
    )
    parser.add_argument("--policy-api", choices=POLICY_APIS, default="responses")
    parser.add_argument("--policy-model", default=None, help="model name, when a task has none")
    parser.add_argument(
        "--policy-retries",
        type=int,
        default=2,
        help="retries of one rollout's generation after a transient failure (default 2)",
    )
    parser.add_argument(
        "--policy-timeout", type=_seconds, default=600.0, help="seconds per generation attempt"
    )
    parser.add_argument(
        "--wait-ready",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="wait this long for the server and the policy to answer before starting (default 30)",
    )
    parser.add_argument(
        "--verify-retries",
        type=_count,
        default=8,
        help="resends of one rollout to /verify after a lost connection, a gateway's 502, 503 or "
        "504, or the server's retry-later 503, with pauses doubling from 0.25 s to 8 s "
        "(default 8: at most 32 s of pauses)",
    )
    parser.add_argument(
        "--verify-timeout",
        type=_seconds,
        default=3600.0,
        help="seconds a group waits for its rewards before its attempt counts as failed",
    )
