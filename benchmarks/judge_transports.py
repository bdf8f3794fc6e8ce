"""Judge transports that the fan-out benchmark measures against the server's own (judge/http11.py).

- `H11Transport`: the same connection stack and the same seam, with h11 doing the HTTP/1.1
  framing (request head out, reply events in) instead of the hand-written framing;
- `HttpxPoolTransport`: httpx's client over its own pooled transport (httpcore's pool with
  `judge_max_concurrency` connections), the baseline J-34a warns about.

Both raise the seam's errors, so the client's attempt loop treats them like the real one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import h11
import httpx
import trio

from genrm_trio.judge.http11 import Http11Transport, _Connection
from genrm_trio.judge.transport import (
    CLOSED_BEFORE_REPLY,
    ConnectError,
    ConnectTimedOut,
    JudgeEndpoint,
    JudgeReply,
    JudgeTransport,
    ReadError,
    RemoteProtocolError,
    TransportStatistics,
    malformed,
)

_RECEIVE_BYTES = 65536


class _H11Reply(JudgeReply):
    __slots__ = ("connection", "machine", "transport")

    def __init__(
        self,
        transport: H11Transport,
        connection: _Connection,
        machine: h11.Connection,
        response: h11.Response,
    ) -> None:
        super().__init__(response.status_code, [(bytes(k), bytes(v)) for k, v in response.headers])
        self.transport = transport
        self.connection = connection
        self.machine = machine

    async def next_part(self) -> bytes:
        event = await self.transport._next_event(self.connection, self.machine)
        if isinstance(event, h11.Data):
            return bytes(event.data)
        if isinstance(event, h11.EndOfMessage):
            return b""
        raise RemoteProtocolError(malformed(f"unexpected {type(event).__name__}"))

    async def release(self) -> None:
        machine = self.machine
        if (
            machine.our_state is h11.DONE
            and machine.their_state is h11.DONE
            and not self.transport._closed
        ):
            machine.start_next_cycle()
            self.connection.idle_since = trio.current_time()
            self.transport._idle.append(self.connection)
        else:
            await trio.aclose_forcefully(self.connection.stream)


class H11Transport(Http11Transport):
    """Http11Transport's connection stack with h11's framing."""

    def __init__(self, endpoint: JudgeEndpoint) -> None:
        super().__init__(endpoint)
        parsed = urlsplit(endpoint.url)
        self._target = (
            (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
        ).encode()
        self._headers = [("Host", parsed.netloc), *endpoint.headers.items()]
        self._machines: dict[int, h11.Connection] = {}

    async def send(self, body: bytes) -> JudgeReply:  # type: ignore[override]
        if self._closed:
            raise RuntimeError("the judge transport has been closed")
        connection = await self._checkout()
        machine = self._machines.get(id(connection))
        if machine is None or machine.our_state is not h11.IDLE:
            machine = self._machines[id(connection)] = h11.Connection(h11.CLIENT)
        try:
            data = machine.send(
                h11.Request(
                    method="POST",
                    target=self._target,
                    headers=[*self._headers, ("Content-Length", str(len(body)))],
                )
            )
            data += machine.send(h11.Data(data=body)) + machine.send(h11.EndOfMessage())
            try:
                await connection.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            while True:
                event = await self._next_event(connection, machine)
                if isinstance(event, h11.InformationalResponse):
                    continue
                if isinstance(event, h11.Response):
                    return _H11Reply(self, connection, machine, event)
                raise RemoteProtocolError(CLOSED_BEFORE_REPLY)
        except BaseException:
            self._machines.pop(id(connection), None)
            await trio.aclose_forcefully(connection.stream)
            raise

    async def _next_event(self, connection: _Connection, machine: h11.Connection) -> h11.Event:
        while True:
            try:
                event = machine.next_event()
            except h11.RemoteProtocolError as exc:
                raise RemoteProtocolError(malformed(str(exc))) from exc
            if event is not h11.NEED_DATA:
                assert not isinstance(event, type)
                return event
            try:
                data = await connection.stream.receive_some(_RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ReadError(str(exc)) from exc
            machine.receive_data(bytes(data))


class _HttpxReply(JudgeReply):
    __slots__ = ("parts", "response")

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response.status_code, [(k.lower(), v) for k, v in response.headers.raw])
        self.response = response
        self.parts: AsyncIterator[bytes] = response.aiter_raw()

    async def next_part(self) -> bytes:
        try:
            return await anext(self.parts, b"")
        except httpx.TransportError as exc:
            raise ReadError(str(exc)) from exc

    async def release(self) -> None:
        await self.response.aclose()


class HttpxPoolTransport(JudgeTransport):
    """httpx's AsyncClient over its pooled transport, limited to ``connections``."""

    def __init__(self, endpoint: JudgeEndpoint, *, connections: int) -> None:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        timeout = endpoint.timeout_s
        self._url = endpoint.url
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(limits=limits, http1=True, http2=False),
            timeout=httpx.Timeout(connect=timeout, read=timeout, write=timeout, pool=timeout),
            headers=dict(endpoint.headers),
            trust_env=False,
        )

    async def send(self, body: bytes) -> JudgeReply:
        request = self._client.build_request("POST", self._url, content=body)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.ConnectTimeout as exc:
            raise ConnectTimedOut(str(exc)) from exc
        except httpx.ConnectError as exc:
            raise ConnectError(str(exc)) from exc
        except httpx.TransportError as exc:
            raise ReadError(str(exc)) from exc
        return _HttpxReply(response)

    async def aclose(self) -> None:
        await self._client.aclose()

    def statistics(self) -> TransportStatistics:
        return TransportStatistics(connections_opened=0, idle_connections=0)
