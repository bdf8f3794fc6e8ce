"""Integers of any length to and from decimal text under Python's default digit cap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from genrm_trio.core.exact_ints import int_from_digits, int_to_digits

pytestmark = pytest.mark.usefixtures("default_digit_cap")


@given(
    digits=st.text("0123456789", min_size=1, max_size=12000).map(lambda t: t.lstrip("0") or "0"),
    negative=st.booleans(),
)
def test_digits_round_trip_exactly_at_any_length(digits: str, negative: bool) -> None:
    text = "-" + digits if negative and digits != "0" else digits
    value = int_from_digits(text)
    assert int_to_digits(value) == text
    assert (value < 0) == (text.startswith("-"))


@pytest.mark.parametrize("power", [599, 600, 601, 4300, 4301, 9000])
def test_values_at_the_piece_boundaries_are_exact(power: int) -> None:
    spelled = {
        10**power - 1: "9" * power,
        10**power: "1" + "0" * power,
        10**power + 1: "1" + "0" * (power - 1) + "1",
        -(10**power): "-1" + "0" * power,
    }
    for value, text in spelled.items():
        assert int_to_digits(value) == text
        assert int_from_digits(text) == value
