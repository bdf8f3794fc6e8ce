"""The judge transport seam: one POST to the judge, its reply, and the failures it can end in.

The attempt loop (judge/client.py) talks to the judge only through a :class:`JudgeTransport`;
http11.py carries it over the network, fakes/memory_transport.py hands it to a fake judge in
memory. This module also holds the transport's whole vocabulary of failure texts (J-40 causes).

Theory of operation. A transport is built once per server from a :class:`JudgeEndpoint` (the
request URL, the J-8 headers and the timeout that bounds connecting) and then only ever sends the
prepared body of a judge request: ``reply = await transport.send(body)`` returns once the reply's
status line and headers are in; the caller reads the body as far as it needs with
:meth:`JudgeReply.read_at_most` and always ends with :meth:`JudgeReply.release`, which keeps the
connection for the next attempt only if the reply was read in full. Deadlines are the caller's
cancel scopes; a cancelled ``send`` or read leaves nothing behind once ``release`` has run.

Every failure a transport reports is a :class:`JudgeTransportError`, translated once, where the
implementation meets its backend (sockets, TLS, a fake judge); ``str(error)`` is the message the
J-40 cause shows after the class name. Nothing else may escape ``send`` or a read, except
cancellation and ``RuntimeError`` for a transport used after ``aclose``.
"""

from __future__ import annotations

import abc
import os
import socket
import ssl
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import trio

# --- endpoint -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JudgeEndpoint:
    """Where and how judge requests go: one per server (J-34)."""

    url: str  # the request URL, without user-info (J-41)
    headers: Mapping[str, str]  # exactly the J-8 headers; Host and Content-Length frame the request
    timeout_s: float  # judge_request_timeout_s: bounds connecting, as the attempt's deadline does
    # Judge requests POST; the readiness probe (judge/_probe.py) sends a GET with an empty body.
    method: str = "POST"


@dataclass(frozen=True, slots=True)
class TransportStatistics:
    """Connections opened since creation, and the idle ones kept for reuse now."""

    connections_opened: int
    idle_connections: int


# --- errors (J-21: every one of them is a transient failure, except ConnectTimedOut) -------------


class JudgeTransportError(Exception):
    """The exchange ended without a complete reply; ``str()`` says why, in the project's words."""


class ConnectError(JudgeTransportError):
    """No connection could be made: refused, unreachable, name resolution, TLS handshake."""


class ConnectTimedOut(JudgeTransportError):
    """Connecting took longer than the endpoint's timeout (counts as the J-27 deadline)."""


class ReadError(JudgeTransportError):
    """The connection broke while the request was being sent or the reply read."""


class RemoteProtocolError(JudgeTransportError):
    """The judge closed the connection before a complete reply, or sent what is not HTTP/1.1."""


class ReplyDecodingFailed(JudgeTransportError):
    """The body's Content-Encoding is unknown or its bytes do not decode."""


class RequestInvalid(JudgeTransportError):
    """The request cannot be sent as configured (a header value with a line break)."""


# --- texts: the one place that words transport failures -----------------------------------------

CLOSED_BEFORE_REPLY = "the judge closed the connection before replying"
CLOSED_IN_CHUNKED_BODY = "the judge closed the connection inside a chunked body"


def closed_in_body(received: int, expected: int) -> str:
    return f"the judge closed the connection after {received} of {expected} body bytes"


def cannot_connect(address: str, reason: BaseException) -> str:
    return f"cannot connect to {address}: {describe(reason)}"


def connect_timed_out(address: str, timeout_s: float) -> str:
    return f"no connection to {address} within {timeout_s:g}s"


def connection_broken(reason: BaseException) -> str:
    return f"connection to the judge broken: {describe(reason)}"


def header_value_invalid(name: str) -> str:
    return f"header {name} has a line break or NUL in its value"


def malformed(what: str) -> str:
    """A reply that breaks HTTP/1.1 framing; ``what`` names the part."""
    return f"malformed reply: {what}"


def describe(exc: BaseException) -> str:
    """A backend exception in a few words: the OS's text for the first errno found down its
    chain (``Connection refused``), else the first message down it (a TLS failure often
    arrives wrapped in an exception with none), else its type's name."""
    chain: list[BaseException] = []
    pending: list[BaseException] = [exc]
    while pending and len(chain) < 32:
        current = pending.pop(0)
        if any(current is seen for seen in chain):
            continue
        chain.append(current)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                pending.append(linked)
    for current in chain:
        if isinstance(current, socket.gaierror) and current.strerror:
            return str(current.strerror)  # name resolution: its own codes, its own texts
        if isinstance(current, ssl.SSLError):
            continue  # an SSL error code is not an errno; its message says more
        if isinstance(current, OSError) and isinstance(current.errno, int) and current.errno > 0:
            return os.strerror(current.errno)
    for current in chain:
        if text := str(current):
            return text if current is exc else f"{type(current).__name__}: {text}"
    return type(exc).__name__


# --- the seam -------------------------------------------------------------------------------------


class JudgeReply(abc.ABC):
    """A reply whose status line and headers are in; the body is read on demand, then released.

    Implementations supply :meth:`next_part` (the body as sent, before any Content-Encoding) and
    :meth:`release`; Content-Encoding is decoded here, once for every transport.
    """

    __slots__ = ("headers", "status")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.headers = headers  # names in lower case, in the order received

    def header(self, name: bytes) -> bytes | None:
        """The value of header ``name`` (lower case); repeated headers joined with commas."""
        values = [value for key, value in self.headers if key == name]
        return b", ".join(values) if values else None

    @abc.abstractmethod
    async def next_part(self) -> bytes:
        """The next piece of the body as sent; b"" at its end."""

    @abc.abstractmethod
    async def release(self) -> None:
        """Give the connection back if the body was read in full, else close it. Always call it,
        also after an error or a cancellation; it never blocks for long."""

    async def read_at_most(self, limit: int, chunks: list[bytes]) -> bool:
        """Append the decoded body to ``chunks`` until more than ``limit`` bytes; True if it all
        fit. Parts read before a failure stay in ``chunks``.

        A body already buffered is read without a schedule point, but never after the caller's
        deadline has passed: a cancelled read leaves the reply unread, and its connection closed.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        encoding = self.header(b"content-encoding")
        decoder = None if encoding is None else _Decoder(encoding)
        size = 0
        while part := await self.next_part():
            if decoder is not None:
                part = decoder.decode(part, limit + 1 - size)
            if part:
                chunks.append(part)
                size += len(part)
            if size > limit:
                return False
        if decoder is not None and (tail := decoder.flush()):
            chunks.append(tail)
            size += len(tail)
        return size <= limit


class JudgeTransport(abc.ABC):
    """Sends judge requests to one endpoint; one instance per server, shared by every attempt."""

    @abc.abstractmethod
    async def send(self, body: bytes) -> JudgeReply:
        """POST ``body`` to the endpoint and return the reply once its head is in."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close idle connections; later sends raise RuntimeError."""

    @abc.abstractmethod
    def statistics(self) -> TransportStatistics: ...


TransportFactory = Callable[[JudgeEndpoint], JudgeTransport]


# --- Content-Encoding -----------------------------------------------------------------------------


class _Decoder:
    """Undoes a Content-Encoding list (gzip, deflate, identity), the last one applied first.

    The final step's output is bounded by the room left under the caller's limit, so a small
    compressed body cannot expand in memory beyond it.
    """

    def __init__(self, encoding: bytes) -> None:
        self._steps: list[_Step] = []
        for token in reversed(encoding.lower().split(b",")):
            name = token.strip()
            if name in (b"", b"identity"):
                continue
            if name not in (b"gzip", b"x-gzip", b"deflate"):
                raise ReplyDecodingFailed(
                    f"unsupported Content-Encoding {name.decode('latin-1')!r}"
                )
            self._steps.append(_Step(name.decode("ascii")))

    def decode(self, data: bytes, room: int) -> bytes:
        last = len(self._steps) - 1
        for index, step in enumerate(self._steps):
            data = step.decode(data, room if index == last else 0)
        return data

    def flush(self) -> bytes:
        data = b""
        for step in self._steps:
            data = step.decode(data, 0) + step.flush()
        return data


class _Step:
    __slots__ = ("_name", "_sniff", "_zlib")

    def __init__(self, name: str) -> None:
        self._name = name
        # deflate is meant to be zlib-wrapped, but raw deflate is common: the first bytes decide.
        self._sniff = name == "deflate"
        self._zlib = zlib.decompressobj(zlib.MAX_WBITS if self._sniff else zlib.MAX_WBITS | 16)

    def decode(self, data: bytes, room: int) -> bytes:
        """Decode ``data``; at most ``room`` bytes out (0: no bound)."""
        if not data:
            return b""
        try:
            try:
                out = self._zlib.decompress(data, room)
            except zlib.error:
                if not self._sniff:
                    raise
                self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
                out = self._zlib.decompress(data, room)
        except zlib.error as exc:
            raise ReplyDecodingFailed(f"{self._name} body does not decode: {exc}") from exc
        self._sniff = False
        return out

    def flush(self) -> bytes:
        try:
            tail = self._zlib.flush()
        except zlib.error as exc:
            raise ReplyDecodingFailed(f"{self._name} body does not decode: {exc}") from exc
        if self._name != "deflate" and not self._zlib.eof:
            raise ReplyDecodingFailed(f"{self._name} body ends inside its compressed stream")
        return tail
