"""The read loop of `serve`'s connections: what is read from each socket, when, and in what pieces.

It reads for hypercorn's HTTP/1.1 protocol through the seam's ``Connection`` (its rules are at the
top of http/_hypercorn_seam.py). Each connection's reads pass its ``ReadGate``
(http/read_gates.py): while a request waits for room in the memory budget its gate is shut, and
its body stays in the kernel and the client (TCP's own backpressure) instead of piling up in
hypercorn's queue. Reads start small, so that a connection holds little while it waits, and grow
while a body streams in.

A whole step posted at once puts thousands of requests in the kernel before the server reads
any, and Trio runs every connection's next step in turn: each read buffer, each copy h11 and
hypercorn make and each piece of a body waiting for the rest was then alive for thousands of
connections at once, and the heap kept the high-water mark as holes between the bodies that
stayed (a quarter of a GiB for 8,192 bodies of 35 KB). So a request whose head declares a body
of at most ``GATHERED_BODY_BYTES`` is read in a turn: at most ``RECEIVING_REQUESTS`` connections
at once read such a request's head and its whole body, into one buffer of its length, handed to
h11 in one piece (the application then takes it as one chunk, without joining pieces). A
connection gives its turn up as soon as it would wait, for the client's bytes or for its gate;
the rest of its reads go as before.

A larger body of declared length (a long rollout: 2 MB for 64k tokens) is passed from the
socket to the application past h11. h11 would copy each read into its buffer and slice it out
twice, and hypercorn copy it once more, each a fresh mapping at these sizes; the body instead
goes in reads of what the kernel holds, up to ``BODY_READ_BYTES``, each handed to hypercorn's
stream as it came, with h11's count of the body's bytes kept, so that h11 still ends the body
and the connection goes on as it would. Its head still goes through h11, and so does everything
about the body other than its bytes: the application's decision to read it now or later (its
gate), a client that stops halfway (a 400), a refusal by its declared length.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
import sys
import termios

import trio

from genrm_trio.http._hypercorn_seam import Connection
from genrm_trio.http.read_gates import ReadGate

__all__ = ["GATHERED_BODY_BYTES", "RECEIVING_REQUESTS", "RequestReader"]

# The first read of a connection, and every read after the socket ran dry: a request's head and
# a small body in one read, while a connection that waits holds at most this much unread.
FIRST_READ_BYTES = 32 * 1024
# Reads double while each one fills its buffer, up to this: a 2 MB body of no declared length (or
# whose head came in pieces) then takes about a dozen reads instead of 64 (each read is one trip
# through h11, hypercorn's queue and the scheduler).
LARGEST_READ_BYTES = 256 * 1024
# The largest read of a body passed past h11 (each asks for what the kernel holds; on loopback a
# 2 MB body comes in about five), so that no read asks for a buffer of whatever length a client
# declares.
BODY_READ_BYTES = 1024 * 1024
# Connections reading a request in their turn at once (see the module's docstring): enough to keep
# the event loop busy, few enough that their buffers are a few MiB that the next ones reuse.
RECEIVING_REQUESTS = 64
# A body with a declared length up to this is read whole in its request's turn: glibc's mmap
# threshold (process_tuning.LARGE_ALLOCATION_BYTES). Larger buffers are mappings of their own,
# given back to the system whole, and leave no holes in the heap.
GATHERED_BODY_BYTES = 128 * 1024
# How much of a request's head is looked at, before it is read, for its Content-Length.
HEAD_PEEK_BYTES = 2048
# A Content-Length field in a request's head (field names are case-insensitive).
_CONTENT_LENGTH = re.compile(rb"\ncontent-length:[ \t]*(\d{1,12})[ \t]*\r?\n", re.IGNORECASE)
# The end of a request's head, as HTTP/1.1 (and h11) finds it: an empty line.
_HEAD_END = re.compile(b"\n\r?\n")


class RequestReader:
    """Reads one connection's requests for hypercorn's protocol: through its ``ReadGate``, with
    adaptive read sizes, each request's head and small body in a turn of ``turns`` when given."""

    __slots__ = ("_gate", "_limit", "_socket", "_stream", "_turns")

    def __init__(
        self,
        stream: trio.SocketStream,
        gate: ReadGate,
        turns: trio.Semaphore | None,
        read_timeout: float,
    ) -> None:
        self._stream = stream
        self._socket = stream.socket
        self._gate = gate
        self._turns = turns
        # How long one read may wait for the client (hypercorn's read_timeout; inf: no limit).
        self._limit = read_timeout

    async def run(self, connection: Connection) -> None:
        """Read the connection until the client closes it."""
        size = FIRST_READ_BYTES
        limit = self._limit
        turns = self._turns
        while True:
            await self._gate.wait_open()
            if turns is not None and connection.between_requests:
                with trio.fail_after(limit):
                    await trio.lowlevel.wait_readable(self._socket)
                head = await self._peek_head() if connection.expects_head else None
                if head is not None and head[1] <= GATHERED_BODY_BYTES:
                    # A request is coming: waiting for its turn is not idling, and must not end
                    # in the keep-alive timeout.
                    await connection.hold_keep_alive()
                    if await self._read_request_in_turn(connection, turns):
                        return  # the client closed the connection
                    if connection.no_request:
                        await connection.restart_keep_alive()
                    size = FIRST_READ_BYTES
                    continue
                if head is not None:
                    if await self._read_large_request(connection, head[0]):
                        return
                    size = FIRST_READ_BYTES
                    continue
            with trio.fail_after(limit):
                data = await self._stream.receive_some(size)
            # A request waiting for its group should not keep its last chunk alive.
            got = len(data)
            await connection.feed(data)
            del data
            if got == 0:
                return
            size = min(size * 2, LARGEST_READ_BYTES) if got == size else FIRST_READ_BYTES

    async def _read_request_in_turn(self, connection: Connection, turns: trio.Semaphore) -> bool:
        """Read the start of the next request in a turn: its head and, when its length is
        declared and small, its whole body. True if the client closed the connection."""
        socket_ = self._socket
        if socket_.fileno() < 0:
            raise trio.ClosedResourceError
        await turns.acquire()
        turn = True
        try:
            data = _read_now(socket_, FIRST_READ_BYTES)
            if data is None:
                return False  # nothing to read after all: wait again
            if not data:
                await connection.feed(b"")
                return True
            # A read that did not fill its buffer took all the kernel had: mostly a whole small
            # request, handed over in one piece as it came. A head declaring a body too large to
            # gather goes with the start of its body in one piece too, as it always did.
            end = _HEAD_END.search(data) if len(data) == FIRST_READ_BYTES else None
            if end is not None and not _may_gather(data, end.end()):
                end = None
            if end is None:
                turns.release()
                turn = False
                await connection.feed(data)
                return False
            head, rest = data[: end.end()], data[end.end() :]
            del data
            await connection.feed(head)
            del head
            body = self._body_to_gather(connection, len(rest))
            if body:
                # The application decides at once whether the body may be read now (it shuts
                # the gate if not).
                await connection.let_application_run()
            if not body or not self._gate.is_open:
                # Anything else (a pipelined request, a body too large) is read as before,
                # without the turn: h11 may wait inside hypercorn until a reply is out.
                turns.release()
                turn = False
                if rest and not connection.failed:
                    await connection.feed(rest)
                return False
            gathered = bytearray(body)
            gathered[: len(rest)] = rest
            filled = len(rest)
            del rest
            with memoryview(gathered) as view:
                while filled < body:
                    got = _read_into_now(socket_, view[filled:])
                    if not got:
                        break  # closed, or the client is slower: the rest is read as before
                    filled += got
            if filled < body:
                del gathered[filled:]
            if gathered:
                await connection.feed(gathered)
            return False
        finally:
            if turn:
                turns.release()

    async def _read_large_request(self, connection: Connection, head_end: int) -> bool:
        """Read a request whose head declares a body larger than GATHERED_BODY_BYTES: the head
        through h11, then the body from the socket to the application in reads as large as the
        kernel has (up to BODY_READ_BYTES), past h11. True if the client closed the connection."""
        socket_ = self._socket
        head = _read_now(socket_, head_end)
        if head is None:
            return False  # nothing to read after all: wait again
        await connection.feed(head)
        if not head:
            return True
        del head
        body = connection.pass_body()
        if body is None or body.remaining <= GATHERED_BODY_BYTES:
            return False  # not a large body of declared length: read as before
        # The application decides whether the body may be read now before any of it is (see
        # _read_request_in_turn); a body it refused without reading is read as before.
        await connection.let_application_run()
        while body.remaining:
            await self._gate.wait_open()
            if body.answered:
                return False  # answered already: hypercorn closes the connection
            # A read asks for what the kernel holds: a buffer over the mmap threshold that
            # got less would stay a mapping of its own (glibc shrinks it in place), one per
            # read of a client sending slowly.
            size = max(_bytes_held(socket_), FIRST_READ_BYTES)
            data = _read_now(socket_, min(body.remaining, size, BODY_READ_BYTES))
            if data is None:
                with trio.fail_after(self._limit):
                    await trio.lowlevel.wait_readable(socket_)
                continue
            if not data:
                # h11 learns of the early end as it does on the usual path (and answers 400).
                await connection.feed(data)
                return True
            await body.give(data)
            del data
        await body.end()
        return False

    async def _peek_head(self) -> tuple[int, int] | None:
        """Where the head of the request the client is sending ends and the body length it
        declares, from the head's first bytes (only a hint: h11's reading of the head decides);
        None when they do not show both. A body up to GATHERED_BODY_BYTES is read in a turn.
        Larger bodies are read as they come, without a turn: in turns, the first reads of a step
        of 2 MB bodies spread out, more of each body came in small reads, and the heap grew with
        them (docs/performance.md)."""
        try:
            start = await self._socket.recv(HEAD_PEEK_BYTES, socket.MSG_PEEK)
        except OSError as exc:
            raise _stream_error(exc) from None
        end = _HEAD_END.search(start)
        declared = None if end is None else _CONTENT_LENGTH.search(start, 0, end.end())
        if end is None or declared is None:
            return None
        return end.end(), int(declared[1])

    @staticmethod
    def _body_to_gather(connection: Connection, started: int) -> int:
        """The length of the body whose head h11 just took, when it is to be read whole: its
        length is declared, at most GATHERED_BODY_BYTES, and more than the ``started`` bytes
        read with the head; 0 otherwise."""
        length = connection.unread_body() or 0
        return length if started < length <= GATHERED_BODY_BYTES else 0


def _may_gather(data: bytes, head_end: int) -> bool:
    """Whether the head at the start of ``data`` declares a body small enough to gather. Only a
    hint, from the first Content-Length field: h11's own reading of the head decides."""
    declared = _CONTENT_LENGTH.search(data, 0, head_end)
    return declared is not None and int(declared[1]) <= GATHERED_BODY_BYTES


def _read_now(socket_: trio.socket.SocketType, size: int) -> bytes | None:
    """Up to ``size`` bytes the kernel holds for ``socket_``; None if it holds none."""
    try:
        return os.read(socket_.fileno(), size)
    except BlockingIOError:
        return None
    except OSError as exc:
        raise _stream_error(exc) from None


def _bytes_held(socket_: trio.socket.SocketType) -> int:
    """How many bytes the kernel holds unread for ``socket_`` (0 if it cannot say)."""
    try:
        held = fcntl.ioctl(socket_.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int.from_bytes(held, sys.byteorder, signed=True)


def _read_into_now(socket_: trio.socket.SocketType, view: memoryview) -> int | None:
    """Bytes the kernel holds for ``socket_`` into ``view``: their count, None if it holds none."""
    try:
        return os.readv(socket_.fileno(), [view])
    except BlockingIOError:
        return None
    except OSError as exc:
        raise _stream_error(exc) from None


def _stream_error(exc: OSError) -> trio.ClosedResourceError | trio.BrokenResourceError:
    # As trio.SocketStream translates them.
    if exc.errno == errno.EBADF:
        return trio.ClosedResourceError()
    return trio.BrokenResourceError(exc)
