"""The fake policy: an OpenAI-compatible model (Responses API and chat completions) for the
collector's demo and tests, whose answers carry a quality the fake judge reads.

Theory of operation. The k-th request for a given prompt (k counts from 0 per prompt, across the
life of the process) is answered with ``answer-<k> <words> [[q=<q>]]``. The quality ``q`` and the
number of filler words are drawn from a generator seeded with ``(seed, purpose, prompt, k)``, or
``q`` is taken from a ``[[qualities=5,3,1]]`` directive in the prompt (the k-th answer gets the
k-th value, cycling), so a test can predict every reward the fake judge will lead to. The
``answer-<k> `` prefix is what fake-judge rules match on. Generation time is drawn from the
latency model (``lognormal:MEDIAN:SIGMA`` gives the long tail of real generation), seeded the same
way, and ``error_rate`` makes that share of requests answer 500, seeded too.
:meth:`FakePolicy.handle` is synchronous; :func:`fake_policy_app` serves it over ASGI.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import trio

from genrm_trio.core.texts import convert_history
from genrm_trio.fakes.judge import parse_latency
from genrm_trio.fakes.judge_http import receive_body, serve_lifespan

DEFAULT_MODEL = "fake-policy"
_CREATED = 1_700_000_000
_QUALITIES = re.compile(r"\[\[qualities=([0-9.,\s]+)\]\]")
_WORDS = (
    "the",
    "answer",
    "follows",
    "from",
    "a",
    "short",
    "argument",
    "about",
    "each",
    "step",
    "and",
    "its",
    "result",
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def parse_range(spec: str, what: str) -> tuple[int, int]:
    """``LO:HI`` (or one number ``N`` for ``N:N``) of integers with 0 <= LO <= HI."""
    parts = spec.split(":")
    try:
        values = [int(part) for part in parts]
    except ValueError:
        raise ValueError(f"{what} {spec!r}: expected LO:HI with integers") from None
    if len(values) == 1:
        values.append(values[0])
    if len(values) != 2 or not 0 <= values[0] <= values[1]:
        raise ValueError(f"{what} {spec!r}: expected LO:HI with 0 <= LO <= HI")
    return values[0], values[1]


@dataclass(frozen=True, slots=True)
class PolicyReply:
    """What to send for one request, after ``delay_s``."""

    status: int
    body: bytes
    delay_s: float = 0.0


def _json(status: int, value: Any, delay_s: float = 0.0) -> PolicyReply:
    return PolicyReply(status, json.dumps(value, ensure_ascii=False).encode(), delay_s)


def _error(status: int, problem: str, delay_s: float = 0.0) -> PolicyReply:
    return _json(status, {"error": {"message": f"fake policy: {problem}"}}, delay_s)


def _tokens(text: str) -> int:
    return (len(text) + 3) // 4


class FakePolicy:
    """An OpenAI-compatible policy whose answers follow from the seed, the prompt and how many
    answers that prompt has had."""

    def __init__(
        self,
        *,
        seed: int = 0,
        model: str | None = None,
        latency: str = "none",
        quality: str = "1:5",
        words: str = "4:24",
        error_rate: float = 0.0,
    ) -> None:
        if not 0 <= error_rate <= 1:
            raise ValueError(f"error rate {error_rate!r}: expected a number in [0, 1]")
        self.seed = seed
        self.model = model
        self.latency = parse_latency(latency)
        self.quality_range = parse_range(quality, "quality")
        self.words_range = parse_range(words, "words")
        self.error_rate = error_rate
        self._answers_per_prompt: dict[str, int] = {}
        self.requests_total = 0
        self.errors_total = 0
        self.by_api = {"responses": 0, "chat_completions": 0}

    def stats(self) -> dict[str, Any]:
        return {
            "requests_total": self.requests_total,
            "errors_total": self.errors_total,
            "by_api": dict(self.by_api),
            "prompts": len(self._answers_per_prompt),
        }

    def _rng(self, purpose: str, prompt: str, number: int) -> random.Random:
        return random.Random(f"{self.seed}/{purpose}/{prompt}/{number}")

    def answer(self, prompt: str, number: int) -> tuple[str, float]:
        """The ``number``-th answer to ``prompt`` and its quality."""
        directive = _QUALITIES.findall(prompt)
        if directive:
            values = [float(v) for v in directive[-1].replace(" ", "").split(",") if v]
            quality = values[number % len(values)] if values else 3.0
        else:
            quality = float(self._rng("quality", prompt, number).randint(*self.quality_range))
        rng = self._rng("words", prompt, number)
        filler = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(*self.words_range)))
        shown = int(quality) if quality == int(quality) else quality
        body = f"{filler} " if filler else ""
        return f"answer-{number} {body}[[q={shown}]]", quality

    def handle(self, method: str, path: str, body: bytes) -> PolicyReply:
        """Decide the reply to one HTTP request."""
        if path == "/healthz" and method == "GET":
            return _json(200, {"status": "ok"})
        if path == "/_fake/stats" and method == "GET":
            return _json(200, self.stats())
        if path == "/v1/models" and method == "GET":
            listed = self.model or DEFAULT_MODEL
            return _json(200, {"object": "list", "data": [{"id": listed, "object": "model"}]})
        if path not in ("/v1/responses", "/v1/chat/completions"):
            return _error(404, f"no route {path}")
        if method != "POST":
            return _error(405, f"{path} accepts POST only")
        chat = path == "/v1/chat/completions"
        try:
            request = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            return _error(400, "body is not valid JSON")
        if not isinstance(request, dict):
            return _error(400, "body is not a JSON object")
        model = request.get("model")
        if self.model is not None and model not in (None, self.model):
            return _error(404, f"model {model!r} is not served here; expected {self.model!r}")
        if chat:
            messages = request.get("messages")
            if not isinstance(messages, list) or not messages:
                return _error(400, "messages must be a non-empty array")
            history = convert_history(messages)
        else:
            if not isinstance(request.get("input"), str | list):
                return _error(400, "input must be a string or an array")
            history = convert_history(request["input"])
        prompt = json.dumps(history, ensure_ascii=False, sort_keys=True)
        number = self._answers_per_prompt.get(prompt, 0)
        self._answers_per_prompt[prompt] = number + 1
        serial = self.requests_total
        self.requests_total += 1
        self.by_api["chat_completions" if chat else "responses"] += 1
        delay_s = self.latency.draw(self._rng("latency", prompt, number))
        if self.error_rate and self._rng("error", prompt, number).random() < self.error_rate:
            self.errors_total += 1
            return _error(500, "injected error", delay_s)
        text, _ = self.answer(prompt, number)
        name: str = model if isinstance(model, str) else self.model or DEFAULT_MODEL
        prompt_tokens = _tokens(prompt)
        output_tokens = _tokens(text)
        if chat:
            reply: dict[str, Any] = {
                "id": f"chatcmpl-fake-{self.seed}-{serial}",
                "object": "chat.completion",
                "created": _CREATED,
                "model": name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": output_tokens,
                    "total_tokens": prompt_tokens + output_tokens,
                },
            }
        else:
            reply = {
                "id": f"resp-fake-{self.seed}-{serial}",
                "object": "response",
                "created_at": _CREATED,
                "status": "completed",
                "model": name,
                "output": [
                    {
                        "type": "message",
                        "id": f"msg-fake-{self.seed}-{serial}",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}],
                    }
                ],
                # Required by the OpenAI SDK's Response model, which NeMo Gym's openai_model
                # server validates every reply against.
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "usage": {
                    "input_tokens": prompt_tokens,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": output_tokens,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": prompt_tokens + output_tokens,
                },
            }
        return _json(200, reply, delay_s)


class FakePolicyApp:
    """The fake policy as an ASGI 3 application (HTTP and lifespan scopes)."""

    def __init__(self, policy: FakePolicy) -> None:
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await receive_body(receive)
        if body is None:
            return
        reply = self.policy.handle(scope["method"], scope["path"], body)
        # Generation time; a caller that leaves meanwhile cancels this task (hypercorn).
        await trio.sleep(reply.delay_s)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(reply.body)).encode()),
        ]
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": reply.body, "more_body": False})


async def serve_fake_policy(
    policy: FakePolicy,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``policy`` over HTTP with hypercorn until cancelled; reports the base URL
    (``http://host:port``) through ``task_status``."""
    from hypercorn.config import Config as HypercornConfig
    from hypercorn.trio import serve as hypercorn_serve

    settings = HypercornConfig()
    shown = f"[{host}]" if ":" in host else host
    settings.bind = [f"{shown}:{port}"]
    settings.accesslog = None
    settings.errorlog = None
    # Generation with a long tail can take a while; keep idle connections for reuse.
    settings.keep_alive_timeout = 75
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: hypercorn_serve(
                FakePolicyApp(policy),  # type: ignore[arg-type]
                settings,
                shutdown_trigger=trio.sleep_forever,
                task_status=task_status,
            )
        )
        task_status.started(binds[0])


__all__ = ["FakePolicy", "FakePolicyApp", "PolicyReply", "parse_range", "serve_fake_policy"]
