"""fingerprint_json on large texts (C-24): a text whose long arrays of numbers are packed piece by
piece has exactly the fingerprint of the whole text decoded at once, for every input, and the
same errors."""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrm_trio.core import canonical
from genrm_trio.core.canonical import fingerprint, fingerprint_json

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _common import BodyShape, response_object

Outcome = tuple[str, Any]


def outcome(compute: Callable[[], bytes]) -> Outcome:
    try:
        return "fingerprint", compute()
    except Exception as exc:  # the same error type either way
        return "error", type(exc)


def reference(text: bytes | str) -> Outcome:
    """The fingerprint by decoding the whole text into Python values (the definition)."""
    return outcome(lambda: canonical._decoded_fingerprint(text))


@contextmanager
def splicing(piece_bytes: int, min_array_bytes: int = 0) -> Iterator[None]:
    """Every text of any size is tried piece by piece, down to the smallest arrays."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(canonical, "SPLICE_MIN_TEXT_BYTES", 0)
        patch.setattr(canonical, "SPLICE_MIN_ARRAY_BYTES", min_array_bytes)
        patch.setattr(canonical, "PIECE_BYTES", piece_bytes)
        yield


def spliced_outcome(text: bytes, piece_bytes: int) -> Outcome:
    with splicing(piece_bytes):
        return outcome(lambda: fingerprint_json(text))


MARK = canonical._mark(canonical._MARKS[0], 0).decode()
MARK_B = canonical._mark(canonical._MARKS[1], 0).decode()
_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-300, max_value=300),
    st.floats(),
    st.sampled_from([0, -0.0, 0.0, 1.0, 2**63, 2**64, -(2**63) - 1, math.nan, math.inf]),
)
_leaves = st.one_of(
    _numbers,
    st.lists(_numbers | st.booleans() | st.none(), max_size=40),
    st.none(),
    st.booleans(),
    st.text(max_size=6),
    st.sampled_from(
        ['"', "\\", "[", "]", "[1, 2]", "{", "}", ",", "\ud800", "\ud83d\ude00", "é", MARK, MARK_B]
    ),
)
_values = st.recursive(
    _leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(["a", "b", "é", "[", MARK, MARK_B]), children, max_size=4),
    ),
    max_leaves=20,
)


def dump(value: Any, rng: random.Random, ensure_ascii: bool) -> str:
    """JSON text of ``value`` with random spacing, and now and then an object key repeated
    before its last occurrence (the last one wins)."""

    def space() -> str:
        return rng.choice(["", "", " ", "\n  ", "\t"])

    if isinstance(value, dict):
        members = []
        for key, item in value.items():
            if rng.random() < 0.2:
                members.append((key, rng.choice([[1, 2.5], "x", None])))
            members.append((key, item))
        return (
            "{"
            + ",".join(
                space()
                + json.dumps(key, ensure_ascii=ensure_ascii)
                + space()
                + ":"
                + space()
                + dump(item, rng, ensure_ascii)
                + space()
                for key, item in members
            )
            + "}"
        )
    if isinstance(value, list):
        return (
            "["
            + ",".join(space() + dump(item, rng, ensure_ascii) + space() for item in value)
            + "]"
        )
    return json.dumps(value, ensure_ascii=ensure_ascii)


@settings(max_examples=600, deadline=None)
@given(
    value=_values,
    rng=st.randoms(use_true_random=False),
    ensure_ascii=st.booleans(),
    piece_bytes=st.sampled_from([0, 1, 5, 64]),
)
def test_piecewise_packing_gives_the_whole_decode_fingerprint(
    value: Any, rng: random.Random, ensure_ascii: bool, piece_bytes: int
) -> None:
    try:
        text = dump(value, rng, ensure_ascii).encode("utf-8")
    except UnicodeEncodeError:
        return  # a lone surrogate written raw is not UTF-8
    expected = reference(text)
    assert spliced_outcome(text, piece_bytes) == expected
    if expected[0] == "fingerprint" and "NaN" not in text.decode():
        assert expected[1] == fingerprint(json.loads(text))


@settings(max_examples=600, deadline=None)
@given(
    text=st.text(alphabet='{}[]":, 0123456789.eE-+tfalsnuNI\\', max_size=40),
    piece_bytes=st.sampled_from([0, 2, 64]),
)
def test_piecewise_packing_agrees_on_arbitrary_text(text: str, piece_bytes: int) -> None:
    data = text.encode()
    assert spliced_outcome(data, piece_bytes) == reference(data)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": [1, 2, 3], "b": [4.5, -0.0, 1e3]}',
        "[1, 2, 3]",
        '{"a": [ ], "b": [\n]}',
        '{"a": [1, 2,], "b": 1}',
        '{"a": [1,, 2]}',
        '{"a": [, 1]}',
        '{"a": [1 2]}',
        '{"a": [01]}',
        '{"a": [1, NaN, 2]}',
        '{"a": [1, Infinity]}',
        '{"a": [1e400]}',
        '{"a": [18446744073709551616, 1]}',
        '{"a": [-9223372036854775809]}',
        '{"a": [true, false, null, 1]}',
        '{"a": [1, 2], "a": [3]}',
        '{"a": [3], "a": [1, 2]}',
        '{"a": "[1, 2, 3]", "b": [4]}',
        '{"a": "x\\\\[1, 2]", "b": "]"}',
        '{"a": "\\"[1, 2]\\"", "b": [5]}',
        '{"a": "[1, 2", "b": "3]"}',
        '{"a": [1, 2], "b": "\\ud800"}',
        '{"a": [1, 2], "b": "\\ud83d\\ude00"}',
        f'{{"a": [1, 2], "b": "{MARK}"}}',
        f'{{"{MARK}": [1, 2]}}',
        # A member whose array is replaced by a later duplicate, and a string equal to a marker.
        f'{{"{MARK}": [1, 2], "{MARK}": null}}',
        f'{{"k": [1, 2], "k": "{MARK}"}}',
        f'{{"k": [1, 2], "k": "{MARK}", "j": "{MARK_B}"}}',
        f'{{"k": [1, 2], "k": "{MARK}", "j": [3], "j": "{MARK_B}"}}',
        f'{{"k": [1, 2], "k": "\\u007e{MARK[1:]}", "j": "{MARK_B}"}}',
        '{"a": [[1, 2], [3]], "b": {"c": [4, 5]}}',
        '{"a": [1, 2]',
        '{"a": [1, 2]} x',
        '  {"a": [1, 2]}  ',
    ],
)
@pytest.mark.parametrize("piece_bytes", [0, 1, 3, 1 << 14])
def test_edge_cases_agree_with_the_whole_decode(text: str, piece_bytes: int) -> None:
    data = text.encode()
    assert spliced_outcome(data, piece_bytes) == reference(data)


@pytest.mark.parametrize("count", [0, 1, 15, 16, 17, 65_535, 65_536, 65_537])
def test_array_headers_of_every_size(count: int) -> None:
    # msgpack's array header changes at 16 and 65,536 items; pieces are cut anywhere.
    items = [i % 300 - 20 for i in range(count)]
    text = json.dumps({"a": items, "b": [0.5] * count}).encode()
    for piece_bytes in (0, 7, 1 << 14):
        assert spliced_outcome(text, piece_bytes) == reference(text)
    assert (
        canonical._array_header(count)
        == canonical._PACKER.encode(items)[: 1 + 2 * (count >= 16) + 2 * (count >= 65_536)]
    )


def rollout_text(tokens: int, seed: int) -> bytes:
    shape = BodyShape(generated_tokens=tokens, prompt_tokens=tokens // 4)
    return json.dumps(response_object(shape, seed=seed, slot=seed % 4)).encode()


@pytest.mark.parametrize("tokens", [4_096, 65_536])
def test_a_rollout_is_packed_piece_by_piece_with_the_same_fingerprint(tokens: int) -> None:
    text = rollout_text(tokens, seed=3)
    assert len(text) >= canonical.SPLICE_MIN_TEXT_BYTES
    spliced = canonical._spliced_fingerprint(text, 0, len(text))
    assert spliced is not None  # its three token and log-prob arrays were cut out
    assert len(canonical._number_arrays(text, 0, len(text))) == 3
    assert spliced == fingerprint_json(text) == canonical._decoded_fingerprint(text)
    assert spliced == fingerprint(json.loads(text))
    # Any other spelling of the same response: the same fingerprint.
    value = json.loads(text)
    for other in (
        json.dumps(value, separators=(",", ":"), sort_keys=True),
        json.dumps(value, indent=2),
    ):
        assert fingerprint_json(other.encode()) == spliced
    # A different log-prob: a different one.
    changed = json.loads(text)
    changed["output"][1]["generation_log_probs"][-1] += 1e-9
    assert fingerprint_json(json.dumps(changed).encode()) != spliced


def test_views_into_a_larger_text_are_read_in_place() -> None:
    response = rollout_text(4_096, seed=5)
    # The response's first bytes occur earlier in the body too.
    body = b'{"decoy": ' + json.dumps(response[:100].decode()).encode() + b', "r": ' + response
    body += b', "same": ' + response + b"}"
    start = body.index(response)
    view = memoryview(body)[start : start + len(response)]
    data, found_start, found_end = canonical._bytes_and_span(view)
    assert data is body and bytes(data[found_start:found_end]) == response
    expected = canonical._decoded_fingerprint(response)
    assert fingerprint_json(view) == fingerprint_json(view.cast("c")) == expected
    assert fingerprint_json(bytearray(response)) == expected
    assert fingerprint_json(memoryview(bytearray(response))[0:]) == expected
    assert fingerprint_json(response.decode()) == expected


def test_long_arrays_inside_strings_are_not_cut_out() -> None:
    numbers = json.dumps(list(range(5_000)))
    value = {"note": f"see {numbers}", "ids": list(range(5_000))}
    text = json.dumps(value).encode()
    assert spliced_outcome(text, 1 << 14) == reference(text)
    with splicing(1 << 14, min_array_bytes=canonical.SPLICE_MIN_ARRAY_BYTES):
        assert fingerprint_json(text) == fingerprint(value)


def test_deep_nesting_raises_where_the_whole_decode_does() -> None:
    numbers = json.dumps(list(range(2_000)))

    def nested(depth: int) -> bytes:
        return ("[" * depth + numbers + "]" * depth).encode()

    def public(text: bytes, *, splice: bool) -> Outcome:
        # The same entry point, so the same stack depth, with and without the piecewise path.
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(canonical, "SPLICE_MIN_TEXT_BYTES", 0 if splice else 1 << 62)
            return outcome(partial(fingerprint_json, text))

    # The depth at which the whole decode starts to raise RecursionError, from about here.
    limit = next(d for d in range(500, 5_000, 10) if public(nested(d), splice=False)[0] == "error")
    for depth in [3, *range(limit - 30, limit + 10)]:
        text = nested(depth)
        assert public(text, splice=True) == public(text, splice=False), depth
