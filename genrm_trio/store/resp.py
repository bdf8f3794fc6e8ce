"""A small Redis/Valkey client on Trio streams: RESP2 framing, a connection pool, pub/sub.

The group store needs a dozen commands, pipelining, WATCH/MULTI/EXEC on a dedicated connection
and one subscription. This client does exactly that and nothing more.

Theory of operation:

- Framing is hiredis's ``Reader``, the sans-IO C parser redis-py uses: bytes are fed as they
  arrive and a reply is taken out once whole. The reader keeps its place inside a partial
  reply, so the cost of reading a reply is linear in its size, however it is split.
- A reply comes back as RESP2's shapes only: ``bytes`` (bulk and simple strings, never
  decoded), ``int``, ``None`` (nil bulk, nil array), ``list`` (nested as sent) and
  ``ServerError`` values for error replies, at the top or inside an array (EXEC).
- Every failure of the connection is one exception type, ``StoreUnavailable``, with a text
  that says what went wrong: refused, reset, closed mid-reply, bytes that are not RESP, a
  reply larger than the cap. A connection that saw a failure, a cancellation or any exception
  in its user's hands is closed, never returned to the pool.
- A client lends out at most ``max_connections`` connections at once; more callers wait for
  one to come back, within their own cancel scope. Deadlines are always the caller's.
"""

from __future__ import annotations

import os
import select
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import hiredis
import trio

PASSWORD_ENV = "GENRM_GROUP_STORE_PASSWORD"

# Redis's own limit on one bulk string (proto-max-bulk-len) is 512 MiB; a reply still
# incomplete past that is a runaway or a broken stream, not data.
MAX_REPLY_BYTES = 512 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 256
_RECEIVE_BYTES = 65536
_TRANSPORT_FAILURES = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)

Arg = bytes | str | int | float


class StoreUnavailable(Exception):
    """The store could not be reached or dropped the connection."""


class ServerError(Exception):
    """The server answered a command with an error reply."""


class _ProtocolError(Exception):
    """hiredis raises this class when the bytes are not RESP (its ``protocolError``)."""


@dataclass(frozen=True)
class StoreAddress:
    """Where the store is, parsed from a ``redis://``, ``rediss://`` or ``unix://`` URL.

    A unix socket address has ``path`` set; its ``host`` is empty and its ``port`` 0.
    """

    host: str
    port: int
    db: int
    tls: bool
    username: str | None
    password: str | None
    path: str | None = None

    @classmethod
    def parse(cls, url: str) -> StoreAddress:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("must be 'memory' or a redis://, rediss:// or unix:// URL")
        password = unquote(parts.password) if parts.password else os.environ.get(PASSWORD_ENV)
        username = unquote(parts.username) if parts.username else None
        if parts.scheme == "unix":
            return cls._parse_unix(parts.hostname, parts.path, parts.query, username, password)
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
        return cls(parts.hostname, port, db, parts.scheme == "rediss", username, password or None)

    @classmethod
    def _parse_unix(
        cls,
        hostname: str | None,
        path: str,
        query: str,
        username: str | None,
        password: str | None,
    ) -> StoreAddress:
        if hostname:
            raise ValueError(
                "names a host in a unix:// URL (write unix:///path/to/redis.sock?db=0)"
            )
        if not path.strip("/"):
            raise ValueError("names no socket path (write unix:///path/to/redis.sock?db=0)")
        db = 0
        for key, value in parse_qsl(query, keep_blank_values=True):
            if key != "db":
                raise ValueError(f"has an unknown query parameter {key!r} (only db is known)")
            try:
                db = int(value)
            except ValueError:
                raise ValueError("has a database that is not a number") from None
        if db < 0:
            raise ValueError("has a negative database number")
        return cls("", 0, db, False, username, password or None, unquote(path))

    def public(self) -> str:
        """The address without credentials, for logs, messages and /healthz."""
        if self.path is not None:
            return f"unix://{self.path}?db={self.db}"
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


# What hiredis's gets() returns while no whole reply is buffered (its default, False, could be
# mistaken for a value).
_MORE: Any = object()
_RESP2_TYPES = (bytes, int, type(None), ServerError)


def _foreign_type(reply: Any) -> str | None:
    """The name of a type RESP2 never produces, anywhere in ``reply``, or None.

    hiredis also parses RESP3; a map, a boolean, a double or a push on this RESP2 connection
    means the stream is not what the callers were written for.
    """
    pending = [reply]
    while pending:
        value = pending.pop()
        kind = type(value)
        if kind is list:
            pending.extend(value)
        elif kind not in _RESP2_TYPES:
            return kind.__name__
    return None


class Connection:
    """One connection; commands are pipelined: send them all, then read their replies."""

    def __init__(self, stream: trio.abc.Stream, *, max_reply_bytes: int = MAX_REPLY_BYTES) -> None:
        self._stream = stream
        self._reader = hiredis.Reader(
            protocolError=_ProtocolError, replyError=ServerError, notEnoughData=_MORE
        )
        self._max_reply_bytes = max_reply_bytes
        # Bytes received since the receive that completed the last reply: the size of the
        # reply being read, low by at most what that receive held past the reply (one
        # receive), never high, so a reply under the cap never fails.
        self._pending = 0
        self._leftover = False  # that receive held bytes past the reply
        self.broken = False
        self.reused = False  # taken from the pool: it may have outlived its server

    def _next_reply(self) -> Any:
        """The next whole reply in the reader, or ``_MORE``."""
        try:
            reply = self._reader.gets()
        except _ProtocolError as exc:
            raise StoreUnavailable(f"the server's reply is not valid RESP ({exc})") from None
        except MemoryError:
            # hiredis allocates an array as soon as its header announces the length.
            raise StoreUnavailable(
                "no memory for the server's reply (an array too long?)"
            ) from None
        if reply is _MORE:
            return reply
        self._pending = 0
        self._leftover = self._reader.has_data()
        foreign = _foreign_type(reply)
        if foreign is not None:
            raise StoreUnavailable(
                f"the server sent a RESP3 value ({foreign}) on a RESP2 connection"
            )
        return reply

    async def _read_value(self) -> Any:
        while True:
            reply = self._next_reply()
            if reply is not _MORE:
                return reply
            if self._pending > self._max_reply_bytes:
                raise StoreUnavailable(
                    f"a reply grew past {self._max_reply_bytes} bytes before it was complete "
                    "(the cap on one reply)"
                )
            data = await self._stream.receive_some(_RECEIVE_BYTES)
            if not data:
                where = " mid-reply" if self._pending or self._leftover else ""
                raise StoreUnavailable(f"the server closed the connection{where}")
            self._pending += len(data)
            # Any buffer will do (hiredis reads it with "s*"); its stub says str | bytes.
            self._reader.feed(cast(bytes, data))

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
            if isinstance(exc, _TRANSPORT_FAILURES):
                raise StoreUnavailable(_os_text(exc)) from exc
            raise

    async def call(self, *args: Arg) -> Any:
        (reply,) = await self.pipeline([args])
        if isinstance(reply, ServerError):
            raise reply
        return reply

    async def receive(self) -> Any:
        """The next pushed value (pub/sub)."""
        if self.broken:
            raise StoreUnavailable("connection already failed")
        try:
            return await self._read_value()
        except BaseException as exc:
            self.broken = True
            if isinstance(exc, _TRANSPORT_FAILURES):
                raise StoreUnavailable(_os_text(exc)) from exc
            raise

    def closed_while_idle(self) -> bool:
        """Whether an idle connection has something to read: a server never speaks unasked on
        a request connection, so that is the end of the stream (it closed or restarted)."""
        if self._reader.has_data():
            return True
        stream: Any = self._stream
        while isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        if not isinstance(stream, trio.SocketStream):
            return False
        # poll, not select: select fails on descriptors numbered 1024 and up.
        poller = select.poll()
        poller.register(stream.socket.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    async def aclose(self) -> None:
        self.broken = True
        with trio.CancelScope(shield=True):
            await self._stream.aclose()


def _os_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@dataclass(frozen=True)
class ClientStatistics:
    """What a client's pool holds now."""

    lent_out: int  # connections in callers' hands (or being opened for one)
    waiting: int  # callers waiting because max_connections are lent out
    idle: int  # connections in the pool


class Client:
    """A pool of connections to one server, at most ``max_connections`` lent out at once."""

    def __init__(
        self,
        address: StoreAddress,
        *,
        max_idle: int = 64,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if max_reply_bytes < 1:
            raise ValueError("max_reply_bytes must be at least 1")
        self.address = address
        self._idle: list[Connection] = []
        self._max_idle = max_idle
        self._max_reply_bytes = max_reply_bytes
        self._max_connections = max_connections
        self._slots = trio.Semaphore(max_connections)
        self.round_trips = 0  # pipelines sent, for the benchmark's figures
        # Callers inside connection() now, waiting for a slot included: a test waits for 0 to
        # know the store's I/O is done.
        self.in_use = 0

    def statistics(self) -> ClientStatistics:
        return ClientStatistics(
            lent_out=self._max_connections - self._slots.value,
            waiting=self._slots.statistics().tasks_waiting,
            idle=len(self._idle),
        )

    async def connect(self) -> Connection:
        """A new connection, authenticated and on the address's database; not counted against
        ``max_connections`` (the pub/sub subscription holds one for the process's life)."""
        address = self.address
        try:
            stream: trio.abc.Stream
            if address.path is not None:
                stream = await trio.open_unix_socket(address.path)
            else:
                stream = await trio.open_tcp_stream(address.host, address.port)
            if address.tls:
                tls = trio.SSLStream(
                    stream, ssl.create_default_context(), server_hostname=address.host
                )
                await tls.do_handshake()
                stream = tls
        except (OSError, trio.BrokenResourceError) as exc:
            raise StoreUnavailable(_os_text(exc)) from exc
        connection = Connection(stream, max_reply_bytes=self._max_reply_bytes)
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

    async def _checkout(self, fresh: bool) -> Connection:
        while self._idle and not fresh:
            connection = self._idle.pop()
            if not connection.closed_while_idle():
                connection.reused = True
                return connection
            # Found before a command is sent on it, so nothing is lost by dropping it.
            await connection.aclose()
        return await self.connect()

    @asynccontextmanager
    async def connection(self, *, fresh: bool = False) -> AsyncIterator[Connection]:
        """A connection for this caller alone; back to the pool only if the caller's block
        ended normally and the connection stayed healthy. ``fresh`` opens a new one even if
        the pool has some. Waits while ``max_connections`` are lent out."""
        self.in_use += 1
        try:
            async with self._slots:
                connection = await self._checkout(fresh)
                try:
                    yield connection
                except BaseException:
                    # Whatever was raised, the connection's state is unknown: a reply half
                    # read, a WATCH still set, a MULTI still open.
                    await connection.aclose()
                    raise
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
