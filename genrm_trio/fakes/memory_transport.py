"""The judge transport in memory: every request goes straight to a fake judge's synchronous core.

No sockets and no framing, but the same seam, the same failures and the same keep-alive
bookkeeping as the network transport, so that tests under a mock clock run the client's real
attempt loop. A :class:`~genrm_trio.fakes.judge.FakeJudge` decides each reply; this
module carries it out:

=================  ===========================================================================
reply kind         what the caller sees
=================  ===========================================================================
``respond``        after ``delay_s`` (``trio.sleep``: instant and exact under ``autojump_clock``),
                   the reply; its body is read in one part
``truncate``       after ``delay_s``, the reply's head, half its body, then ``RemoteProtocolError``
                   naming the bytes received, and the connection is dropped
``close``          after ``delay_s``, ``RemoteProtocolError`` (closed before replying)
``hang``           nothing, until the caller's cancel scope ends the wait
=================  ===========================================================================

A caller that leaves before the reply is decided (cancelled during the delay or a hang) is
counted in the judge's ``cancelled``; ``in_flight`` always comes back down.

Connections are bookkeeping only: a send takes an idle one or "opens" one, and ``release``
keeps it for reuse only when the body was read in full, as the network transport does; the
counts show in :meth:`MemoryTransport.statistics`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Protocol
from urllib.parse import urlsplit

import trio

from genrm_trio.fakes._judge_replies import FakeReply
from genrm_trio.judge.transport import (
    CLOSED_BEFORE_REPLY,
    JudgeEndpoint,
    JudgeReply,
    JudgeTransport,
    JudgeTransportError,
    RemoteProtocolError,
    TransportFactory,
    TransportStatistics,
    closed_in_body,
)

__all__ = ["BodyReply", "JudgeCore", "MemoryTransport", "memory_transport"]


class JudgeCore(Protocol):
    """What the transport needs of a judge: the synchronous core every adapter drives
    (`FakeJudge`). The transport knows only this, so the judge can hand out its own transport
    (`FakeJudge.transport()`)."""

    def handle(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        *,
        now: float,
    ) -> FakeReply: ...

    def end_request(self, reply: FakeReply, *, cancelled: bool) -> None: ...


class BodyReply(JudgeReply):
    """A reply whose body is already in memory, given in ``parts``.

    After the parts, ``then`` says how the body ends: None for complete, an exception to raise
    (a connection broken mid-body), or ``"stall"`` for a body that never ends. ``on_release``
    is called with whether the body was read in full.
    """

    __slots__ = ("_done", "_next", "_on_release", "_parts", "_then")

    def __init__(
        self,
        status: int,
        headers: Sequence[tuple[bytes | str, bytes | str]],
        parts: Sequence[bytes],
        *,
        then: JudgeTransportError | str | None = None,
        on_release: Callable[[bool], None] | None = None,
    ) -> None:
        super().__init__(status, [(_bytes(name).lower(), _bytes(value)) for name, value in headers])
        self._parts = [part for part in parts if part]
        self._next = 0
        self._then = then
        self._done = False
        self._on_release = on_release

    async def next_part(self) -> bytes:
        await trio.lowlevel.checkpoint()
        if self._next < len(self._parts):
            self._next += 1
            return self._parts[self._next - 1]
        if self._then == "stall":
            await trio.sleep_forever()
        if isinstance(self._then, JudgeTransportError):
            raise self._then
        self._done = True
        return b""

    async def release(self) -> None:
        if self._on_release is not None:
            on_release, self._on_release = self._on_release, None
            on_release(self._done)


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode("latin-1")


class MemoryTransport(JudgeTransport):
    """Serves a :class:`FakeJudge` to the judge client in process; see the module docstring."""

    def __init__(self, judge: JudgeCore, endpoint: JudgeEndpoint) -> None:
        self.judge = judge
        parsed = urlsplit(endpoint.url)
        self.target = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
        self._host = parsed.netloc
        self._method = endpoint.method
        self._headers = [(name.lower(), value) for name, value in endpoint.headers.items()]
        self._closed = False
        self._opened = 0
        self._idle = 0

    @property
    def closed(self) -> bool:
        return self._closed

    async def send(self, body: bytes) -> JudgeReply:
        if self._closed:
            raise RuntimeError("the judge transport has been closed")
        await trio.lowlevel.checkpoint()
        return await self.serve(self.judge, body)

    async def serve(self, judge: JudgeCore, body: bytes) -> JudgeReply:
        """Have ``judge`` answer ``body`` sent on one of this transport's connections."""
        # A connection that fails or is not read in full is not given back (see _keep).
        if self._idle:
            self._idle -= 1
        else:
            self._opened += 1
        headers = [
            ("host", self._host),
            ("content-length", str(len(body))),
            *self._headers,
        ]
        reply = judge.handle(self._method, self.target, headers, body, now=trio.current_time())
        if reply.tracked:
            cancelled = True
            try:
                if reply.kind == "hang":
                    await trio.sleep_forever()
                await trio.sleep(reply.delay_s)
                cancelled = False
            finally:
                judge.end_request(reply, cancelled=cancelled)
        if reply.kind == "close":
            raise RemoteProtocolError(CLOSED_BEFORE_REPLY)
        head = [*reply.headers, ("content-length", str(len(reply.body)))]
        if reply.kind == "truncate":
            cut = RemoteProtocolError(closed_in_body(reply.sent_bytes, len(reply.body)))
            return BodyReply(
                reply.status,
                head,
                [reply.body[: reply.sent_bytes]],
                then=cut,
                on_release=self._keep,
            )
        return BodyReply(reply.status, head, [reply.body], on_release=self._keep)

    def _keep(self, reusable: bool) -> None:
        if reusable and not self._closed:
            self._idle += 1

    async def aclose(self) -> None:
        self._closed = True
        self._idle = 0
        await trio.lowlevel.checkpoint()

    def statistics(self) -> TransportStatistics:
        return TransportStatistics(connections_opened=self._opened, idle_connections=self._idle)


def memory_transport(judge: JudgeCore) -> TransportFactory:
    """The judge client's ``transport`` (the server's ``judge_transport``) serving ``judge``."""
    return partial(MemoryTransport, judge)
