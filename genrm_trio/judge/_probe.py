"""The judge probe: ``GET <base><judge_probe_path>`` to every replica at start and then every
``judge_probe_interval_s``, through the judge's own transport (its headers, its API key) but on
connections of its own, and `serve --wait-for-judge`'s wait for a first answer.

Probes are not judge attempts: they never hold a concurrency slot, never count in
``judge_attempts_total`` or the attempt metrics, and never move a replica in or out of the
balancer's service (ejection stays the business of real attempts). What they find is kept in a
:class:`~genrm_trio.judge._readiness.JudgeReadiness`, which decides readiness and the log lines.
"""

from __future__ import annotations

import logging
import math
import os
import time
from urllib.parse import urlsplit, urlunsplit

import trio

from genrm_trio.config import Config, url_without_userinfo
from genrm_trio.judge._readiness import JudgeReadiness, LogLine
from genrm_trio.judge._requests import judge_headers, replica_base_urls, resolve_api_key
from genrm_trio.judge.transport import (
    JudgeEndpoint,
    JudgeTransport,
    TransportFactory,
)

__all__ = ["WAIT_RETRY_S", "JudgeProbe", "probe_url", "wait_for_judge"]

log = logging.getLogger("genrm_trio")

# How often `serve --wait-for-judge` asks again while no replica answers (at most).
WAIT_RETRY_S = 1.0


def probe_url(base_url: str, path: str) -> str:
    """The probe's URL: the replica's base URL without user-info or trailing slash, plus
    ``path`` (``http://judge:8000/v1`` and ``/models`` give ``http://judge:8000/v1/models``)."""
    parts = urlsplit(url_without_userinfo(base_url))
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + path, "", ""))


class JudgeProbe:
    """Probes every judge replica of one configuration; ``transport`` None turns probing off
    (as ``judge_probe_path: null`` does): every replica then stays ``reachable`` None."""

    def __init__(self, config: Config, transport: TransportFactory | None) -> None:
        self._config = config
        bases = replica_base_urls(config)
        names = [url_without_userinfo(base).rstrip("/") for base in bases]
        path = config.judge_probe_path if transport is not None else None
        self.readiness = JudgeReadiness(names, probe_path=path)
        self._transports: list[JudgeTransport] = []
        if transport is not None and path is not None:
            # The judge's own headers, less the body's type: a probe has no body.
            headers = judge_headers(resolve_api_key(config, os.environ))
            headers.pop("Content-Type")
            self._transports = [
                transport(
                    JudgeEndpoint(
                        url=probe_url(base, path),
                        headers=headers,
                        timeout_s=config.judge_probe_timeout_s,
                        method="GET",
                    )
                )
                for base in bases
            ]
        self._running = trio.CancelScope()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Probe every replica now and then every interval, until :meth:`stop`."""
        task_status.started()
        if not self._transports:
            return
        interval = self._config.judge_probe_interval_s
        with self._running:
            while True:
                started = trio.current_time()
                for line in await self.probe_round():
                    log.log(line.level, line.text)
                await trio.sleep_until(started + interval)

    def stop(self) -> None:
        self._running.cancel()

    async def aclose(self) -> None:
        for transport in self._transports:
            await transport.aclose()

    async def probe_round(self, deadline: float = math.inf) -> list[LogLine]:
        """Probe every replica at once; the log lines of what changed. Each probe ends within
        ``judge_probe_timeout_s`` and by ``deadline`` (Trio time)."""
        lines: list[LogLine] = []

        async def one(index: int) -> None:
            error = await self._probe(self._transports[index], deadline)
            lines.extend(self.readiness.record(index, at=time.time(), error=error))

        async with trio.open_nursery() as nursery:
            for index in range(len(self._transports)):
                nursery.start_soon(one, index)
        return lines + self.readiness.finish_round()

    async def _probe(self, transport: JudgeTransport, deadline: float) -> str | None:
        """None for a 2xx reply, else a short text of why not."""
        now = trio.current_time()
        limit = min(now + self._config.judge_probe_timeout_s, deadline)
        with trio.CancelScope(deadline=limit):
            try:
                reply = await transport.send(b"")
                # The body is not read: the connection closes, and a probe every few seconds
                # would outlive keep-alive anyway.
                await reply.release()
            except Exception as exc:
                # A transport failure (JudgeTransportError), or anything else: a probe that
                # fails for any reason reports it, and never stops the server that runs it.
                return f"{type(exc).__name__}: {exc}"
            if 200 <= reply.status <= 299:
                return None
            return f"HTTP {reply.status}"
        return f"Timeout: no reply within {limit - now:.3g} s"


async def wait_for_judge(
    config: Config, seconds: float, transport: TransportFactory
) -> JudgeReadiness:
    """Probe every replica until one answers or ``seconds`` have passed (`serve
    --wait-for-judge`); the readiness found, whose ``answering()`` says which. Every replica
    gets one whole probe (up to ``judge_probe_timeout_s``), however short ``seconds``."""
    probe = JudgeProbe(config, transport)
    now = trio.current_time()
    deadline = now + seconds
    first = max(deadline, now + config.judge_probe_timeout_s)
    try:
        while True:
            started = trio.current_time()
            await probe.probe_round(first if probe.readiness.rounds == 0 else deadline)
            if probe.readiness.answering():
                return probe.readiness
            retry = min(WAIT_RETRY_S, config.judge_probe_interval_s)
            await trio.sleep_until(min(started + retry, deadline))
            # No round starts at the deadline: it would only replace each replica's error with
            # a timeout of no time at all.
            if trio.current_time() >= deadline:
                return probe.readiness
    finally:
        with trio.CancelScope(shield=True):
            await probe.aclose()
