"""Request bodies beyond the memory budget wait in files (`waiting_body_memory_bytes`, `spool_dir`).

``SpoolBudget`` is plain bookkeeping of the body bytes held in memory. ``Spool`` owns the spool
directory (by default a private temporary directory, removed at exit): it writes a body to a
file and reads byte ranges back in worker threads, so that large files never block the event
loop, and removes files when their request is done, at shutdown, and, for files a crashed server
left behind, when the next server starts.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import itertools
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import NamedTuple

import trio

log = logging.getLogger("genrm_trio")

READ_CHUNK_BYTES = 64 * 1024
_PRIVATE_PREFIX = "genrm-trio-spool-"
_PRIVATE_DIR = re.compile(r"genrm-trio-spool-(\d+)-")
_FILE = re.compile(r"genrm-trio-(\d+)-\d+\.body")


class BudgetStatistics(NamedTuple):
    in_memory: int  # bytes the budget has given out
    receiving: int  # body bytes read and not yet parsed
    waiting: int  # bytes of whole bodies waiting in memory


class SpoolStatistics(NamedTuple):
    files: int  # spool files now on disk
    bytes_on_disk: int


class SpoolBudget:
    """The bytes of request bodies held in memory, against ``limit`` (None: no limit).

    ``in_memory`` is what the budget has given out: bodies admitted by their length, while they
    are read, parsed and while their requests wait. ``receiving`` is every body byte read and not
    yet parsed, within the budget or beyond it; ``waiting`` the admitted bodies that are whole.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.in_memory = 0
        self.receiving = 0
        self.waiting = 0
        self._room = trio.lowlevel.ParkingLot()

    def statistics(self) -> BudgetStatistics:
        return BudgetStatistics(self.in_memory, self.receiving, self.waiting)

    def admit(self, size: int) -> bool:
        """Keep a body of ``size`` bytes in memory if it fits (and count it); else False."""
        if self.limit is None or self.in_memory + size <= self.limit:
            self.in_memory += size
            return True
        return False

    async def wait_to_admit(self, size: int) -> None:
        """Count a body of ``size`` bytes in memory once it fits, waiting for others to leave.

        For bodies that cannot be spooled. One larger than the whole budget is let in when
        nothing else is held: otherwise it could never be served.
        """
        while not self.admit(size):
            if self.in_memory == 0:
                self.in_memory += size
                return
            await self._room.park()

    def release(self, size: int) -> None:
        self.in_memory -= size
        self._room.unpark_all()


class SpoolError(Exception):
    """A body could not be spooled; ``cause`` names why (directory, OS error)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


def spool_failed(cause: str, budget: SpoolBudget) -> str:
    """The 503 detail when a body beyond the memory budget cannot be spooled."""
    return (
        f"GenRM cannot hold this request body while it waits: bodies in memory are at the "
        f"waiting_body_memory_bytes budget ({budget.limit} bytes) and the spool file failed: "
        f"{cause}"
    )


@dataclass(frozen=True, slots=True)
class SpoolFile:
    path: str
    size: int


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _os_error_text(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    reason = exc.strerror or str(exc)
    return f"{name}: {reason}" if name else reason


class Spool:
    """The spool directory of one server and the files in it."""

    def __init__(self, directory: str | None) -> None:
        self._configured = directory
        self.directory: str | None = directory
        self._problem: str | None = None
        self._numbers = itertools.count()
        # Written and removed from worker threads, read by /metrics: under the lock.
        self._files: dict[str, int] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self._prepared = False

    @property
    def files(self) -> int:
        """Spool files now on disk."""
        return len(self._files)

    @property
    def bytes_on_disk(self) -> int:
        """Bytes of the spool files now on disk."""
        return self._bytes

    def statistics(self) -> SpoolStatistics:
        with self._lock:
            return SpoolStatistics(len(self._files), self._bytes)

    def prepare(self) -> None:
        """Create the directory and remove what servers that are no longer running left there.

        A directory that cannot be created is logged; every body that then needs spooling gets
        a 503 naming the cause, and bodies within the budget are served as usual.
        """
        if self._prepared:
            return
        self._prepared = True
        try:
            if self._configured is None:
                _remove_dead_private_dirs(tempfile.gettempdir())
                self.directory = tempfile.mkdtemp(prefix=f"{_PRIVATE_PREFIX}{os.getpid()}-")
                atexit.register(shutil.rmtree, self.directory, ignore_errors=True)
            else:
                os.makedirs(self._configured, exist_ok=True)
                _remove_dead_files(self._configured)
        except OSError as exc:
            where = self._configured or tempfile.gettempdir()
            self._problem = f"cannot prepare the spool directory {where}: {_os_error_text(exc)}"
            log.warning("GenRM %s", self._problem)

    def write_sync(self, body: bytes) -> SpoolFile:
        """Write ``body`` to a new file; meant for a worker thread. Raises ``SpoolError``."""
        if self._problem is not None:
            raise SpoolError(self._problem)
        assert self.directory is not None, "prepare() first"
        path = os.path.join(self.directory, f"genrm-trio-{os.getpid()}-{next(self._numbers)}.body")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise SpoolError(f"cannot write to {self.directory}: {_os_error_text(exc)}") from None
        with self._lock:
            self._files[path] = len(body)
            self._bytes += len(body)
        try:
            try:
                view = memoryview(body)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        except OSError as exc:
            self._remove_sync(path)
            raise SpoolError(f"cannot write to {self.directory}: {_os_error_text(exc)}") from None
        return SpoolFile(path, len(body))

    async def write(self, body: bytes) -> SpoolFile:
        return await trio.to_thread.run_sync(self.write_sync, body)

    @contextlib.asynccontextmanager
    async def reader(self, file: SpoolFile) -> AsyncIterator[_Reader]:
        """An open file to read ranges from; opening it raises ``SpoolError``."""
        try:
            fd = await trio.to_thread.run_sync(os.open, file.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise SpoolError(f"cannot read {file.path}: {_os_error_text(exc)}") from None
        try:
            yield _Reader(fd, file.path)
        finally:
            os.close(fd)

    async def remove(self, file: SpoolFile) -> None:
        """Remove a request's file; shielded, so that a cancelled request still cleans up."""
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._remove_sync, file.path)

    def _remove_sync(self, path: str) -> None:
        with self._lock:
            self._bytes -= self._files.pop(path, 0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def close(self) -> None:
        """At shutdown: remove every file still here, and the private directory."""
        with self._lock:
            paths = list(self._files)
        for path in paths:
            with contextlib.suppress(OSError):
                self._remove_sync(path)
        if self._configured is None and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


class _Reader:
    __slots__ = ("_fd", "_path")

    def __init__(self, fd: int, path: str) -> None:
        self._fd = fd
        self._path = path

    async def chunks(self, start: int, end: int) -> AsyncIterator[bytes]:
        """Bytes ``start:end`` of the file, in chunks of at most READ_CHUNK_BYTES."""
        while start < end:
            size = min(READ_CHUNK_BYTES, end - start)
            try:
                chunk = await trio.to_thread.run_sync(os.pread, self._fd, size, start)
            except OSError as exc:
                raise SpoolError(f"cannot read {self._path}: {_os_error_text(exc)}") from None
            if not chunk:
                raise SpoolError(f"cannot read {self._path}: the file is shorter than written")
            start += len(chunk)
            yield chunk


def _remove_dead_private_dirs(parent: str) -> None:
    for entry in os.scandir(parent):
        match = _PRIVATE_DIR.match(entry.name)
        if match and entry.is_dir(follow_symlinks=False) and not _pid_alive(int(match[1])):
            shutil.rmtree(entry.path, ignore_errors=True)


def _remove_dead_files(directory: str) -> None:
    for entry in os.scandir(directory):
        match = _FILE.fullmatch(entry.name)
        if match and entry.is_file(follow_symlinks=False) and not _pid_alive(int(match[1])):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
