"""Lua scripts a shared store runs by EVALSHA, loaded again when the server has lost them."""

from __future__ import annotations

import hashlib
from typing import Any

from genrm_trio.store.resp import Arg, ServerError

__all__ = ["Script"]


class Script:
    """A Lua script run by EVALSHA; loaded again when the server answers NOSCRIPT (a restart,
    SCRIPT FLUSH)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    def command(self, keys: list[Arg], args: list[Arg]) -> list[Arg]:
        return ["EVALSHA", self.sha, len(keys), *keys, *args]

    @staticmethod
    def missing(reply: Any) -> bool:
        return isinstance(reply, ServerError) and str(reply).startswith("NOSCRIPT")
