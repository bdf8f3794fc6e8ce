"""Length and style adjustments applied to the base scores of the rollouts being scored
(S-40…S-48).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from genrm_trio.config import Config

__all__ = ["adjust_scores", "group_relative_weights", "style_density"]

_FENCE = "```"
_HEADER = re.compile(r"^#{1,6}\s", re.MULTILINE)
# A list item is `^\s*` (MULTILINE) before its marker; `_list_items` finds those line starts
# without the regex engine's rescan of a whitespace run from every line start inside it.
_ORDERED_MARKER = re.compile(r"(?<!\S)\d+\.\s")
_UNORDERED_MARKER = re.compile(r"(?<!\S)[-*+]\s")
_BOLD_STARS = re.compile(r"\*\*[^*\n]+\*\*")
_BOLD_UNDERSCORES = re.compile(r"__[^_\n]+__")
# S-47: the second range also spans CJK, kana and Hangul; kept for reward parity with NeMo Gym.
_EMOJI = re.compile(
    "[\u24c2-\U0001f251\U0001f300-\U0001f5ff\U0001f600-\U0001f64f\U0001f680-\U0001f6ff"
    "\U0001f900-\U0001f9ff\U0001fa00-\U0001fa6f\U0001fa70-\U0001faff]"
)


def style_density(answer: str) -> float:
    """Style elements per code point of the answer outside fenced code blocks (S-46)."""
    remaining = _without_code_blocks(answer)
    length = len(remaining.strip())
    if length == 0:
        return 0.0
    elements = _list_items(remaining, _ORDERED_MARKER) + _list_items(remaining, _UNORDERED_MARKER)
    elements += sum(
        len(pattern.findall(remaining))
        for pattern in (_HEADER, _BOLD_STARS, _BOLD_UNDERSCORES, _EMOJI)
    )
    return elements / length


def group_relative_weights(values: Sequence[float]) -> list[float]:
    """Zero-sum weights, positive for the smaller values (S-43): [0, 0.5, 1] -> [0.5, 0, -0.5]."""
    if not values:
        return []
    low, high = min(values), max(values)
    if low == high:
        return [0.0] * len(values)
    raw = [1.0 - (value - low) / (high - low) for value in values]
    mean = sum(raw) / len(raw)
    return [weight - mean for weight in raw]


def adjust_scores(
    scores: Sequence[float],
    reasoning: Sequence[str],
    answers: Sequence[str],
    config: Config,
) -> list[float]:
    """Final scores of the rollouts being scored, given in slot order (S-32, S-34, S-40…S-47).

    Every list describes exactly the rollouts being scored; N is their number.
    """
    if not len(scores) == len(reasoning) == len(answers):
        raise ValueError("scores, reasoning and answers must describe the same rollouts")
    running = list(scores)
    if len(running) < 2:
        return running
    reasoning_coeff = config.group_reasoning_length_penalty_coeff
    answer_coeff = config.group_answer_length_penalty_coeff
    if (
        config.reasoning_bonus > 0
        or config.answer_bonus > 0
        or reasoning_coeff > 0
        or answer_coeff > 0
    ):
        reasoning_lengths = [len(text.strip()) for text in reasoning]
        answer_lengths = [len(text.strip()) for text in answers]
        ranked = sorted(running, reverse=True)
        threshold = ranked[max(0, math.floor(len(running) * config.top_percentile) - 1)]
        for bonus, lengths in (
            (config.reasoning_bonus, reasoning_lengths),
            (config.answer_bonus, answer_lengths),
        ):
            if bonus > 0:
                shortest = _shortest_non_empty(lengths)
                if shortest is not None and running[shortest] >= threshold:
                    running[shortest] += bonus
        if reasoning_coeff > 0 or answer_coeff > 0:
            reasoning_weights = group_relative_weights(reasoning_lengths)
            answer_weights = group_relative_weights(answer_lengths)
            for k in range(len(running)):
                running[k] += (
                    reasoning_weights[k] * reasoning_coeff + answer_weights[k] * answer_coeff
                )
    if config.group_style_penalty_coeff > 0:
        style_weights = group_relative_weights([style_density(text) for text in answers])
        for k in range(len(running)):
            running[k] += style_weights[k] * config.group_style_penalty_coeff
    return running


def _shortest_non_empty(lengths: Sequence[int]) -> int | None:
    """Index of the smallest positive length, lowest index on ties."""
    best: int | None = None
    for k, length in enumerate(lengths):
        if length > 0 and (best is None or length < lengths[best]):
            best = k
    return best


def _list_items(text: str, marker: re.Pattern[str]) -> int:
    """Number of matches of ``^\\s*<marker>`` (MULTILINE, non-overlapping) in linear time."""
    count = 0
    matched_up_to = 0
    for found in marker.finditer(text):
        # Walk back through the whitespace before the marker, not past the previous match,
        # looking for a line start.
        line_start = found.start()
        while True:
            if line_start == 0 or text[line_start - 1] == "\n":
                count += 1
                matched_up_to = found.end()
                break
            if line_start - 1 < matched_up_to or not text[line_start - 1].isspace():
                break
            line_start -= 1
    return count


def _without_code_blocks(text: str) -> str:
    """`text` with every fenced block removed: a fence up to the next fence, shortest match."""
    kept: list[str] = []
    position = 0
    while True:
        opening = text.find(_FENCE, position)
        if opening == -1:
            break
        closing = text.find(_FENCE, opening + len(_FENCE))
        if closing == -1:
            break
        kept.append(text[position:opening])
        position = closing + len(_FENCE)
    kept.append(text[position:])
    return "".join(kept)
