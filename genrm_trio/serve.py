"""`genrm-trio serve` in one process, and in each worker process of `serve --workers`: the
startup lines, `--wait-for-judge`, hypercorn's settings, and serving until a signal (or the
parent's end) with a graceful shutdown."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from genrm_trio.config import Config
from genrm_trio.logs import configure_logging, startup_lines
from genrm_trio.process_tuning import (
    REJECTING_CONNECTIONS,
    prepare_collector,
    tune_for_serving,
)

if TYPE_CHECKING:
    from hypercorn.config import Config as HypercornConfig

log = logging.getLogger("genrm_trio")

# How often a worker of `serve --workers` checks that its parent is still there.
PARENT_POLL_S = 0.5


def run_serve(
    config: Config,
    notes: Sequence[str] = (),
    *,
    listen_fd: int | None = None,
    parent_pid: int | None = None,
    wait_for_judge_s: float | None = None,
) -> int:
    """Log the startup lines (``notes`` first) and serve until a signal; the exit status.
    ``listen_fd`` and ``parent_pid``: a worker of `serve --workers` serves the listening socket
    its parent made and stops when that parent is gone. ``wait_for_judge_s``: bind only once a
    judge replica answers a probe, or exit 1 when none has within that many seconds."""
    configure_logging(config.log_level, config.log_format)
    for note in notes:
        log.info(note)
    for line in startup_lines(config):
        log.info(line)
    if wait_for_judge_s is not None and not hold_for_judge(config, wait_for_judge_s):
        return 1
    failure: BaseException | None = None
    try:
        trio.run(serve, config, listen_fd, parent_pid)
    except* OSError as group:
        # Binding happens inside hypercorn's nursery, so the error arrives wrapped in a group.
        failure = group
        while isinstance(failure, BaseExceptionGroup):
            failure = failure.exceptions[0]
    if failure is not None:
        print(
            f"genrm-trio: cannot serve on {config.host}:{config.port}: {failure}", file=sys.stderr
        )
        return 1
    return 0


def hold_for_judge(config: Config, seconds: float) -> bool:
    """`serve --wait-for-judge`: probe the judge replicas until one answers; False, with each
    replica's URL and last error on stderr, when none has within ``seconds``."""
    from genrm_trio.judge import Http11Transport, readiness_verdict, wait_for_judge

    log.info(
        "waiting up to %s s for a judge replica to answer GET <base>%s",
        f"{seconds:g}",
        config.judge_probe_path,
    )
    started = time.monotonic()
    try:
        readiness = trio.run(wait_for_judge, config, seconds, Http11Transport)
    except KeyboardInterrupt:
        print("genrm-trio: interrupted while waiting for the judge", file=sys.stderr)
        return False
    if readiness.answering():
        answering = [replica.url for replica in readiness.replicas if replica.reachable]
        log.info(
            "judge replica %s answered after %.1f s",
            ", ".join(answering),
            time.monotonic() - started,
        )
        return True
    verdict = readiness_verdict(
        readiness.replicas, probing=True, store=("memory", True), shutting_down=False
    )
    print(
        f"genrm-trio: no judge replica answered GET <base>{config.judge_probe_path} within "
        f"{seconds:g} s (--wait-for-judge); not serving",
        file=sys.stderr,
    )
    for reason in verdict.reasons:
        print(f"genrm-trio: {reason}", file=sys.stderr)
    return False


def hypercorn_settings(config: Config, *, backlog: int | None = None) -> HypercornConfig:
    """hypercorn's settings for `serve`; the HTTP benchmark's echo ceiling uses them too."""
    from hypercorn.config import Config as HypercornConfig

    settings = HypercornConfig()
    settings.bind = [f"{config.host}:{config.port}"]
    settings.accesslog = None
    settings.errorlog = None
    # A trainer posts a whole step on fresh connections at once; connections the kernel cannot
    # queue are dropped and retried by the client a second or more later (listen_backlog).
    settings.backlog = config.listen_backlog if backlog is None else backlog
    # Handlers still running at shutdown get this long; waiting groups were failed first.
    settings.graceful_timeout = config.shutdown_grace_s
    # Applies between requests on a connection and before its first request. It must outlast
    # the clients' own idle expiry (aiohttp in NeMo Gym's agent: 15 s, httpx: 5 s): a server
    # closing first races the client's next POST on that connection, which then fails. Not
    # much longer, because an idle connection still holds a descriptor under the connection cap.
    settings.keep_alive_timeout = 30.0
    # A /verify waits for its group for seconds to minutes with nothing more to read; hypercorn
    # applies read_timeout to every read, so any value would cut waiting requests off.
    settings.read_timeout = None
    # The limit on a request's head (request line and headers; bodies are streamed). Trainer
    # heads are a few hundred bytes; 16 KiB keeps a client's oversized head from holding memory.
    settings.h11_max_incomplete_size = 16 * 1024
    # Keep-alive clients get `connection: close` after this many requests and reconnect; high
    # enough that reconnecting costs nothing measurable.
    settings.keep_alive_max_requests = 1000
    return settings


async def serve(
    config: Config, listen_fd: int | None = None, parent_pid: int | None = None
) -> None:
    """Serve until SIGINT/SIGTERM, then shut down gracefully (CL-4)."""
    from genrm_trio.http.app import create_app
    from genrm_trio.http.read_gates import ReadGates
    from genrm_trio.http.serving import (
        ACCEPT_BATCH,
        WORKER_ACCEPT_BATCH,
        ConnectionGate,
        serve_app,
    )

    tuning = tune_for_serving(config.listen_backlog, config.judge_max_concurrency)
    for line in tuning.lines:
        log.info(line)
    for line in tuning.warnings:
        log.warning(line)
    # The connections' read gates, handed to the app so that a body waiting for room in the
    # memory budget stays unread in the kernel and the client.
    read_gates = ReadGates()
    app = create_app(config, read_gates=read_gates)
    settings = hypercorn_settings(config, backlog=tuning.backlog)
    if listen_fd is not None:
        settings.bind = [f"fd://{listen_fd}"]
    gate = ConnectionGate(tuning.files.connections, tuning.files.soft, REJECTING_CONNECTIONS)
    prepare_collector()
    stop = trio.Event()

    async with trio.open_nursery() as nursery:

        def begin_stopping() -> None:
            # Fail waiting groups before hypercorn starts draining handlers, so waiting
            # requests are answered at once instead of being cut off (C-98).
            app.engine.begin_shutdown()
            stop.set()
            nursery.cancel_scope.deadline = trio.current_time() + config.shutdown_grace_s + 1.5

        async def watch_signals(
            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
        ) -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                task_status.started()
                async for _ in signals:
                    if stop.is_set():
                        os._exit(130)
                    begin_stopping()

        async def watch_parent(parent: int) -> None:
            # A worker whose parent died (even by SIGKILL) drains as if told to stop.
            while os.getppid() == parent:  # noqa: ASYNC110 (no event tells of a parent's end)
                await trio.sleep(PARENT_POLL_S)
            if not stop.is_set():
                log.warning("the parent process %d is gone; shutting down", parent)
                begin_stopping()

        async def run_server(task_status: trio.TaskStatus[list[str]]) -> None:
            await serve_app(
                app,
                settings,
                gate,
                shutdown_trigger=stop.wait,
                read_gates=read_gates,
                accept_batch=ACCEPT_BATCH if listen_fd is None else WORKER_ACCEPT_BATCH,
                task_status=task_status,
            )
            nursery.cancel_scope.cancel()

        await nursery.start(watch_signals)
        if parent_pid is not None:
            nursery.start_soon(watch_parent, parent_pid)
        binds = await nursery.start(run_server)
        print(f"genrm-trio listening on {binds[0]}", flush=True)
    log.info("genrm-trio stopped")
