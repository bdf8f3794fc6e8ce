"""Standard JSON as a judge may write it: integers of any size, no NaN or Infinity literals."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["loads_standard"]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard literal {name}")


def _any_size_int(digits: str) -> int | float:
    # Python refuses to build ints of more than 4300 digits unless the whole interpreter is told
    # otherwise; such a number is standard JSON all the same, so it is read as a float.
    try:
        return int(digits)
    except ValueError:
        return float(digits)


def loads_standard(text: str) -> Any:
    """`text` decoded as standard JSON; ValueError (or RecursionError) when it is not."""
    return json.loads(text, parse_constant=_reject_constant, parse_int=_any_size_int)
