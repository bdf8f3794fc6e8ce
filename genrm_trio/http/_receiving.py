"""Reading a /verify body under the memory budget for request bodies (`waiting_body_memory_bytes`).

A trainer posts a whole step at once, so what a server holds is decided before it reads: each
body is admitted by its Content-Length before a byte of it is taken from hypercorn. Within the
budget it is read into memory and stays there while its request waits. Beyond it, the request
waits for one of ``SPOOL_SLOTS`` slots with its connection's reads shut (its ``ReadGate``, found
through the ``ReadGates`` that `serve` hands over): its bytes stay in the kernel and the client.
With a slot it is read, validated, written to its spool file and let go, so at most
``SPOOL_SLOTS`` bodies beyond the budget are in memory at once. Slots are given back as soon as a
body is on disk, never held while a group waits, so a group whose members all queue for slots
still completes.

A chunked body (no Content-Length) is admitted chunk by chunk; when a chunk does not fit, the
rest of the body waits for a slot and the whole body is spooled.

Validation needs the whole body in memory once (a body that is refused must change nothing), so
a body beyond the budget is read whole within its slot rather than streamed to its file first:
streaming would save nothing at the peak, which is the parse.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final, cast

import trio
from hypercorn.typing import ASGIReceiveCallable, HTTPScope

from genrm_trio.http._spool import SpoolBudget
from genrm_trio.http.read_gates import ReadGate, ReadGates

# Bodies beyond the budget read, validated and written to their files at once. Validation runs
# on the event loop, one body at a time; a second slot lets the next body arrive while one is
# being written out.
SPOOL_SLOTS: Final = 2


@dataclass(frozen=True, slots=True)
class Refused:
    """A body that will not be read: ``status`` and the reason, for the reply."""

    status: int
    reason: str  # "too_large" or "timeout"


class Received:
    """A whole body and its share of the budget, given back when its request is done."""

    __slots__ = ("_body", "_budget", "_counted", "_reserved", "_slots", "_waiting", "size")

    def __init__(self, budget: SpoolBudget, slots: trio.Semaphore | None) -> None:
        self._budget = budget
        self._slots = slots
        self._body = b""
        self._reserved = 0  # given out by the budget
        self._counted = 0  # counted as being received
        self._waiting = False
        self.size = 0

    @property
    def within_budget(self) -> bool:
        """The body stays in memory; otherwise it must be spooled, then ``spooled()`` called."""
        return self._slots is None

    def take_body(self) -> bytes:
        """The body's bytes, handed over once: the caller's copy is then the only one."""
        body, self._body = self._body, b""
        return body

    def admitted(self) -> None:
        """The body is valid and waits in memory."""
        self._budget.receiving -= self._counted
        self._counted = 0
        self._waiting = True
        self._budget.waiting += self.size

    def spooled(self) -> None:
        """The body is in its spool file and no longer in memory: its slot goes to the next."""
        self._body = b""
        self._give_back_memory()

    def done(self) -> None:
        self._body = b""
        self._give_back_memory()
        if self._waiting:
            self._budget.waiting -= self.size
            self._waiting = False
        self._budget.release(self._reserved)
        self._reserved = 0

    def _give_back_memory(self) -> None:
        self._budget.receiving -= self._counted
        self._counted = 0
        if self._slots is not None:
            self._budget.release(self._reserved)
            self._reserved = 0
            self._slots.release()
            self._slots = None


class BodyReceiver:
    """Admits and reads /verify bodies for one server."""

    def __init__(
        self,
        budget: SpoolBudget,
        max_body_bytes: int,
        read_seconds: float | None,
        read_gates: ReadGates | None = None,
    ) -> None:
        self.budget = budget
        self.max_body_bytes = max_body_bytes
        # How long reading one body may take (Quart's BODY_TIMEOUT); the wait for room is apart.
        self.read_seconds = read_seconds
        self.slots = trio.Semaphore(SPOOL_SLOTS)
        # Under `serve`, how a request's connection is kept from being read while its body waits.
        self.read_gates = read_gates

    def _read_gate(self, scope: HTTPScope) -> ReadGate | None:
        return None if self.read_gates is None else self.read_gates.of(scope)

    @contextlib.asynccontextmanager
    async def receive(
        self,
        scope: HTTPScope,
        receive: ASGIReceiveCallable,
    ) -> AsyncIterator[Received | Refused | None]:
        """The request's whole body (None if the client left while it was sent); the budget and
        slot it holds are given back on leaving the block."""
        declared = declared_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            yield Refused(413, "too_large")
            return
        received = Received(self.budget, None)
        try:
            if declared is not None and not self.budget.admit(declared):
                await self._wait_for_slot(scope, received)
            elif declared is not None:
                received._reserved = declared
            yield await self._read(scope, receive, received, declared, admit_chunks=True)
        finally:
            received.done()

    @contextlib.asynccontextmanager
    async def receive_held(
        self,
        scope: HTTPScope,
        receive: ASGIReceiveCallable,
    ) -> AsyncIterator[Received | Refused | None]:
        """Like ``receive``, for a body that cannot be spooled (a whole group, judged as soon as
        it is read): beyond the budget it waits, unread, for room instead of for a slot; alone,
        it is let in whatever its size."""
        declared = declared_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            yield Refused(413, "too_large")
            return
        received = Received(self.budget, None)
        try:
            if declared is not None:
                gate = self._read_gate(scope)
                if gate is not None:
                    gate.shut()
                try:
                    await self.budget.wait_to_admit(declared)
                finally:
                    if gate is not None:
                        gate.open()
                received._reserved = declared
            outcome = await self._read(scope, receive, received, declared, admit_chunks=False)
            if declared is None and isinstance(outcome, Received):
                await self.budget.wait_to_admit(outcome.size)
                received._reserved = outcome.size
            yield outcome
        finally:
            received.done()

    async def _wait_for_slot(self, scope: HTTPScope, received: Received) -> None:
        gate = self._read_gate(scope)
        if gate is not None:
            gate.shut()
        try:
            await self.slots.acquire()
        finally:
            if gate is not None:
                gate.open()
        received._slots = self.slots

    async def _read(
        self,
        scope: HTTPScope,
        receive: ASGIReceiveCallable,
        received: Received,
        declared: int | None,
        *,
        admit_chunks: bool,
    ) -> Received | Refused | None:
        budget = self.budget
        chunks: list[bytes] = []
        size = 0
        limit = self.read_seconds
        deadline = trio.current_time() + (float("inf") if limit is None else limit)
        while True:
            message = None
            with trio.move_on_at(deadline):
                message = await receive()
            if message is None:
                return Refused(408, "timeout")
            if message["type"] == "http.disconnect":
                return None
            chunk = cast(bytes, message.get("body", b""))
            size += len(chunk)
            if size > self.max_body_bytes:
                return Refused(413, "too_large")
            if admit_chunks and declared is None and received.within_budget:
                if budget.admit(len(chunk)):
                    received._reserved += len(chunk)
                else:
                    waited_from = trio.current_time()
                    await self._wait_for_slot(scope, received)
                    deadline += trio.current_time() - waited_from
            budget.receiving += len(chunk)
            received._counted += len(chunk)
            if chunk:
                # hypercorn ends every body with an empty message: a body read in one piece is
                # then taken as it is, not joined with it into a copy.
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        received.size = size
        received._body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return received


def declared_length(scope: HTTPScope) -> int | None:
    """The request's Content-Length, or None when absent or not a number."""
    for name, value in scope["headers"]:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
