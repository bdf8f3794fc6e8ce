"""The fingerprint of a decoded value, the form /verify computes it in, equals the fingerprint of
the same value through the Python API and from its JSON text (C-21, C-24)."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from genrm_trio.core.canonical import fingerprint, fingerprint_decoded, fingerprint_json

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**100), max_value=2**100),
    st.floats(),
    st.sampled_from([0.0, -0.0, 1.0, 1, math.nan, -math.nan, math.inf, -math.inf, 2**64]),
    st.text(st.characters(exclude_categories=()), max_size=8),
    st.sampled_from(["\ud800", "\ud83d\ude00", "é"]),
)
_values = st.recursive(
    _leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.text(max_size=4), children, max_size=5),
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_decoded_fingerprint_equals_the_python_api_fingerprint(value: Any) -> None:
    assert fingerprint_decoded(value) == fingerprint(value)
    assert fingerprint_decoded(json.loads(json.dumps(value))) == fingerprint(value)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_a_standard_decode_needs_no_search_for_nan(value: Any) -> None:
    text = json.dumps(value).encode()
    try:
        decoded = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return  # non-standard literals or lone surrogates: /verify reads those leniently
    assert fingerprint_decoded(decoded, may_hold_nan=False) == fingerprint(value)
    assert fingerprint_decoded(decoded, may_hold_nan=False) == fingerprint_json(text)


def test_nan_infinities_and_null_stay_four_classes_when_decoded() -> None:
    prints = {
        fingerprint_decoded(json.loads(f'{{"lp": [0.5, {literal}]}}'))
        for literal in ("NaN", "Infinity", "-Infinity", "null")
    }
    assert len(prints) == 4
