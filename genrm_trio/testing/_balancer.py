"""A round-robin TCP balancer for tests and benchmarks of several genrm-trio processes.

Each accepted connection goes to the next backend in turn and is relayed byte for byte in both
directions (with half-closes passed on), as HAProxy or nginx in `mode tcp` / `stream` would do
with round-robin. A backend that refuses the connection is skipped for that connection, so a
killed process's share goes to the others until it is back on its port. It knows nothing about
HTTP or groups: members of one group land on whichever process their connection reaches.

It also counts *turns*: each time a client sends after its backend has answered (or sends for
the first time). For a request/reply protocol that is the number of round trips, pipelined
commands included as one, which is how the benchmarks count round trips to Redis.

Run it as a process with
``python -m genrm_trio.testing._balancer --port 0 --backend 127.0.0.1:8001 --backend ...``;
it prints ``balancer listening on http://127.0.0.1:<port>`` once it accepts connections.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Sequence

import trio

RELAY_CHUNK = 65536
Backend = tuple[str, int]


def parse_backend(text: str) -> Backend:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"backend must be host:port, got {text!r}")
    return host, int(port)


class RoundRobinBalancer:
    """Spreads connections over `backends` in turn; `connections` counts them per backend."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        if not backends:
            raise ValueError("a balancer needs at least one backend")
        self.backends = list(backends)
        self.connections: Counter[Backend] = Counter()
        self.refused = 0
        self.turns = 0
        self._next = 0

    async def _open_backend(self) -> trio.SocketStream | None:
        for _ in range(len(self.backends)):
            backend = self.backends[self._next]
            self._next = (self._next + 1) % len(self.backends)
            try:
                stream = await trio.open_tcp_stream(*backend)
            except OSError:
                continue
            self.connections[backend] += 1
            return stream
        return None

    async def handle(self, client: trio.SocketStream) -> None:
        """Relay one client connection to the next backend that accepts it."""
        backend = await self._open_backend()
        if backend is None:
            self.refused += 1
            await client.aclose()
            return
        answered = True

        def client_sent() -> None:
            nonlocal answered
            if answered:
                self.turns += 1
                answered = False

        def backend_sent() -> None:
            nonlocal answered
            answered = True

        async with client, backend, trio.open_nursery() as nursery:
            nursery.start_soon(_relay, client, backend, nursery.cancel_scope, client_sent)
            nursery.start_soon(_relay, backend, client, nursery.cancel_scope, backend_sent)

    async def serve(
        self,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept connections until cancelled; `task_status.started` gets the bound port."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound: int = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self.handle, listeners)
            task_status.started(bound)


async def _relay(
    source: trio.SocketStream,
    sink: trio.SocketStream,
    scope: trio.CancelScope,
    on_data: Callable[[], None],
) -> None:
    """Copy `source` to `sink` until EOF, then half-close `sink`; any error ends both ways."""
    try:
        while data := await source.receive_some(RELAY_CHUNK):
            on_data()
            await sink.send_all(data)
        await sink.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        scope.cancel()


async def _main(port: int, backends: list[Backend]) -> None:
    balancer = RoundRobinBalancer(backends)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(balancer.serve, port)
        print(f"balancer listening on http://127.0.0.1:{bound}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m genrm_trio.testing._balancer",
        description="Round-robin TCP balancer over the given backends (loopback only).",
    )
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free)")
    parser.add_argument(
        "--backend", type=parse_backend, action="append", required=True, help="host:port"
    )
    args = parser.parse_args(argv)
    try:
        trio.run(_main, args.port, args.backend)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
