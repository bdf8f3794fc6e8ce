"""The judge client: one comparison in, a verdict or a judge failure out, over HTTP/1.1 on Trio.

It runs the attempt loop that attempts.py decides, under one FIFO concurrency limit per server.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import select
import ssl
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial
from http.cookiejar import Cookie, CookiePolicy
from typing import Any, Literal, cast

import httpx
import trio

from genrm_trio.config import Config
from genrm_trio.core.verdicts import Verdict
from genrm_trio.judge.attempts import (
    ERROR_BODY_BYTES,
    AttemptOutcome,
    Conclusion,
    Failed,
    FatalFailure,
    ParseFailure,
    TransientFailure,
    budget_exhausted_log_text,
    conclude,
    conclude_without_time,
    draw_backoff,
    fallback_log_text,
    judge_error_text,
    max_output_tokens_text,
    parse_retry_after,
    reply_outcome,
    retry_log_text,
    retry_sleep,
    short_cause,
    status_outcome,
    timeout_outcome,
    transport_outcome,
)
from genrm_trio.judge.requests import (
    build_body,
    encode_body,
    judge_headers,
    judge_url,
    resolve_api_key,
)
from genrm_trio.judge.slots import JudgeSlots, Lane

logger = logging.getLogger("genrm_trio")

# A judge reply is a few kilobytes; a body beyond this is refused rather than held in memory.
MAX_REPLY_BYTES = 16 * 1024 * 1024
# Error bodies are read this far so that the connection can be reused; longer ones are cut off.
MAX_ERROR_BODY_BYTES = 64 * 1024
# httpx's default: an idle connection older than this is closed rather than reused.
KEEPALIVE_EXPIRY_S = 5.0
# httpcore's text for a connection closed before a complete reply head (J-21: transient).
CLOSED_WITHOUT_REPLY = "Server disconnected without sending a response."
_RECEIVE_BYTES = 65536
# A reply head (status line and headers) or a chunk-size line longer than this is refused.
_HEAD_LIMIT = 64 * 1024
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n]*)?")
_REDACTED = "<redacted>"


@dataclass(frozen=True, slots=True)
class JudgeTask:
    """One comparison as the judge sees it; every attempt resends exactly these texts."""

    history: list[dict[str, str]]  # judge-facing conversation, already converted (J-7)
    principle: str | None  # effective principle (J-6 applied), or None
    text_1: str  # response_1 as sent (J-5 applied)
    text_2: str  # response_2 as sent
    pair: tuple[int, int]  # presentation-order slots, for texts and logs
    judge_pass: int
    # Where its attempts wait for a slot (``JudgeClient.slots``); None: a complete lane of its
    # own, ranked by when the comparison started.
    lane: Lane | None = None


@dataclass(frozen=True, slots=True)
class JudgeFailure:
    """A failed comparison: its J-40 judge error text and the attempts it made."""

    text: str
    attempts: int


@dataclass(frozen=True, slots=True)
class JudgeVerdict:
    """A comparison with a verdict; ``fallback`` marks J-24's default verdict."""

    verdict: Verdict
    fallback: bool
    attempts: int


JudgeResult = JudgeVerdict | JudgeFailure


class _RefuseCookies(CookiePolicy):
    """Judge requests carry only the J-8 headers, so cookies a judge sets are never kept."""

    netscape = True
    rfc2965 = False
    hide_cookie2 = True

    def set_ok(self, cookie: Cookie, request: Any) -> bool:
        return False

    def return_ok(self, cookie: Cookie, request: Any) -> bool:
        return False

    def domain_return_ok(self, domain: str, request: Any) -> bool:
        return False

    def path_return_ok(self, path: str, request: Any) -> bool:
        return False


class _Connection:
    """One keep-alive HTTP/1.1 connection to the judge and the bytes read but not yet used."""

    __slots__ = ("buffer", "idle_since", "socket", "stream")

    def __init__(self, stream: trio.abc.Stream, socket: trio.socket.SocketType) -> None:
        self.stream = stream
        self.socket = socket
        self.buffer = bytearray()
        self.idle_since = 0.0

    async def fill(self) -> bool:
        """Read more bytes into the buffer; False when the judge has closed the connection."""
        try:
            data = await self.stream.receive_some(_RECEIVE_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise httpx.ReadError(str(exc)) from exc
        if not data:
            return False
        self.buffer += data
        return True


class _Reply:
    """A judge reply whose status line and headers have been read; the body is read on demand.

    Framing follows RFC 9112: no body for 1xx, 204 and 304, else chunked, else Content-Length,
    else everything until the judge closes the connection.
    """

    __slots__ = (
        "chunk_left",
        "complete",
        "connection",
        "expected",
        "headers",
        "keep_alive",
        "left",
        "mode",
        "status",
    )
    mode: Literal["length", "chunked", "close"]

    def __init__(
        self,
        connection: _Connection,
        status: int,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
    ) -> None:
        self.connection = connection
        self.status = status
        self.headers = headers
        self.keep_alive = keep_alive
        self.expected = 0  # Content-Length
        self.left = 0  # body bytes still expected
        self.chunk_left = -1  # bytes left of the current chunk; -1 before a chunk-size line
        self.complete = False
        encoding = self.header(b"transfer-encoding")
        length = self.header(b"content-length")
        if status in (204, 304):
            self.mode, self.complete = "length", True
        elif encoding is not None:
            if encoding.rsplit(b",", 1)[-1].strip().lower() != b"chunked":
                raise httpx.RemoteProtocolError(f"unsupported Transfer-Encoding {encoding!r}")
            self.mode = "chunked"
        elif length is not None:
            values = {value.strip() for value in length.split(b",")}
            if len(values) != 1 or not next(iter(values)).isdigit():
                raise httpx.RemoteProtocolError("bad Content-Length")
            self.mode = "length"
            self.expected = self.left = int(next(iter(values)))
            self.complete = self.left == 0
        else:
            self.mode, self.keep_alive = "close", False

    def header(self, name: bytes) -> bytes | None:
        """The value of header ``name`` (lower case); repeated headers joined with commas."""
        values = [value for key, value in self.headers if key == name]
        return b", ".join(values) if values else None

    @property
    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.connection.buffer

    async def next_part(self) -> bytes:
        """The next piece of the body as sent (before any Content-Encoding); b"" at its end."""
        if self.complete:
            return b""
        connection = self.connection
        buffer = connection.buffer
        if self.mode == "length":
            if not buffer and not await connection.fill():
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body "
                    f"(received {self.expected - self.left} bytes, expected {self.expected})"
                )
            part = bytes(buffer[: self.left])
            del buffer[: len(part)]
            self.left -= len(part)
            self.complete = self.left == 0
            return part
        if self.mode == "close":
            if not buffer and not await connection.fill():
                self.complete = True
                return b""
            part = bytes(buffer)
            buffer.clear()
            return part
        return await self._next_chunk()

    async def _next_chunk(self) -> bytes:
        connection = self.connection
        buffer = connection.buffer
        while self.chunk_left < 0:
            line_end = buffer.find(b"\r\n")
            if line_end < 0:
                if len(buffer) > _HEAD_LIMIT:
                    raise httpx.RemoteProtocolError("chunk size line too long")
                await self._fill_chunked()
                continue
            size = bytes(buffer[:line_end]).split(b";", 1)[0].strip()
            try:
                self.chunk_left = int(size, 16)
            except ValueError:
                raise httpx.RemoteProtocolError(f"bad chunk size {size[:40]!r}") from None
            del buffer[: line_end + 2]
            if self.chunk_left == 0:
                await self._skip_trailers()
                return b""
        while not buffer:
            await self._fill_chunked()
        part = bytes(buffer[: self.chunk_left])
        del buffer[: len(part)]
        self.chunk_left -= len(part)
        if self.chunk_left == 0:
            while len(buffer) < 2:
                await self._fill_chunked()
            if buffer[:2] != b"\r\n":
                raise httpx.RemoteProtocolError("chunk not followed by CRLF")
            del buffer[:2]
            self.chunk_left = -1
        return part

    async def _skip_trailers(self) -> None:
        buffer = self.connection.buffer
        while True:
            line_end = buffer.find(b"\r\n")
            if line_end < 0:
                if len(buffer) > _HEAD_LIMIT:
                    raise httpx.RemoteProtocolError("trailers too long")
                await self._fill_chunked()
                continue
            del buffer[: line_end + 2]
            if line_end == 0:
                self.complete = True
                return

    async def _fill_chunked(self) -> None:
        if not await self.connection.fill():
            raise httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body "
                "(incomplete chunked read)"
            )

    async def read_at_most(self, limit: int, chunks: list[bytes]) -> bool:
        """Append the body to ``chunks`` until more than ``limit`` bytes; True if it all fit.

        A body with a Content-Encoding is decoded the way httpx decodes it, by httpx itself.
        """
        if self.header(b"content-encoding") is not None:
            response = httpx.Response(200, headers=self.headers, stream=_ReplyBody(self))
            return await _read_at_most(response, limit, chunks)
        size = 0
        while part := await self.next_part():
            chunks.append(part)
            size += len(part)
            if size > limit:
                return False
        return True


class _ReplyBody(httpx.AsyncByteStream):
    def __init__(self, reply: _Reply) -> None:
        self._reply = reply

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while part := await self._reply.next_part():
            yield part


def _peer_has_spoken(socket: trio.socket.SocketType) -> bool:
    """An idle keep-alive connection with bytes (or an end of stream) to read is not reusable."""
    poller = select.poll()
    poller.register(socket.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class _JudgeWire:
    """The judge's HTTP/1.1 client: keep-alive connections checked out and returned in O(1).

    httpx's client and httpcore's pool cost more CPU per judge call than the rest of a /verify
    together (building request and response objects, cookies, URL merging, and a pool that
    rescans every waiting request against every connection: J-34a), and under bursts of hundreds
    of attempts that pool stretched attempts the judge answered in milliseconds to seconds. Here
    a request is one prepared head plus the body, written in one piece, and the reply is parsed
    directly from the socket's bytes.

    The concurrency limit already caps attempts at the pool size, so a stack of idle connections
    is enough: an attempt takes the most recently used live connection or opens a new one, and
    gives it back once its reply has been read in full. At most ``judge_max_concurrency``
    connections ever exist, and no attempt ever waits for one (there is no pool timeout to
    reach). Connecting is bounded by ``judge_request_timeout_s``; every read and write lies
    within the attempt's own deadline of the same length (J-27), which starts before them.
    Failures are raised as the httpx exceptions, with httpcore's texts, that the attempt loop
    classifies (J-21, J-40).
    """

    def __init__(
        self, url: str, headers: dict[str, str], *, timeout_s: float, keepalive_expiry_s: float
    ) -> None:
        parsed = httpx.URL(url)
        self._https = parsed.scheme == "https"
        self._host = parsed.host
        self._port = parsed.port or (443 if self._https else 80)
        self._timeout_s = timeout_s
        self._keepalive_expiry_s = keepalive_expiry_s
        self._ssl_context: ssl.SSLContext | None = None
        self._closed = False
        host = parsed.netloc
        lines = [b"POST " + parsed.raw_path + b" HTTP/1.1", b"Host: " + host]
        self._header_error: str | None = None
        for name, value in headers.items():
            if any(bad in value for bad in "\r\n\0"):
                self._header_error = f"Illegal header value for {name}"
            lines.append(f"{name}: {value}".encode("latin-1", errors="replace"))
        self._head = b"\r\n".join(lines) + b"\r\nContent-Length: "
        # Most recently used on the right; the left end holds the longest idle.
        self._idle: deque[_Connection] = deque()

    async def request(self, body: bytes) -> _Reply:
        """Send one POST and read its reply's head; the caller reads the body and releases."""
        if self._closed:
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        if self._header_error is not None:
            raise httpx.LocalProtocolError(self._header_error)
        connection = await self._checkout()
        try:
            try:
                await connection.stream.send_all(b"%s%d\r\n\r\n%s" % (self._head, len(body), body))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                # As httpcore does: a judge may close early and still answer (a 413, say); if it
                # did not, reading says so.
                pass
            return await self._read_head(connection)
        except BaseException:
            await trio.aclose_forcefully(connection.stream)
            raise

    async def release(self, reply: _Reply) -> None:
        """Keep the reply's connection for reuse if its reply was read in full, else close it."""
        connection = reply.connection
        if reply.reusable and not self._closed:
            connection.idle_since = trio.current_time()
            self._idle.append(connection)
        else:
            await trio.aclose_forcefully(connection.stream)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, deque()
        for connection in idle:
            await trio.aclose_forcefully(connection.stream)

    def _expired(self, connection: _Connection, now: float) -> bool:
        return now - connection.idle_since > self._keepalive_expiry_s

    async def _checkout(self) -> _Connection:
        now = trio.current_time()
        # Reusing the freshest connection lets older ones age out; close one of those per call
        # so that sockets the judge has long closed are not kept until the next burst.
        if self._idle and self._expired(self._idle[0], now):
            await trio.aclose_forcefully(self._idle.popleft().stream)
        while self._idle:
            connection = self._idle.pop()
            if not self._expired(connection, now) and not _peer_has_spoken(connection.socket):
                return connection
            await trio.aclose_forcefully(connection.stream)
        return await self._open()

    async def _open(self) -> _Connection:
        try:
            with trio.fail_after(self._timeout_s):
                tcp = await trio.open_tcp_stream(self._host, self._port)
                stream: trio.abc.Stream = tcp
                if self._https:
                    if self._ssl_context is None:
                        self._ssl_context = httpx.create_ssl_context(trust_env=False)
                        self._ssl_context.set_alpn_protocols(["http/1.1"])
                    tls = trio.SSLStream(
                        tcp, self._ssl_context, server_hostname=self._host, https_compatible=True
                    )
                    await tls.do_handshake()
                    stream = tls
        except trio.TooSlowError as exc:
            raise httpx.ConnectTimeout(str(exc)) from exc
        except (OSError, trio.BrokenResourceError) as exc:
            raise httpx.ConnectError(str(exc)) from exc
        return _Connection(stream, tcp.socket)

    async def _read_head(self, connection: _Connection) -> _Reply:
        buffer = connection.buffer
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _HEAD_LIMIT:
                    raise httpx.RemoteProtocolError("reply head too long")
                if not await connection.fill():
                    raise httpx.RemoteProtocolError(CLOSED_WITHOUT_REPLY)
                continue
            lines = bytes(buffer[:end]).split(b"\r\n")
            del buffer[: end + 4]
            match = _STATUS_LINE.fullmatch(lines[0])
            if match is None:
                raise httpx.RemoteProtocolError(f"illegal status line: {bytearray(lines[0])!r}")
            status = int(match.group(2))
            headers: list[tuple[bytes, bytes]] = []
            for line in lines[1:]:
                name, colon, value = line.partition(b":")
                if not colon or not name or name != name.strip() or name[:1] in b" \t":
                    raise httpx.RemoteProtocolError(f"illegal header line: {bytearray(line)!r}")
                headers.append((name.lower(), value.strip(b" \t")))
            if 100 <= status <= 199:
                if status == 101:
                    raise httpx.RemoteProtocolError("unexpected 101 Switching Protocols")
                continue  # an interim reply; the real one follows
            reply = _Reply(connection, status, headers, keep_alive=match.group(1) == b"1")
            tokens = reply.header(b"connection")
            if tokens is not None and b"close" in tokens.lower().replace(b" ", b"").split(b","):
                reply.keep_alive = False
            return reply


async def _read_at_most(response: httpx.Response, limit: int, chunks: list[bytes]) -> bool:
    """Append the body to ``chunks`` until more than ``limit`` bytes; True if it all fit.

    Chunks read before a transport error stay in ``chunks``.
    """
    size = 0
    parts = cast(AsyncGenerator[bytes, None], response.aiter_bytes())
    async with aclosing(parts):
        async for part in parts:
            chunks.append(part)
            size += len(part)
            if size > limit:
                return False
    return True


class JudgeClient:
    """All judge calls of one server: one HTTP client and one concurrency limit (J-33, J-34)."""

    def __init__(
        self,
        config: Config,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._config = config
        self._url = judge_url(config.judge_base_url, config.judge_api)
        self._api_key = resolve_api_key(config, os.environ)
        self._rng = rng if rng is not None else random.Random()
        self.slots = JudgeSlots(config.judge_max_concurrency)
        self._max_attempts = config.attempts_per_comparison
        self._max_output_tokens = max_output_tokens_text(config.genrm_responses_create_params)
        self._default = Verdict(config.default_score, config.default_score, config.default_ranking)
        self._attempts_total = 0
        timeout = config.judge_request_timeout_s
        # J-34: one client per server. Over the network it is the judge wire; a transport handed
        # in (an in-process fake judge, a test double) is driven through httpx instead.
        self._wire: _JudgeWire | None = None
        self._http: httpx.AsyncClient | None = None
        if transport is None:
            self._wire = _JudgeWire(
                self._url,
                judge_headers(self._api_key),
                timeout_s=timeout,
                keepalive_expiry_s=KEEPALIVE_EXPIRY_S,
            )
            return
        self._http = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(connect=timeout, read=timeout, write=timeout, pool=timeout),
            follow_redirects=False,
            http1=True,
            http2=False,
            trust_env=False,
        )
        # httpx adds Accept-Encoding, Connection and its own User-Agent by default; J-8 allows
        # exactly our four headers (Host and Content-Length frame the request).
        for name in list(self._http.headers):
            del self._http.headers[name]
        self._http.headers.update(judge_headers(self._api_key))
        self._http.cookies.jar.set_policy(_RefuseCookies())

    @property
    def url(self) -> str:
        """The judge request URL, without user-info."""
        return self._url

    @property
    def in_flight(self) -> int:
        """Attempts holding a concurrency slot now (I-13)."""
        return self.slots.in_use

    @property
    def attempts_total(self) -> int:
        """Judge HTTP requests started since creation."""
        return self._attempts_total

    async def aclose(self) -> None:
        if self._wire is not None:
            await self._wire.aclose()
        if self._http is not None:
            await self._http.aclose()

    async def judge(
        self, task: JudgeTask, *, deadline: float | Callable[[], float] = math.inf
    ) -> JudgeVerdict | JudgeFailure:
        """Run one comparison's attempt loop (J-20…J-32).

        ``deadline`` is the absolute Trio time of the enclosing deadline, or a function giving
        it when it can still move; a retry sleep that would end after it is not taken (J-32).
        Every attempt waits for a slot in the task's lane. The caller's own cancel scope bounds
        the call.
        """
        config = self._config
        lane = task.lane
        if lane is None:
            lane = self.slots.lane(complete=True)
        body = encode_body(
            build_body(
                config,
                history=task.history,
                principle=task.principle,
                text_1=task.text_1,
                text_2=task.text_2,
            )
        )
        outcomes: list[AttemptOutcome] = []
        while True:
            outcome = await self._attempt(body, lane)
            outcomes.append(outcome)
            attempt = len(outcomes)
            if isinstance(outcome, ParseFailure) and outcome.exhausted:
                logger.warning(
                    budget_exhausted_log_text(
                        api=config.judge_api,
                        pair=task.pair,
                        attempt=attempt,
                        max_attempts=self._max_attempts,
                        max_output_tokens=self._max_output_tokens,
                    )
                )
            conclusion = conclude(
                outcomes,
                max_attempts=self._max_attempts,
                default=self._default,
                max_output_tokens=self._max_output_tokens,
            )
            if conclusion is not None:
                return self._finish(task, conclusion, attempt)
            assert isinstance(outcome, TransientFailure | ParseFailure)
            drawn = draw_backoff(
                self._rng,
                attempt,
                base_s=config.genrm_parse_retry_sleep_s,
                max_s=config.judge_retry_max_sleep_s,
            )
            sleep_s = retry_sleep(outcome, drawn)
            limit = deadline() if callable(deadline) else deadline
            if trio.current_time() + sleep_s > limit:
                conclusion = conclude_without_time(
                    outcomes, default=self._default, max_output_tokens=self._max_output_tokens
                )
                return self._finish(task, conclusion, attempt)
            logger.info(
                retry_log_text(
                    pair=task.pair,
                    judge_pass=task.judge_pass,
                    attempt=attempt,
                    max_attempts=self._max_attempts,
                    cause=short_cause(outcome),
                    sleep_s=sleep_s,
                )
            )
            if sleep_s > 0:
                await trio.sleep(sleep_s)

    def _finish(self, task: JudgeTask, conclusion: Conclusion, attempts: int) -> JudgeResult:
        if isinstance(conclusion, Failed):
            text = judge_error_text(
                url=self._url,
                pair=task.pair,
                judge_pass=task.judge_pass,
                attempt=attempts,
                max_attempts=self._max_attempts,
                timeout_s=self._config.judge_request_timeout_s,
                cause=conclusion.cause,
            )
            if self._api_key:
                # A judge may echo request headers in an error body (J-41).
                text = text.replace(self._api_key, _REDACTED)
            return JudgeFailure(text=text, attempts=attempts)
        if conclusion.fallback:
            logger.warning(
                fallback_log_text(pair=task.pair, judge_pass=task.judge_pass, attempts=attempts)
            )
        return JudgeVerdict(
            verdict=conclusion.verdict, fallback=conclusion.fallback, attempts=attempts
        )

    async def _attempt(self, body: bytes, lane: Lane) -> AttemptOutcome:
        """One judge HTTP request, holding a concurrency slot for exactly its duration."""
        timeout = self._config.judge_request_timeout_s
        await self.slots.acquire(lane)
        try:
            self._attempts_total += 1
            # J-27: the deadline starts once the slot is held and covers the whole exchange;
            # the HTTP client's own timeouts are only a second line behind it.
            with trio.move_on_after(timeout):
                try:
                    return await self._exchange(body)
                except httpx.TimeoutException:
                    return timeout_outcome(timeout)
                except (httpx.TransportError, httpx.DecodingError) as exc:
                    return transport_outcome(exc)
            return timeout_outcome(timeout)
        finally:
            self.slots.release()

    async def _exchange(self, body: bytes) -> AttemptOutcome:
        if self._wire is not None:
            reply = await self._wire.request(body)
            try:
                return await self._outcome(
                    reply.status, reply.header(b"retry-after"), reply.read_at_most
                )
            finally:
                await self._wire.release(reply)
        assert self._http is not None
        async with self._http.stream("POST", self._url, content=body) as response:
            return await self._outcome(
                response.status_code,
                response.headers.get("Retry-After"),
                partial(_read_at_most, response),
            )

    async def _outcome(
        self,
        status: int,
        retry_after_header: bytes | str | None,
        read_at_most: Callable[[int, list[bytes]], Awaitable[bool]],
    ) -> AttemptOutcome:
        """Read the reply's body as far as its status calls for and classify the attempt."""
        chunks: list[bytes] = []
        if 200 <= status <= 299:
            if not await read_at_most(MAX_REPLY_BYTES, chunks):
                return FatalFailure(
                    cause=f"ReplyTooLarge: judge reply exceeds {MAX_REPLY_BYTES} bytes"
                )
            return reply_outcome(
                self._config.judge_api,
                chunks[0] if len(chunks) == 1 else b"".join(chunks),
                default_score=self._config.default_score,
                default_ranking=self._config.default_ranking,
            )
        try:
            await read_at_most(MAX_ERROR_BODY_BYTES, chunks)
        except (httpx.NetworkError, httpx.RemoteProtocolError, httpx.DecodingError):
            pass  # the status decides; whatever part of the body arrived is shown
        prefix = b"".join(chunks)[:ERROR_BODY_BYTES]
        if isinstance(retry_after_header, bytes):
            retry_after_header = retry_after_header.decode("latin-1")
        retry_after = parse_retry_after(retry_after_header, now_epoch_s=time.time())
        return status_outcome(status, prefix, retry_after)
