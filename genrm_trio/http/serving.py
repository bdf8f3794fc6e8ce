"""The accept side of `serve`: our own Trio listener, served by `trio.serve_listeners`, in front
of hypercorn's HTTP/1.1 protocol.

A trainer opens a fresh connection per rollout and posts a whole step at once, and each of those
connections then waits for its group. trio's ``SocketListener``, which hypercorn's own worker
serves, accepts one connection per trip through the scheduler; and when descriptors run out,
`serve_listeners` logs a traceback every 100 ms while the judge's connections fail for want of
descriptors. ``GatedListener`` instead:

- accepts in batches: after one wait for the socket it returns up to ``ACCEPT_BATCH`` queued
  connections without a checkpoint, so that `serve_listeners` starts their handlers back to back
  and the kernel's listen queue drains as fast as clients fill it;
- keeps client connections under a cap sized from the open-file limit, so the descriptors a group
  needs to be judged and answered always remain; a connection over the cap is answered at once
  with a 503 naming the limit (not left hanging), and the episode is logged once, with its end;
- treats running out of descriptors anyway (EMFILE and kin) as a logged pause within ``accept``,
  which `serve_listeners` never sees.

It replaced an accept loop of `serve`'s own that did the same: bursts of 8,192 fresh connections
ran at the same rate and server CPU per /verify through either, with no listen-queue overflow
(docs/performance.md, "The accept side as a Trio listener").

Each connection it admits is served by hypercorn's protocol and read by its own read loop
(http/_read_loop.py), through a ``ReadGate`` announced to the application in the scope of every
request on the connection (http/read_gates.py). What it needs of hypercorn and h11 beyond their
public APIs is in http/_hypercorn_seam.py; what it leaves out of hypercorn's own worker (TLS,
HTTP/2 and QUIC, ``max_requests``, ...) is listed in docs/running.md.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.typing import Framework

from genrm_trio.http._hypercorn_seam import running
from genrm_trio.http._read_loop import RECEIVING_REQUESTS, RequestReader
from genrm_trio.http.read_gates import ReadGate, ReadGates
from genrm_trio.wire.rendering import error_body

log = logging.getLogger("genrm_trio")

# One wake-up of the listener takes at most this many connections before letting the handlers
# started for them run. With thousands of connection tasks runnable, one pass of the
# scheduler takes long enough for a fast client to refill the queue, so each wake-up may empty
# the default backlog whole (accepting one costs tens of microseconds). With 256, one of two
# bursts of 8,192 in bench_burst.py saw 8 listen-queue overflows; with 4,096, none in two.
ACCEPT_BATCH = 4096
# A worker of `serve --workers` shares its listening socket with the others, and every one of
# them is woken for each new connection: taking a whole burst in one wake-up would leave the
# others idle while it parses every body. In small batches, whichever worker comes back to its
# listener first (the least busy one) takes the next connections.
WORKER_ACCEPT_BATCH = 16
# accept(2) errors meaning the process or the system is out of descriptors or memory: waiting is
# the only remedy, and the connection stays in the listen queue meanwhile.
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
OUT_OF_RESOURCES_PAUSE_S = 0.1
# accept(2) errors about the one connection being accepted (it went away, or a firewall said no);
# the listener carries on with the next.
CONNECTION_GONE = frozenset(
    {errno.ECONNABORTED, errno.ECONNRESET, errno.EPROTO, errno.EPERM, errno.ETIMEDOUT}
)
# A connection answered 503 is drained for at most this long, so that the request body the
# client is still sending does not turn the reply into a connection reset.
REJECT_DRAIN_S = 2.0


def over_limit_reply(connections: int, open_file_limit: int) -> bytes:
    """The whole HTTP reply given to a connection over the client-connection cap."""
    body = error_body(
        f"server at its connection limit: {connections} client connections are open "
        f"(open-file limit {open_file_limit}); retry later, or raise the open-file limit "
        "of genrm-trio serve"
    )
    head = (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nretry-after: 1\r\nconnection: close\r\n\r\n" % len(body)
    )
    return head + body


class ConnectionGate:
    """Counts client connections against their cap and logs when the cap or the descriptors
    run out, once per episode. Plain bookkeeping: no method awaits."""

    def __init__(self, capacity: int, open_file_limit: int, rejecting_slots: int) -> None:
        self.capacity = capacity
        self.open_file_limit = open_file_limit
        self.rejecting_slots = rejecting_slots
        self.open = 0
        self.rejecting = 0
        self.rejected_total = 0
        self._rejected_in_episode = 0
        self._starved_since: float | None = None
        self.room = trio.Event()
        self.reply = over_limit_reply(capacity, open_file_limit)

    @property
    def can_accept(self) -> bool:
        return self.open < self.capacity or self.rejecting < self.rejecting_slots

    def admit(self) -> bool:
        """Count a newly accepted connection in; False if it must be answered 503."""
        if self.open < self.capacity:
            self.open += 1
            if self._rejected_in_episode:
                log.warning(
                    "accepting client connections again after answering %d with 503 at the "
                    "connection limit",
                    self._rejected_in_episode,
                )
                self._rejected_in_episode = 0
            return True
        if not self._rejected_in_episode:
            log.warning(
                "connection limit reached: %d client connections are open under the open-file "
                "limit %d; answering new connections 503 until some close. Raise the open-file "
                "limit (ulimit -n) for bursts this large",
                self.open,
                self.open_file_limit,
            )
        self._rejected_in_episode += 1
        self.rejected_total += 1
        self.rejecting += 1
        return False

    def closed(self, *, admitted: bool) -> None:
        if admitted:
            self.open -= 1
        else:
            self.rejecting -= 1
        self.room.set()
        self.room = trio.Event()

    def out_of_descriptors(self, exc: OSError) -> None:
        if self._starved_since is None:
            self._starved_since = time.monotonic()
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            log.error(
                "out of file descriptors: accept failed with %s (%s) while %d client "
                "connections are open (open-file limit %d); new connections wait in the listen "
                "queue until descriptors are freed",
                name,
                os.strerror(exc.errno or 0),
                self.open,
                self.open_file_limit,
            )

    def accepted(self) -> None:
        if self._starved_since is not None:
            log.warning(
                "accepting connections again after %.1f s out of file descriptors",
                time.monotonic() - self._starved_since,
            )
            self._starved_since = None


async def _reject(stream: trio.SocketStream, reply: bytes) -> None:
    """Answer a connection over the cap with ``reply`` (the 503), and drain what the client is
    still sending, for at most REJECT_DRAIN_S."""
    try:
        with trio.move_on_after(REJECT_DRAIN_S):
            await stream.send_all(reply)
            await stream.send_eof()
            while await stream.receive_some(65536):
                pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


class Accepted(trio.abc.AsyncResource):
    """A connection the listener accepted: ``admitted`` under the cap, or to be answered 503 at
    once. Closing it gives its place back to the gate."""

    __slots__ = ("_gate", "admitted", "stream")

    def __init__(self, stream: trio.SocketStream, gate: ConnectionGate, admitted: bool) -> None:
        self.stream = stream
        self.admitted = admitted
        self._gate: ConnectionGate | None = gate

    async def aclose(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.closed(admitted=self.admitted)
        await self.stream.aclose()


class GatedListener(trio.abc.Listener[Accepted]):
    """A listening socket as a Trio listener, accepting through the connection cap (``gate``)
    in batches of up to ``batch``, and pausing, logged, while descriptors run out."""

    def __init__(self, sock: socket.socket, gate: ConnectionGate, batch: int) -> None:
        sock.setblocking(False)
        self._socket = sock
        self._gate = gate
        self._batch = batch
        # What this wake-up may still take before waiting for the socket again.
        self._left = 0

    async def accept(self) -> Accepted:
        """The next connection. After a wait for the socket, up to ``batch`` connections the
        kernel has queued are returned one after another without a checkpoint, so that
        ``trio.serve_listeners`` starts each one's handler and takes the next at once; the next
        wait lets those handlers run."""
        gate = self._gate
        sock = self._socket
        while True:
            if not self._left or not gate.can_accept:
                while not gate.can_accept:
                    await gate.room.wait()
                await trio.lowlevel.wait_readable(sock)
                self._left = self._batch
            self._left -= 1
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                self._left = 0
                continue
            except OSError as exc:
                if exc.errno in CONNECTION_GONE:
                    continue
                if exc.errno in OUT_OF_RESOURCES:
                    gate.out_of_descriptors(exc)
                    await trio.sleep(OUT_OF_RESOURCES_PAUSE_S)
                    self._left = 0
                    continue
                raise
            gate.accepted()
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(conn))
            return Accepted(stream, gate, gate.admit())

    async def aclose(self) -> None:
        trio.lowlevel.notify_closing(self._socket)
        self._socket.close()
        await trio.lowlevel.checkpoint()


async def serve_app(
    app: Framework,
    settings: HypercornConfig,
    gate: ConnectionGate,
    *,
    shutdown_trigger: Callable[[], Awaitable[Any]],
    read_gates: ReadGates | None = None,
    accept_batch: int = ACCEPT_BATCH,
    turns: trio.Semaphore | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `settings.bind` until `shutdown_trigger` returns, as hypercorn's trio
    worker does (ASGI lifespan, graceful timeout), but accepting through `gate`; requests are
    read in `turns` (by default RECEIVING_REQUESTS at once). Each connection's ReadGate is
    announced to `app` through `read_gates`, the object `create_app` was given."""
    reading = trio.Semaphore(RECEIVING_REQUESTS) if turns is None else turns
    read_timeout = settings.read_timeout or math.inf
    async with running(app, settings) as worker:
        listening = worker.listen()

        def handle(accepted: Accepted) -> Awaitable[None]:
            # What serve_listeners awaits for the connection. Not a coroutine function: each of
            # thousands of waiting connections would hold one more frame for it.
            stream = accepted.stream
            if not accepted.admitted:
                return _reject(stream, gate.reply)
            reads = ReadGate()
            reader = RequestReader(stream, reads, reading, read_timeout)
            extensions = None if read_gates is None else read_gates.extensions(reads)
            return worker.serve_connection(stream, reader.run, extensions)

        listeners = [GatedListener(sock, gate, accept_batch) for sock, _ in listening]

        async def accept(handlers: trio.Nursery) -> None:
            await trio.serve_listeners(handle, listeners, handler_nursery=handlers)

        task_status.started([url for _, url in listening])
        await worker.serve(accept, shutdown_trigger)
