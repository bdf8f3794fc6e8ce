"""Canonical JSON form (C-20) and the digests built on it: response fingerprints and prompt digests.

Two JSON values are the same response exactly when their canonical forms are equal (C-21, C-24).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import msgspec

from genrm_trio.core.exact_ints import int_from_digits, int_to_digits

__all__ = [
    "canonical_json",
    "digest_hex",
    "fingerprint",
    "fingerprint_decoded",
    "fingerprint_json",
]

_ENCODER = json.JSONEncoder(
    ensure_ascii=True,
    check_circular=True,
    allow_nan=True,
    sort_keys=True,
    separators=(",", ":"),
)

# json writes five control characters with short escapes; C-20 wants every code point outside
# printable ASCII as \uXXXX. Matching "\\\\" first keeps an escaped backslash followed by a
# letter from being read as a short escape.
_SHORT_ESCAPE = re.compile(r"\\\\|\\([bfnrt])")
_SURROGATE_ESCAPE = re.compile(r"\\ud[89a-f]")
_LONG_ESCAPES = {"b": "\\u0008", "f": "\\u000c", "n": "\\u000a", "r": "\\u000d", "t": "\\u0009"}

_JSON_DECODER = msgspec.json.Decoder()
_PACKER = msgspec.msgpack.Encoder(order="sorted")
_NAN_SIGNATURE = re.compile(rb"\xcb[\x7f\xff][\xf0-\xff]")

# Prefixes the packed form so that it can never be mistaken for a canonical JSON text, which is
# pure ASCII.
_PACKED_TAG = b"\xff"


def canonical_json(value: Any) -> bytes:
    """The C-20 canonical form of `value` (msgspec Structs are taken in their plain form).

    Raises ValueError with ``Circular reference`` in its message for a cyclic value.
    """
    return _canonical_plain(_plain(value))


def digest_hex(value: Any) -> str:
    """SHA-256 hex of the canonical form: the prompt digest (C-10) and D of S-51."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def fingerprint(value: Any) -> bytes:
    """32-byte response fingerprint: equal exactly when the canonical forms are equal (C-21).

    Raises ValueError with ``Circular reference`` in its message for a cyclic value.
    """
    return _fingerprint_plain(_plain(value), may_hold_nan=True)


def fingerprint_decoded(value: Any, *, may_hold_nan: bool = True) -> bytes:
    """The fingerprint of a value exactly as a JSON decoder returns it (dicts with string keys,
    lists, strings, ints, floats, booleans, None), which skips the conversion ``fingerprint``
    gives typed objects. Equals ``fingerprint(value)``.

    ``may_hold_nan=False`` promises that no float in the value is NaN (msgspec's decoder never
    returns one); it spares the search for NaN.
    """
    return _fingerprint_plain(value, may_hold_nan=may_hold_nan)


def fingerprint_json(raw: bytes | bytearray | memoryview | str) -> bytes:
    """The fingerprint of the value a client's JSON text denotes.

    The text may use NaN/Infinity/-Infinity, integers of any size, lone-surrogate escapes,
    nested duplicate keys (last wins) and any whitespace. Equals ``fingerprint(value)``.
    """
    if not isinstance(raw, str) and len(raw) >= SPLICE_MIN_TEXT_BYTES:
        data, start, end = _bytes_and_span(raw)
        spliced = _spliced_fingerprint(data, start, end)
        if spliced is not None:
            return spliced
    return _decoded_fingerprint(raw)


def _decoded_fingerprint(raw: bytes | bytearray | memoryview | str) -> bytes:
    """``fingerprint_json`` by decoding the whole text into Python values."""
    try:
        value = _JSON_DECODER.decode(raw)
    except msgspec.DecodeError:
        # msgspec rejects the non-standard literals, out-of-range floats such as 1e309 and
        # lone surrogates; Python's json module reads all of them.
        text = bytes(raw) if isinstance(raw, bytearray | memoryview) else raw
        return _fingerprint_plain(json.loads(text, parse_int=int_from_digits), may_hold_nan=True)
    # A successful msgspec decode cannot produce NaN, so the NaN check can be skipped.
    return _fingerprint_plain(value, may_hold_nan=False)


# ---- large texts: arrays of numbers packed piece by piece ---------------------------------------
#
# A rollout's response is mostly a few long arrays of numbers (token ids, log-probs). Decoding the
# whole text builds a Python object for every number at once (several MB for a 2 MB text) before
# any of it is packed. Instead, each long array of numbers is cut out of the text and replaced by
# a marker string; the rest (the skeleton, a few KB) is decoded and packed as usual, and each
# array's packed form is spliced in where its marker's packed form is. An array is packed in
# pieces of about PIECE_BYTES of text, decoded by the same decoder, so only a piece's numbers
# exist at a time (and a piece's buffers stay below serve's mmap threshold, so they are not
# fresh pages each time). msgpack writes an array as its header (from its length) followed by
# its items, each written on its own, so the bytes hashed are the same as the whole text's
# packed form, and so is the fingerprint. Whatever this path cannot show to be the same (a
# marker that does not come back as exactly one whole string, text msgspec refuses, a value
# msgpack refuses, an empty piece) sends the text to the whole decode, which decides.

# Texts from this size on are tried this way; arrays of numbers above SPLICE_MIN_ARRAY_BYTES of
# text are cut out.
SPLICE_MIN_TEXT_BYTES = 1 << 16
SPLICE_MIN_ARRAY_BYTES = 1 << 12
PIECE_BYTES = 1 << 16
# Two families of marker strings; each marker is 40 bytes: its family's prefix, its number.
_MARKS = (b"~genrm-trio:array-at-", b"~genrm-trio:array-no-")
_MARK_BYTES = 40
# msgpack's header for a 40-byte string (str8, length 0x28). The two bytes never occur inside
# UTF-8 text (0xd9 starts a two-byte sequence, 0x28 cannot continue one), so a marker that
# follows them was packed as a whole string.
_MARK_HEADER = b"\xd9\x28"
_NOT_IN_NUMBER_ARRAYS = (b'"', b"{", b"}")
# A skeleton with more brackets than this may nest deep enough for the whole decode to raise
# RecursionError (about 1,000 levels), which this path must not hide.
_SKELETON_MAX_OPENINGS = 512


def _bytes_and_span(raw: bytes | bytearray | memoryview) -> tuple[bytes, int, int]:
    """``raw`` as (bytes, start, end) without copying a view of a bytes object (the response's
    view into its request body): the view's bytes are found in it, checked whole."""
    if isinstance(raw, bytes):
        return raw, 0, len(raw)
    whole = raw.obj if isinstance(raw, memoryview) and raw.c_contiguous else None
    if isinstance(whole, bytes):
        view = memoryview(raw).cast("B")  # bytes, whatever the view's format
        prefix = view[:64]
        at = whole.find(prefix)
        for _ in range(8):
            if at < 0:
                break
            if whole.startswith(view, at):
                return whole, at, at + view.nbytes
            at = whole.find(prefix, at + 1)
    data = bytes(raw)
    return data, 0, len(data)


def _mark(prefix: bytes, index: int) -> bytes:
    return b"%s%0*d" % (prefix, _MARK_BYTES - len(prefix), index)


def _array_header(count: int) -> bytes:
    """msgpack's header for an array of ``count`` items, as msgspec writes it."""
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def _spliced_fingerprint(data: bytes, start: int, end: int) -> bytes | None:
    """The fingerprint of ``data[start:end]`` with its long arrays of numbers packed in pieces;
    None when the text has none or this path cannot vouch for the result."""
    arrays = _number_arrays(data, start, end)
    if not arrays:
        return None
    found = _marked_skeleton(data, start, end, arrays, _MARKS[0])
    if found is None or found != _marked_skeleton(data, start, end, arrays, _MARKS[1]):
        return None
    packed, places = found
    digest = hashlib.sha256(_PACKED_TAG)
    packed_view = memoryview(packed)
    pos = 0
    for at, index in places:
        digest.update(packed_view[pos:at])
        pieces = _packed_numbers(data, *arrays[index])
        if pieces is None:
            return None
        for piece in pieces:
            digest.update(piece)
        pos = at
    digest.update(packed_view[pos:])
    return digest.digest()


def _marked_skeleton(
    data: bytes, start: int, end: int, arrays: list[tuple[int, int]], prefix: bytes
) -> tuple[bytes, list[tuple[int, int]]] | None:
    """The text with each array replaced by its marker (of this family), packed with the
    markers cut out, and where each array goes in it, in order; None if a marker does not come
    back exactly once as a whole string.

    A marker swallowed by a string of the text would come back after a quote, and one whose
    member a later duplicate key replaced would not come back: the text then goes the whole
    way. A string of the text equal to a marker might stand in for a lost one; it cannot do so
    for both families at once (the caller asks for both, which must agree).
    """
    view = memoryview(data)
    parts: list[bytes | memoryview] = []
    pos = start
    for index, (opening, closing) in enumerate(arrays):
        parts += (view[pos:opening], b'"', _mark(prefix, index), b'"')
        pos = closing
    parts.append(view[pos:end])
    skeleton = b"".join(parts)
    if skeleton.count(b"[") + skeleton.count(b"{") > _SKELETON_MAX_OPENINGS:
        return None  # possibly nested deeper than the whole decode reaches: it decides
    try:
        packed = _PACKER.encode(_JSON_DECODER.decode(skeleton))
    except (msgspec.MsgspecError, UnicodeEncodeError, OverflowError, RecursionError):
        return None
    places: list[tuple[int, int]] = []
    header = len(_MARK_HEADER)
    for index in range(len(arrays)):
        mark = _mark(prefix, index)
        at = packed.find(mark)
        if (
            at < header
            or packed[at - header : at] != _MARK_HEADER
            or packed.find(mark, at + 1) >= 0
        ):
            return None
        places.append((at - header, index))
    places.sort()
    pieces: list[bytes] = []
    pos = 0
    for at, _ in places:
        pieces.append(packed[pos:at])
        pos = at + header + _MARK_BYTES
    pieces.append(packed[pos:])
    return b"".join(pieces), [
        (at - index * (header + _MARK_BYTES), array) for index, (at, array) in enumerate(places)
    ]


def _number_arrays(data: bytes, start: int, end: int) -> list[tuple[int, int]]:
    """(start, end) of long bracketed runs in ``data[start:end]`` holding no string, bracket or
    brace: in valid JSON outside a string, arrays of numbers and literals. Found with bytes
    searches that only move forward (the text is read about once per character searched for);
    a text with more brackets than are cheap to follow is left to the whole decode."""
    find = data.find
    known: dict[bytes, int] = {}

    def next_at(char: bytes, pos: int) -> int:
        """The first ``char`` at or after ``pos``, or ``end``."""
        at = known.get(char, -1)
        if at < pos:
            at = find(char, pos, end)
            if at < 0:
                at = end
            known[char] = at
        return at

    arrays: list[tuple[int, int]] = []
    steps = (end - start) // 2048 + 64
    opening = next_at(b"[", start)
    while opening < end:
        steps -= 1
        if steps < 0:
            return []
        closing = next_at(b"]", opening + 1)
        if closing == end:
            break
        following = next_at(b"[", opening + 1)
        if (
            closing - opening > SPLICE_MIN_ARRAY_BYTES
            and following > closing
            and all(next_at(char, opening + 1) > closing for char in _NOT_IN_NUMBER_ARRAYS)
        ):
            arrays.append((opening, closing + 1))
            following = next_at(b"[", closing + 1)
        opening = following
    return arrays


def _packed_numbers(data: bytes, opening: int, end: int) -> list[bytes | memoryview] | None:
    """The packed form of the array ``data[opening:end]`` (no strings or brackets inside), as
    its header and the items of each piece; None if a piece is not valid JSON or holds a value
    msgpack refuses."""
    last = end - 1  # the closing bracket
    view = memoryview(data)
    pieces: list[bytes | memoryview] = []
    count = 0
    pos = opening + 1
    while True:
        # Outside strings every comma separates two items, so a piece ends at one.
        cut = data.find(b",", pos + PIECE_BYTES, last)
        if cut < 0:
            cut = last
        try:
            items = _JSON_DECODER.decode(b"".join((b"[", view[pos:cut], b"]")))
            packed = _PACKER.encode(items)
        except (msgspec.MsgspecError, OverflowError):
            return None
        if not items:
            # Only an empty array has an empty piece; anywhere else it is a stray comma.
            return [_array_header(0)] if not pieces and cut == last else None
        count += len(items)
        pieces.append(memoryview(packed)[len(_array_header(len(items))) :])
        if cut == last:
            return [_array_header(count), *pieces]
        pos = cut + 1


# Why the fast path is sound (C-24 only asks for the same classes, not the same bytes):
# msgpack with sorted keys writes every plain JSON value injectively by type and content:
# None, booleans, ints and floats are distinct types, floats are their exact 64-bit pattern
# (so 1 vs 1.0 and 0.0 vs -0.0 stay apart, as in C-20's shortest round-trip form, and +inf and
# -inf each have a single pattern), strings are their UTF-8 bytes (a bijection for strings
# without lone surrogates), and keys are unique and sorted. Two such values therefore pack to
# equal bytes exactly when their canonical forms are equal. The exceptions are handled by the
# canonical path, chosen by properties of the value's class alone so equal values always take
# the same path: NaN (many bit patterns, one canonical spelling), integers outside msgpack's
# 64-bit range and lone surrogates (msgpack refuses both).
def _fingerprint_plain(plain: Any, *, may_hold_nan: bool) -> bytes:
    try:
        packed = _PACKER.encode(plain)
    except UnicodeEncodeError:
        # Surrogate code points: paired ones mean the same string as the code point they pair
        # up to, lone ones stay and send the value to the canonical path.
        plain = _paired_surrogates_joined(plain)
        try:
            packed = _PACKER.encode(plain)
        except (OverflowError, UnicodeEncodeError):
            return hashlib.sha256(_canonical_plain(plain)).digest()
    except OverflowError:
        return hashlib.sha256(_canonical_plain(plain)).digest()
    if may_hold_nan and _may_pack_nan(packed) and _holds_nan(plain):
        return hashlib.sha256(_canonical_plain(plain)).digest()
    digest = hashlib.sha256(_PACKED_TAG)
    digest.update(packed)  # no copy of the packed form to put the tag in front
    return digest.digest()


def _may_pack_nan(packed: bytes) -> bool:
    """False only if no float64 in `packed` can be a NaN (a float64 is 0xcb + 8 bytes)."""
    # A NaN has every exponent bit set: after the cb marker come 7f or ff, then f0..ff. The
    # pattern cannot occur in UTF-8 text, so only number payloads give (rare) false alarms,
    # which the exact check then clears.
    return _NAN_SIGNATURE.search(packed) is not None


def _holds_nan(plain: Any) -> bool:
    pending = [plain]
    while pending:
        item = pending.pop()
        if isinstance(item, float):
            if item != item:
                return True
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            try:
                total = sum(item, 0.0)
            except (TypeError, OverflowError):
                pending.extend(item)
                continue
            # Any NaN makes the sum NaN; a NaN sum without one comes from inf - inf.
            if total != total:
                pending.extend(item)
    return False


def _canonical_plain(plain: Any) -> bytes:
    text = _encoded(plain)
    if _SURROGATE_ESCAPE.search(text):
        # Python strings may hold a surrogate pair as two code points; C-20 spells it like the
        # code point it encodes, and two keys may turn out to be one (the last wins).
        text = _encoded(_paired_surrogates_joined(plain))
    if "\\" in text:
        text = _SHORT_ESCAPE.sub(_long_escape, text)
    return text.encode("ascii")


def _encoded(plain: Any) -> str:
    """``_ENCODER``'s text for ``plain``, integers beyond Python's digit cap included."""
    try:
        return _ENCODER.encode(plain)
    except ValueError as exc:
        if "integer string conversion" not in str(exc):
            raise
        return "".join(_encoded_parts(plain, []))


def _encoded_parts(node: Any, parts: list[str]) -> list[str]:
    """What ``_ENCODER`` writes for ``node``, for values holding an integer beyond Python's
    digit cap, which the encoder refuses; everything else is still written by the encoder."""
    if isinstance(node, int) and not isinstance(node, bool):
        parts.append(int_to_digits(node))
    elif isinstance(node, dict):
        parts.append("{")
        for index, key in enumerate(sorted(node)):
            if index:
                parts.append(",")
            parts.append(_ENCODER.encode(key))
            parts.append(":")
            _encoded_parts(node[key], parts)
        parts.append("}")
    elif isinstance(node, list | tuple):
        parts.append("[")
        for index, item in enumerate(node):
            if index:
                parts.append(",")
            _encoded_parts(item, parts)
        parts.append("]")
    else:
        parts.append(_ENCODER.encode(node))
    return parts


def _paired_surrogates_joined(plain: Any) -> Any:
    """`plain` with every string rewritten so that surrogate pairs are single code points."""
    try:
        return _join_surrogates(plain)
    except RecursionError:
        raise ValueError("value is nested too deeply for a canonical form") from None


def _join_surrogates(node: Any) -> Any:
    if isinstance(node, str):
        return node.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "surrogatepass")
    if isinstance(node, dict):
        return {_join_surrogates(key): _join_surrogates(value) for key, value in node.items()}
    if isinstance(node, list | tuple):
        return [_join_surrogates(item) for item in node]
    return node


def _long_escape(match: re.Match[str]) -> str:
    letter = match.group(1)
    return match.group(0) if letter is None else _LONG_ESCAPES[letter]


def _plain(value: Any) -> Any:
    """`value` as plain JSON builtins; typed objects become their plain form."""
    try:
        return msgspec.to_builtins(value, str_keys=True, order="deterministic")
    except RecursionError:
        if _has_cycle(value):
            raise ValueError("Circular reference detected") from None
        raise ValueError("value is nested too deeply for a canonical form") from None


def _children(node: Any) -> list[Any] | None:
    if isinstance(node, dict):
        return list(node.values())
    if isinstance(node, list | tuple | set | frozenset):
        return list(node)
    if isinstance(node, msgspec.Struct):
        return list(msgspec.structs.astuple(node))
    return None


def _has_cycle(root: Any) -> bool:
    on_path: set[int] = set()
    finished: set[int] = set()
    pending: list[tuple[Any, bool]] = [(root, False)]
    while pending:
        node, leaving = pending.pop()
        if leaving:
            on_path.discard(id(node))
            finished.add(id(node))
            continue
        children = _children(node)
        if children is None or id(node) in finished:
            continue
        if id(node) in on_path:
            return True
        on_path.add(id(node))
        pending.append((node, True))
        pending.extend((child, False) for child in children)
    return False
