"""`POST /verify`, answered straight from ASGI in the order a request lives: admit, read, parse,
hand to the engine, render, send.

Every rollout of every group passes through here, so the route skips Quart's per-request
context, routing and response objects, which cost about as much CPU as the rest of the request.
Quart never sees `/verify`: before/after-request hooks do not run for it.
"""

from __future__ import annotations

import hashlib
import logging
from contextlib import AsyncExitStack
from typing import Final, cast

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, HTTPScope
from werkzeug.exceptions import InternalServerError

from genrm_trio.config import Config
from genrm_trio.core import messages
from genrm_trio.core.canonical import fingerprint_json
from genrm_trio.core.outcomes import Masked, Outcome, Scored
from genrm_trio.http._asgi import (
    cancel_on_disconnect,
    http_error_reply,
    refusal_reply,
    send_parts,
    send_reply,
)
from genrm_trio.http._receiving import BodyReceiver, Refused
from genrm_trio.http._request_counts import RequestCounts
from genrm_trio.http._spool import Spool, SpoolError, SpoolFile, spool_failed
from genrm_trio.runtime.engine import Engine
from genrm_trio.wire.bodies import BadRequest, EchoValue, FileSpan, VerifyRequest
from genrm_trio.wire.parsing import parse_verify_body
from genrm_trio.wire.rendering import (
    bound_failure_text,
    error_body,
    masked_row_parts,
    scored_row_parts,
)

log = logging.getLogger("genrm_trio")

_SHUTTING_DOWN: Final = error_body(messages.SHUTTING_DOWN)


class VerifyRoute:
    """`POST /verify` of one server. The engine counts every request it answers; this route
    counts the ones it answers itself (refused, invalid, unspoolable, a defect)."""

    def __init__(
        self,
        engine: Engine,
        receiver: BodyReceiver,
        spool: Spool,
        config: Config,
        counts: RequestCounts,
    ) -> None:
        self.engine = engine
        self.counts = counts
        self.receiver = receiver
        self.spool = spool
        self.config = config
        self._internal_error = http_error_reply(InternalServerError(), config.max_body_bytes)

    async def __call__(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if self.engine.closed:
            await self._refuse(send, "unavailable", 503, _SHUTTING_DOWN)
            return
        # Admitted by its Content-Length, then read; its share of the body budget is given back
        # on leaving the block, once the reply is out.
        async with self.receiver.receive(scope, receive) as received:
            if received is None:
                return  # the client left while sending
            if isinstance(received, Refused):
                reply = refusal_reply(received, self.config.max_body_bytes)
                await self._refuse(send, "invalid", *reply)
                return
            parsed = await self._parse(received.take_body(), send)
            if parsed is None:
                return
            if received.within_budget:
                received.admitted()
                await self._verify_and_reply(parsed, None, receive, send)
                return
            spooled = await self._spool(parsed, send)
            if spooled is None:
                return
            try:
                parsed.spool_out()
                received.spooled()
                await self._verify_and_reply(parsed, spooled, receive, send)
            finally:
                await self.spool.remove(spooled[0])

    async def _parse(self, body: bytes, send: ASGISendCallable) -> VerifyRequest | None:
        """The validated request; None once a rejection has been sent (W-5: nothing changed)."""
        try:
            return parse_verify_body(body, self.config)
        except BadRequest as exc:
            await self._refuse(send, "invalid", exc.status, error_body(exc.detail))
        except Exception:
            await send_reply(send, *self._defect())
        return None

    async def _spool(
        self, parsed: VerifyRequest, send: ASGISendCallable
    ) -> tuple[SpoolFile, tuple[bytes, bytes]] | None:
        """Beyond the memory budget the body waits in a file; None once a 503 has been sent.
        Nothing has happened to the request's group yet, so a disk that cannot take it is a
        clean 503."""
        try:
            return await trio.to_thread.run_sync(_spool_and_fingerprint, self.spool, parsed)
        except SpoolError as exc:
            detail = spool_failed(exc.cause, self.receiver.budget)
            await self._refuse(send, "unavailable", 503, error_body(detail))
            return None

    async def _verify_and_reply(
        self,
        parsed: VerifyRequest,
        spooled: tuple[SpoolFile, tuple[bytes, bytes]] | None,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
    ) -> None:
        """Hand the request to the engine, render its row and send it."""
        file, fingerprints = (None, None) if spooled is None else spooled
        reply: tuple[int, list[EchoValue]] | None = None
        # The engine's block is left once the reply is out: keeping the member's fingerprint
        # for replays (C-34) then does not delay it.
        async with AsyncExitStack() as answered:
            try:
                # A client that leaves while its group is still collecting or judging cancels
                # only its own wait (C-51), as it does through Quart.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancel_on_disconnect, receive, nursery.cancel_scope)
                    verified = await answered.enter_async_context(
                        self.engine.verify(parsed, fingerprints=fingerprints)
                    )
                    reply = _row(parsed, verified.outcome)
                    nursery.cancel_scope.cancel()
            except Exception:
                status, body = self._defect()
                reply = (status, [body])
            if reply is None:
                return  # the client left while its group was collecting or judging
            await self._send(send, *reply, file)

    async def _send(
        self, send: ASGISendCallable, status: int, parts: list[EchoValue], file: SpoolFile | None
    ) -> None:
        if file is None:
            await send_parts(send, status, cast(list[bytes | memoryview], parts))
            return
        try:
            await _send_streamed(send, status, parts, self.spool, file)
        except SpoolError as exc:
            # Only a file that cannot be opened gets here: nothing was sent yet.
            log.error("GenRM could not read a spooled request body: %s", exc.cause)
            detail = spool_failed(exc.cause, self.receiver.budget)
            await send_reply(send, 503, error_body(detail))

    async def _refuse(self, send: ASGISendCallable, label: str, status: int, body: bytes) -> None:
        """Answer a request the engine gave no outcome for, counted by ``label``."""
        self.counts.verify_answered(label)
        await send_reply(send, status, body)

    def _defect(self) -> tuple[int, bytes]:
        """The 500 for a bug while reading or answering a request, counted and logged with its
        traceback; called from the ``except`` block that caught it."""
        self.counts.verify_answered("error")
        log.exception("Exception on request POST /verify")
        return self._internal_error


def _row(request: VerifyRequest, outcome: Outcome) -> tuple[int, list[EchoValue]]:
    """The reply in parts; a spooled request's large echoed values stay spans of its file."""
    if isinstance(outcome, Scored):
        return 200, scored_row_parts(request, outcome.reward, outcome.metrics)
    if isinstance(outcome, Masked):
        text = bound_failure_text(outcome.text, outcome.suffix)
        return 200, masked_row_parts(request, text, outcome.placeholder)
    return outcome.status, [error_body(outcome.detail)]


def _spool_and_fingerprint(
    spool: Spool, request: VerifyRequest
) -> tuple[SpoolFile, tuple[bytes, bytes]]:
    """In a worker thread: the body to a file, and what its member's identity needs once the
    bytes are gone from memory (the raw digest and the canonical fingerprint)."""
    file = spool.write_sync(request.body)
    raw = request.response_view()
    return file, (hashlib.sha256(raw).digest(), fingerprint_json(raw))


async def _send_streamed(
    send: ASGISendCallable, status: int, parts: list[EchoValue], spool: Spool, file: SpoolFile
) -> None:
    """Send a reply whose large parts are read from the request's spool file as it goes."""
    length = sum(len(part) for part in parts)
    # Opened before the head is sent, so that a missing file is still a whole 503.
    async with spool.reader(file) as reader:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % length)]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        pending: list[bytes | memoryview] = []
        for part in parts:
            if not isinstance(part, FileSpan):
                pending.append(part)
                continue
            if pending:
                await send(
                    {"type": "http.response.body", "body": b"".join(pending), "more_body": True}
                )
                pending = []
            try:
                async for chunk in reader.chunks(part.start, part.end):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except SpoolError as exc:
                # The head is out: the connection is cut, and the length it announced tells the
                # client the row is incomplete; it is never taken for a whole one.
                raise RuntimeError(f"reply cut short: {exc.cause}") from None
        await send({"type": "http.response.body", "body": b"".join(pending), "more_body": False})
