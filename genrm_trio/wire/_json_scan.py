"""Splits a JSON object into its members, keeping each key's and value's exact byte span, with
the scanning done in C (msgspec, bytes searches; Python's json for NaN or lone surrogates)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from genrm_trio.core.exact_ints import int_from_digits

# A bound well below the interpreter's recursion limit, so that every accepted value can still
# be decoded and canonicalised by recursive code running deep inside a server's stack.
MAX_NESTING: Final = 128

NOT_DECODED: Final[Any] = object()

# From this size on, a body is split by following its brackets and strings with bytes searches
# and each value is validated by msgspec on its own span, so that the values asked for are read
# only once. Smaller bodies take one msgspec pass over the whole text, which is cheaper there.
SCAN_MIN_BYTES: Final = 1 << 16
# The bracket scan gives up (and the whole-text pass runs instead) after about one step per this
# many bytes. A step (one bracket or string) costs about what msgspec spends on 600 bytes, so a
# scan that runs out of steps adds at most about a third to the pass that follows it; a typical
# rollout needs under a hundred steps.
_BYTES_PER_STEP: Final = 2048

_WHITESPACE = re.compile(rb"[ \t\n\r]*+")
_TEXT_WHITESPACE = re.compile(r"[ \t\n\r]*+")
# A string token; possessive loops keep the match linear on any input.
_STRING = re.compile(rb'"[^"\\]*+(?:\\[\s\S][^"\\]*+)*+"')
_NOT_BRACKET: Final = bytes(range(256)).translate(None, b"[]{}")
_ONE_BRACKET_KIND: Final = bytes.maketrans(b"{}", b"[]")
_RAW_MEMBERS: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_VALUE: Final = msgspec.json.Decoder(msgspec.Raw)
_ANY_VALUE: Final = msgspec.json.Decoder()
_KEY: Final = msgspec.json.Decoder(str)
# A top-level number or literal runs up to whitespace, a comma or the closing brace; msgspec then
# says whether it is one.
_SCALAR = re.compile(rb"[^ \t\n\r,}]*+")
_TEXT_DECODER: Final = json.JSONDecoder(parse_int=int_from_digits)


class JsonScanError(ValueError):
    """The text is not one JSON object; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Member:
    """One member of an object: its decoded key, the byte spans of key and value as sent, and
    the decoded value when it was asked for (``NOT_DECODED`` otherwise).

    ``standard`` says the value was read as standard JSON, so no float in it is NaN or infinite;
    it is False where a decoded value may hold the non-standard literals.
    """

    key: str
    key_start: int
    key_end: int
    value_start: int
    value_end: int
    value: Any
    standard: bool = True


def split_object(
    data: bytes,
    *,
    decode: Container[str] = (),
    decode_as: Mapping[str, msgspec.json.Decoder[Any]] | None = None,
    validate: bool = True,
) -> list[Member]:
    """The members of the JSON object ``data`` in order, duplicate keys included.

    With ``validate`` the whole text must be one JSON object in UTF-8, nested at most
    ``MAX_NESTING`` deep, or ``JsonScanError`` is raised; NaN, Infinity and -Infinity are
    accepted inside values, and values whose key is in ``decode`` are decoded. Without
    ``validate`` the text is trusted and only split.

    ``decode_as`` names keys (among ``decode``) whose value is read with the given typed decoder
    instead, in the same pass that validates it, so that a large value can be checked without
    building what the type skips. A value that does not fit the type is decoded in full, for
    the caller to report; values read by Python's decoder (non-standard literals) are full too.
    """
    typed = decode_as or {}
    text = None
    if validate and not data.isascii():
        # ASCII text is UTF-8 as it is; only other text is decoded to check it (a copy as
        # large as the body, kept for the lenient splitter).
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonScanError(f"invalid UTF-8 at byte {exc.start}") from None
    if validate:
        if len(data) >= SCAN_MIN_BYTES:
            scanned = _split_scanned(data, decode, typed)
            if scanned is not None:
                return scanned
        _check_nesting(data)
    members = _split_standard(data)
    if members is None:
        if text is None:
            text = data.decode("utf-8")
        return _split_lenient(data, text, decode if validate else ())
    if not validate:
        return members
    return [_decode_member(data, m, typed.get(m.key)) if m.key in decode else m for m in members]


def decode_value(raw: bytes | memoryview) -> Any:
    """One JSON value, NaN, Infinity and -Infinity accepted; ``JsonScanError`` if invalid."""
    return _decode(raw)[0]


def _decode(
    raw: bytes | memoryview, typed: msgspec.json.Decoder[Any] | None = None
) -> tuple[Any, bool]:
    """The value and whether it was read as standard JSON (see ``Member.standard``)."""
    try:
        return _typed_or_any(raw, typed), True
    except (msgspec.MsgspecError, RecursionError):
        pass
    # Python's decoder accepts the non-standard literals, lone surrogate escapes and
    # out-of-range floats that msgspec refuses; it is slower, so it only runs when needed.
    try:
        return json.loads(str(raw, "utf-8"), parse_int=int_from_digits), False
    except RecursionError:
        raise JsonScanError("nesting too deep") from None
    except json.JSONDecodeError as exc:
        raise JsonScanError(f"{exc.msg.removesuffix(' at')} at character {exc.pos}") from None
    except ValueError as exc:  # invalid UTF-8
        raise JsonScanError(str(exc).split(";")[0]) from None


def _typed_or_any(raw: bytes | memoryview, typed: msgspec.json.Decoder[Any] | None) -> Any:
    """``raw`` read with ``typed``, or in full when there is no type or the value does not fit
    it; a syntax error raises."""
    if typed is not None:
        try:
            return typed.decode(raw)
        except msgspec.ValidationError:
            pass
    return _ANY_VALUE.decode(raw)


def _split_scanned(
    data: bytes, decode: Container[str], typed: Mapping[str, msgspec.json.Decoder[Any]]
) -> list[Member] | None:
    """The members of a standard-JSON object, found by following its strings and brackets with
    bytes searches; each value is then decoded (if asked for) or validated by msgspec on its own
    span, so the text is read by a parser only once. None when the text is not plain standard
    JSON within the nesting bound, or has more brackets than the scan follows cheaply: the other
    splitters then decide, and report any error."""
    view = memoryview(data)
    steps = len(data) // _BYTES_PER_STEP + 64
    members: list[Member] = []
    pos = _skip(data, 0)
    if data[pos : pos + 1] != b"{":
        return None
    pos = _skip(data, pos + 1)
    if data[pos : pos + 1] == b"}":
        return members if _skip(data, pos + 1) == len(data) else None
    while True:
        key_match = _STRING.match(data, pos)
        if key_match is None:
            return None
        colon = _skip(data, key_match.end())
        if data[colon : colon + 1] != b":":
            return None
        value_start = _skip(data, colon + 1)
        first = data[value_start : value_start + 1]
        if first == b'"':
            string = _STRING.match(data, value_start)
            value_end = -1 if string is None else string.end()
        elif first == b"[" or first == b"{":
            value_end, steps = _container_end(data, value_start, steps)
        else:
            scalar = _SCALAR.match(data, value_start)
            assert scalar is not None  # the pattern matches the empty string
            value_end = scalar.end() if scalar.end() > value_start else -1
        if value_end < 0:
            return None
        try:
            key = _KEY.decode(key_match.group())
            span = view[value_start:value_end]
            if key in decode:
                value = _typed_or_any(span, typed.get(key))
            else:
                _RAW_VALUE.decode(span)
                value = NOT_DECODED
        except (msgspec.MsgspecError, RecursionError):
            return None
        members.append(Member(key, pos, key_match.end(), value_start, value_end, value))
        pos = _skip(data, value_end)
        after = data[pos : pos + 1]
        if after == b",":
            pos = _skip(data, pos + 1)
        elif after == b"}":
            return members if _skip(data, pos + 1) == len(data) else None
        else:
            return None


def _container_end(data: bytes, start: int, steps: int) -> tuple[int, int]:
    """(end, steps left) for the array or object that opens at ``start``: ``end`` is the index
    after its closing bracket, or -1 when the text ends first, the nesting goes deeper than
    MAX_NESTING (the enclosing object counts as one level) or the steps run out.

    Brackets are counted outside strings. The answer is exact for valid JSON; for any other
    text the caller's msgspec pass over the span rejects it.
    """
    find = data.find
    size = len(data)

    def after(char: bytes, pos: int) -> int:
        found = find(char, pos)
        return size if found < 0 else found

    # The next occurrence of each character that matters, each search moving only forward.
    quote = after(b'"', start)
    square = after(b"[", start)
    curly = after(b"{", start)
    square_close = after(b"]", start)
    curly_close = after(b"}", start)
    depth = 0
    while steps > 0:
        steps -= 1
        pos = min(quote, square, curly, square_close, curly_close)
        if pos == size:
            return -1, steps
        if pos == quote:
            end = _string_end(data, pos)
            if end < 0:
                return -1, steps
            quote = after(b'"', end)
            if square < end:
                square = after(b"[", end)
            if curly < end:
                curly = after(b"{", end)
            if square_close < end:
                square_close = after(b"]", end)
            if curly_close < end:
                curly_close = after(b"}", end)
        elif pos == square or pos == curly:
            depth += 1
            if depth >= MAX_NESTING:
                return -1, steps
            if pos == square:
                square = after(b"[", pos + 1)
            else:
                curly = after(b"{", pos + 1)
        else:
            depth -= 1
            if depth == 0:
                return pos + 1, steps
            if pos == square_close:
                square_close = after(b"]", pos + 1)
            else:
                curly_close = after(b"}", pos + 1)
    return -1, steps


def _string_end(data: bytes, start: int) -> int:
    """The index after the quote that closes the string opening at ``start``, or -1."""
    close = data.find(b'"', start + 1)
    if close < 0:
        return -1
    if data[close - 1] != 0x5C:  # no backslash before it: the common case, found by memchr
        return close + 1
    # An escaped quote, or an escaped backslash before the closing one: let the regex decide.
    string = _STRING.match(data, start)
    return -1 if string is None else string.end()


def _split_standard(data: bytes) -> list[Member] | None:
    """The members of a standard-JSON object, or None when msgspec cannot take the text
    (non-standard literals, lone surrogates, syntax errors) or when a key repeats with a
    different value; the lenient splitter then decides."""
    try:
        raw_values = _RAW_MEMBERS.decode(data)
    except (msgspec.MsgspecError, RecursionError):
        return None
    # msgspec has validated the text; what is left is to find where each member sits. A value
    # that is not at its key's position belongs to a later duplicate of that key.
    members: list[Member] = []
    pos = _skip(data, _skip(data, 0) + 1)
    if data[pos : pos + 1] == b"}":
        return members
    while True:
        key_match = _STRING.match(data, pos)
        if key_match is None:
            return None
        key: str = _KEY.decode(key_match.group())
        colon = _skip(data, key_match.end())
        value_start = _skip(data, colon + 1)
        raw = raw_values.get(key)
        if raw is None or not data.startswith(raw, value_start):
            return None
        value_end = value_start + len(raw)
        members.append(Member(key, pos, key_match.end(), value_start, value_end, NOT_DECODED))
        pos = _skip(data, value_end)
        after = data[pos : pos + 1]
        if after == b",":
            pos = _skip(data, pos + 1)
        elif after == b"}":
            return members
        else:
            return None  # a later duplicate's number is a prefix of this one, as 1 of 12


def _split_lenient(data: bytes, text: str, decode: Container[str]) -> list[Member]:
    """Split with Python's decoder, which knows NaN and Infinity and reports syntax errors."""
    # The decoder works on code points; spans are converted to bytes as the scan moves forward.
    ascii_only = len(text) == len(data)
    char_seen = 0
    byte_seen = 0

    def to_byte(char_pos: int) -> int:
        nonlocal char_seen, byte_seen
        if ascii_only:
            return char_pos
        byte_seen += len(text[char_seen:char_pos].encode("utf-8"))
        char_seen = char_pos
        return byte_seen

    def fail(problem: str, char_pos: int) -> JsonScanError:
        offset = char_pos if ascii_only else len(text[:char_pos].encode("utf-8"))
        return JsonScanError(f"{problem} at byte {offset}")

    def parse(char_pos: int) -> tuple[Any, int]:
        try:
            return _TEXT_DECODER.raw_decode(text, char_pos)
        except json.JSONDecodeError as exc:
            raise fail(exc.msg.removesuffix(" at"), exc.pos) from None
        except RecursionError:
            raise JsonScanError("nesting too deep") from None
        except ValueError as exc:  # an integer beyond Python's digit limit
            raise fail(str(exc).split(";")[0], char_pos) from None

    end = len(text)
    pos = _skip_text(text, 0)
    if pos == end:
        raise JsonScanError("the body is empty")
    if text[pos] != "{":
        raise fail(f"expected a JSON object at the top level, found {_found(text, pos)}", pos)
    members: list[Member] = []
    pos = _skip_text(text, pos + 1)
    if text.startswith("}", pos):
        return _finish(text, pos + 1, members, fail)
    while True:
        key_start = pos
        if not text.startswith('"', pos):
            raise fail(f"expected a string key, found {_found(text, pos)}", pos)
        key, key_end = parse(pos)
        pos = _skip_text(text, key_end)
        if not text.startswith(":", pos):
            raise fail(f"expected ':', found {_found(text, pos)}", pos)
        value_start = _skip_text(text, pos + 1)
        if value_start == end:
            raise fail("expected a value, found the end of the body", value_start)
        value, value_end = parse(value_start)
        members.append(
            Member(
                key,
                to_byte(key_start),
                to_byte(key_end),
                to_byte(value_start),
                to_byte(value_end),
                value if key in decode else NOT_DECODED,
                standard=False,
            )
        )
        pos = _skip_text(text, value_end)
        if text.startswith(",", pos):
            pos = _skip_text(text, pos + 1)
            continue
        if text.startswith("}", pos):
            return _finish(text, pos + 1, members, fail)
        raise fail(f"expected ',' or '}}', found {_found(text, pos)}", pos)


def _finish(
    text: str, pos: int, members: list[Member], fail: Callable[[str, int], JsonScanError]
) -> list[Member]:
    pos = _skip_text(text, pos)
    if pos != len(text):
        raise fail("extra data after the top-level object", pos)
    return members


def _decode_member(
    data: bytes, member: Member, typed: msgspec.json.Decoder[Any] | None = None
) -> Member:
    try:
        value, standard = _decode(memoryview(data)[member.value_start : member.value_end], typed)
    except JsonScanError as exc:
        raise JsonScanError(f"{exc.reason} in the value of '{member.key}'") from None
    return Member(
        member.key,
        member.key_start,
        member.key_end,
        member.value_start,
        member.value_end,
        value,
        standard,
    )


def _check_nesting(data: bytes) -> None:
    # Depth is the number of rounds of removing innermost bracket pairs (strings left out)
    # that empties the brackets; all of this runs in C. Few brackets cannot nest too deep.
    if _opening_brackets_at_most(data, MAX_NESTING):
        return
    brackets = _STRING.sub(b"", data).translate(_ONE_BRACKET_KIND, _NOT_BRACKET)
    for _ in range(MAX_NESTING):
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            return  # empty, or unbalanced: the parser reports the latter
        brackets = shorter
    if brackets.replace(b"[]", b"") != brackets:
        raise JsonScanError(f"nesting deeper than {MAX_NESTING} levels")


def _opening_brackets_at_most(data: bytes, limit: int) -> bool:
    # Searches that stop at the limit: bytes.count would read a large body once per bracket.
    found = 0
    for bracket in (b"[", b"{"):
        pos = data.find(bracket)
        while pos >= 0:
            found += 1
            if found > limit:
                return False
            pos = data.find(bracket, pos + 1)
    return True


def _skip(data: bytes, pos: int) -> int:
    match = _WHITESPACE.match(data, pos)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _skip_text(text: str, pos: int) -> int:
    match = _TEXT_WHITESPACE.match(text, pos)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _found(text: str, pos: int) -> str:
    if pos >= len(text):
        return "the end of the body"
    char = text[pos]
    return f"'{char}'" if char.isprintable() and not char.isspace() else f"U+{ord(char):04X}"
