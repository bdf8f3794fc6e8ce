"""Hypothesis strategies for JSON values, and object texts built from them with chosen
separators, for the property tests of the body splitter."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**90), max_value=2**90)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)
separators = st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")])


def json_values(scalars: st.SearchStrategy[Any] = json_scalars) -> st.SearchStrategy[Any]:
    """Nested lists and objects of ``scalars``."""
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=4), children, max_size=4)
        ),
        max_leaves=12,
    )


def object_text(
    pairs: list[tuple[str, Any]], seps: tuple[str, str], ensure_ascii: bool
) -> bytes | None:
    """The object with these members in this order, as Python's json writes it with ``seps``;
    None when it holds lone surrogates written raw, which are not UTF-8."""
    item_sep, key_sep = seps
    text = (
        "{"
        + item_sep.join(
            json.dumps(k, ensure_ascii=ensure_ascii)
            + key_sep
            + json.dumps(v, ensure_ascii=ensure_ascii, separators=seps)
            for k, v in pairs
        )
        + "}"
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return None
