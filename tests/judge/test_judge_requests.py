"""Judge request construction: bodies for both protocols, URL, headers and the API key (J-1…J-8)."""

from __future__ import annotations

import json
from typing import Any

from genrm_trio import __version__
from genrm_trio.config import Config
from genrm_trio.judge._requests import (
    build_body,
    encode_body,
    judge_headers,
    judge_url,
    resolve_api_key,
)

HISTORY = [{"role": "user", "content": "2+2?"}]


def make_config(**overrides: Any) -> Config:
    fields: dict[str, Any] = {"judge_base_url": "http://judge:8000/v1", "judge_model": "judge-m"}
    fields.update(overrides)
    return Config(**fields)


def body_for(config: Config, principle: str | None = None) -> dict[str, Any]:
    return build_body(
        config, history=HISTORY, principle=principle, text_1="answer-0 4", text_2="answer-1 5"
    )


def test_chat_body_renames_max_output_tokens_and_appends_the_two_responses() -> None:
    assert body_for(make_config()) == {
        "model": "judge-m",
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "response_1", "content": "answer-0 4"},
            {"role": "response_2", "content": "answer-1 5"},
        ],
        "max_tokens": 16384,
        "temperature": 0.6,
        "top_p": 0.95,
    }


def test_chat_body_passes_extra_sampling_keys_and_ignores_input_and_metadata() -> None:
    sampling = {
        "max_output_tokens": 1341,
        "temperature": 0.0,
        "chat_template_kwargs": {"enable_thinking": False},
        "input": "ignored",
        "metadata": {"ignored": True},
    }
    body = body_for(make_config(genrm_responses_create_params=sampling))
    assert body["max_tokens"] == 1341
    assert body["temperature"] == 0.0
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "max_output_tokens" not in body
    assert "input" not in body
    assert "metadata" not in body


def test_chat_body_without_max_output_tokens_sends_no_token_limit() -> None:
    body = body_for(make_config(genrm_responses_create_params={"temperature": 1.0}))
    assert body == {
        "model": "judge-m",
        "messages": body["messages"],
        "temperature": 1.0,
    }


def test_chat_principle_message_sits_directly_before_response_1() -> None:
    body = body_for(make_config(use_principle=True), principle="Be brief")
    assert [message["role"] for message in body["messages"]] == [
        "user",
        "principle",
        "response_1",
        "response_2",
    ]
    assert body["messages"][1] == {"role": "principle", "content": "Be brief"}


def test_no_principle_is_sent_when_use_principle_is_false() -> None:
    body = body_for(make_config(use_principle=False), principle="Be brief")
    assert [message["role"] for message in body["messages"]] == ["user", "response_1", "response_2"]


def test_empty_or_missing_principle_sends_no_principle_message() -> None:
    for principle in (None, ""):
        body = body_for(make_config(use_principle=True), principle=principle)
        assert "principle" not in [message["role"] for message in body["messages"]]


def test_responses_body_carries_history_items_and_metadata() -> None:
    config = make_config(judge_api="responses", use_principle=True)
    assert body_for(config, principle="Be brief") == {
        "model": "judge-m",
        "input": [{"role": "user", "content": "2+2?", "type": "message"}],
        "metadata": {
            "response_1": "answer-0 4",
            "response_2": "answer-1 5",
            "principle": "Be brief",
        },
        "max_output_tokens": 16384,
        "temperature": 0.6,
        "top_p": 0.95,
    }


def test_responses_body_without_principle_has_only_the_two_responses_in_metadata() -> None:
    body = body_for(make_config(judge_api="responses"), principle="Be brief")
    assert body["metadata"] == {"response_1": "answer-0 4", "response_2": "answer-1 5"}


def test_sampling_cannot_replace_the_server_written_keys() -> None:
    sampling = {"input": "x", "metadata": {"response_1": "forged"}, "top_p": 0.5}
    body = body_for(make_config(judge_api="responses", genrm_responses_create_params=sampling))
    assert body["input"] == [{"role": "user", "content": "2+2?", "type": "message"}]
    assert body["metadata"] == {"response_1": "answer-0 4", "response_2": "answer-1 5"}
    assert body["top_p"] == 0.5


def test_url_per_protocol_ignores_trailing_slash() -> None:
    assert judge_url("http://judge:8000/v1/", "chat_completions") == (
        "http://judge:8000/v1/chat/completions"
    )
    assert judge_url("http://judge:8000/v1", "responses") == "http://judge:8000/v1/responses"
    assert judge_url("https://judge.example", "chat_completions") == (
        "https://judge.example/chat/completions"
    )


def test_url_drops_user_info() -> None:
    assert judge_url("http://user:pw@127.0.0.1:9/v1", "chat_completions") == (
        "http://127.0.0.1:9/v1/chat/completions"
    )
    assert judge_url("http://user@[::1]:9/v1/", "responses") == "http://[::1]:9/v1/responses"


def test_headers_are_exactly_the_j8_set() -> None:
    assert judge_headers(None) == {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "User-Agent": f"genrm-trio/{__version__}",
    }
    assert judge_headers("sk-1")["Authorization"] == "Bearer sk-1"


def test_api_key_prefers_configuration_then_non_empty_environment() -> None:
    env = {"GENRM_JUDGE_API_KEY": "from-env"}
    assert resolve_api_key(make_config(judge_api_key="from-config"), env) == "from-config"
    assert resolve_api_key(make_config(), env) == "from-env"
    assert resolve_api_key(make_config(), {"GENRM_JUDGE_API_KEY": ""}) is None
    assert resolve_api_key(make_config(), {}) is None


def test_encoded_body_is_json_that_reads_back_identically() -> None:
    body = body_for(make_config())
    assert json.loads(encode_body(body)) == body


def test_texts_with_lone_surrogates_are_still_sent_as_json() -> None:
    body = build_body(
        make_config(), history=HISTORY, principle=None, text_1="a\udc80b", text_2="ünï"
    )
    encoded = encode_body(body)
    assert json.loads(encoded)["messages"][1]["content"] == "a\udc80b"
    assert json.loads(encoded)["messages"][2]["content"] == "ünï"
