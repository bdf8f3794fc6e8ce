"""Large bodies are split by following brackets and strings and validating each value on its own
span; the result (members, spans, values or the exact 400 reason) is the same as for the
whole-text pass that smaller bodies take (W-4, W-8, W-9, W-21)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_texts import json_scalars, json_values, object_text, separators

from genrm_trio.wire import _json_scan as json_scan
from genrm_trio.wire._json_scan import (
    MAX_NESTING,
    NOT_DECODED,
    SCAN_MIN_BYTES,
    JsonScanError,
    split_object,
)

Outcome = tuple[str, Any]


@contextmanager
def scan_from(size: int) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json_scan, "SCAN_MIN_BYTES", size)
        yield


def outcome(split: Callable[[], list[json_scan.Member]]) -> Outcome:
    """What a caller sees: every member with its spans and value, or the error reason."""
    try:
        members = split()
    except JsonScanError as exc:
        return "error", exc.reason
    for m in members:
        # The flag may be False for a standard value, never True for a non-finite one.
        assert not (m.standard and m.value is not NOT_DECODED and non_finite(m.value))
    return "members", [
        (
            m.key,
            m.key_start,
            m.key_end,
            m.value_start,
            m.value_end,
            "not decoded" if m.value is NOT_DECODED else json.dumps(m.value),
        )
        for m in members
    ]


def non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(non_finite(item) for item in value.values())
    if isinstance(value, list):
        return any(non_finite(item) for item in value)
    return False


def both_ways(data: bytes, decode: Container[str]) -> tuple[Outcome, Outcome]:
    with scan_from(0):
        scanned = outcome(lambda: split_object(data, decode=decode))
    with scan_from(1 << 62):
        whole = outcome(lambda: split_object(data, decode=decode))
    return scanned, whole


def padding(size: int) -> str:
    """A JSON array of integers at least ``size`` bytes long."""
    return json.dumps(list(range(10**6, 10**6 + size // 9 + 1)))


def test_a_large_body_splits_into_exact_spans_and_decodes_only_what_is_asked() -> None:
    tokens = padding(SCAN_MIN_BYTES)
    text = (
        '{ "response" : {"output": [{"type": "message", "text": "a \\"[quoted]\\" {x}"}],\n'
        f'  "generation_token_ids": {tokens}}},\n'
        '"n": -1.5e3 , "s": "\\\\", "t": true, "z": null}'
    )
    data = text.encode()
    assert len(data) >= SCAN_MIN_BYTES
    members = split_object(data, decode={"response", "s"})
    assert [m.key for m in members] == ["response", "n", "s", "t", "z"]
    spans = [data[m.value_start : m.value_end] for m in members]
    assert spans[1:] == [b"-1.5e3", b'"\\\\"', b"true", b"null"]
    assert json.loads(spans[0]) == members[0].value
    assert members[0].value["output"][0]["text"] == 'a "[quoted]" {x}'
    assert members[0].standard
    assert members[2].value == "\\"
    assert members[1].value is NOT_DECODED


def test_non_standard_literals_in_a_large_body_are_read_leniently() -> None:
    data = ('{"lp": [NaN, -Infinity, 0.5], "pad": ' + padding(SCAN_MIN_BYTES) + "}").encode()
    (lp, _) = split_object(data, decode={"lp"})
    assert math.isnan(lp.value[0]) and lp.value[1:] == [-math.inf, 0.5]
    assert not lp.standard


def test_many_small_arrays_fall_back_to_the_whole_text_pass() -> None:
    # 20,000 brackets are more than the scan follows cheaply; the result is the same.
    experts = json.dumps([[i % 64, (i + 1) % 64] for i in range(10_000)])
    data = ('{"routed_experts": ' + experts + ', "id": "r"}').encode()
    scanned, whole = both_ways(data, {"routed_experts"})
    assert scanned == whole
    assert scanned[0] == "members"


@pytest.mark.parametrize(
    ("inner", "ok"), [(MAX_NESTING - 1, True), (MAX_NESTING, False)], ids=["128", "129"]
)
def test_nesting_bound_is_the_same_for_large_bodies(inner: int, ok: bool) -> None:
    data = (
        '{"pad": ' + padding(SCAN_MIN_BYTES) + ', "a": ' + "[" * inner + "]" * inner + "}"
    ).encode()
    if ok:
        assert [m.key for m in split_object(data)] == ["pad", "a"]
    else:
        with pytest.raises(JsonScanError) as caught:
            split_object(data)
        assert caught.value.reason == f"nesting deeper than {MAX_NESTING} levels"


@pytest.mark.parametrize(
    "tail",
    [
        '"a": [1, 2}',
        '"a": [1, 2',
        '"a": "x',
        '"a": "x\\"',
        '"a": 1 "b": 2}',
        '"a": 01}',
        '"a": [1,]}',
        '"a": {"k" 1}}',
        '"a": 1}{}',
        '"a": 1} x',
        '"a": NaN, "a": 2}',
        '"a": [NaN, 1e400, "\\ud800"]}',
        '"a": "\\x"}',
        '"a": tru}',
        '"a": ]',
        '"a": }',
    ],
)
def test_large_invalid_or_lenient_bodies_give_the_same_outcome(tail: str) -> None:
    data = ('{"pad": ' + padding(SCAN_MIN_BYTES) + ", " + tail).encode()
    scanned, whole = both_ways(data, {"a"})
    assert scanned == whole


# Strings full of the characters the bracket scan follows.
tricky_values = json_values(
    json_scalars | st.sampled_from(['"', "\\", '\\"', "[", "]", "{", "}", '"]}', "\\\\"])
)


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(st.sampled_from(["a", "b", "é", "response"]), tricky_values), max_size=6
    ),
    seps=separators,
    ensure_ascii=st.booleans(),
)
def test_scanned_and_whole_text_splits_agree_on_any_object(
    pairs: list[tuple[str, Any]], seps: tuple[str, str], ensure_ascii: bool
) -> None:
    data = object_text(pairs, seps, ensure_ascii)
    if data is None:
        return
    scanned, whole = both_ways(data, {"a", "response"})
    assert scanned == whole


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet='{}[]":,0123456789aeflnrstu \\NI-', max_size=40))
def test_scanned_and_whole_text_splits_agree_on_arbitrary_text(text: str) -> None:
    scanned, whole = both_ways(text.encode(), {"a"})
    assert scanned == whole


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (b'"a": "\xc3\xa9 \xe2\x82\xac"}', ("members", "\u00e9 \u20ac")),
        (b'"a": "\xff"}', ("error", "invalid UTF-8 at byte {at}")),
        (b'"a": "\xc3"}', ("error", "invalid UTF-8 at byte {at}")),
        (b'"a": "\xed\xa0\x80"}', ("error", "invalid UTF-8 at byte {at}")),
        (b'"a": "x"}\xff', ("error", "invalid UTF-8 at byte {end}")),
    ],
)
@pytest.mark.parametrize("pad", [0, SCAN_MIN_BYTES])
def test_text_is_checked_as_utf8_whether_ascii_or_not(
    tail: bytes, expected: tuple[str, str], pad: int
) -> None:
    head = ('{"pad": ' + padding(pad) + ", ").encode()
    data = head + tail
    scanned, whole = both_ways(data, {"a"})
    assert scanned == whole
    kind, detail = expected
    if kind == "error":
        position = len(head) + 6 if "{at}" in detail else len(data) - 1
        assert scanned == ("error", detail.format(at=position, end=position))
    else:
        assert scanned[0] == "members"
        assert json.loads(scanned[1][-1][-1]) == detail
