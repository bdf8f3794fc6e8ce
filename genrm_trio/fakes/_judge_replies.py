"""What a fake judge answers: the reply it decides for each API (bodies, statuses, how they are
sent) and the checks of the judge requests it is sent (§8.2)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

from genrm_trio.fakes._judge_rules import Api

ReplyKind = Literal["respond", "truncate", "close", "hang"]

REASONING = "comparing the two responses"

UNFINISHED_REASONING = "comparing the two responses, weighing the first one against"

# A fixed creation time keeps replies byte-identical across runs (CL-19).
CREATED = 1_700_000_000

_STANDARD_ROLES = frozenset({"system", "user", "assistant", "developer", "tool"})


# --------------------------------------------------------------------------------------------
# Replies


@dataclass(frozen=True, slots=True)
class FakeReply:
    """What an adapter must do for one request.

    ``respond``: after ``delay_s``, send status, headers and body. ``truncate``: after
    ``delay_s``, announce ``Content-Length: len(body)``, send only ``body[:sent_bytes]`` and break
    the connection. ``close``: after ``delay_s``, break the connection without replying.
    ``hang``: never reply; wait until the caller goes away. Tracked replies must be ended with
    :meth:`FakeJudge.end_request`.
    """

    kind: ReplyKind
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    action: str
    delay_s: float = 0.0
    tracked: bool = False

    @property
    def reason(self) -> str:
        try:
            return HTTPStatus(self.status).phrase
        except ValueError:
            return ""

    @property
    def sent_bytes(self) -> int:
        """How much of the body a ``truncate`` reply sends before breaking the connection."""
        return len(self.body) // 2


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def body_bytes(value: Any) -> bytes:
    """A rule's ``body``: a string is sent exactly, anything else as compact JSON."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def json_reply(status: int, value: Any, action: str) -> FakeReply:
    return FakeReply(
        "respond", status, (("content-type", "application/json"),), json_bytes(value), action
    )


def error_reply(status: int, problem: str, action: str = "rejected") -> FakeReply:
    return json_reply(status, {"error": {"message": f"fake judge: {problem}"}}, action)


def _tokens(text: str) -> int:
    # A rough four-characters-per-token count keeps ``usage`` plausible and deterministic.
    return (len(text) + 3) // 4


def _fenced(verdict: Mapping[str, Any]) -> str:
    return "```json\n" + json.dumps(dict(verdict)) + "\n```"


@dataclass(frozen=True, slots=True)
class Call:
    """A checked judge call."""

    api: Api
    model: str
    response_1: str
    response_2: str
    principle: str | None
    prompt_chars: int
    prefix: bytes  # digest of the conversation before the two responses


def _chat_reply(call: Call, number: int, content: str | None, finish_reason: str) -> dict[str, Any]:
    completion = _tokens(content or "")
    prompt = _tokens("x" * call.prompt_chars)
    return {
        "id": f"chatcmpl-fake-{number}",
        "object": "chat.completion",
        "created": CREATED,
        "model": call.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _responses_reply(
    call: Call,
    number: int,
    text: str | None,
    status: str,
    *,
    with_message: bool = True,
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    # Every field a Responses-API client requires is present (ids, annotations, tool settings,
    # token details), so that clients that validate replies, such as NeMo Gym's model servers,
    # accept them.
    output: list[dict[str, Any]] = [
        {
            "id": f"rs-fake-{number}",
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": REASONING}],
        }
    ]
    if with_message:
        output.append(
            {
                "id": f"msg-fake-{number}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    reasoning = _tokens(REASONING)
    completion = _tokens(REASONING + (text or ""))
    prompt = _tokens("x" * call.prompt_chars)
    reply: dict[str, Any] = {
        "id": f"resp-fake-{number}",
        "object": "response",
        "created_at": CREATED,
        "status": status,
        "model": call.model,
        "output": output,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + completion,
        },
    }
    if incomplete_reason is not None:
        reply["incomplete_details"] = {"reason": incomplete_reason}
    return reply


def completion(call: Call, number: int, action: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of a completed-looking reply for the actions that produce one."""
    chat = call.api == "chat_completions"
    if action == "verdict":
        verdict = {k: fields[k] for k in ("score_1", "score_2", "ranking") if k in fields}
        if chat:
            content = f"<think>{REASONING}</think>\n{_fenced(verdict)}"
            return _chat_reply(call, number, content, "stop")
        return _responses_reply(call, number, _fenced(verdict), "completed")
    if action == "text":
        if chat:
            return _chat_reply(call, number, fields["text"], fields.get("finish", "stop"))
        return _responses_reply(call, number, fields["text"], fields.get("finish", "completed"))
    if action == "empty":
        if chat:
            return _chat_reply(call, number, f"<think>{REASONING}</think>", "stop")
        return _responses_reply(call, number, "", "completed")
    if action == "null_content":
        if chat:
            return _chat_reply(call, number, None, "stop")
        return _responses_reply(call, number, None, "completed")
    if action == "finish":
        if chat:
            return _chat_reply(call, number, f"<think>{REASONING}</think>", fields["value"])
        return _responses_reply(call, number, None, fields["value"], with_message=False)
    if action == "budget_exhausted":
        if chat:
            return _chat_reply(call, number, f"<think>{UNFINISHED_REASONING}", "length")
        return _responses_reply(
            call,
            number,
            None,
            "incomplete",
            with_message=False,
            incomplete_reason="max_output_tokens",
        )
    raise AssertionError(f"action {action!r} has no completion body")


# --------------------------------------------------------------------------------------------
# Request checks (CL-11)


class RequestRejected(Exception):
    def __init__(self, status: int, problem: str) -> None:
        super().__init__(problem)
        self.status = status
        self.problem = problem


def check_chat(body: Mapping[str, Any]) -> tuple[str, str, str | None, int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestRejected(400, "messages must be a non-empty array")
    roles: list[str] = []
    chars = 0
    for index, message in enumerate(messages):
        if not (
            isinstance(message, Mapping)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise RequestRejected(
                400, f"messages[{index}] must be an object with string role and content"
            )
        roles.append(message["role"])
        chars += len(message["content"])
    if len(roles) < 2 or roles[-2:] != ["response_1", "response_2"]:
        raise RequestRejected(
            400, "the last two messages must have roles response_1 then response_2"
        )
    has_principle = len(roles) >= 3 and roles[-3] == "principle"
    head = roles[: -3 if has_principle else -2]
    for index, role in enumerate(head):
        if role not in _STANDARD_ROLES:
            raise RequestRejected(400, f"messages[{index}] has unexpected role {role!r}")
    principle = messages[-3]["content"] if has_principle else None
    return messages[-2]["content"], messages[-1]["content"], principle, chars


def check_responses(body: Mapping[str, Any]) -> tuple[str, str, str | None, int]:
    metadata = body.get("metadata")
    if not isinstance(metadata, Mapping):
        raise RequestRejected(400, "metadata must be an object")
    for key in ("response_1", "response_2"):
        if not isinstance(metadata.get(key), str):
            raise RequestRejected(400, f"metadata.{key} must be a string")
    principle = metadata.get("principle")
    if principle is not None and not isinstance(principle, str):
        raise RequestRejected(400, "metadata.principle must be a string")
    history = body.get("input", [])
    if not isinstance(history, str | list):
        raise RequestRejected(400, "input must be a string or an array")
    chars = len(json.dumps(history)) + sum(len(v) for v in metadata.values() if isinstance(v, str))
    return metadata["response_1"], metadata["response_2"], principle, chars
