"""The `/verify_group` request for one group, built from a prompt (a string or a conversation)
and its responses (texts, chat messages or Responses-API objects)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

Prompt = str | Sequence[Mapping[str, Any]]
Response = str | Mapping[str, Any] | Sequence[Mapping[str, Any]]

_ENCODER = msgspec.json.Encoder()


def prompt_input(prompt: Prompt) -> str | list[dict[str, Any]]:
    """`responses_create_params.input`: a string as is, a conversation as message items.

    Message content given as parts keeps its text parts, as the judge reads them (`input_text`
    for the prompt's messages, `output_text` for an assistant's); other parts (images) are left
    out, since the judge reads text only.
    """
    if isinstance(prompt, str):
        return prompt
    items = []
    for message in prompt:
        role = message.get("role", "user")
        content = message.get("content", "")
        part_type = "output_text" if role == "assistant" else "input_text"
        if not isinstance(content, str):
            content = [
                {"type": part_type, "text": part["text"]}
                for part in content or []
                if isinstance(part, Mapping) and isinstance(part.get("text"), str)
            ]
        items.append({"type": "message", "role": role, "content": content})
    return items


def response_object(response: Response) -> dict[str, Any]:
    """A Responses-API object for one response.

    A string is the answer text. A mapping with an ``output`` array is already a Responses
    object. A list of chat messages (a conversational completion) becomes one output message per
    assistant message, with its ``reasoning_content`` (if any) as a reasoning item before it.
    """
    if isinstance(response, str):
        return {"output": [_message(response)]}
    if isinstance(response, Mapping):
        if isinstance(response.get("output"), list):
            return dict(response)
        response = [response]
    output: list[dict[str, Any]] = []
    for message in response:
        if message.get("role", "assistant") != "assistant":
            continue
        reasoning = message.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            output.append(
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": reasoning}]}
            )
        content = message.get("content")
        if isinstance(content, str):
            output.append(_message(content))
        elif isinstance(content, Sequence):
            texts = [
                part["text"]
                for part in content
                if isinstance(part, Mapping) and isinstance(part.get("text"), str)
            ]
            output.append(_message("".join(texts)))
    return {"output": output}


def _message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def group_body(
    prompt: Prompt,
    responses: Sequence[Response],
    group_id: str,
    attempt: int,
    principle: str | None = None,
) -> bytes:
    """The encoded request; the same bytes are sent again on every resend."""
    body: dict[str, Any] = {
        "responses_create_params": {"input": prompt_input(prompt)},
        "responses": [response_object(response) for response in responses],
        "_ng_group_id": group_id,
        "_ng_group_attempt": attempt,
    }
    if principle is not None:
        body["principle"] = principle
    return _ENCODER.encode(body)
