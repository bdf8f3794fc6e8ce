"""The judge client: one comparison in, a verdict or a judge failure out, over httpx on Trio.

It runs the attempt loop that attempts.py decides, under one FIFO concurrency limit per server.
"""

from __future__ import annotations

import logging
import math
import os
import random
import ssl
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from http.cookiejar import Cookie, CookiePolicy
from typing import Any, cast

import httpcore
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

logger = logging.getLogger("genrm_trio")

# A judge reply is a few kilobytes; a body beyond this is refused rather than held in memory.
MAX_REPLY_BYTES = 16 * 1024 * 1024
# Error bodies are read this far so that the connection can be reused; longer ones are cut off.
MAX_ERROR_BODY_BYTES = 64 * 1024
# httpx's default: an idle connection older than this is closed rather than reused.
KEEPALIVE_EXPIRY_S = 5.0
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


# httpcore's failures as the httpx types the attempt loop classifies; most specific first.
_HTTPX_ERRORS: dict[type[Exception], type[httpx.TransportError]] = {
    httpcore.ConnectTimeout: httpx.ConnectTimeout,
    httpcore.ReadTimeout: httpx.ReadTimeout,
    httpcore.WriteTimeout: httpx.WriteTimeout,
    httpcore.PoolTimeout: httpx.PoolTimeout,
    httpcore.TimeoutException: httpx.TimeoutException,
    httpcore.ConnectError: httpx.ConnectError,
    httpcore.ReadError: httpx.ReadError,
    httpcore.WriteError: httpx.WriteError,
    httpcore.NetworkError: httpx.NetworkError,
    httpcore.RemoteProtocolError: httpx.RemoteProtocolError,
    httpcore.LocalProtocolError: httpx.LocalProtocolError,
    httpcore.ProtocolError: httpx.ProtocolError,
    httpcore.UnsupportedProtocol: httpx.UnsupportedProtocol,
    httpcore.ProxyError: httpx.ProxyError,
}


@contextmanager
def _as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for kind in type(exc).__mro__:
            mapped = _HTTPX_ERRORS.get(kind)
            if mapped is not None:
                raise mapped(str(exc)) from exc
        raise


class _JudgeConnections(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 connections to the judge, checked out and returned in O(1) (J-34a).

    httpcore's pool rescans every waiting request against every connection on each request and
    each reply; with hundreds of attempts in flight that scan took most of the client's time and
    stretched attempts the judge answered in milliseconds to seconds. The concurrency limit
    already caps attempts at the pool size, so a stack of idle connections is enough: an attempt
    takes the most recently used live connection or opens a new one, and gives it back once its
    reply has been read in full. At most ``judge_max_concurrency`` connections ever exist.
    """

    def __init__(self, *, keepalive_expiry_s: float) -> None:
        self._keepalive_expiry_s = keepalive_expiry_s
        self._ssl_context: ssl.SSLContext | None = None
        # Most recently used on the right; the left end holds the longest idle.
        self._idle: deque[httpcore.AsyncHTTPConnection] = deque()

    async def _checkout(self, origin: httpcore.Origin) -> httpcore.AsyncHTTPConnection:
        # Reusing the freshest connection lets older ones age out; close one of those per call
        # so that sockets the judge has long closed are not kept until the next burst.
        if self._idle and self._idle[0].has_expired():
            await self._idle.popleft().aclose()
        while self._idle:
            connection = self._idle.pop()
            if (
                connection.can_handle_request(origin)
                and connection.is_idle()
                and not connection.has_expired()
            ):
                return connection
            await connection.aclose()
        if origin.scheme == b"https" and self._ssl_context is None:
            self._ssl_context = httpx.create_ssl_context(trust_env=False)
        return httpcore.AsyncHTTPConnection(
            origin,
            ssl_context=self._ssl_context,
            keepalive_expiry=self._keepalive_expiry_s,
            http1=True,
            http2=False,
        )

    def _checkin(self, connection: httpcore.AsyncHTTPConnection) -> None:
        # A reply read in full leaves the connection idle; anything else has closed it.
        if connection.is_idle():
            self._idle.append(connection)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        connection = await self._checkout(core_request.url.origin)
        try:
            with _as_httpx_errors():
                core_response = await connection.handle_async_request(core_request)
        except BaseException:
            if not connection.is_closed():
                with trio.CancelScope(shield=True):
                    await connection.aclose()
            raise
        return httpx.Response(
            status_code=core_response.status,
            headers=core_response.headers,
            stream=_PooledBody(core_response, connection, self._checkin),
            extensions=core_response.extensions,
        )

    async def aclose(self) -> None:
        idle, self._idle = self._idle, deque()
        for connection in idle:
            await connection.aclose()


class _PooledBody(httpx.AsyncByteStream):
    def __init__(
        self,
        response: httpcore.Response,
        connection: httpcore.AsyncHTTPConnection,
        checkin: Callable[[httpcore.AsyncHTTPConnection], None],
    ) -> None:
        self._response = response
        self._connection = connection
        self._checkin = checkin
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors():
            async for part in self._response.aiter_stream():
                yield part

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            with _as_httpx_errors():
                await self._response.aclose()
        finally:
            self._checkin(self._connection)


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
        self._limiter = trio.CapacityLimiter(config.judge_max_concurrency)
        self._max_attempts = config.attempts_per_comparison
        self._max_output_tokens = max_output_tokens_text(config.genrm_responses_create_params)
        self._default = Verdict(config.default_score, config.default_score, config.default_ranking)
        self._attempts_total = 0
        timeout = config.judge_request_timeout_s
        if transport is None:
            transport = _JudgeConnections(keepalive_expiry_s=KEEPALIVE_EXPIRY_S)
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
        return int(self._limiter.borrowed_tokens)

    @property
    def attempts_total(self) -> int:
        """Judge HTTP requests started since creation."""
        return self._attempts_total

    async def aclose(self) -> None:
        await self._http.aclose()

    async def judge(
        self, task: JudgeTask, *, deadline: float | Callable[[], float] = math.inf
    ) -> JudgeVerdict | JudgeFailure:
        """Run one comparison's attempt loop (J-20…J-32).

        ``deadline`` is the absolute Trio time of the enclosing deadline, or a function giving
        it when it can still move; a retry sleep that would end after it is not taken (J-32).
        The caller's own cancel scope bounds the call.
        """
        config = self._config
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
            outcome = await self._attempt(body)
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

    async def _attempt(self, body: bytes) -> AttemptOutcome:
        """One judge HTTP request, holding a concurrency slot for exactly its duration."""
        timeout = self._config.judge_request_timeout_s
        borrower = object()
        await self._limiter.acquire_on_behalf_of(borrower)
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
            self._limiter.release_on_behalf_of(borrower)

    async def _exchange(self, body: bytes) -> AttemptOutcome:
        async with self._http.stream("POST", self._url, content=body) as response:
            status = response.status_code
            chunks: list[bytes] = []
            if 200 <= status <= 299:
                if not await _read_at_most(response, MAX_REPLY_BYTES, chunks):
                    return FatalFailure(
                        cause=f"ReplyTooLarge: judge reply exceeds {MAX_REPLY_BYTES} bytes"
                    )
                return reply_outcome(
                    self._config.judge_api,
                    b"".join(chunks),
                    default_score=self._config.default_score,
                    default_ranking=self._config.default_ranking,
                )
            try:
                await _read_at_most(response, MAX_ERROR_BODY_BYTES, chunks)
            except (httpx.NetworkError, httpx.RemoteProtocolError, httpx.DecodingError):
                pass  # the status decides; whatever part of the body arrived is shown
            prefix = b"".join(chunks)[:ERROR_BODY_BYTES]
            retry_after = parse_retry_after(
                response.headers.get("Retry-After"), now_epoch_s=time.time()
            )
            return status_outcome(status, prefix, retry_after)
