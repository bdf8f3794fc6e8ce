"""Read gates: how the application holds a request's unread body in the kernel under `serve`.

`serve` reads each connection through a ``ReadGate``. The application shuts the gate of a
request whose body must wait for room in the memory budget, and opens it again when there is
room; meanwhile `serve` reads nothing more of that connection, and the body stays in the kernel
and the client (TCP's own backpressure). The application learns of the gates explicitly:
`serve` gives ``create_app`` a ``ReadGates``, and announces each connection's gate in the ASGI
scope of every request on it, as the extension named ``READ_GATE_EXTENSION``. Without `serve`
(plain ASGI, httpx's ASGITransport) there is no gate: a body is then read as it comes.
"""

from __future__ import annotations

from typing import Any, Final

import trio
from hypercorn.typing import HTTPScope

__all__ = ["READ_GATE_EXTENSION", "ReadGate", "ReadGates"]

# The ASGI scope extension (``scope["extensions"]``) that carries a connection's gate; as ASGI
# asks of an extension, its value is a dict, here ``{"gate": ReadGate}``.
READ_GATE_EXTENSION: Final = "genrm_trio.read_gate"


class ReadGate:
    """Whether a connection's socket may be read. Shut by the application when it cannot take
    the request's body yet, opened again when it can; open by default."""

    __slots__ = ("_opened",)

    def __init__(self) -> None:
        self._opened: trio.Event | None = None

    @property
    def is_open(self) -> bool:
        return self._opened is None

    def shut(self) -> None:
        if self._opened is None:
            self._opened = trio.Event()

    def open(self) -> None:
        if self._opened is not None:
            self._opened.set()
            self._opened = None

    async def wait_open(self) -> None:
        opened = self._opened
        if opened is not None:
            await opened.wait()


class ReadGates:
    """What `serve` hands the application so that it finds the gate of the connection a request
    came on: ``extensions`` on the server's side, ``of`` on the application's."""

    __slots__ = ()

    def extensions(self, gate: ReadGate) -> dict[str, dict[str, Any]]:
        """The scope extensions that announce ``gate`` in each request of its connection."""
        return {READ_GATE_EXTENSION: {"gate": gate}}

    def of(self, scope: HTTPScope) -> ReadGate | None:
        """The gate of the connection ``scope``'s request came on; None if it has none."""
        extension = (scope.get("extensions") or {}).get(READ_GATE_EXTENSION)
        gate = None if extension is None else extension.get("gate")
        return gate if isinstance(gate, ReadGate) else None
