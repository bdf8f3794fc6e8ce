"""The collector's progress bar on stderr: groups done, rollouts per minute, mask rate so far.
Shown only when stderr is a terminal, so logs and CI output stay clean.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TextIO

from tqdm import tqdm

from genrm_trio.collect._runner import RunCounts


class Progress:
    """A tqdm bar over groups; `update(counts)` after each finished group."""

    def __init__(
        self, total: int, done: int, *, stream: TextIO | None = None, enabled: bool | None = None
    ) -> None:
        stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = stream.isatty()
        self._bar = tqdm(
            total=total,
            initial=done,
            unit="group",
            desc="collect",
            file=stream,
            disable=not enabled,
            dynamic_ncols=True,
        )
        self._start = done

    def update(self, counts: RunCounts) -> None:
        self._bar.update(self._start + counts.groups_done - self._bar.n)
        self._bar.set_postfix_str(
            f"{counts.rollouts_per_minute():.0f} rollouts/min, mask rate {counts.mask_rate:.1%}"
        )

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
