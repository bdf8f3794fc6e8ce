"""Interpretation of one judge reply body: JSON, usable or not, budget exhaustion, verdict.

Pure functions over bytes and decoded JSON (J-10…J-17); the problem strings are J-26's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from genrm_trio.config import JudgeApi
from genrm_trio.core.standard_json import loads_standard
from genrm_trio.core.verdicts import Verdict, parse_verdict

NOT_AN_OBJECT = "not a JSON object"
NO_CHOICES = "no choices"
CONTENT_NOT_STRING = "content is not a string"
EMPTY_VERDICT_TEXT = "empty verdict text"
UNFINISHED_REASONING = "unfinished reasoning"
NO_VERDICT_FOUND = "no verdict found"

# A hostile finish_reason or status could be megabytes long; error texts only need its start.
_VALUE_LIMIT = 200


class ReplyNotJson(ValueError):
    """The reply body is not valid JSON (J-10)."""


@dataclass(frozen=True, slots=True)
class ReplyReading:
    """What one judge reply amounts to."""

    verdict: Verdict | None
    problem: str | None  # J-26 text when there is no verdict
    usable: bool  # J-11 / J-14: a completed answer with non-empty verdict text
    exhausted: bool  # J-13 / J-15: the output budget ran out before a verdict


def decode_reply(body: bytes) -> object:
    """J-10: the body as standard JSON whatever its Content-Type, or ReplyNotJson.

    Invalid UTF-8, NaN/Infinity literals and nesting too deep to decode all count as not JSON.
    """
    try:
        text = body.decode("utf-8")
        if text.startswith("\ufeff"):
            text = text[1:]
        return loads_standard(text)
    except (ValueError, RecursionError) as exc:
        raise ReplyNotJson(str(exc)) from None


def _show(value: object) -> str:
    if isinstance(value, str):
        return value[:_VALUE_LIMIT]
    try:
        shown = json.dumps(value, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        shown = type(value).__name__
    return shown[:_VALUE_LIMIT]


def chat_verdict_text(content: str) -> str | None:
    """J-12: content after the last ``</think>``; None when the reasoning never closed."""
    last_open = content.rfind("<think>")
    if last_open != -1 and content.find("</think>", last_open) == -1:
        return None
    last_close = content.rfind("</think>")
    if last_close == -1:
        return content
    return content[last_close + len("</think>") :]


def responses_verdict_text(output: object) -> str:
    """J-14: every string text of every output_text part of every message item, concatenated."""
    if not isinstance(output, list):
        return ""
    texts: list[str] = []
    for item in output:
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        content = item.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, dict) and part.get("type") == "output_text":
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
    return "".join(texts)


def _unusable(problem: str, *, exhausted: bool = False) -> ReplyReading:
    return ReplyReading(verdict=None, problem=problem, usable=False, exhausted=exhausted)


def _judge_text(text: str, default_score: float, default_ranking: float) -> ReplyReading:
    """J-17 for a usable reply's verdict text."""
    if not text.strip():
        return _unusable(EMPTY_VERDICT_TEXT)
    verdict = parse_verdict(text, default_score=default_score, default_ranking=default_ranking)
    if verdict is None:
        return ReplyReading(verdict=None, problem=NO_VERDICT_FOUND, usable=True, exhausted=False)
    return ReplyReading(verdict=verdict, problem=None, usable=True, exhausted=False)


def read_chat_reply(reply: object, *, default_score: float, default_ranking: float) -> ReplyReading:
    """J-11…J-13 for a decoded chat-completions reply."""
    if not isinstance(reply, dict):
        return _unusable(NOT_AN_OBJECT)
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices:
        return _unusable(NO_CHOICES)
    choice = choices[0]
    if not isinstance(choice, dict):
        return _unusable(CONTENT_NOT_STRING)
    message = choice.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    finish_reason = choice.get("finish_reason")
    if finish_reason == "length":
        # A verdict written before the budget ran out still counts; anything else is exhaustion,
        # including servers that move all reasoning out of content and leave it null.
        if isinstance(content, str):
            text = chat_verdict_text(content)
            if text is not None and text.strip():
                verdict = parse_verdict(
                    text, default_score=default_score, default_ranking=default_ranking
                )
                if verdict is not None:
                    return ReplyReading(verdict=verdict, problem=None, usable=True, exhausted=False)
        return _unusable("finish_reason=length", exhausted=True)
    if finish_reason not in (None, "stop"):
        return _unusable(f"finish_reason={_show(finish_reason)}")
    if not isinstance(content, str):
        return _unusable(CONTENT_NOT_STRING)
    text = chat_verdict_text(content)
    if text is None:
        return _unusable(UNFINISHED_REASONING)
    return _judge_text(text, default_score, default_ranking)


def read_responses_reply(
    reply: object, *, default_score: float, default_ranking: float
) -> ReplyReading:
    """J-14, J-15 for a decoded responses reply; reasoning items are ignored, no think-stripping."""
    if not isinstance(reply, dict):
        return _unusable(NOT_AN_OBJECT)
    status = reply.get("status")
    if status == "incomplete":
        details = reply.get("incomplete_details")
        if isinstance(details, dict) and details.get("reason") == "max_output_tokens":
            return _unusable("status=incomplete", exhausted=True)
    if status not in (None, "completed"):
        return _unusable(f"status={_show(status)}")
    return _judge_text(responses_verdict_text(reply.get("output")), default_score, default_ranking)


def read_reply(
    api: JudgeApi, reply: object, *, default_score: float, default_ranking: float
) -> ReplyReading:
    """The protocol's reading of a decoded reply."""
    if api == "chat_completions":
        return read_chat_reply(reply, default_score=default_score, default_ranking=default_ranking)
    return read_responses_reply(reply, default_score=default_score, default_ranking=default_ranking)
