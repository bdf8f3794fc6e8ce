"""Every test of this suite runs on every group store (``group_store``, tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _on_every_store(group_store: str) -> str:
    return group_store
