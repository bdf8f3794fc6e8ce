"""A stand-in for a genrm-trio server in tests of its clients: a raw HTTP/1.1 server on loopback
that answers each route from a table and records every request, so that a test can put the
server in states that are hard to reach for real (not ready, another group size, no `/readyz`)
and see what the client sent.

Each route (`"GET /readyz"`) has a list of answers given in turn, the last one repeated; a route
without answers gets 404. Every connection is closed after its answer.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

Answer = tuple[int, Any]  # status, JSON body
_REASONS = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}


@dataclass
class StandIn:
    url: str
    answers: dict[str, list[Answer]]
    requests: list[str] = field(default_factory=list)  # "GET /readyz", in arrival order

    def answer(self, route: str) -> Answer:
        queued = self.answers.get(route)
        if not queued:
            return 404, {"detail": "Not Found"}
        return queued.pop(0) if len(queued) > 1 else queued[0]


async def _read_request(stream: trio.SocketStream) -> str | None:
    """The request's method and path (its body read and dropped), or None if it never came."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    while len(body) < length:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        body += chunk
    method, path = lines[0].split(" ")[:2]
    return f"{method} {path}"


async def _serve(stand_in: StandIn, stream: trio.SocketStream) -> None:
    async with stream:
        try:
            route = await _read_request(stream)
            if route is None:
                return
            stand_in.requests.append(route)
            status, payload = stand_in.answer(route)
            body = json.dumps(payload).encode()
            head = (
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
                f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
                "connection: close\r\n\r\n"
            ).encode()
            await stream.send_all(head + body)
        except trio.BrokenResourceError:
            return


@contextmanager
def stand_in_server(answers: Mapping[str, Sequence[Answer]]) -> Iterator[StandIn]:
    """Run a stand-in on a free loopback port in a thread of its own (its clients may run their
    own event loops in the test's thread) until the block ends."""
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        stand_in = StandIn(f"http://127.0.0.1:{port}", {k: list(v) for k, v in answers.items()})
        with trio.CancelScope() as scope:
            holder.update(stand_in=stand_in, scope=scope, token=trio.lowlevel.current_trio_token())
            started.set()
            await trio.serve_listeners(partial(_serve, stand_in), listeners)

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield holder["stand_in"]
    finally:
        trio.from_thread.run_sync(holder["scope"].cancel, trio_token=holder["token"])
        thread.join(10)
