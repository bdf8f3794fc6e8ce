"""Chat-template markup taken out of what the judge reads of an OpenRLHF sample: each common
template's prompt becomes its turns, each response loses its end marker, and a text without
markup is passed unchanged."""

from __future__ import annotations

import pytest

from genrm_trio.core.chat_markup import DEFAULT_STRIP_TOKENS, ChatMarkup, check_strip_token

DEFAULT = ChatMarkup(DEFAULT_STRIP_TOKENS)


def test_chatml_prompt_becomes_its_turns_without_the_open_assistant_turn() -> None:
    prompt = (
        "<|im_start|>system\nYou are a careful tutor.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert DEFAULT.prompt(prompt) == [
        {"role": "system", "content": "You are a careful tutor."},
        {"role": "user", "content": "What is 2+2?"},
    ]


def test_chatml_response_loses_its_end_markers() -> None:
    assert DEFAULT.response("It is 4.<|im_end|>\n<|endoftext|>") == "It is 4."
    assert DEFAULT.response("It is 4.<|endoftext|>") == "It is 4."


def test_llama3_prompt_becomes_its_turns() -> None:
    prompt = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nName a prime.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert DEFAULT.prompt(prompt) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a prime."},
    ]
    assert DEFAULT.response("7<|eot_id|>") == "7"
    assert DEFAULT.response("7<|end_of_text|>") == "7"


def test_mistral_prompt_names_no_roles_so_it_stays_one_text_without_glued_words() -> None:
    assert DEFAULT.prompt("<s>[INST] Name a prime. [/INST]") == "Name a prime."
    assert DEFAULT.prompt("<s>[INST]Hi[/INST]Hello</s>[INST]Name a prime.[/INST]") == (
        "Hi\nHello\nName a prime."
    )
    assert DEFAULT.response(" 7</s>") == "7"


def test_gemma_prompt_becomes_its_turns_with_model_as_assistant() -> None:
    prompt = (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nName a prime.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert DEFAULT.prompt(prompt) == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Name a prime."},
    ]
    assert DEFAULT.response("7<end_of_turn>\n<eos>") == "7"


def test_text_before_the_first_header_is_a_user_turn() -> None:
    prompt = "Context: tides.\n<|im_start|>user\nExplain them.<|im_end|>\n<|im_start|>assistant\n"
    assert DEFAULT.prompt(prompt) == [
        {"role": "user", "content": "Context: tides."},
        {"role": "user", "content": "Explain them."},
    ]


def test_a_text_without_markup_is_unchanged_whitespace_included() -> None:
    assert DEFAULT.prompt("  Explain tides.\n") == "  Explain tides.\n"
    assert DEFAULT.response(" The moon.\n") == " The moon.\n"


def test_a_response_loses_headers_with_their_role_names() -> None:
    assert DEFAULT.response("4<|im_end|>\n<|im_start|>user\nAnd 3+3?") == "4\nAnd 3+3?"


def test_a_header_without_a_role_is_still_removed() -> None:
    assert DEFAULT.prompt("<|im_start|> Explain tides.<|im_end|>") == "Explain tides."


def test_an_empty_list_changes_nothing() -> None:
    off = ChatMarkup(())
    prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert off.prompt(prompt) == prompt
    assert off.response("Hello<|endoftext|>") == "Hello<|endoftext|>"


def test_a_configured_list_strips_only_its_markers() -> None:
    custom = ChatMarkup(["<|user|>{role}", "<|end|>"])
    assert custom.prompt("<|user|>user Hi<|end|>") == [{"role": "user", "content": "Hi"}]
    assert custom.response("Hello<|end|><|endoftext|>") == "Hello\n<|endoftext|>"


def test_a_prompt_that_is_only_markup_is_an_empty_text() -> None:
    assert DEFAULT.prompt("<|im_start|>assistant\n") == ""


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("", "an empty marker"),
        ("{role}<|x|>", "starts with {role}"),
        ("<a>{role}<b>{role}", "more than once"),
    ],
)
def test_bad_markers_are_named(token: str, problem: str) -> None:
    message = check_strip_token(token)
    assert message is not None and problem in message
    with pytest.raises(ValueError, match=problem.replace("{", r"\{").replace("}", r"\}")):
        ChatMarkup([token])


def test_every_default_marker_is_valid() -> None:
    assert all(check_strip_token(token) is None for token in DEFAULT_STRIP_TOKENS)
