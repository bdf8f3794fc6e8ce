"""`genrm-trio collect`: evaluation runs that generate rollouts with a policy, have a genrm-trio
server judge each task's rollouts as one whole group, and write rows, failures and metrics.

The package's face is the command: `add_arguments(parser)` adds its flags and `run(args)` runs it.
`run` loads the collector's modules (and tqdm) the first time it is asked for, so the command
line's other commands never load them.
"""

from typing import TYPE_CHECKING, Any

from genrm_trio.collect._arguments import add_arguments

if TYPE_CHECKING:
    from genrm_trio.collect._command import run

__all__ = ["add_arguments", "run"]


def __getattr__(name: str) -> Any:
    if name == "run":
        from genrm_trio.collect._command import run

        return run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
