"""A fake judge on a loopback port that a test can stop and start again on the same port, as a
judge replica that goes away and comes back."""

from __future__ import annotations

from typing import Generic, TypeVar

import trio

from genrm_trio.fakes.judge import FakeJudge
from genrm_trio.fakes.judge_http import serve_fake_judge

__all__ = ["LoopbackJudge"]

Judge = TypeVar("Judge", bound=FakeJudge)


class LoopbackJudge(Generic[Judge]):
    """``judge`` served over HTTP in ``nursery``; its first start picks the port, later ones
    take the same port again."""

    def __init__(self, nursery: trio.Nursery, judge: Judge) -> None:
        self.nursery = nursery
        self.judge = judge
        self.port = 0
        self.scope = trio.CancelScope()

    async def start(self) -> None:
        self.scope = trio.CancelScope()
        self.port = await self.nursery.start(self._serve)

    async def _serve(self, *, task_status: trio.TaskStatus[int]) -> None:
        with self.scope:
            await serve_fake_judge(self.judge, "127.0.0.1", self.port, task_status=task_status)

    def stop(self) -> None:
        """Close the listener and cut every open connection, replies in flight included."""
        self.scope.cancel()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"
