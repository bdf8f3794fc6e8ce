"""Parsing and validating /verify bodies: status codes and exact texts (W-4…W-14, AS-12…AS-19,
AS-23), and that random bodies end in a result or a BadRequest, never another exception."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from row_texts import masked_row, response_bytes, scored_row

from genrm_trio.config import Config
from genrm_trio.wire.bodies import BadRequest, VerifyRequest
from genrm_trio.wire.parsing import parse_verify_body

GROUP = Config(judge_base_url="http://judge/v1", judge_model="m", num_rollouts_per_prompt=2)
SINGLE = Config(judge_base_url="http://judge/v1", judge_model="m", num_rollouts_per_prompt=1)
BASELINE = Config(
    judge_base_url="http://judge/v1",
    judge_model="m",
    num_rollouts_per_prompt=1,
    comparison_strategy="fixed_baseline",
)


def member(i: int = 0, q: int = 3, g: Any = "g", a: int = 0, **extra: Any) -> dict[str, Any]:
    """The §10 harness body `member(i, q, g, a)`."""
    body: dict[str, Any] = {
        "responses_create_params": {"input": "2+2?"},
        "response": {
            "id": f"r-{g}-{a}-{i}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"answer-{i} [[q={q}]]"}],
                }
            ],
        },
        "_ng_group_id": g,
        "_ng_group_attempt": a,
        "_ng_rollout_index": i,
    }
    body.update(extra)
    return body


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def without(body: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in keys}


def rejected(body: bytes | dict[str, Any], config: Config = GROUP) -> BadRequest:
    data = body if isinstance(body, bytes) else encode(body)
    with pytest.raises(BadRequest) as caught:
        parse_verify_body(data, config)
    return caught.value


def test_a_harness_member_is_read_completely() -> None:
    request = parse_verify_body(encode(member(1, g="g7", a=3)), GROUP)
    assert isinstance(request, VerifyRequest)
    assert (request.group_id, request.attempt, request.attempt_given) == ("g7", 3, True)
    assert (request.rollout_index, request.task_index, request.prompt_id) == (1, None, None)
    assert request.principle is None and request.baseline is None
    assert request.input_value == "2+2?"
    assert request.response_value == member(1, g="g7", a=3)["response"]
    assert response_bytes(request) == json.dumps(member(1, g="g7", a=3)["response"]).encode()


def test_legacy_keys_and_principle_are_read() -> None:
    body = without(member(0), "_ng_group_id", "_ng_group_attempt")
    body.update(_ng_task_index=-7, prompt_id="p-1", principle="Be brief.")
    body["responses_create_params"] = {"input": [{"role": "user", "content": "hi"}], "model": "x"}
    request = parse_verify_body(encode(body), GROUP)
    assert request.group_id is None
    assert (request.attempt, request.attempt_given) == (0, False)
    assert (request.task_index, request.prompt_id, request.principle) == (-7, "p-1", "Be brief.")
    assert request.input_value == [{"role": "user", "content": "hi"}]


def test_omitted_attempt_is_zero_and_remembered_as_omitted() -> None:
    request = parse_verify_body(encode(without(member(0), "_ng_group_attempt")), GROUP)
    assert (request.group_id, request.attempt, request.attempt_given) == ("g", 0, False)


# --- 400 and 413 (W-4, AS-12, AS-13, AS-14) --------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"{",
        b'{"response": }',
        b"not json",
        encode(member(0)) + b" trailing",
        encode(member(0))[:-1],
        encode(member(0)).replace(b"2+2?", b"2+2?\xff"),
    ],
    ids=["empty", "open brace", "missing value", "word", "trailing", "truncated", "bad utf-8"],
)
def test_unparseable_json_is_400(data: bytes) -> None:
    error = rejected(data)
    assert error.status == 400
    assert error.detail.startswith("invalid JSON body: ")


@pytest.mark.parametrize(
    "data", [b"[1, 2]", b'"x"', b"5", b"null", b"[" + encode(member(0)) + b"]"]
)
def test_a_top_level_that_is_not_an_object_is_400(data: bytes) -> None:
    error = rejected(data)
    assert error.status == 400
    assert error.detail.startswith("invalid JSON body: expected a JSON object at the top level")


def test_a_repeated_top_level_key_is_400_naming_it() -> None:
    text = encode(member(0))[:-1] + b', "_ng_rollout_index": 1}'
    error = rejected(text)
    assert (error.status, error.detail) == (400, "duplicate key '_ng_rollout_index'")
    same_value = encode(member(0))[:-1] + b', "_ng_rollout_index": 0}'
    assert rejected(same_value).detail == "duplicate key '_ng_rollout_index'"
    escaped = encode(member(0))[:-1] + b', "\\u005fng_rollout_index": 0}'
    assert rejected(escaped).detail == "duplicate key '_ng_rollout_index'"


def test_repeated_keys_inside_values_are_accepted_last_one_winning() -> None:
    text = encode(member(0)).replace(b'"id": ', b'"id": "first", "id": ', 1)
    request = parse_verify_body(text, GROUP)
    assert request.response_value["id"] == "r-g-0-0"
    assert b'"id": "first", "id": "r-g-0-0"' in response_bytes(request)


def test_a_body_over_the_limit_is_413() -> None:
    config = Config(judge_base_url="http://j/v1", judge_model="m", max_body_bytes=4096)
    body = member(0, note="x" * 5000)
    assert len(encode(body)) > 4096
    error = rejected(body, config)
    assert (error.status, error.detail) == (413, "request body exceeds 4096 bytes")
    fits = encode(member(0, note="x" * 10))
    fits = fits[:-1] + b" " * (4096 - len(fits)) + b"}"
    assert len(fits) == 4096
    assert parse_verify_body(fits, config).rollout_index == 0


# --- 422 shape rules (W-6, AS-15) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (
            without(member(0), "response"),
            "response: required field missing (expected an object with an output array)",
        ),
        (
            member(0, response={"id": "r"}),
            "response.output: required field missing (expected an array of objects)",
        ),
        (member(0, response={"output": [1]}), "response.output[0]: expected an object, got 1"),
        (
            member(0, response={"output": [{}, "text"]}),
            'response.output[1]: expected an object, got "text"',
        ),
        (
            member(0, response={"output": {"type": "message"}}),
            "response.output: expected an array of objects, got an object",
        ),
        (member(0, response=[{"output": []}]), "response: expected an object, got an array"),
        (member(0, response=None), "response: expected an object, got null"),
        (
            without(member(0), "responses_create_params"),
            "responses_create_params: required field missing (expected an object)",
        ),
        (
            member(0, responses_create_params="2+2?"),
            'responses_create_params: expected an object, got "2+2?"',
        ),
        (
            member(0, responses_create_params={"model": "x"}),
            "responses_create_params.input: required field missing "
            "(expected a string or an array of objects)",
        ),
        (
            member(0, responses_create_params={"input": 5}),
            "responses_create_params.input: expected a string or an array of objects, got 5",
        ),
        (
            member(0, responses_create_params={"input": [{"role": "user"}, "hi"]}),
            'responses_create_params.input[1]: expected an object, got "hi"',
        ),
        (member(0, prompt_id=5), "prompt_id: expected a string or null, got 5"),
        (member(0, principle=["x"]), "principle: expected a string or null, got an array"),
    ],
    ids=lambda value: "" if isinstance(value, dict) else value.split(":")[0],
)
def test_shape_violations_are_422_naming_the_path(body: dict[str, Any], detail: str) -> None:
    error = rejected(body)
    assert (error.status, error.detail) == (422, detail)


def test_only_the_first_problem_found_is_named() -> None:
    error = rejected(member(0, response={"output": [1]}, _ng_group_attempt=-1, prompt_id=5))
    assert error.detail == "response.output[0]: expected an object, got 1"


# --- coordinates (W-7, W-12, AS-16, AS-17, AS-18) ---------------------------------------------


def test_group_mode_requires_a_slot_in_range() -> None:
    required = "_ng_rollout_index is required for cohort comparison"
    assert rejected(without(member(0), "_ng_rollout_index")).detail == required
    assert rejected(member(0, _ng_rollout_index=None)).detail == required
    assert rejected(member(2)).detail == "_ng_rollout_index must be in [0, 2); got 2"
    assert rejected(member(-1)).detail == "_ng_rollout_index must be in [0, 2); got -1"
    assert parse_verify_body(encode(member(1)), GROUP).rollout_index == 1


def test_fixed_baseline_is_group_mode_whatever_n() -> None:
    body = member(0, responses_create_params={"input": "q", "metadata": {"baseline_response": "b"}})
    assert parse_verify_body(encode(body), BASELINE).rollout_index == 0
    assert rejected({**body, "_ng_rollout_index": 1}, BASELINE).detail == (
        "_ng_rollout_index must be in [0, 1); got 1"
    )
    assert rejected(without(body, "_ng_rollout_index"), BASELINE).detail == (
        "_ng_rollout_index is required for cohort comparison"
    )


def test_single_rollout_mode_needs_no_slot_but_checks_its_type() -> None:
    request = parse_verify_body(encode(without(member(0), "_ng_rollout_index")), SINGLE)
    assert request.rollout_index is None
    assert parse_verify_body(encode(member(5)), SINGLE).rollout_index == 5
    error = rejected(member(0, _ng_rollout_index=True), SINGLE)
    assert error.detail == "_ng_rollout_index: expected an integer or null, got true"


@pytest.mark.parametrize(
    ("literal", "shown"),
    [
        (b"true", "true"),
        (b"1.5", "1.5"),
        (b"1.0", "1.0"),
        (b"1e3", "1e3"),
        (b'"1"', '"1"'),
        (b"-1", "-1"),
        (b"NaN", "NaN"),
        (b"null", "null"),
        (b"[0]", "an array"),
    ],
)
def test_attempt_is_a_strict_non_negative_integer(literal: bytes, shown: str) -> None:
    text = encode(member(0)).replace(b'"_ng_group_attempt": 0', b'"_ng_group_attempt": ' + literal)
    error = rejected(text)
    assert (error.status, error.detail) == (
        422,
        f"_ng_group_attempt: expected an integer >= 0, got {shown}",
    )


def test_attempt_must_fit_in_64_bits() -> None:
    assert parse_verify_body(encode(member(0, a=2**63 - 1)), GROUP).attempt == 2**63 - 1
    for value in (2**63, 2**70):
        error = rejected(member(0, a=value))
        assert error.detail == (
            f"_ng_group_attempt: expected an integer between 0 and {2**63 - 1}, got {value}"
        )
    huge = encode(member(0)).replace(
        b'"_ng_group_attempt": 0', b'"_ng_group_attempt": 1' + b"0" * 60
    )
    assert rejected(huge).status == 422


@pytest.mark.parametrize("literal", [b"true", b"1.5", b'"1"', b"1.0", b"1E0", b"Infinity"])
@pytest.mark.parametrize("key", ["_ng_rollout_index", "_ng_task_index"])
def test_slot_and_task_index_are_strict_integers(key: str, literal: bytes) -> None:
    text = encode(member(0))[:-1].replace(b', "_ng_rollout_index": 0', b"")
    if key == "_ng_task_index":
        text += b', "_ng_rollout_index": 0'
    text += b', "' + key.encode() + b'": ' + literal + b"}"
    error = rejected(text)
    shown = literal.decode()
    assert (error.status, error.detail) == (422, f"{key}: expected an integer or null, got {shown}")


def test_task_index_takes_the_whole_signed_64_bit_range() -> None:
    assert parse_verify_body(encode(member(0, _ng_task_index=-(2**63))), GROUP).task_index == -(
        2**63
    )
    error = rejected(member(0, _ng_task_index=-(2**63) - 1))
    assert error.status == 422
    assert error.detail.startswith("_ng_task_index: expected an integer between")
    assert parse_verify_body(encode(member(0, _ng_task_index=None)), GROUP).task_index is None


@pytest.mark.parametrize(
    ("value", "shown"),
    [("", '""'), (5, "5"), ("x" * 1025, "a string of 1025 code points"), (["g"], "an array")],
)
def test_group_id_is_1_to_1024_code_points(value: Any, shown: str) -> None:
    error = rejected(member(0, g=value))
    assert (error.status, error.detail) == (
        422,
        f"_ng_group_id: expected a string of 1 to 1024 code points or null, got {shown}",
    )


def test_group_id_length_counts_code_points_not_bytes() -> None:
    assert parse_verify_body(encode(member(0, g="é" * 1024)), GROUP).group_id == "é" * 1024
    assert parse_verify_body(encode(member(0, g=None)), GROUP).group_id is None


# --- fixed_baseline (W-13, AS-19) -------------------------------------------------------------

W13 = (
    "responses_create_params.metadata.baseline_response: expected a non-empty string when "
    "comparison_strategy is fixed_baseline"
)


@pytest.mark.parametrize(
    "params",
    [
        {"input": "q"},
        {"input": "q", "metadata": None},
        {"input": "q", "metadata": {}},
        {"input": "q", "metadata": {"baseline_response": ""}},
        {"input": "q", "metadata": {"baseline_response": 5}},
    ],
)
def test_fixed_baseline_requires_a_baseline_response(params: dict[str, Any]) -> None:
    error = rejected(member(0, responses_create_params=params), BASELINE)
    assert (error.status, error.detail) == (422, W13)


def test_the_baseline_is_read_only_under_fixed_baseline() -> None:
    params = {"input": "q", "metadata": {"baseline_response": "B"}}
    assert (
        parse_verify_body(encode(member(0, responses_create_params=params)), BASELINE).baseline
        == "B"
    )
    assert (
        parse_verify_body(encode(member(0, responses_create_params=params)), GROUP).baseline is None
    )


# --- free-form values and server-owned keys (W-8, W-9, §2.2, AS-23, AS-26) --------------------


def test_non_standard_literals_are_accepted_in_free_form_values() -> None:
    text = encode(member(0)).replace(
        b'"id": ', b'"logprobs": [NaN, Infinity, -Infinity, -0.5], "id": ', 1
    )
    text = text[:-1] + b', "instance_config": {"t": NaN}, "extra": [Infinity]}'
    request = parse_verify_body(text, GROUP)
    logprobs = request.response_value["logprobs"]
    assert math.isnan(logprobs[0]) and logprobs[1:] == [math.inf, -math.inf, -0.5]
    assert b"[NaN, Infinity, -Infinity, -0.5]" in response_bytes(request)


@pytest.mark.parametrize("key", ["_ng_group_attempt", "_ng_rollout_index", "_ng_task_index"])
@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_standard_literals_are_rejected_where_a_number_is_expected(
    key: str, literal: bytes
) -> None:
    text = encode(without(member(0), key))[:-1] + b', "' + key.encode() + b'": ' + literal + b"}"
    error = rejected(text)
    assert error.status == 422
    assert error.detail.startswith(f"{key}: expected an integer")
    assert error.detail.endswith(f"got {literal.decode()}")


def test_server_owned_keys_and_rollout_id_take_any_value() -> None:
    body = member(
        1,
        reward="x",
        mask_sample=[1],
        failure_kind={"a": None},
        failure_reason=7,
        _ng_failure_class=True,
        _ng_failure_judge_error=None,
        genrm_failed_comparison_rate_per_group="n/a",
        genrm_masked_rollout_rate_per_group=[],
        mean_individual_score={},
        std_individual_score="",
        tiebreak_usage_rate=False,
        _ng_rollout_id={"anything": [1, 2]},
    )
    text = encode(body)[:-1] + b', "tiebreak_usage_rate_x": NaN}'
    assert parse_verify_body(text, GROUP).rollout_index == 1


def test_plain_coordinate_names_are_ordinary_extra_fields() -> None:
    body = member(0, group_id=5, group_attempt="x", rollout_index=[], task_index=None)
    request = parse_verify_body(encode(body), GROUP)
    assert (request.group_id, request.attempt, request.rollout_index) == ("g", 0, 0)


# --- properties ---------------------------------------------------------------------------------

KEYS = [
    "responses_create_params",
    "response",
    "_ng_group_id",
    "_ng_group_attempt",
    "_ng_rollout_index",
    "_ng_task_index",
    "prompt_id",
    "principle",
    "instance_config",
    "_ng_rollout_id",
    "reward",
    "mask_sample",
    "x",
]
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
    | st.sampled_from(["\ud800", "h\u00e9llo", "\udc00x"])
    | st.integers(min_value=-2, max_value=3)
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["input", "output", "metadata", "baseline_response", "k"]),
            children,
            max_size=3,
        )
    ),
    max_leaves=10,
)
valid_response = st.fixed_dictionaries(
    {"output": st.lists(st.dictionaries(st.text(max_size=3), scalars, max_size=2), max_size=2)},
    optional={"id": st.text(max_size=5), "lp": st.lists(st.floats(), max_size=3)},
)
valid_params = st.fixed_dictionaries(
    {
        "input": st.text(max_size=5)
        | st.lists(st.dictionaries(st.text(max_size=3), scalars), max_size=2)
    },
    optional={"metadata": st.fixed_dictionaries({"baseline_response": st.text(max_size=3)})},
)
mostly_valid = st.builds(
    lambda base, rest: {**rest, **base},
    st.fixed_dictionaries(
        {
            "responses_create_params": valid_params,
            "response": valid_response,
            "_ng_rollout_index": st.integers(min_value=0, max_value=1) | values,
        },
        optional={
            "_ng_group_id": st.none() | st.text(min_size=1, max_size=4),
            "_ng_group_attempt": st.integers(min_value=0, max_value=2**63 - 1),
            "_ng_task_index": st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1),
            "prompt_id": st.none() | st.text(max_size=4),
            "principle": st.none() | st.text(max_size=4),
        },
    ),
    st.dictionaries(st.sampled_from(KEYS[8:]) | st.text(max_size=4), values, max_size=4),
)
bodies = st.dictionaries(st.sampled_from(KEYS), values, max_size=8) | mostly_valid
configs = st.sampled_from([GROUP, SINGLE, BASELINE])


def check_round_trip(request: VerifyRequest, config: Config) -> None:
    """W-23: each rendered row is a valid request for the same slot with the same response."""
    metrics = (
        None
        if not config.group_mode
        else dict.fromkeys(
            [
                "genrm_failed_comparison_rate_per_group",
                "genrm_masked_rollout_rate_per_group",
                "mean_individual_score",
                "std_individual_score",
                "tiebreak_usage_rate",
            ],
            0.25,
        )
    )
    for row in (scored_row(request, 3.0, metrics), masked_row(request, "boom")):
        again = parse_verify_body(row, config)
        assert response_bytes(again) == response_bytes(request)
        coordinates = (again.group_id, again.attempt, again.rollout_index, again.task_index)
        assert coordinates == (
            request.group_id,
            request.attempt,
            request.rollout_index,
            request.task_index,
        )
        assert json.dumps(again.input_value) == json.dumps(request.input_value)


@settings(max_examples=400, deadline=None)
@given(body=bodies, config=configs)
def test_random_bodies_end_in_a_request_or_a_bad_request(
    body: dict[str, Any], config: Config
) -> None:
    try:
        text = json.dumps(body).encode()
    except UnicodeEncodeError:
        return
    try:
        request = parse_verify_body(text, config)
    except BadRequest as error:
        assert error.status in (400, 422)
        return
    check_round_trip(request, config)


@settings(max_examples=400, deadline=None)
@given(
    cut=st.integers(min_value=0, max_value=400),
    insert=st.binary(min_size=0, max_size=3),
    config=configs,
)
def test_damaged_bodies_end_in_a_request_or_a_bad_request(
    cut: int, insert: bytes, config: Config
) -> None:
    params = {"input": "q", "metadata": {"baseline_response": "b"}}
    text = encode(member(0, responses_create_params=params, instance_config={"a": 1}))
    cut %= len(text) + 1
    damaged = text[:cut] + insert + text[cut + len(insert) // 2 :]
    try:
        request = parse_verify_body(damaged, config)
    except BadRequest as error:
        assert error.status in (400, 422)
        return
    check_round_trip(request, config)
