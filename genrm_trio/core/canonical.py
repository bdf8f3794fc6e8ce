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
    try:
        value = _JSON_DECODER.decode(raw)
    except msgspec.DecodeError:
        # msgspec rejects the non-standard literals, out-of-range floats such as 1e309 and
        # lone surrogates; Python's json module reads all of them.
        text = bytes(raw) if isinstance(raw, bytearray | memoryview) else raw
        return _fingerprint_plain(json.loads(text, parse_int=int_from_digits), may_hold_nan=True)
    # A successful msgspec decode cannot produce NaN, so the NaN check can be skipped.
    return _fingerprint_plain(value, may_hold_nan=False)


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
    try:
        text = _ENCODER.encode(plain)
    except ValueError as exc:
        if "integer string conversion" not in str(exc):
            raise
        text = "".join(_encoded_parts(plain, []))
    if _SURROGATE_ESCAPE.search(text):
        # Python strings may hold a surrogate pair as two code points; C-20 spells it like the
        # code point it encodes, and two keys may turn out to be one (the last wins).
        text = _ENCODER.encode(_paired_surrogates_joined(plain))
    if "\\" in text:
        text = _SHORT_ESCAPE.sub(_long_escape, text)
    return text.encode("ascii")


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
