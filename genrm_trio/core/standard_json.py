"""Standard JSON as a judge may write it: integers of any size, no NaN or Infinity literals."""

from __future__ import annotations

import json
from typing import Any

from genrm_trio.core.exact_ints import int_from_digits

__all__ = ["loads_standard"]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard literal {name}")


# One decoder for every call: ``json.loads`` with hooks builds a new one each time, which costs
# as much as decoding a verdict.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_int=int_from_digits)


def loads_standard(text: str) -> Any:
    """`text` decoded as standard JSON; ValueError (or RecursionError) when it is not."""
    return _DECODER.decode(text)
