"""The collector's policy client: one rollout from an OpenAI-compatible server, over the
Responses API or chat completions, always returned as a Responses-API object.

Transient failures (transport errors, 408, 429, 5xx, no reply in time) are retried with a growing
pause; any other answer is a `PolicyError` at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import trio

from genrm_trio.core.messages import exception_text
from genrm_trio.core.texts import convert_history

PolicyApi = Literal["responses", "chat_completions"]
API_KEY_ENV = "GENRM_POLICY_API_KEY"

_RETRIED_STATUSES = frozenset({408, 429})
# Sampling settings that mean the same in both APIs (max_output_tokens is renamed for chat).
_CHAT_SETTINGS = ("model", "temperature", "top_p", "seed", "stop", "user")


class PolicyError(Exception):
    """The policy gave no usable rollout; the message says why."""


def chat_request(params: Mapping[str, Any]) -> dict[str, Any]:
    """A chat-completions body for Responses-API create params (history converted as for the
    judge, J-7; `instructions` become a leading system message)."""
    messages = convert_history(params.get("input"))
    instructions = params.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    body: dict[str, Any] = {"messages": messages}
    for key in _CHAT_SETTINGS:
        if key in params:
            body[key] = params[key]
    if "max_output_tokens" in params:
        body["max_tokens"] = params["max_output_tokens"]
    return body


def response_from_chat(reply: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses-API object for a chat-completions reply: reasoning (vLLM's
    `reasoning_content`) as a reasoning item, the content as the message."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise PolicyError("chat completion has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise PolicyError("chat completion choice has no message")
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        output.append(
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": reasoning}]}
        )
    content = message.get("content")
    output.append(
        {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": content if isinstance(content, str) else ""}
            ],
        }
    )
    response: dict[str, Any] = {
        "id": reply.get("id"),
        "object": "response",
        "model": reply.get("model"),
        "status": "completed" if choice.get("finish_reason") in (None, "stop") else "incomplete",
        "output": output,
    }
    usage = reply.get("usage")
    if isinstance(usage, dict):
        response["usage"] = {
            "input_tokens": usage.get("prompt_tokens"),
            "output_tokens": usage.get("completion_tokens"),
            "total_tokens": usage.get("total_tokens"),
        }
    return response


@dataclass(frozen=True, slots=True)
class PolicyClient:
    """Generates rollouts from the policy at `base_url` (the `/v1` URL)."""

    client: httpx.AsyncClient
    base_url: str
    api: PolicyApi = "responses"
    model: str | None = None
    api_key: str | None = None
    retries: int = 2
    timeout_s: float = 600.0
    retry_pause_s: float = 0.5

    def _request(self, params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        base = self.base_url.rstrip("/")
        if self.api == "chat_completions":
            body = chat_request(params)
            url = f"{base}/chat/completions"
        else:
            body = dict(params)
            url = f"{base}/responses"
        if self.model is not None and "model" not in body:
            body["model"] = self.model
        return url, body

    async def generate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """One rollout for the task's create params, as a Responses-API object."""
        url, body = self._request(params)
        content = json.dumps(body, ensure_ascii=False).encode()
        headers = {"content-type": "application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await trio.sleep(self.retry_pause_s * 2 ** (attempt - 1))
            try:
                with trio.fail_after(self.timeout_s):
                    reply = await self.client.post(url, content=content, headers=headers)
            except trio.TooSlowError:
                problem = f"no reply within {self.timeout_s}s"
                continue
            except httpx.TransportError as error:
                problem = exception_text(error)
                continue
            except httpx.HTTPError as error:
                # Not a lost connection (a body that cannot be decoded, say): retrying won't help.
                raise PolicyError(exception_text(error)) from None
            if reply.status_code in _RETRIED_STATUSES or reply.status_code >= 500:
                problem = f"policy answered {reply.status_code}: {reply.text[:500]}"
                continue
            if reply.status_code != 200:
                raise PolicyError(f"policy answered {reply.status_code}: {reply.text[:500]}")
            return self._interpret(reply.content)
        tries = self.retries + 1
        raise PolicyError(f"{problem} (after {tries} attempt{'s' if tries > 1 else ''})")

    def _interpret(self, raw: bytes) -> dict[str, Any]:
        try:
            decoded = json.loads(raw)
        except ValueError:
            raise PolicyError(f"policy reply is not JSON: {raw[:200]!r}") from None
        if not isinstance(decoded, dict):
            raise PolicyError("policy reply is not a JSON object")
        if self.api == "chat_completions":
            return response_from_chat(decoded)
        output = decoded.get("output")
        if not isinstance(output, list) or not all(isinstance(item, dict) for item in output):
            raise PolicyError("policy response has no output array of objects")
        return decoded
