"""Process-wide settings `genrm-trio serve` makes for itself at start-up, each with its reason.

Only `serve` calls these: an application that embeds `create_app` keeps its interpreter as it
was (collector, open-file limit, hypercorn's module constants are all process-wide).
"""

from __future__ import annotations

import gc
import resource
from dataclasses import dataclass
from pathlib import Path

# A server holds thousands of requests in flight, each with a few hundred tracked objects (tasks,
# frames, cancel scopes). At Python's default threshold (700) the collector ran every few requests
# and kept walking that population: about 40% of the CPU of a /verify under load (see
# docs/performance.md). Cyclic garbage still goes, only in larger batches.
GC_THRESHOLDS = (50_000, 20, 10)


def prepare_collector() -> None:
    """Garbage-collector settings for a long-running server process.

    Everything alive at start-up (modules, the app) is frozen out of every later collection, and
    young collections run every 50,000 net allocations instead of 700.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


# glibc serves a large allocation with its own mapping (returned to the system when freed) only
# above a threshold that it raises to the size of the largest such block freed so far, up to
# 32 MiB. A server that frees a 2 MB request body therefore serves the next ones from its heap,
# and once a whole step of bodies has come and gone the heap stays at its high-water mark. A
# fixed threshold keeps request bodies, joined buffers and large reads in mappings that go back
# to the system with their request (docs/performance.md, "Memory").
LARGE_ALLOCATION_BYTES = 128 * 1024
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def return_large_blocks_to_the_system() -> bool:
    """Fix glibc's mmap threshold (and trim the heap at the same size); False off glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, LARGE_ALLOCATION_BYTES)
        and mallopt(_M_TRIM_THRESHOLD, 2 * LARGE_ALLOCATION_BYTES)
    )


SOMAXCONN_PATH = Path("/proc/sys/net/core/somaxconn")


def kernel_listen_limit(path: Path = SOMAXCONN_PATH) -> int | None:
    """The kernel's cap on a listen backlog (net.core.somaxconn), or None where unknown."""
    try:
        return int(path.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return None


def effective_backlog(requested: int, kernel_limit: int | None) -> tuple[int, str | None]:
    """The backlog to ask for and, when the kernel cuts it down, the line that says so.

    Linux silently truncates a larger backlog to somaxconn; saying so at start-up is the only
    place an operator learns why a burst overflowed a queue they configured larger.
    """
    if kernel_limit is None or requested <= kernel_limit:
        return requested, None
    return kernel_limit, (
        f"listen_backlog={requested} is capped at {kernel_limit} by the kernel "
        f"(net.core.somaxconn); raise it with `sysctl -w net.core.somaxconn={requested}` "
        "for bursts of fresh connections that large"
    )


# Descriptors `serve` needs besides client connections: standard streams, the event loop's
# epoll and wake-up sockets, the listening socket, the resolver's sockets and files while a
# judge connection is opened, and the 503s being written to connections over the limit.
BASE_DESCRIPTORS = 64
# Connections answered 503 at once when the server is at its connection limit; beyond these,
# further connections wait in the listen queue until one of these is done.
REJECTING_CONNECTIONS = 32


@dataclass(frozen=True)
class OpenFileLimit:
    """The open-file limit before and after start-up, and the client connections it allows."""

    before: int
    soft: int
    hard: int
    connections: int
    reserved: int
    problem: str | None = None

    def line(self) -> str:
        raised = (
            f"raised from {self.before} to {self.soft}"
            if self.soft != self.before
            else f"{self.soft}"
        )
        hard = "unlimited" if self.hard == resource.RLIM_INFINITY else str(self.hard)
        return (
            f"open-file limit {raised} (hard limit {hard}): up to {self.connections} client "
            f"connections at once; {self.reserved} descriptors kept for judge connections and "
            "the process"
        )


# Where the hard limit is unlimited, this many is plenty and stays within what the kernel
# accepts for RLIMIT_NOFILE (fs.nr_open, 1,048,576 by default).
_UNLIMITED_TARGET = 1_048_576


def raise_open_file_limit(judge_connections: int) -> OpenFileLimit:
    """Raise the open-file soft limit to the hard limit and size the client-connection cap.

    Each waiting /verify holds one descriptor for as long as its group takes, and a trainer
    posts a whole step at once, so the common default soft limit of 1,024 is far too few while
    the hard limit is usually much higher; raising the soft limit needs no privilege.
    """
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    soft = target if before == resource.RLIM_INFINITY else before
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return connection_budget(before, soft, hard, judge_connections)


def connection_budget(before: int, soft: int, hard: int, judge_connections: int) -> OpenFileLimit:
    """How many client connections `soft` descriptors allow once the judge's are kept aside.

    The judge's connections are kept aside so that a burst of clients can never take the
    descriptors a group needs to be judged and answered.
    """
    reserved = BASE_DESCRIPTORS + REJECTING_CONNECTIONS + judge_connections
    connections = soft - reserved
    problem = None
    if connections < soft // 2:
        connections = max(1, soft // 2)
        reserved = soft - connections
        problem = (
            f"the open-file limit {soft} is too low for judge_max_concurrency="
            f"{judge_connections} judge connections besides client connections: client "
            f"connections are capped at {connections} and judge calls may fail to connect; "
            "raise the open-file limit (ulimit -n) or lower judge_max_concurrency"
        )
    return OpenFileLimit(before, soft, hard, connections, reserved, problem)


@dataclass(frozen=True)
class ServeTuning:
    """What `tune_for_serving` set: the listen backlog, the open-file limit, and the lines to
    log about them (`warnings` where a limit is lower than a burst may need)."""

    backlog: int
    files: OpenFileLimit
    lines: tuple[str, ...]
    warnings: tuple[str, ...]


def tune_for_serving(listen_backlog: int, judge_connections: int) -> ServeTuning:
    """The process-wide settings `serve` makes before it binds (see each function's reason)."""
    backlog, capped = effective_backlog(listen_backlog, kernel_listen_limit())
    files = raise_open_file_limit(judge_connections)
    return_large_blocks_to_the_system()
    lines = (f"listen backlog {backlog}", files.line())
    warnings = tuple(line for line in (capped, files.problem) if line is not None)
    return ServeTuning(backlog, files, lines, warnings)
