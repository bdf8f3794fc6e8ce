"""genrm-trio: turns groups of RL rollouts into rewards with a pairwise generative judge.

The public face is lazy: `create_app` and `fingerprint` load their modules the first time they
are asked for, so that `import genrm_trio.client` (a trainer's process) never loads the server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from genrm_trio._version import __version__

if TYPE_CHECKING:
    from genrm_trio.core.canonical import fingerprint
    from genrm_trio.http.app import create_app

__all__ = ["__version__", "create_app", "fingerprint"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from genrm_trio.http.app import create_app

        return create_app
    if name == "fingerprint":
        from genrm_trio.core.canonical import fingerprint

        return fingerprint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
