"""What the judge reads: scoring texts of a rollout (S-1), the judge-facing history (J-7, §2.7)
and the effective principle (J-6).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "convert_history",
    "effective_principle",
    "extract_scoring_text",
    "judge_answer_text",
    "normalize_compare_history",
]

_EMPTY_ANSWER = "None"
_JUDGE_ROLES = frozenset({"user", "assistant", "system"})
_TEXT_PART_TYPES = frozenset({"input_text", "output_text"})


def extract_scoring_text(response: Any) -> tuple[str, str]:
    """(reasoning text, answer text) of one rollout's `response` value (S-1).

    Anything that is not shaped like a Responses-API object is ignored, never an error.
    """
    reasoning: list[str] = []
    answer: list[str] = []
    output = response.get("output") if isinstance(response, dict) else None
    if not isinstance(output, list):
        return "", ""
    for item in output:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "reasoning":
            reasoning.extend(_texts(item.get("summary"), part_types=None))
        elif kind == "message":
            answer.extend(_texts(item.get("content"), part_types=frozenset({"output_text"})))
    return "".join(reasoning), "".join(answer)


def judge_answer_text(answer: str) -> str:
    """The answer as shown to the judge: an empty or blank answer becomes ``None`` (J-5)."""
    return answer if answer.strip() else _EMPTY_ANSWER


def convert_history(input_value: Any) -> list[dict[str, str]]:
    """The judge-facing history of `responses_create_params.input` (J-7)."""
    if isinstance(input_value, str):
        return [{"role": "user", "content": input_value}]
    if not isinstance(input_value, list):
        return []
    history: list[dict[str, str]] = []
    for item in input_value:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        role = item.get("role")
        role = _judge_role(role if isinstance(role, str) else "user")
        if role is None:
            continue
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(_texts(content, part_types=_TEXT_PART_TYPES))
        elif not isinstance(content, str):
            content = ""
        history.append({"role": role, "content": content})
    return history


def normalize_compare_history(items: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The judge-facing history of a `/compare` `conversation_history` (§2.7)."""
    history: list[dict[str, str]] = []
    for item in items:
        role = _judge_role(item["role"])
        if role is not None:
            history.append({"role": role, "content": item["content"]})
    return history


def effective_principle(
    request_principle: str | None, default_principle: str, use_principle: bool
) -> str | None:
    """The principle to send to the judge, or None to send none (J-2, J-6)."""
    if not use_principle:
        return None
    if isinstance(request_principle, str) and request_principle.strip():
        return request_principle
    return default_principle or None


def _judge_role(role: str) -> str | None:
    if role == "developer":
        return "system"
    return role if role in _JUDGE_ROLES else None


def _texts(parts: Any, *, part_types: frozenset[str] | None) -> list[str]:
    """String `text` of each dict part (of the given types, when given), in order."""
    if not isinstance(parts, list):
        return []
    texts: list[str] = []
    for part in parts:
        if not isinstance(part, dict):
            continue
        if part_types is not None and part.get("type") not in part_types:
            continue
        text = part.get("text")
        if isinstance(text, str):
            texts.append(text)
    return texts
