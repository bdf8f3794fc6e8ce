"""Rows as /verify sends them for a body in memory: the parts the server renders, joined."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from genrm_trio.wire.bodies import VerifyRequest
from genrm_trio.wire.rendering import masked_row_parts, scored_row_parts


def scored_row(request: VerifyRequest, reward: float, metrics: Mapping[str, float] | None) -> bytes:
    return b"".join(cast(list[bytes | memoryview], scored_row_parts(request, reward, metrics)))


def masked_row(request: VerifyRequest, failure_text: str, placeholder: float = 0.0) -> bytes:
    parts = masked_row_parts(request, failure_text, placeholder)
    return b"".join(cast(list[bytes | memoryview], parts))


def response_bytes(request: VerifyRequest) -> bytes:
    """The response value's bytes as sent."""
    return bytes(request.response_view())
