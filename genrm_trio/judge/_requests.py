"""Judge request construction for both protocols: URL, body and headers (§3.1).

Pure functions: the same comparison always yields the same bytes, so every attempt resends them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec

from genrm_trio._version import __version__
from genrm_trio.config import Config, JudgeApi, url_without_userinfo

API_KEY_ENV = "GENRM_JUDGE_API_KEY"
USER_AGENT = f"genrm-trio/{__version__}"

_PATHS: dict[JudgeApi, str] = {
    "chat_completions": "/chat/completions",
    "responses": "/responses",
}
# The server writes these itself; sampling may never replace them (J-4, CF-12).
_SERVER_KEYS = frozenset({"model", "messages", "stream", "input", "metadata"})
_ENCODER = msgspec.json.Encoder()


def judge_url(base_url: str, api: JudgeApi) -> str:
    """The request URL: base without user-info or trailing slash, plus the protocol's path.

    User-info is dropped rather than sent as a Basic credential: J-8 allows only a Bearer key,
    and the same string is written into error texts (J-41).
    """
    parts = urlsplit(url_without_userinfo(base_url))
    path = parts.path.rstrip("/") + _PATHS[api]
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def replica_base_urls(config: Config) -> list[str]:
    """The judge replicas' base URLs: ``judge_base_urls`` when set, else ``judge_base_url``."""
    return list(config.judge_base_urls or (config.judge_base_url,))


def resolve_api_key(config: Config, environ: Mapping[str, str]) -> str | None:
    """J-35: the configured key, else a non-empty GENRM_JUDGE_API_KEY, else none."""
    if config.judge_api_key:
        return config.judge_api_key
    return environ.get(API_KEY_ENV) or None


def judge_headers(api_key: str | None) -> dict[str, str]:
    """J-8: the complete header set of every judge request."""
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "User-Agent": USER_AGENT,
    }
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def sampling_params(config: Config) -> dict[str, Any]:
    """J-4: genrm_responses_create_params in the protocol's spelling."""
    sampling: dict[str, Any] = {}
    for key, value in config.genrm_responses_create_params.items():
        if key in _SERVER_KEYS:
            continue
        if key == "max_output_tokens" and config.judge_api == "chat_completions":
            sampling["max_tokens"] = value
        else:
            sampling[key] = value
    return sampling


def _sent_principle(config: Config, principle: str | None) -> str | None:
    if config.use_principle and principle:
        return principle
    return None


def build_body(
    config: Config,
    *,
    history: list[dict[str, str]],
    principle: str | None,
    text_1: str,
    text_2: str,
) -> dict[str, Any]:
    """The JSON body of one comparison's judge request (J-2 chat, J-3 responses)."""
    principle = _sent_principle(config, principle)
    body: dict[str, Any] = {"model": config.judge_model}
    if config.judge_api == "chat_completions":
        messages = [{"role": item["role"], "content": item["content"]} for item in history]
        if principle is not None:
            messages.append({"role": "principle", "content": principle})
        messages.append({"role": "response_1", "content": text_1})
        messages.append({"role": "response_2", "content": text_2})
        body["messages"] = messages
    else:
        body["input"] = [
            {"role": item["role"], "content": item["content"], "type": "message"}
            for item in history
        ]
        metadata = {"response_1": text_1, "response_2": text_2}
        if principle is not None:
            metadata["principle"] = principle
        body["metadata"] = metadata
    body.update(sampling_params(config))
    return body


def encode_body(body: dict[str, Any]) -> bytes:
    """UTF-8 JSON; texts holding lone surrogates fall back to ASCII escapes, which JSON allows."""
    try:
        return _ENCODER.encode(body)
    except UnicodeEncodeError:
        return json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode("ascii")
