"""Shared pytest configuration: every async test runs under Trio (trio_mode in pyproject).

The Redis fixtures (a real server per test or per module) are available to every test.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

pytest_plugins = ["genrm_trio.testing.redis_fixtures"]


@pytest.fixture
def default_digit_cap() -> Iterator[None]:
    """Python's own 4,300-digit cap on decimal conversions, whatever ran before."""
    earlier = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(4300)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(earlier)
