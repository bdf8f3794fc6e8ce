"""Integers of any size to and from decimal text, exactly, whatever the interpreter's cap.

Python refuses decimal conversions of more than 4,300 digits by default (a guard against
quadratic conversions of untrusted text). JSON has no such bound, and bodies here are already
bounded by ``max_body_bytes``, so numbers beyond the cap are converted here in halves, each
half under it, instead of lifting the cap for the whole interpreter.
"""

from __future__ import annotations

from typing import Final

__all__ = ["int_from_digits", "int_to_digits"]

# Well under the default cap of 4,300 digits (and under any cap of at least 640, the smallest
# Python accepts), so every single conversion below is allowed.
_PIECE: Final = 600


def int_from_digits(text: str) -> int:
    """The integer the JSON number text (an optional minus, then digits) spells."""
    if len(text) <= _PIECE:
        return int(text)
    if text.startswith("-"):
        return -_from_digits(text[1:])
    return _from_digits(text)


def _from_digits(digits: str) -> int:
    if len(digits) <= _PIECE:
        return int(digits)
    # Halving keeps the multiplications balanced, so the cost grows like Karatsuba's rather
    # than quadratically in the number of pieces.
    low = len(digits) // 2
    return _from_digits(digits[:-low]) * 10**low + _from_digits(digits[-low:])


def int_to_digits(value: int) -> str:
    """``str(value)`` for an integer of any size."""
    if -(10**_PIECE) < value < 10**_PIECE:
        return str(value)
    if value < 0:
        return "-" + _to_digits(-value, _width(-value))
    return _to_digits(value, _width(value))


def _width(value: int) -> int:
    """A number of digits at least that of ``value`` (from its bit length)."""
    return value.bit_length() * 30103 // 100000 + 1


def _to_digits(value: int, width: int) -> str:
    """``value`` (non-negative) in decimal, without leading zeros."""
    if width <= _PIECE:
        return str(value)
    low = width // 2
    high, rest = divmod(value, 10**low)
    if high == 0:
        return _to_digits(rest, low)
    return _to_digits(high, width - low) + _to_digits(rest, low).zfill(low)
