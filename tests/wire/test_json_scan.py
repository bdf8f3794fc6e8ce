"""The top-level object splitter: exact byte spans, duplicates kept, lenient literals, and the
errors that become 400 `invalid JSON body: <reason>` (W-4, W-8, W-9, W-21)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_texts import json_values, object_text, separators

from genrm_trio.wire._json_scan import (
    MAX_NESTING,
    NOT_DECODED,
    JsonScanError,
    Member,
    decode_value,
    split_object,
)


def spans(data: bytes, members: list[Member]) -> list[tuple[bytes, bytes]]:
    return [(data[m.key_start : m.key_end], data[m.value_start : m.value_end]) for m in members]


STANDARD = b'{ "a" : [1, 2] ,\n"b":{"x" : 1, "x": 2},"c":"h\xc3\xa9llo","d":null}'
LENIENT = b'{ "a" : [NaN, 2] ,\n"b":{"x" : 1, "x": 2},"c":"h\xc3\xa9llo","d":-Infinity}'


@pytest.mark.parametrize("data", [STANDARD, LENIENT], ids=["standard", "non-standard literals"])
def test_members_keep_exact_key_and_value_bytes_in_order(data: bytes) -> None:
    members = split_object(data)
    assert [m.key for m in members] == ["a", "b", "c", "d"]
    got = spans(data, members)
    assert got[1] == (b'"b"', b'{"x" : 1, "x": 2}')
    assert got[2] == (b'"c"', b'"h\xc3\xa9llo"')
    assert got[0][0] == b'"a"'
    assert got[0][1] in (b"[1, 2]", b"[NaN, 2]")
    assert got[3][1] in (b"null", b"-Infinity")


def test_spans_are_bytes_not_code_points_after_non_ascii_text() -> None:
    data = '{"é": "ü€😀", "n": NaN, "z": [1]}'.encode()
    members = split_object(data)
    assert spans(data, members) == [
        ('"é"'.encode(), '"ü€😀"'.encode()),
        (b'"n"', b"NaN"),
        (b'"z"', b"[1]"),
    ]


def test_only_requested_values_are_decoded() -> None:
    members = split_object(STANDARD, decode={"b", "c"})
    values = {m.key: m.value for m in members}
    assert values["b"] == {"x": 2}  # W-9: the last occurrence wins for interpretation
    assert values["c"] == "héllo"
    assert values["a"] is NOT_DECODED and values["d"] is NOT_DECODED


def test_non_standard_literals_decode_to_python_floats() -> None:
    data = b'{"lp": [NaN, Infinity, -Infinity, -0.5]}'
    (member,) = split_object(data, decode={"lp"})
    assert math.isnan(member.value[0])
    assert member.value[1:] == [math.inf, -math.inf, -0.5]
    assert data[member.value_start : member.value_end] == b"[NaN, Infinity, -Infinity, -0.5]"


@pytest.mark.parametrize(
    "data",
    [
        b'{"k": 1, "k": 2}',
        b'{"k": 1, "k": 1}',
        b'{"k": 12, "k": 1}',
        b'{"k": 1.5, "k": 1}',
        b'{"k": NaN, "k": 2}',
        b'{"k": 1, "\\u006b": 2}',
    ],
)
def test_repeated_top_level_keys_are_all_returned(data: bytes) -> None:
    members = split_object(data)
    assert [m.key for m in members] == ["k", "k"]
    first, second = (data[m.value_start : m.value_end] for m in members)
    assert first in (b"1", b"12", b"1.5", b"NaN")
    assert second in (b"1", b"2")


def test_values_beyond_64_bits_and_lone_surrogates_are_kept_verbatim() -> None:
    data = b'{"big": 1208925819614629174706176, "s": "\\ud800", "\\udc00": 1e400}'
    members = split_object(data, decode={"big", "s", "\udc00"})
    assert [m.value for m in members] == [2**80, "\ud800", math.inf]
    assert spans(data, members)[0][1] == b"1208925819614629174706176"
    assert spans(data, members)[2] == (b'"\\udc00"', b"1e400")


def test_empty_object_has_no_members() -> None:
    assert split_object(b" { } ") == []
    assert split_object(b"{}") == []


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "the body is empty"),
        (b" \n ", "the body is empty"),
        (b"[1, 2]", "expected a JSON object at the top level, found '[' at byte 0"),
        (b'  "x"', "expected a JSON object at the top level, found '\"' at byte 2"),
        (b"5", "expected a JSON object at the top level, found '5' at byte 0"),
        (b'{"a": 1} x', "extra data after the top-level object at byte 9"),
        (b'{"a": 1}{}', "extra data after the top-level object at byte 8"),
        (b'{"a": 1,}', "expected a string key, found '}' at byte 8"),
        (b'{"a" 1}', "expected ':', found '1' at byte 5"),
        (b'{"a": 1 "b": 2}', "expected ',' or '}', found '\"' at byte 8"),
        (b'{"a": ', "expected a value, found the end of the body at byte 6"),
        (b'{"a": 1', "expected ',' or '}', found the end of the body at byte 7"),
        (b'{"a": "x', "Unterminated string starting at byte 6"),
        (b'{"a": [1, 2}', "Expecting ',' delimiter at byte 11"),
        (b'{"a": nan}', "Expecting value at byte 6"),
        (b'{"a": 01}', "expected ',' or '}', found '1' at byte 7"),
        (b'{"a": "\x01"}', "Invalid control character at byte 7"),
        (b'{"a": "\xff"}', "invalid UTF-8 at byte 7"),
        (
            b'\xef\xbb\xbf{"a": 1}',
            "expected a JSON object at the top level, found U+FEFF at byte 0",
        ),
        (b"{1: 2}", "expected a string key, found '1' at byte 1"),
    ],
)
def test_malformed_text_is_reported_with_its_position(data: bytes, reason: str) -> None:
    with pytest.raises(JsonScanError) as caught:
        split_object(data)
    assert caught.value.reason == reason


@pytest.mark.usefixtures("default_digit_cap")
def test_integers_beyond_the_digit_cap_are_read_exactly() -> None:
    for data in (b'{"n": NaN, "a": 1', b'{"n": 0, "a": 1'):
        members = split_object(data + b"0" * 5000 + b"}", decode={"a"})
        assert members[1].value == 10**5000
    assert decode_value(b"[-1" + b"0" * 5000 + b"]") == [-(10**5000)]


def test_nesting_is_bounded_and_brackets_inside_strings_do_not_count() -> None:
    inner = MAX_NESTING - 1  # the top-level object is one level
    assert len(split_object(b'{"a": ' + b"[" * inner + b"]" * inner + b"}")) == 1
    deeper = b'{"a": ' + b"[" * (inner + 1) + b"]" * (inner + 1) + b"}"
    with pytest.raises(JsonScanError) as caught:
        split_object(deeper)
    assert caught.value.reason == f"nesting deeper than {MAX_NESTING} levels"
    in_string = b'{"a": "' + b"[{" * 500 + b'", "b": [[1]]}'
    assert [m.key for m in split_object(in_string)] == ["a", "b"]
    with pytest.raises(JsonScanError, match="nesting deeper"):
        split_object(b'{"a": ' + b'{"k":' * 200 + b"1" + b"}" * 200 + b"}")


def test_without_validation_the_text_is_only_split() -> None:
    data = b'{"task": "keep", "mask_sample": NaN, "mask_sample": false}'
    members = split_object(data, validate=False, decode={"task"})
    assert [m.key for m in members] == ["task", "mask_sample", "mask_sample"]
    assert all(m.value is NOT_DECODED for m in members)


def test_decode_value_accepts_what_python_clients_emit() -> None:
    assert decode_value(b"[1, 2]") == [1, 2]
    assert math.isnan(decode_value(b"NaN"))
    assert decode_value(b'"\\ud800"') == "\ud800"
    with pytest.raises(JsonScanError):
        decode_value(b"[1,")


# --- properties ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.text("abé", max_size=2), json_values()), max_size=6),
    seps=separators,
    ensure_ascii=st.booleans(),
)
def test_every_span_is_the_text_of_its_value(
    pairs: list[tuple[str, Any]], seps: tuple[str, str], ensure_ascii: bool
) -> None:
    data = object_text(pairs, seps, ensure_ascii)
    if data is None:
        return  # lone surrogates written raw are not UTF-8; nothing to split
    members = split_object(data, decode={k for k, _ in pairs})
    assert [m.key for m in members] == [k for k, _ in pairs]
    for member, (_, value) in zip(members, pairs, strict=True):
        raw = data[member.value_start : member.value_end]
        assert raw.decode() == json.dumps(value, ensure_ascii=ensure_ascii, separators=seps)
        assert json.dumps(member.value) == json.dumps(value)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64) | st.text(alphabet='{}[]":,0123456789aeflnrstu \\NI-', max_size=40))
def test_arbitrary_input_either_splits_or_raises_a_scan_error(data: bytes | str) -> None:
    raw = data.encode() if isinstance(data, str) else data
    try:
        split_object(raw, decode={"a"})
    except JsonScanError:
        pass
