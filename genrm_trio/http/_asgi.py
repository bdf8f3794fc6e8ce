"""Replies written straight to ASGI, and the one mapping of HTTP errors to `{"detail": ...}`
bodies (W-3) that the routes answered from ASGI and the Quart routes share."""

from __future__ import annotations

from typing import Final

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout

from genrm_trio.http._receiving import Refused
from genrm_trio.wire.parsing import body_too_large
from genrm_trio.wire.rendering import error_body

JSON: Final = "application/json"
ALLOW_POST: Final = ((b"allow", b"POST"),)
# A reply from a body in memory goes out in pieces of about this size: its large values are
# views of the request's body, so no copy of the whole row is made while it is sent.
REPLY_PIECE_BYTES: Final = 64 * 1024


def http_error_body(exc: HTTPException) -> bytes:
    """A werkzeug HTTP error as `{"detail": "<name>: <description>"}`."""
    return error_body(f"{exc.name}: {exc.description}")


def http_error_reply(exc: HTTPException, max_body_bytes: int) -> tuple[int, bytes]:
    """The status and body of a werkzeug HTTP error; a body over the limit names the limit."""
    if isinstance(exc, RequestEntityTooLarge):
        return 413, error_body(body_too_large(max_body_bytes))
    return exc.code or 500, http_error_body(exc)


async def send_reply(
    send: ASGISendCallable,
    status: int,
    payload: bytes,
    extra_headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    headers.extend(extra_headers)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def send_parts(send: ASGISendCallable, status: int, parts: list[bytes | memoryview]) -> None:
    """Send a reply given in parts, without joining a large one into a single copy."""
    length = sum(len(part) for part in parts)
    if length <= REPLY_PIECE_BYTES:
        await send_reply(send, status, b"".join(parts))
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % length)]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    pending: list[bytes | memoryview] = []
    pending_size = 0
    for part in parts:
        if len(part) < REPLY_PIECE_BYTES:
            pending.append(part)
            pending_size += len(part)
            if pending_size < REPLY_PIECE_BYTES:
                continue
            piece = b"".join(pending)
            pending, pending_size = [], 0
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            continue
        if pending:
            piece = b"".join(pending)
            pending, pending_size = [], 0
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        view = memoryview(part)
        for start in range(0, len(view), REPLY_PIECE_BYTES):
            piece = bytes(view[start : start + REPLY_PIECE_BYTES])
            await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b"".join(pending), "more_body": False})


async def cancel_on_disconnect(receive: ASGIReceiveCallable, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` once the client has gone (the body has been read by then)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def refusal_reply(refused: Refused, max_body_bytes: int) -> tuple[int, bytes]:
    """The reply to a body that was not read: too large (413) or too slow to arrive (408)."""
    exc = RequestEntityTooLarge() if refused.status == 413 else RequestTimeout()
    return http_error_reply(exc, max_body_bytes)
