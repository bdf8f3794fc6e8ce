"""Finding the verdict `(score_1, score_2, ranking)` in a judge's verdict text (S-20…S-23).

Works in near-linear time on any text, however hostile, and never raises.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

from genrm_trio.core.standard_json import loads_standard

__all__ = ["Verdict", "mapped_back", "parse_verdict"]


class Verdict(NamedTuple):
    """A parsed verdict: ranking 1 means response_1 is much better, 6 response_2."""

    score_1: float
    score_2: float
    ranking: float


def parse_verdict(text: str, *, default_score: float, default_ranking: float) -> Verdict | None:
    """The verdict in `text`, or None when it holds no valid candidate.

    Fenced ```json blocks are searched first (first valid candidate wins); otherwise the whole
    text (last valid candidate wins).
    """
    for block in _json_fences(text):
        # The usual block is one JSON object and nothing else. When it is valid, it is the
        # block's first candidate: the scan from its opening brace follows JSON's own strings
        # and nesting, so it closes at the object's last brace.
        whole = block.strip()
        if whole[:1] == "{" and whole[-1:] == "}":
            verdict = _verdict_of(whole, default_score, default_ranking)
            if verdict is not None:
                return verdict
        for candidate in _candidates(block):
            verdict = _verdict_of(candidate, default_score, default_ranking)
            if verdict is not None:
                return verdict
    last: Verdict | None = None
    for candidate in _candidates(text):
        verdict = _verdict_of(candidate, default_score, default_ranking)
        if verdict is not None:
            last = verdict
    return last


def mapped_back(verdict: Verdict) -> Verdict:
    """A baseline-first verdict in rollout-first orientation (S-51)."""
    return Verdict(verdict.score_2, verdict.score_1, 7 - verdict.ranking)


_FENCE_OPEN = re.compile(r"```json\s*", re.IGNORECASE)
_FENCE = "```"


def _json_fences(text: str) -> Iterator[str]:
    position = 0
    while True:
        opening = _FENCE_OPEN.search(text, position)
        if opening is None:
            return
        closing = text.find(_FENCE, opening.end())
        if closing == -1:
            # No later opener can have a closing fence either.
            return
        yield text[opening.end() : closing]
        position = closing + len(_FENCE)


def _candidates(text: str) -> Iterator[str]:
    """Candidate spans in scanning order (S-21)."""
    closing = _closing_braces(text)
    start = text.find("{")
    while start != -1:
        end = closing.get(start)
        if end is None:
            start = text.find("{", start + 1)
        else:
            yield text[start : end + 1]
            start = text.find("{", end + 1)


# Theory of operation for _closing_braces.
#
# A scan from a '{' is a lexer in one of three string states: outside a string (OUT), inside
# one (IN), or just after a backslash inside one (ESC). Its future depends only on its state and
# position, so scans that reach the same position in the same state agree from then on, and at
# most three distinct scans are alive at any position. Each such "track" keeps one depth counter
# and, for every scan riding on it, the depth at which that scan's '{' is closed. Every '{' read
# by the OUT track starts a scan on that track; a '{' when no track is OUT starts a new one.
# Tracks that land in the same state merge (smaller into larger), so the sweep costs
# O(n log n) in the worst case instead of the O(n^2) of restarting a scan at every '{'.
#
# A judge's text nearly always keeps one track from start to end: a second one starts only at a
# '{' read inside a string of the first. That case is swept first with a plain stack of open
# braces, and the general sweep runs only when such a '{' turns up.
_OUT, _IN, _ESC = 0, 1, 2
_LEXEMES = re.compile(r'[{}"\\]')


class _Track:
    __slots__ = ("depth", "scans", "size")

    def __init__(self) -> None:
        self.depth = 0
        # Scan starts, keyed by the track depth at which each one closes.
        self.scans: dict[int, list[int]] = {}
        self.size = 0


def _join(kept: _Track | None, other: _Track) -> _Track:
    if kept is None:
        return other
    if kept.size < other.size:
        kept, other = other, kept
    shift = kept.depth - other.depth
    for depth, starts in other.scans.items():
        kept.scans.setdefault(depth + shift, []).extend(starts)
    kept.size += other.size
    return kept


def _closing_braces(text: str) -> dict[int, int]:
    """For every '{' whose scan closes, the position of its closing '}'."""
    closing = _closing_braces_one_track(text)
    return _closing_braces_any(text) if closing is None else closing


def _closing_braces_one_track(text: str) -> dict[int, int] | None:
    """``_closing_braces`` while at most one track is alive; None when a second one starts."""
    closing: dict[int, int] = {}
    opened: list[int] = []  # the track's open '{' positions, innermost last
    state = _OUT
    after_last = 0
    for lexeme in _LEXEMES.finditer(text):
        position = lexeme.start()
        char = text[position]
        if not opened:  # no track alive: only a '{' matters, and it starts one outside strings
            if char == "{":
                opened.append(position)
                state = _OUT
            after_last = position + 1
            continue
        if state == _ESC and position > after_last:
            state = _IN  # an ordinary character was the escaped one
        after_last = position + 1
        if state == _OUT:
            if char == "{":
                opened.append(position)
            elif char == "}":
                closing[opened.pop()] = position
            elif char == '"':
                state = _IN
        elif char == "{":
            return None  # read inside a string: a scan starting here is a second track
        elif state == _IN:
            if char == '"':
                state = _OUT
            elif char == "\\":
                state = _ESC
        else:
            state = _IN  # the escaped character
    return closing


def _closing_braces_any(text: str) -> dict[int, int]:
    """``_closing_braces`` with any number of tracks."""
    closing: dict[int, int] = {}
    tracks: dict[int, _Track] = {}
    after_last = 0
    for lexeme in _LEXEMES.finditer(text):
        position = lexeme.start()
        if position > after_last and _ESC in tracks:
            # Any ordinary character ends an escape.
            escaped = tracks.pop(_ESC)
            tracks[_IN] = _join(tracks.get(_IN), escaped)
        after_last = position + 1
        char = text[position]
        moved: dict[int, _Track] = {}
        for state, track in tracks.items():
            if state == _OUT:
                new_state = _IN if char == '"' else _OUT
                if char == "{":
                    track.scans.setdefault(track.depth, []).append(position)
                    track.size += 1
                    track.depth += 1
                elif char == "}":
                    track.depth -= 1
                    closed = track.scans.pop(track.depth, None)
                    if closed is not None:
                        for start in closed:
                            closing[start] = position
                        track.size -= len(closed)
            elif state == _IN:
                new_state = _OUT if char == '"' else _ESC if char == "\\" else _IN
            else:
                new_state = _IN
            if track.size:
                moved[new_state] = _join(moved.get(new_state), track)
        if char == "{" and _OUT not in tracks:
            fresh = _Track()
            fresh.scans[0] = [position]
            fresh.size = 1
            fresh.depth = 1
            moved[_OUT] = _join(moved.get(_OUT), fresh)
        tracks = moved
    return closing


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_ABSENT: Any = object()


def _verdict_of(candidate: str, default_score: float, default_ranking: float) -> Verdict | None:
    """The verdict of one candidate span if it is valid (S-22), else None."""
    try:
        decoded = loads_standard(candidate)
    except (ValueError, RecursionError):
        return None
    if not isinstance(decoded, dict):
        return None
    overall = decoded.get("overall")
    if isinstance(overall, dict):
        decoded = overall
    score_1 = decoded.get("score_1", _ABSENT)
    score_2 = decoded.get("score_2", _ABSENT)
    ranking = decoded.get("ranking", _ABSENT)
    if score_1 is _ABSENT and score_2 is _ABSENT and ranking is _ABSENT:
        return None
    number_1 = default_score if score_1 is _ABSENT else _number(score_1)
    number_2 = default_score if score_2 is _ABSENT else _number(score_2)
    number_3 = default_ranking if ranking is _ABSENT else _number(ranking)
    if number_1 is None or number_2 is None or number_3 is None:
        return None
    if not (math.isfinite(number_1) and math.isfinite(number_2) and math.isfinite(number_3)):
        return None
    return Verdict(number_1, number_2, number_3)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:
            return None
    if isinstance(value, str):
        text = value.strip()
        if _DECIMAL.fullmatch(text):
            return float(text)
    return None
