"""Chat-template markup taken out of the texts the OpenRLHF route hands to the judge: its
prompts and responses arrive as decoded token text, control tokens and end markers included.

Rules. The markup is a list of literal markers (``judge_input_strip_tokens``). A marker holding
``{role}`` is a turn header: ``{role}`` stands for a role name written in the text (letters,
digits, ``_`` and ``-``, starting with a letter or ``_``), as in ``<|im_start|>{role}``. Any
other marker is removed wherever it occurs. The parts of a header before and after ``{role}``
are removed too where they occur without a role.

- A prompt without a turn header becomes one text. A prompt with turn headers becomes a list of
  messages ``{"role", "content"}``, one per turn that has content, in order; text before the
  first header is a user turn, and the empty turn a template opens for the reply to come (the
  trailing ``<|im_start|>assistant``) is left out. Gemma's role ``model`` is ``assistant``.
- A response loses every marker, headers with their role names included.
- Where a marker was removed, the pieces it separated are trimmed of whitespace and the
  non-empty ones joined by a line break, so no two words are glued together and no template
  line breaks are left over. A text in which no marker occurs is returned unchanged.

One regular expression of every marker, longest first, finds them; a prompt is scanned once
for its turns and each turn once more for its other markers, so the cost is linear in the text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

__all__ = ["DEFAULT_STRIP_TOKENS", "ROLE", "ChatMarkup", "check_strip_token"]

ROLE: Final = "{role}"

DEFAULT_STRIP_TOKENS: Final[tuple[str, ...]] = (
    # ChatML (Qwen, Yi, many fine-tunes)
    "<|im_start|>{role}",
    "<|im_end|>",
    # Llama 3
    "<|begin_of_text|>",
    "<|start_header_id|>{role}<|end_header_id|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    # Mistral (its template names no roles)
    "[INST]",
    "[/INST]",
    "<s>",
    "</s>",
    # Gemma
    "<bos>",
    "<start_of_turn>{role}",
    "<end_of_turn>",
    "<eos>",
    # GPT-2 style end of text
    "<|endoftext|>",
)

_ROLE_NAME: Final = r"([A-Za-z_][\w-]*)"
_ROLE_ALIASES: Final = {"model": "assistant"}


def check_strip_token(token: str) -> str | None:
    """What is wrong with one configured marker, or None."""
    if not token:
        return "an empty marker"
    if token.count(ROLE) > 1:
        return f"{token!r} holds {ROLE} more than once"
    if token.startswith(ROLE):
        return f"{token!r} starts with {ROLE}; a turn header needs text before the role"
    return None


class ChatMarkup:
    """The compiled markers of one configuration; ``ChatMarkup(())`` changes nothing."""

    def __init__(self, tokens: Iterable[str]) -> None:
        headers: list[str] = []
        plain: set[str] = set()
        for token in tokens:
            problem = check_strip_token(token)
            if problem is not None:
                raise ValueError(problem)
            before, role, after = token.partition(ROLE)
            if role:
                headers.append(re.escape(before) + _ROLE_NAME + re.escape(after))
                plain.update(part for part in (before, after) if part)
            else:
                plain.add(token)
        # Headers first, so that a header's own parts match alone only where no role follows;
        # longer markers before their prefixes.
        alternatives = headers + [re.escape(t) for t in sorted(plain, key=lambda t: (-len(t), t))]
        self._pattern = re.compile("|".join(alternatives)) if alternatives else None

    def response(self, text: str) -> str:
        """A response as the judge sees it: every marker removed."""
        if self._pattern is None:
            return text
        pieces = self._pattern.split(text)
        if len(pieces) == 1:
            return text
        # split() interleaves the role groups; a role name inside a response is markup too.
        step = self._pattern.groups + 1
        return _join(pieces[::step])

    def prompt(self, prompt: str) -> str | list[dict[str, str]]:
        """A prompt as the judge sees it: one text, or the messages of its turns."""
        if self._pattern is None:
            return prompt
        turns: list[tuple[str, str]] = []
        role = "user"
        start = 0
        found = False
        for match in self._pattern.finditer(prompt):
            found = True
            named = next((group for group in match.groups() if group is not None), None)
            if named is None:
                continue
            turns.append((role, prompt[start : match.start()]))
            role = _ROLE_ALIASES.get(named, named)
            start = match.end()
        if not found:
            return prompt
        turns.append((role, prompt[start:]))
        if len(turns) == 1:
            return self.response(prompt)
        messages = [
            {"role": name, "content": content}
            for name, text in turns
            if (content := self.response(text).strip())
        ]
        return messages or ""


def _join(pieces: list[str]) -> str:
    return "\n".join(stripped for piece in pieces if (stripped := piece.strip()))
