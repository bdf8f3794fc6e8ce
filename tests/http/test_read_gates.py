"""The hand-over of read gates from `serve` to the application: a request's connection gate is
found through the ``ReadGates`` given to the body receiver, in the scope extension `serve`
announces, and nowhere else; without them a body is read as it comes."""

from __future__ import annotations

from typing import Any, cast

import trio
import trio.testing
from hypercorn.typing import ASGIReceiveEvent, HTTPScope

from genrm_trio.http._receiving import SPOOL_SLOTS, BodyReceiver, Received
from genrm_trio.http._spool import SpoolBudget
from genrm_trio.http.read_gates import READ_GATE_EXTENSION, ReadGate, ReadGates

BODY = b'{"x": 1}'


def scope(extensions: dict[str, Any] | None) -> HTTPScope:
    value: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/verify",
        "headers": [(b"content-length", b"%d" % len(BODY))],
        "state": {},
    }
    if extensions is not None:
        value["extensions"] = extensions
    return cast(HTTPScope, value)


async def receive() -> ASGIReceiveEvent:
    return {"type": "http.request", "body": BODY, "more_body": False}


def test_the_gate_announced_in_a_requests_scope_is_the_one_found() -> None:
    gates = ReadGates()
    gate = ReadGate()
    announced = gates.extensions(gate)
    assert list(announced) == [READ_GATE_EXTENSION]
    assert gates.of(scope({"http.response.trailers": {}, **announced})) is gate
    assert gates.of(scope({"http.response.trailers": {}})) is None
    assert gates.of(scope(None)) is None
    # Nothing is looked for in the lifespan state any more.
    legacy = scope(None)
    legacy["state"] = {READ_GATE_EXTENSION: gate}
    assert gates.of(legacy) is None


def test_a_gate_is_open_until_shut_and_open_again_once_opened() -> None:
    gate = ReadGate()
    assert gate.is_open
    gate.shut()
    gate.shut()
    assert not gate.is_open
    gate.open()
    assert gate.is_open


async def wait_for_a_slot(receiver: BodyReceiver, request: HTTPScope) -> list[bool]:
    """Post ``request`` while every spool slot is busy (the budget is 0): whether its gate was
    open while it waited, then once it was read."""
    gate = ReadGates().of(request)
    seen: list[bool] = []
    for _ in range(SPOOL_SLOTS):
        await receiver.slots.acquire()
    async with trio.open_nursery() as nursery:

        async def post() -> None:
            async with receiver.receive(request, receive) as received:
                assert isinstance(received, Received)
                assert received.take_body() == BODY
                seen.append(gate is None or gate.is_open)

        nursery.start_soon(post)
        await trio.testing.wait_all_tasks_blocked()
        seen.insert(0, gate is None or gate.is_open)
        for _ in range(SPOOL_SLOTS):
            receiver.slots.release()
    return seen


async def test_a_body_waiting_for_a_slot_shuts_its_gate_when_the_gates_were_handed_over() -> None:
    gates = ReadGates()
    gate = ReadGate()
    receiver = BodyReceiver(SpoolBudget(0), 1 << 20, None, gates)
    assert await wait_for_a_slot(receiver, scope(gates.extensions(gate))) == [False, True]
    assert gate.is_open


async def test_without_the_gates_handed_over_no_gate_is_touched() -> None:
    gate = ReadGate()
    receiver = BodyReceiver(SpoolBudget(0), 1 << 20, None)
    # A gate in the scope is not the receiver's to shut unless it was given the gates.
    request = scope(ReadGates().extensions(gate))
    assert await wait_for_a_slot(receiver, request) == [True, True]
    assert await wait_for_a_slot(receiver, scope(None)) == [True, True]
