"""The hand-written validators and the documented msgspec shapes (W-51) accept the same bodies.

The OpenAPI document is generated from the shapes in ``wire.schema`` while requests are checked
by ``wire.parsing``; feeding both the same bodies keeps the document from drifting from what is
enforced. Bodies here are standard JSON without repeated keys and with every size within the
limits: beyond those, the validators are deliberately more lenient (non-standard literals, lone
surrogates) or stricter (repeated keys, nesting) than a generic decoder, as W-2…W-4 say. Rules
that depend on the configuration (the slot range in group mode, the baseline under
fixed_baseline, the number of /compare answers) are described in the shapes' text and tested
with the validators.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from genrm_trio.config import Config, config_from_mapping
from genrm_trio.testing.harness import SCENARIO_DEFAULTS
from genrm_trio.wire.bodies import INT64_MAX, INT64_MIN, BadRequest
from genrm_trio.wire.parsing import parse_compare_body, parse_verify_body
from genrm_trio.wire.schema import CompareRequestDoc, VerifyRequestDoc

CONFIG: Config = config_from_mapping(
    {**SCENARIO_DEFAULTS, "num_rollouts_per_prompt": 1, "max_compare_responses": 64}
)
MISSING: Any = object()

text = st.text(
    st.characters(exclude_categories=["Cs"]),  # lone surrogates are not standard JSON text
    max_size=6,
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    text,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
    max_leaves=8,
)
integers = st.one_of(
    st.integers(min_value=-3, max_value=3),
    st.sampled_from([INT64_MIN - 1, INT64_MIN, INT64_MAX, INT64_MAX + 1, 2**70]),
)
objects = st.dictionaries(text, values, max_size=3)


def field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a valid value, sometimes absent, sometimes any JSON value at all; a body has
    several fields, so each must usually be valid for the later checks to be reached."""
    return st.integers(0, 9).flatmap(
        lambda roll: valid if roll < 8 else st.just(MISSING) if roll == 8 else values
    )


output_items = st.lists(st.one_of(objects, objects, values), max_size=3)
responses = st.one_of(
    st.fixed_dictionaries({"output": output_items}, optional={"id": text, "extra": values}),
    st.fixed_dictionaries({}, optional={"id": text}),
    values,
)
group_ids = st.one_of(
    st.text(st.characters(exclude_categories=["Cs"]), min_size=0, max_size=3),
    st.just("g" * 1024),
    st.just("g" * 1025),
    st.none(),
)


def body_of(fields: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in fields.items() if v is not MISSING}).encode()


verify_bodies = st.builds(
    lambda params, response, extras: body_of({**extras, **params, **response}),
    st.fixed_dictionaries(
        {
            "responses_create_params": field(
                st.fixed_dictionaries(
                    {"input": field(st.one_of(text, st.lists(objects, max_size=2)))},
                    optional={"metadata": field(objects), "model": text},
                ).map(lambda d: {k: v for k, v in d.items() if v is not MISSING})
            )
        }
    ),
    st.fixed_dictionaries({"response": field(responses)}),
    st.fixed_dictionaries(
        {},
        optional={
            "_ng_group_id": field(group_ids),
            "_ng_group_attempt": field(integers),
            "_ng_rollout_index": field(st.one_of(integers, st.none())),
            "_ng_task_index": field(st.one_of(integers, st.none())),
            "prompt_id": field(st.one_of(text, st.none())),
            "principle": field(st.one_of(text, st.none())),
            "instance_config": values,
            "_ng_rollout_id": values,
            "task": values,
        },
    ),
)

history_items = st.one_of(
    st.fixed_dictionaries({"role": field(text), "content": field(text)}).map(
        lambda d: {k: v for k, v in d.items() if v is not MISSING}
    ),
    values,
)
compare_bodies = st.builds(
    body_of,
    st.fixed_dictionaries(
        {
            "conversation_history": field(st.lists(history_items, max_size=3)),
            "response_objs": field(st.lists(responses, max_size=4)),
        },
        optional={
            "principle": field(st.one_of(text, st.none())),
            "baseline_response": values,
            "extra": values,
        },
    ),
)


def hand_accepts(parse: Any, body: bytes) -> bool:
    try:
        parse(body, CONFIG)
    except BadRequest:
        return False
    return True


def schema_accepts(shape: type[msgspec.Struct], body: bytes) -> bool:
    try:
        msgspec.json.decode(body, type=shape)
    except msgspec.ValidationError:
        return False
    return True


@settings(max_examples=600, deadline=None)
@given(verify_bodies)
def test_verify_validator_and_documented_shape_agree(body: bytes) -> None:
    assert hand_accepts(parse_verify_body, body) == schema_accepts(VerifyRequestDoc, body)


@settings(max_examples=400, deadline=None)
@given(compare_bodies)
def test_compare_validator_and_documented_shape_agree(body: bytes) -> None:
    assert hand_accepts(parse_compare_body, body) == schema_accepts(CompareRequestDoc, body)


def test_the_generated_bodies_reach_both_answers() -> None:
    """Without both answers in the mix the agreement above would prove nothing."""
    seen: set[tuple[bool, bool]] = set()

    @settings(max_examples=200, deadline=None, database=None)
    @given(verify_bodies, compare_bodies)
    def collect(verify: bytes, compare: bytes) -> None:
        seen.add(
            (hand_accepts(parse_verify_body, verify), hand_accepts(parse_compare_body, compare))
        )

    collect()
    assert {accepted for accepted, _ in seen} == {True, False}
    assert {accepted for _, accepted in seen} == {True, False}
