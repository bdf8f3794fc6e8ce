"""The progress bar: groups, rollouts per minute and mask rate on a terminal, nothing otherwise."""

from __future__ import annotations

import io

from genrm_trio.collect._progress import Progress
from genrm_trio.collect._runner import RunCounts


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _counts() -> RunCounts:
    return RunCounts(groups_done=3, rollouts=24, masked=6, started=0.0)


def test_a_terminal_shows_groups_rate_and_mask_rate() -> None:
    stream = Terminal()
    with Progress(10, 2, stream=stream) as progress:
        progress.update(_counts())
    shown = stream.getvalue()
    assert "5/10" in shown  # two groups done before a resume, three in this run
    assert "rollouts/min" in shown
    assert "mask rate 25.0%" in shown


def test_nothing_is_written_when_stderr_is_not_a_terminal() -> None:
    stream = io.StringIO()
    with Progress(10, 0, stream=stream) as progress:
        progress.update(_counts())
    assert stream.getvalue() == ""
