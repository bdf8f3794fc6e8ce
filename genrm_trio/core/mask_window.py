"""The share of /verify rollouts answered masked over the last ``mask_window_s`` seconds, by
reason, and when that share is worth a log line.

Theory of operation. Each rollout's first answer (a scored or a masked row; never a replay or
a rejection) is counted at the time it is given, in one of ``SLICES`` slices of the window. The
window is the last ``SLICES`` slices, so its far edge is exact to one slice (one second of the
default minute), and memory stays fixed however many rollouts a second the server answers. A
masked rollout is counted under a short reason read from its failure text (``masked_reason``):
the judge's error class (``judge ConnectError``, ``judge HTTP 503``, ``judge TimeoutError``) or
what ended its group (``evaluation deadline``), words from a small fixed set that may label a
Prometheus series.

The rules of the warning, checked after each answer:

- The window is *dominated* when it holds at least ``min_rollouts`` answers and the masked share
  is at or above ``warning_ratio``. ``warning_ratio`` None never warns.
- Becoming dominated: one WARNING naming the share and the most common reason with its count.
- Staying dominated: one more WARNING each time a whole window has passed since the last one.
- Ceasing to be dominated: one INFO. A window that empties for lack of traffic says nothing
  until the next answer.
"""

from __future__ import annotations

import logging
import math
import re
from collections import deque
from typing import NamedTuple

__all__ = ["SLICES", "MaskReading", "MaskWindow", "masked_reason"]

SLICES = 60
EXAMPLE_CHARS = 300  # of the latest failure text shown with a warning

# The judge error text of a failed comparison (J-40), wherever it sits in a masked row's text.
_JUDGE_ERROR = re.compile(
    r"GenRM judge \S+ pair=\(\d+, \d+\) judge=\d+ attempt=\d+/\d+ deadline=\S+s: (.*)", re.DOTALL
)
_HTTP_STATUS = re.compile(r"HTTPStatusError: HTTP (\d{3})\b")
_ERROR_CLASS = re.compile(r"([A-Z][A-Za-z0-9_]{0,63}): ")
# What ended a group, by the words of its failure text (core/messages.py).
_GROUP_FAILURES = (
    ("evaluation deadline exceeded", "evaluation deadline"),
    ("evaluation was cancelled", "evaluation cancelled"),
    ("cohort evaluation failed", "evaluation error"),
    ("input conversion failed", "input conversion error"),
    ("was sent again on its own", "legacy resend"),
)


def masked_reason(text: str) -> tuple[str, str]:
    """(short reason, the failure text worth showing) of a masked row's failure text.

    The short reason comes from a fixed vocabulary: ``judge HTTP <status>``, ``judge <error
    class>`` (a transport error, ``TimeoutError``, ``JSONDecodeError``), ``judge gave no
    verdict``, or what ended the group; ``other`` for a text none of these match. The text shown
    is the judge's error text when there is one (the group key and slot before it say nothing
    about the cause), else the whole text.
    """
    judge = _JUDGE_ERROR.search(text)
    if judge is not None:
        cause = judge.group(1)
        shown = text[judge.start() :]
        status = _HTTP_STATUS.match(cause)
        if status is not None:
            return f"judge HTTP {status.group(1)}", shown
        if cause.startswith("Judge returned no completed answer"):
            return "judge gave no verdict", shown
        error = _ERROR_CLASS.match(cause)
        return (f"judge {error.group(1)}" if error else "judge error"), shown
    for words, reason in _GROUP_FAILURES:
        if words in text:
            return reason, text
    return "other", text


class MaskReading(NamedTuple):
    """The window as of one instant."""

    answered: int  # rollouts answered, scored or masked
    masked: int
    reasons: dict[str, int]  # masked rollouts by reason

    @property
    def ratio(self) -> float:
        """The masked share; 0 when nothing was answered."""
        return self.masked / self.answered if self.answered else 0.0

    def dominant(self) -> tuple[str, int] | None:
        """The most common reason and its count (the first by name on a tie)."""
        if not self.reasons:
            return None
        return min(self.reasons.items(), key=lambda item: (-item[1], item[0]))


class _Slice:
    __slots__ = ("answered", "index", "masked", "reasons")

    def __init__(self, index: int) -> None:
        self.index = index
        self.answered = 0
        self.masked = 0
        self.reasons: dict[str, int] = {}


class MaskWindow:
    """Rollouts answered and masked over a sliding window, and the warning's state."""

    def __init__(
        self, window_s: float, warning_ratio: float | None = None, min_rollouts: int = 1
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.window_s = window_s
        self.warning_ratio = warning_ratio
        self.min_rollouts = min_rollouts
        self._slice_s = window_s / SLICES
        self._slices: deque[_Slice] = deque()
        self._answered = 0
        self._masked = 0
        self._reasons: dict[str, int] = {}
        # Every reason ever counted, so a gauge by reason reads 0 once it leaves the window
        # instead of keeping its last count.
        self.known_reasons: set[str] = set()
        self._latest: dict[str, str] = {}  # reason -> its latest failure text
        self._warned_at: float | None = None  # while dominated: the last warning's time

    # ---- counting ------------------------------------------------------------------------------

    def answered(self, masked_text: str | None, now: float) -> tuple[int, str] | None:
        """Count one rollout answered at ``now``: scored (None) or masked with this failure
        text. Returns the (level, text) of a log line to write, if the warning's state says so."""
        current = self._advance(now)
        current.answered += 1
        self._answered += 1
        if masked_text is not None:
            reason, shown = masked_reason(masked_text)
            current.masked += 1
            current.reasons[reason] = current.reasons.get(reason, 0) + 1
            self._masked += 1
            self._reasons[reason] = self._reasons.get(reason, 0) + 1
            self.known_reasons.add(reason)
            self._latest[reason] = shown
        return self._check(now)

    def reading(self, now: float) -> MaskReading:
        """The window ending at ``now``."""
        self._expire(self._index(now))
        reasons = {reason: count for reason, count in self._reasons.items() if count}
        return MaskReading(self._answered, self._masked, reasons)

    def _index(self, now: float) -> int:
        return math.floor(now / self._slice_s)

    def _advance(self, now: float) -> _Slice:
        index = self._index(now)
        self._expire(index)
        if not self._slices or self._slices[-1].index < index:
            self._slices.append(_Slice(index))
        # A clock never runs back; if one did, its answers join the newest slice.
        return self._slices[-1]

    def _expire(self, index: int) -> None:
        slices = self._slices
        while slices and slices[0].index <= index - SLICES:
            gone = slices.popleft()
            self._answered -= gone.answered
            self._masked -= gone.masked
            for reason, count in gone.reasons.items():
                self._reasons[reason] -= count

    # ---- the warning ---------------------------------------------------------------------------

    def _dominated(self, reading: MaskReading) -> bool:
        ratio = self.warning_ratio
        return (
            ratio is not None
            and reading.answered >= self.min_rollouts
            and reading.masked >= ratio * reading.answered
        )

    def _check(self, now: float) -> tuple[int, str] | None:
        reading = self.reading(now)
        if self._dominated(reading):
            if self._warned_at is not None and now - self._warned_at < self.window_s:
                return None
            self._warned_at = now
            return logging.WARNING, self._warning(reading)
        if self._warned_at is None:
            return None
        self._warned_at = None
        return logging.INFO, (
            f"GenRM masked rollouts fell below mask_warning_ratio {self.warning_ratio:g}:"
            f" {reading.masked} of {reading.answered} in the last {self.window_s:g} s"
            f" ({reading.ratio:.0%})"
        )

    def _warning(self, reading: MaskReading) -> str:
        text = (
            f"GenRM masked {reading.masked} of {reading.answered} rollouts in the last"
            f" {self.window_s:g} s ({reading.ratio:.0%}, mask_warning_ratio"
            f" {self.warning_ratio:g}); the trainer gets no reward for them"
        )
        dominant = reading.dominant()
        if dominant is not None:
            reason, count = dominant
            example = _shorten(self._latest[reason])
            text += f"; most common reason ({count}): {reason}; latest: {example}"
        return text


def _shorten(text: str) -> str:
    return text if len(text) <= EXAMPLE_CHARS else text[: EXAMPLE_CHARS - 3] + "..."
