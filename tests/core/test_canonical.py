"""Canonical JSON (C-20) and response fingerprints (C-21, C-22, C-24, AS-154…AS-157)."""

from __future__ import annotations

import hashlib
import json
import math
import random
import struct
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrm_trio.core.canonical import canonical_json, digest_hex, fingerprint, fingerprint_json
from genrm_trio.core.exact_ints import int_from_digits


def _nan_with_bits(bits: int) -> float:
    value: float = struct.unpack(">d", bits.to_bytes(8, "big"))[0]
    assert math.isnan(value)
    return value


def test_canonical_form_is_exact() -> None:
    value = {
        "b": [1, 1.0, -0.0, 0.0, 1e16, 5e-324, 2**80, -(2**80)],
        "a": [float("nan"), float("inf"), float("-inf"), True, False, None],
        "s": 'é\n\t\x7f\x00"\\😀\ud800 ~',
    }
    assert canonical_json(value) == (
        b'{"a":[NaN,Infinity,-Infinity,true,false,null],'
        b'"b":[1,1.0,-0.0,0.0,1e+16,5e-324,1208925819614629174706176,-1208925819614629174706176],'
        b'"s":"\\u00e9\\u000a\\u0009\\u007f\\u0000\\"\\\\\\ud83d\\ude00\\ud800 ~"}'
    )


def test_escaped_backslash_before_a_letter_stays_a_backslash() -> None:
    assert canonical_json("\\n\b") == b'"\\\\n\\u0008"'


def test_keys_sort_by_code_point_not_utf16_unit() -> None:
    # U+FFFF sorts before U+1F600 by code point, after its surrogate pair by UTF-16 unit.
    value = {"😀": 1, "\uffff": 2, "a": 3, "B": 4}
    assert canonical_json(value) == b'{"B":4,"a":3,"\\uffff":2,"\\ud83d\\ude00":1}'


def test_digest_hex_is_sha256_of_the_canonical_form() -> None:
    value = {"input": "Hello", "principle": None}
    expected = hashlib.sha256(b'{"input":"Hello","principle":null}').hexdigest()
    assert digest_hex(value) == expected


class _Usage(msgspec.Struct):
    output_tokens: int
    input_tokens: int


class _Response(msgspec.Struct):
    output: list[dict[str, Any]]
    usage: _Usage
    id: str = "resp_1"


def test_as154_key_order_and_typed_form_do_not_matter() -> None:
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    typed = _Response(output=[{"type": "message"}], usage=_Usage(output_tokens=2, input_tokens=1))
    plain = {
        "usage": {"input_tokens": 1, "output_tokens": 2},
        "id": "resp_1",
        "output": [{"type": "message"}],
    }
    assert fingerprint(typed) == fingerprint(plain)
    assert canonical_json(typed) == canonical_json(plain)
    assert fingerprint(typed) == fingerprint_json(json.dumps(plain).encode())


def _response() -> dict[str, Any]:
    rng = random.Random(7)
    return {
        "id": "resp_1",
        "output": [
            {"type": "message", "content": [{"type": "output_text", "text": "same answer"}]}
        ],
        "generation_token_ids": [rng.randrange(150_000) for _ in range(2048)],
        "generation_log_probs": [-rng.random() * 5 for _ in range(2048)],
        "routed_experts": [[rng.randrange(64) for _ in range(4)] for _ in range(256)],
    }


@pytest.mark.parametrize(
    ("key", "position", "new_value"),
    [
        ("generation_token_ids", 1000, 1),
        ("generation_log_probs", 2047, -0.25),
        ("routed_experts", 17, [0, 1, 2, 3]),
    ],
)
def test_as155_any_training_data_change_changes_the_fingerprint(
    key: str, position: int, new_value: Any
) -> None:
    original = _response()
    changed = _response()
    changed[key][position] = new_value
    assert fingerprint(changed) != fingerprint(original)
    assert fingerprint_json(json.dumps(changed).encode()) != fingerprint_json(
        json.dumps(original).encode()
    )


@pytest.mark.parametrize(
    "special", ["\ud800", 2**80, -(2**80), float("nan"), float("inf"), float("-inf")]
)
def test_as156_special_values_are_deterministic_and_differ_from_null(special: Any) -> None:
    value = {"x": [special]}
    text = json.dumps(value).encode()
    assert fingerprint(value) == fingerprint({"x": [special]}) == fingerprint_json(text)
    assert fingerprint(value) != fingerprint({"x": [None]})


def test_as156_nan_infinities_and_a_number_are_four_fingerprints() -> None:
    prints = {fingerprint({"lp": [0.5, v]}) for v in (math.nan, math.inf, -math.inf, -0.5)}
    assert len(prints) == 4
    assert fingerprint({"lp": [None]}) not in prints


def test_as156_int_and_float_spellings_differ() -> None:
    assert fingerprint([1]) != fingerprint([1.0])
    assert fingerprint([0.0]) != fingerprint([-0.0])
    assert fingerprint_json(b"[1]") != fingerprint_json(b"[1.0]")
    assert fingerprint_json(b"[1.0]") == fingerprint_json(b"[1.00]") == fingerprint_json(b"[1e0]")


def test_every_nan_is_the_same_nan() -> None:
    # C-20 writes every NaN as NaN, whatever its sign or payload bits.
    nans = [float("nan"), -float("nan"), _nan_with_bits(0x7FF0000000000001)]
    prints = {fingerprint({"lp": [0.25, nan]}) for nan in nans}
    assert prints == {fingerprint_json(b'{"lp": [0.25, NaN]}')}


def test_nan_deep_in_a_long_array_is_found() -> None:
    values: list[Any] = [i / 7 for i in range(10_000)]
    values[9_999] = -float("nan")
    assert fingerprint({"lp": values}) == fingerprint_json(json.dumps({"lp": values}).encode())
    values[9_999] = float("inf")
    assert fingerprint({"lp": values}) == fingerprint_json(json.dumps({"lp": values}).encode())


def test_numbers_that_resemble_a_nan_bit_pattern() -> None:
    # 3414159360 is 0xcb7ff000: its packed bytes look like the start of a NaN.
    for value in ([3414159360, 1.5], [0xCBFFF8, float("inf"), float("-inf")], [52095, 52223]):
        text = json.dumps(value).encode()
        assert fingerprint(value) == fingerprint_json(text)
        assert fingerprint(value) != fingerprint([*value[:-1], float("nan")])


def test_fingerprint_json_reads_client_spellings() -> None:
    reference = fingerprint(
        {"a": {"x": 2}, "n": [math.nan, math.inf, -math.inf], "s": "é\ud800", "i": 2**80}
    )
    text = (
        b'{ "i" : 1208925819614629174706176 ,\n\t"s": "\\u00e9\\ud800",'
        b' "n": [NaN, 1e309, -Infinity], "a": {"x": 1, "x": 2} }'
    )
    assert fingerprint_json(text) == reference
    assert fingerprint_json(text.decode()) == reference
    assert fingerprint_json(bytearray(text)) == reference
    assert (
        fingerprint_json(
            b'{"s": "\xc3\xa9\\ud800", "a": {"x": 2}, "i": 1208925819614629174706176,'
            b'"n": [NaN, Infinity, -1e400]}'
        )
        == reference
    )


def test_fingerprint_is_32_bytes() -> None:
    assert len(fingerprint({"a": 1})) == 32
    assert len(fingerprint({"a": "\ud800"})) == 32
    assert len(fingerprint_json(b'{"a": 1}')) == 32


def test_as157_cyclic_values_are_rejected() -> None:
    looped: dict[str, Any] = {"a": 1}
    looped["self"] = looped
    listed: list[Any] = [1]
    listed.append({"back": listed})
    for value in (looped, listed):
        for function in (canonical_json, fingerprint, digest_hex):
            with pytest.raises(ValueError, match="Circular reference"):
                function(value)


def test_shared_but_acyclic_values_are_accepted() -> None:
    shared = [1, 2]
    assert canonical_json({"a": shared, "b": shared}) == b'{"a":[1,2],"b":[1,2]}'


# Values any JSON text can denote, including the non-standard ones clients send.
_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**100), max_value=2**100),
    st.floats(),
    st.sampled_from([0.0, -0.0, 1.0, 1, 0, math.nan, math.inf, -math.inf, 2**64, -(2**63) - 1]),
    st.text(st.characters(exclude_categories=()), max_size=8),
    st.sampled_from(["\ud800", "\udfff", "\ud83d\ude00", "a\x7f\n", "é"]),
)
_json_values = st.recursive(
    _json_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(
            st.text(st.characters(exclude_categories=()), max_size=4), children, max_size=5
        ),
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(_json_values)
def test_fingerprint_of_any_json_text_equals_fingerprint_of_its_value(value: Any) -> None:
    compact = json.dumps(value).encode()
    assert fingerprint_json(compact) == fingerprint(value)
    assert fingerprint_json(json.dumps(value, indent=3, sort_keys=True)) == fingerprint(value)


@settings(max_examples=300, deadline=None)
@given(_json_values, st.randoms(use_true_random=False))
def test_key_order_never_matters(value: Any, rng: random.Random) -> None:
    def shuffled(node: Any) -> Any:
        if isinstance(node, dict):
            items = [(k, shuffled(v)) for k, v in node.items()]
            rng.shuffle(items)
            return dict(items)
        if isinstance(node, list):
            return [shuffled(item) for item in node]
        return node

    assert canonical_json(shuffled(value)) == canonical_json(value)
    assert fingerprint(shuffled(value)) == fingerprint(value)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_canonical_form_is_printable_ascii_and_reads_back(value: Any) -> None:
    form = canonical_json(value)
    assert all(0x20 <= byte <= 0x7E for byte in form)
    assert canonical_json(json.loads(form)) == form
    assert fingerprint_json(form) == fingerprint(value)


_small_leaf = st.sampled_from(
    [
        None,
        True,
        False,
        0,
        1,
        -1,
        0.0,
        -0.0,
        1.0,
        0.5,
        math.nan,
        -math.nan,
        math.inf,
        "",
        "a",
        "1",
        "\ud800",
        "é",
        2**70,
    ]
)
_small_values = st.recursive(
    _small_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "é"]), children, max_size=3),
    ),
    max_leaves=6,
)


@settings(max_examples=500, deadline=None)
@given(_small_values, _small_values)
def test_fingerprints_are_equal_exactly_when_canonical_forms_are(left: Any, right: Any) -> None:
    same_form = canonical_json(left) == canonical_json(right)
    assert (fingerprint(left) == fingerprint(right)) == same_form


def test_a_surrogate_pair_held_as_two_code_points_is_its_code_point() -> None:
    # JSON text cannot tell these apart: both are written \ud83d\ude00.
    assert canonical_json("\ud83d\ude00") == canonical_json("😀") == b'"\\ud83d\\ude00"'
    assert fingerprint(["\ud83d\ude00", 1]) == fingerprint(["😀", 1])
    assert fingerprint(["\ud83d\ude00", "\ud800"]) == fingerprint(["😀", "\ud800"])
    assert fingerprint({"\ud83d\ude00": 1, "😀": 2}) == fingerprint({"😀": 2})
    assert fingerprint(["\ude00\ud83d"]) != fingerprint(["😀"])


@pytest.mark.usefixtures("default_digit_cap")
def test_an_integer_beyond_the_digit_cap_next_to_a_surrogate_pair_is_fingerprinted() -> None:
    # Both need the slower encoding: the pair rejoined, the integer written in pieces.
    digits = "7" * 5000
    text = f'{{"seed": {digits}, "text": "\\ud83d\\ude00"}}'.encode()
    same = f'{{"text": "😀", "seed": {digits}}}'.encode()
    assert fingerprint_json(text) == fingerprint_json(same)
    assert fingerprint_json(text) != fingerprint_json(same.replace(b"7}", b"8}"))
    seed = int_from_digits(digits)
    assert fingerprint([seed, "\ud83d\ude00"]) == fingerprint([seed, "😀"])
