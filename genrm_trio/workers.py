"""`serve --workers N`: one parent process, N worker processes, one listening socket.

The parent binds the listening socket and hands the same socket to every worker (inherited
descriptor, hypercorn's `fd://` bind). One shared accept queue rather than one socket per worker
(SO_REUSEPORT): a connection waits in the kernel until some worker accepts it, so a worker that
is busy, dead or restarting never strands the connections the kernel would have hashed to it,
and the least busy worker takes the next one. Groups are shared through the group store: the
configured Redis, or with `group_store: memory` a Redis/Valkey server the parent starts for the
run on a unix socket in a private state directory (store/embedded.py).

The parent restarts a worker that dies (logged with its exit status), forwards SIGINT and
SIGTERM as SIGTERM to every worker for a graceful drain within `shutdown_grace_s`, stops the
embedded store after the workers and removes the state directory. Its exit status: 0 when every
worker drained and exited 0; 1 when a worker had to be killed or exited otherwise, or the socket
could not be bound; 2 when the configuration cannot be served (no store server to start).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import trio

from genrm_trio.config import Config, config_from_mapping
from genrm_trio.logs import configure_logging, set_worker
from genrm_trio.serve import hold_for_judge, run_serve
from genrm_trio.store.embedded import EmbeddedStore, NoServerBinary

log = logging.getLogger("genrm_trio")

# What a worker reads from its environment (set by the parent only).
CONFIG_ENV = "GENRM_WORKER_CONFIG"
LISTEN_FD_ENV = "GENRM_LISTEN_FD"
INDEX_ENV = "GENRM_WORKER_INDEX"
COUNT_ENV = "GENRM_WORKERS"
PARENT_ENV = "GENRM_PARENT_PID"
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

READY_LINE = "genrm-trio listening on "
# A worker that dies sooner than this after starting is started again after a pause that
# doubles, so a worker that cannot start does not spin the machine.
STEADY_S = 10.0
FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 15.0
# Beyond shutdown_grace_s, for a worker to close its connections and exit before it is killed.
EXIT_MARGIN_S = 5.0


@dataclass
class Worker:
    index: int
    process: trio.Process | None = None
    ready: trio.Event = field(default_factory=trio.Event)
    exited: trio.Event = field(default_factory=trio.Event)  # the current process's end
    starts: int = 0
    exits: list[int] = field(default_factory=list)
    killed: bool = False


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: a parent killed outright (SIGKILL) still takes its store server with
    # it. Set from the main thread's fork, which lives as long as the parent.
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)


def bind_listener(config: Config, backlog: int) -> socket.socket:
    """The listening socket every worker serves, inheritable so the workers get it."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((config.host, config.port))
    listener.listen(backlog)
    listener.set_inheritable(True)
    return listener


def run_workers(
    config: Config, notes: Sequence[str] = (), *, wait_for_judge_s: float | None = None
) -> int:
    """Serve with `config.workers` worker processes until a signal; the exit status.
    ``wait_for_judge_s``: the parent binds the socket and starts the workers only once a judge
    replica answers a probe (exit 1 when none has within that many seconds)."""
    from genrm_trio.logs import startup_lines
    from genrm_trio.process_tuning import effective_backlog, kernel_listen_limit

    configure_logging(config.log_level, config.log_format)
    for note in notes:
        log.info(note)
    for line in startup_lines(config):
        log.info(line)
    if wait_for_judge_s is not None and not hold_for_judge(config, wait_for_judge_s):
        return 1
    state_dir = Path(tempfile.mkdtemp(prefix="genrm-trio-"))  # mkdtemp makes it 0700
    store: EmbeddedStore | None = None
    try:
        store_url = config.group_store
        if store_url == "memory":
            try:
                store = EmbeddedStore(state_dir, appendfsync=config.embedded_store_appendfsync)
            except NoServerBinary as exc:
                print(f"genrm-trio: serve --workers {config.workers}: {exc}", file=sys.stderr)
                return 2
            store.start(preexec_fn=_die_with_parent)
            store_url = store.url
            log.info(
                "group store for %d workers: %s (pid %s, appendfsync %s)",
                config.workers,
                store.binary,
                store.process.pid if store.process else "?",
                config.embedded_store_appendfsync,
            )
        backlog, _ = effective_backlog(config.listen_backlog, kernel_listen_limit())
        try:
            listener = bind_listener(config, backlog)
        except OSError as exc:
            print(
                f"genrm-trio: cannot serve on {config.host}:{config.port}: {exc}", file=sys.stderr
            )
            return 1
        with listener:
            worker_config = msgspec.structs.replace(config, workers=1, group_store=store_url)
            config_path = state_dir / "worker-config.json"
            fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(msgspec.to_builtins(worker_config), handle)
            metrics_dir = state_dir / "metrics"
            metrics_dir.mkdir(mode=0o700)
            supervisor = Supervisor(config, listener, config_path, metrics_dir)
            return trio.run(supervisor.run)
    finally:
        if store is not None:
            status = store.stop()
            log.info("group store stopped (exit status %s)", status)
        shutil.rmtree(state_dir, ignore_errors=True)


class Supervisor:
    """Starts, watches, restarts and finally drains the worker processes."""

    def __init__(
        self, config: Config, listener: socket.socket, config_path: Path, metrics_dir: Path
    ) -> None:
        self.config = config
        self.listener = listener
        self.config_path = config_path
        self.metrics_dir = metrics_dir
        self.workers = [Worker(index) for index in range(config.workers)]
        self.stopping = False
        self.stop = trio.Event()
        self.failed: str | None = None  # why the run ended before every worker was up

    def _environment(self, worker: Worker) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                CONFIG_ENV: str(self.config_path),
                LISTEN_FD_ENV: str(self.listener.fileno()),
                INDEX_ENV: str(worker.index),
                COUNT_ENV: str(len(self.workers)),
                METRICS_DIR_ENV: str(self.metrics_dir),
                PARENT_ENV: str(os.getpid()),
            }
        )
        return env

    async def run(self) -> int:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._signals)
            for worker in self.workers:
                nursery.start_soon(self._keep_running, worker)
            nursery.start_soon(self._announce)
            await self.stop.wait()
            self.stopping = True
            for worker in self.workers:
                self._signal(worker, signal.SIGTERM)
            await self._drain()
            nursery.cancel_scope.cancel()
        if self.failed is not None:
            print(f"genrm-trio: {self.failed}", file=sys.stderr)
            return 1
        clean = all(
            not worker.killed and worker.exits and worker.exits[-1] == 0 for worker in self.workers
        )
        log.info("genrm-trio stopped (%s)", "every worker drained" if clean else "not clean")
        return 0 if clean else 1

    async def _announce(self) -> None:
        for worker in self.workers:
            await worker.ready.wait()
        host, port = self.listener.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        log.info("%d workers serving", len(self.workers))
        print(f"{READY_LINE}http://{shown}:{port}", flush=True)

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if self.stopping:
                    # A second signal: no more waiting.
                    for worker in self.workers:
                        self._signal(worker, signal.SIGKILL)
                        worker.killed = True
                    continue
                log.info(
                    "%s: draining %d workers within %s s",
                    signal.Signals(signum).name,
                    len(self.workers),
                    self.config.shutdown_grace_s,
                )
                self.stopping = True
                self.stop.set()

    @staticmethod
    def _signal(worker: Worker, signum: int) -> None:
        process = worker.process
        if process is not None and process.returncode is None:
            try:
                process.send_signal(signum)
            except ProcessLookupError:
                pass

    async def _drain(self) -> None:
        """Wait for every worker to exit after SIGTERM; kill the ones that outlast the grace."""
        with trio.move_on_after(self.config.shutdown_grace_s + EXIT_MARGIN_S):
            for worker in self.workers:
                await worker.exited.wait()
        for worker in self.workers:
            process = worker.process
            if process is not None and process.returncode is None:
                log.warning(
                    "worker %d (pid %d) did not exit in time; killing it", worker.index, process.pid
                )
                worker.killed = True
                self._signal(worker, signal.SIGKILL)
                await process.wait()

    async def _keep_running(self, worker: Worker) -> None:
        pause = FIRST_PAUSE_S
        argv = [sys.executable, "-m", "genrm_trio.workers"]
        while not self.stopping:
            started = trio.current_time()
            process = await trio.lowlevel.open_process(
                argv,
                env=self._environment(worker),
                pass_fds=(self.listener.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                # Its own session: a terminal's Ctrl-C reaches the parent only, which forwards
                # one SIGTERM (a worker takes a second signal as "exit now"). No parent-death
                # signal: Trio starts processes from a worker thread, and that signal follows
                # the thread, not the process; the worker watches its parent itself.
                start_new_session=True,
            )
            worker.process = process
            worker.exited = trio.Event()
            worker.starts += 1
            async with trio.open_nursery() as watching:
                watching.start_soon(self._read_output, worker, process)
                status = await process.wait()
            worker.exits.append(status)
            worker.exited.set()
            self._forget_metrics(process.pid)
            if not worker.ready.is_set() and not self.stopping:
                # It never came up: starting it again would fail the same way.
                self.failed = f"worker {worker.index} exited with status {status} before serving"
                self.stop.set()
                return
            if self.stopping:
                log.info(
                    "worker %d (pid %d) exited with status %d", worker.index, process.pid, status
                )
                return
            log.warning(
                "worker %d (pid %d) exited with status %d; starting it again",
                worker.index,
                process.pid,
                status,
            )
            if trio.current_time() - started < STEADY_S:
                await trio.sleep(pause)
                pause = min(pause * 2, MAX_PAUSE_S)
            else:
                pause = FIRST_PAUSE_S

    async def _read_output(self, worker: Worker, process: trio.Process) -> None:
        """A worker's stdout: its listening line marks it ready; anything else is passed on."""
        assert process.stdout is not None
        buffer = b""
        async for chunk in process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                if line.startswith(READY_LINE):
                    worker.ready.set()
                else:
                    print(line, flush=True)

    def _forget_metrics(self, pid: int) -> None:
        """prometheus_client's multiprocess mode: a dead worker's live gauges go away."""
        try:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid, str(self.metrics_dir))
        except Exception as exc:
            log.warning("could not clear the metrics of worker pid %d: %s", pid, exc)


def worker_main() -> int:
    """One worker: the configuration and the listening socket come from the parent."""
    with open(os.environ[CONFIG_ENV], encoding="utf-8") as handle:
        config = config_from_mapping(json.load(handle))
    set_worker(int(os.environ[INDEX_ENV]))
    return run_serve(
        config,
        listen_fd=int(os.environ[LISTEN_FD_ENV]),
        parent_pid=int(os.environ[PARENT_ENV]),
    )


if __name__ == "__main__":
    sys.exit(worker_main())
