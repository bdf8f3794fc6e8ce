"""A parsed /verify request hands its decoded response and prompt input over once and then holds
only the body its reply echoes (I-10, W-24)."""

from __future__ import annotations

import gc
import json

import pytest

from genrm_trio.config import Config
from genrm_trio.wire.parsing import parse_verify_body

CONFIG = Config(judge_base_url="http://judge/v1", judge_model="judge", num_rollouts_per_prompt=2)
MARKER = "response-to-hand-over"


def body(log_probs: str = "[-0.5, -1.25]") -> bytes:
    return (
        '{"responses_create_params": {"input": "2+2?"}, "response": {"id": "' + MARKER + '", '
        '"output": [{"type": "message", "content": []}], "generation_log_probs": '
        + log_probs
        + '}, "_ng_group_id": "g", "_ng_rollout_index": 0}'
    ).encode()


def live_responses() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, dict) and o.get("id") == MARKER)


def test_the_decoded_parts_are_taken_once_and_then_released() -> None:
    data = body()
    request = parse_verify_body(data, CONFIG)
    scoring, prompt = request.take_scoring()
    response = request.response_value
    assert response["generation_log_probs"] == [-0.5, -1.25]
    assert prompt == "2+2?"
    with pytest.raises(RuntimeError, match="already taken"):
        request.take_scoring()
    del scoring, response
    gc.collect()
    assert live_responses() == 0
    # The echo still has the response exactly as sent.
    raw = bytes(request.response_view())
    assert raw == json.dumps(json.loads(data)["response"]).encode()
    assert raw in data


def test_only_a_lenient_read_may_hold_nan() -> None:
    assert not parse_verify_body(body(), CONFIG).response_may_hold_nan
    assert parse_verify_body(body("[NaN, -Infinity]"), CONFIG).response_may_hold_nan
