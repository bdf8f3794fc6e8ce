"""Marks the engine's critical sections so an instrument can prove they never checkpoint.

A critical section is synchronous bookkeeping; a Trio task step must never end inside one (I-1).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0


def inside_critical_section() -> bool:
    return _depth > 0


@contextmanager
def critical_section() -> Iterator[None]:
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
