"""Fault-injection points for tests (I-20): conversion, comparison and evaluation start.

A hook that raises simulates a non-judge error at that point; comparison and evaluation hooks may
be coroutines, so a test can also hold them open for a while.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Hooks:
    on_conversion: Callable[[int], None] | None = None
    on_comparison_start: Callable[[int, int, int], Awaitable[None] | None] | None = None
    on_evaluation_start: Callable[[str], Awaitable[None] | None] | None = None
    # Shared store only: before each renewal of an evaluation lease (a test can stall it).
    on_lease_renewal: Callable[[str], Awaitable[None] | None] | None = None
    # Shared store only: how many times this process handles an outcome notification it
    # received (0 loses it, 2 duplicates it); called with the finished record's id.
    on_notification: Callable[[str], int] | None = None


async def call_hook(hook: Callable[..., Any] | None, *args: Any) -> None:
    if hook is None:
        return
    result = hook(*args)
    if inspect.isawaitable(result):
        await result
