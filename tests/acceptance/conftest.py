"""Running `genrm-trio` as a real process for the [TCP] acceptance scenarios of §10.

The `cli` fixture starts commands, reads their stdout line by line with a timeout, and kills
every process it started when the test ends, whatever the outcome.
"""

from __future__ import annotations

import os
import queue
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

# Only guards against a hung process; no assertion depends on it.
SAFETY_S = 20.0
API_KEY_ENV = "GENRM_JUDGE_API_KEY"


def genrm_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "genrm_trio.cli", *args]


def console_script() -> Path:
    """The installed `genrm-trio` entry point of the interpreter running the tests."""
    return Path(sys.executable).parent / "genrm-trio"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until(condition: Callable[[], bool], timeout: float = SAFETY_S) -> None:
    """Poll `condition` until it holds; fail the test if it never does."""
    limit = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > limit:
            raise AssertionError(f"condition still false after {timeout} s")
        time.sleep(0.02)


def http_client(base_url: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, timeout=SAFETY_S, trust_env=False)


def json_of(reply: httpx.Response) -> Any:
    """The JSON body of a reply that says it is JSON (W-2)."""
    assert reply.headers["content-type"].startswith("application/json"), reply.headers
    return reply.json()


class CliProcess:
    """A started command whose stdout lines arrive on a queue and whose stderr is collected."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.popen = popen
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self._stdout.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self._stderr.append(line)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def read_line(self, timeout: float = SAFETY_S) -> str:
        """The next stdout line without its newline; fails if none comes within `timeout`."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no stdout line within {timeout} s") from None
        if line is None:
            self._lines.put(None)
            raise AssertionError(f"stdout closed; stderr:\n{self.stderr()}")
        return line.rstrip("\n")

    def send_signal(self, sig: signal.Signals) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float = SAFETY_S) -> int:
        """Wait for the exit status, then for both pipes to be read to the end."""
        status = self.popen.wait(timeout)
        for reader in self._readers:
            reader.join(SAFETY_S)
        return status

    def stdout(self) -> str:
        return "".join(self._stdout)

    def stderr(self) -> str:
        return "".join(self._stderr)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(SAFETY_S)
        for reader in self._readers:
            reader.join(SAFETY_S)


class Cli:
    """Starts `genrm-trio` commands for one test and remembers them for teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.processes: list[CliProcess] = []

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The test's environment without a judge key, plus `extra`."""
        env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
        env.update(extra or {})
        return env

    def write(self, name: str, text: str) -> Path:
        path = self.tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    def run(
        self, *args: str, env: Mapping[str, str] | None = None, timeout: float = SAFETY_S
    ) -> subprocess.CompletedProcess[str]:
        """Run `genrm-trio <args>` to completion."""
        return subprocess.run(
            genrm_command(*args),
            capture_output=True,
            text=True,
            env=self.env(env),
            timeout=timeout,
            check=False,
        )

    def start(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        preexec_fn: Callable[[], object] | None = None,
    ) -> CliProcess:
        """Start `genrm-trio <args>` in the background; `preexec_fn` runs in the child first."""
        return self.start_program(genrm_command(*args), env=env, preexec_fn=preexec_fn)

    def start_program(
        self,
        command: list[str],
        *,
        env: Mapping[str, str] | None = None,
        preexec_fn: Callable[[], object] | None = None,
    ) -> CliProcess:
        """Start any program in the background, read and killed at the end like the others."""
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(env),
            preexec_fn=preexec_fn,
        )
        process = CliProcess(popen)
        self.processes.append(process)
        return process

    def start_fake_judge(self, *args: str) -> tuple[CliProcess, str]:
        """`genrm-trio fake-judge --port 0 <args>`; returns the process and its `/v1` URL."""
        process = self.start("fake-judge", "--port", "0", *args)
        line = process.read_line()
        prefix = "fake judge listening on "
        assert line.startswith(prefix), line
        return process, line.removeprefix(prefix)

    def start_serve(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        preexec_fn: Callable[[], object] | None = None,
    ) -> tuple[CliProcess, str, str]:
        """`genrm-trio serve --port 0 <args>`; returns the process, its URL and its ready line."""
        process = self.start("serve", "--port", "0", *args, env=env, preexec_fn=preexec_fn)
        line = process.read_line()
        prefix = "genrm-trio listening on "
        assert line.startswith(prefix), line
        return process, line.removeprefix(prefix), line

    def close(self) -> None:
        for process in self.processes:
            process.kill()

    # Test modules cannot import a conftest, so the helpers travel with the fixture.
    console_script = staticmethod(console_script)
    free_port = staticmethod(free_port)
    wait_until = staticmethod(wait_until)
    http_client = staticmethod(http_client)
    json_of = staticmethod(json_of)


@pytest.fixture
def many_files() -> Iterator[None]:
    """The test process holds thousands of client sockets at once: raise its own soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    runner = Cli(tmp_path)
    try:
        yield runner
    finally:
        runner.close()
