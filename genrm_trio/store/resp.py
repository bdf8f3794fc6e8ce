"""A small Redis/Valkey client on Trio streams: RESP2 framing, a connection pool, pub/sub.

The group store needs a dozen commands, pipelining, WATCH/MULTI/EXEC on a dedicated connection
and one subscription. This client does exactly that and nothing more; every failure to reach
the server (refused, reset, closed mid-reply) is one exception type, ``StoreUnavailable``, and
a connection that saw a failure or a cancellation mid-reply is closed, never reused.
Deadlines are the caller's cancel scopes.
"""

from __future__ import annotations

import os
import select
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import trio

PASSWORD_ENV = "GENRM_GROUP_STORE_PASSWORD"

Arg = bytes | str | int | float


class StoreUnavailable(Exception):
    """The store could not be reached or dropped the connection."""


class ServerError(Exception):
    """The server answered a command with an error reply."""


@dataclass(frozen=True)
class StoreAddress:
    """Where the store is, parsed from a ``redis://`` or ``rediss://`` URL."""

    host: str
    port: int
    db: int
    tls: bool
    username: str | None
    password: str | None

    @classmethod
    def parse(cls, url: str) -> StoreAddress:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError("must be 'memory' or a redis:// or rediss:// URL")
        if not parts.hostname:
            raise ValueError("names no host")
        path = parts.path.strip("/")
        try:
            db = int(path) if path else 0
            port = parts.port or 6379
        except ValueError:
            raise ValueError("has a database or port that is not a number") from None
        if db < 0:
            raise ValueError("has a negative database number")
        password = unquote(parts.password) if parts.password else os.environ.get(PASSWORD_ENV)
        username = unquote(parts.username) if parts.username else None
        return cls(parts.hostname, port, db, parts.scheme == "rediss", username, password or None)

    def public(self) -> str:
        """The address without credentials, for logs, messages and /healthz."""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{self.host}:{self.port}/{self.db}"


def encode_command(args: Sequence[Arg]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, float):
            data = repr(arg).encode()
        else:
            data = str(arg).encode()
        out.append(b"$%d\r\n" % len(data))
        out.append(data)
        out.append(b"\r\n")
    return b"".join(out)


class _Incomplete(Exception):
    pass


def _parse(buffer: bytearray, start: int) -> tuple[Any, int]:
    """One RESP2 value from ``buffer[start:]``: (value, end), or _Incomplete."""
    end = buffer.find(b"\r\n", start)
    if end < 0:
        raise _Incomplete
    kind = buffer[start : start + 1]
    line = bytes(buffer[start + 1 : end])
    after = end + 2
    if kind == b"+":
        return line, after
    if kind == b"-":
        return ServerError(line.decode(errors="replace")), after
    if kind == b":":
        return int(line), after
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, after
        if len(buffer) < after + size + 2:
            raise _Incomplete
        return bytes(buffer[after : after + size]), after + size + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, after
        items = []
        position = after
        for _ in range(count):
            item, position = _parse(buffer, position)
            items.append(item)
        return items, position
    raise StoreUnavailable(f"unexpected reply byte {kind!r}")


class Connection:
    """One connection; commands are pipelined: send them all, then read their replies."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self.broken = False
        self.reused = False  # taken from the pool: it may have outlived its server

    async def _read_value(self) -> Any:
        while True:
            if self._buffer:
                try:
                    value, end = _parse(self._buffer, 0)
                except _Incomplete:
                    pass
                else:
                    del self._buffer[:end]
                    return value
            data = await self._stream.receive_some(65536)
            if not data:
                raise StoreUnavailable("the server closed the connection")
            self._buffer += data

    async def pipeline(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """Send every command, read every reply; error replies are returned, not raised."""
        if self.broken:
            raise StoreUnavailable("connection already failed")
        try:
            await self._stream.send_all(b"".join(encode_command(c) for c in commands))
            return [await self._read_value() for _ in commands]
        except BaseException as exc:
            # A reply half read (or a cancellation) leaves the framing unknown.
            self.broken = True
            if isinstance(exc, (OSError, trio.BrokenResourceError, trio.ClosedResourceError)):
                raise StoreUnavailable(_os_text(exc)) from exc
            raise

    async def call(self, *args: Arg) -> Any:
        (reply,) = await self.pipeline([args])
        if isinstance(reply, ServerError):
            raise reply
        return reply

    async def receive(self) -> Any:
        """The next pushed value (pub/sub)."""
        try:
            return await self._read_value()
        except BaseException as exc:
            self.broken = True
            if isinstance(exc, (OSError, trio.BrokenResourceError, trio.ClosedResourceError)):
                raise StoreUnavailable(_os_text(exc)) from exc
            raise

    def closed_while_idle(self) -> bool:
        """Whether an idle connection has something to read: a server never speaks unasked on
        a request connection, so that is the end of the stream (it closed or restarted)."""
        stream: Any = self._stream
        while isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        if not isinstance(stream, trio.SocketStream):
            return False
        readable, _, _ = select.select([stream.socket.fileno()], [], [], 0)
        return bool(readable)

    async def aclose(self) -> None:
        self.broken = True
        with trio.CancelScope(shield=True):
            await self._stream.aclose()


def _os_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Client:
    """A pool of connections to one server."""

    def __init__(self, address: StoreAddress, *, max_idle: int = 64) -> None:
        self.address = address
        self._idle: list[Connection] = []
        self._max_idle = max_idle
        self.round_trips = 0  # pipelines sent, for the benchmark's figures
        self.in_use = 0  # connections lent out now: a test waits for 0 to know I/O is done

    async def connect(self) -> Connection:
        address = self.address
        try:
            stream: trio.abc.Stream = await trio.open_tcp_stream(address.host, address.port)
            if address.tls:
                tls = trio.SSLStream(
                    stream, ssl.create_default_context(), server_hostname=address.host
                )
                await tls.do_handshake()
                stream = tls
        except (OSError, trio.BrokenResourceError) as exc:
            raise StoreUnavailable(_os_text(exc)) from exc
        connection = Connection(stream)
        setup: list[list[Arg]] = []
        if address.password is not None:
            auth: list[Arg] = ["AUTH"]
            if address.username is not None:
                auth.append(address.username)
            setup.append([*auth, address.password])
        if address.db:
            setup.append(["SELECT", address.db])
        if setup:
            try:
                replies = await connection.pipeline(setup)
            except BaseException:
                await connection.aclose()
                raise
            for reply in replies:
                if isinstance(reply, ServerError):
                    await connection.aclose()
                    raise StoreUnavailable(f"the server refused the connection: {reply}")
        return connection

    @asynccontextmanager
    async def connection(self, *, fresh: bool = False) -> AsyncIterator[Connection]:
        """A connection for this caller alone; back to the pool only if it stayed healthy.
        ``fresh`` opens a new one even if the pool has some."""
        self.in_use += 1
        try:
            connection = None
            while self._idle and not fresh and connection is None:
                connection = self._idle.pop()
                if connection.closed_while_idle():
                    # Found before a command is sent on it, so nothing is lost by dropping it.
                    await connection.aclose()
                    connection = None
            if connection is None:
                connection = await self.connect()
            else:
                connection.reused = True
            try:
                yield connection
            finally:
                if connection.broken or len(self._idle) >= self._max_idle:
                    await connection.aclose()
                else:
                    self._idle.append(connection)
        finally:
            self.in_use -= 1

    async def pipeline(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """Send commands that only read (or may be repeated): a pooled connection that turns
        out dead, as after a server restart, is replaced by a new one, once."""
        self.round_trips += 1
        reused = False
        try:
            async with self.connection() as connection:
                reused = connection.reused
                return await connection.pipeline(commands)
        except StoreUnavailable:
            if not reused:
                raise
        async with self.connection(fresh=True) as connection:
            return await connection.pipeline(commands)

    async def call(self, *args: Arg) -> Any:
        """One command that only reads (or may be repeated), with the same retry."""
        (reply,) = await self.pipeline([args])
        if isinstance(reply, ServerError):
            raise reply
        return reply

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.aclose()
