"""Request bodies and reply readers shared by the fake judge tests.
They build what genrm-trio's judge client sends (§3.1) and read what a judge answers.
"""

from __future__ import annotations

import json
from typing import Any

BASE_URL = "http://fake-judge/v1"


def chat_body(
    response_1: str,
    response_2: str,
    *,
    principle: str | None = None,
    model: str = "genrm",
) -> dict[str, Any]:
    messages: list[dict[str, str]] = [{"role": "user", "content": "2+2?"}]
    if principle is not None:
        messages.append({"role": "principle", "content": principle})
    messages += [
        {"role": "response_1", "content": response_1},
        {"role": "response_2", "content": response_2},
    ]
    return {"model": model, "messages": messages, "max_tokens": 16384, "temperature": 0.6}


def responses_body(
    response_1: str,
    response_2: str,
    *,
    principle: str | None = None,
    model: str = "genrm",
) -> dict[str, Any]:
    metadata = {"response_1": response_1, "response_2": response_2}
    if principle is not None:
        metadata["principle"] = principle
    return {
        "model": model,
        "input": [{"role": "user", "content": "2+2?", "type": "message"}],
        "metadata": metadata,
        "max_output_tokens": 16384,
    }


def chat_content(reply: dict[str, Any]) -> Any:
    return reply["choices"][0]["message"]["content"]


def responses_text(reply: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in reply["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text" and isinstance(part["text"], str)
    )


def fenced_verdict(verdict_text: str) -> Any:
    """The JSON inside the one ```json fence of a fake judge verdict text."""
    start = verdict_text.index("```json\n") + len("```json\n")
    end = verdict_text.index("\n```", start)
    return json.loads(verdict_text[start:end])


def chat_verdict(reply: dict[str, Any]) -> Any:
    content = chat_content(reply)
    return fenced_verdict(content.rpartition("</think>")[2])
