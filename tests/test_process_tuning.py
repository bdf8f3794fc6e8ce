"""What `serve` sets for its own process: listen backlog under somaxconn, open-file limit and the
client-connection cap derived from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from genrm_trio.process_tuning import (
    BASE_DESCRIPTORS,
    REJECTING_CONNECTIONS,
    connection_budget,
    effective_backlog,
    kernel_listen_limit,
)


def test_backlog_under_somaxconn_is_kept_without_a_line() -> None:
    assert effective_backlog(4096, 4096) == (4096, None)
    assert effective_backlog(100, None) == (100, None)


def test_backlog_over_somaxconn_is_capped_and_says_how_to_raise_it() -> None:
    backlog, line = effective_backlog(8192, 128)
    assert backlog == 128
    assert line is not None
    assert "listen_backlog=8192 is capped at 128" in line
    assert "net.core.somaxconn=8192" in line


def test_somaxconn_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    path = tmp_path / "somaxconn"
    path.write_text("4096\n")
    assert kernel_listen_limit(path) == 4096
    assert kernel_listen_limit(tmp_path / "absent") is None


def test_judge_connections_and_the_process_are_kept_out_of_the_client_cap() -> None:
    files = connection_budget(1024, 65536, 65536, judge_connections=256)
    assert files.reserved == BASE_DESCRIPTORS + REJECTING_CONNECTIONS + 256
    assert files.connections == 65536 - files.reserved
    assert files.problem is None
    assert "raised from 1024 to 65536 (hard limit 65536)" in files.line()
    assert f"up to {files.connections} client connections" in files.line()


def test_a_limit_too_low_for_the_judge_halves_it_and_says_so() -> None:
    files = connection_budget(256, 256, 256, judge_connections=256)
    assert files.connections == 128
    assert files.problem is not None
    assert "judge_max_concurrency=256" in files.problem
    assert "ulimit -n" in files.problem


def test_serve_tuning_raises_the_soft_limit_to_the_hard_limit() -> None:
    # In a child process: the limit is process-wide and the test runner's must stay as it was.
    script = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "from genrm_trio.process_tuning import tune_for_serving\n"
        "tuning = tune_for_serving(4096, 16)\n"
        "now = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "print(tuning.files.soft, now[0], now[1], tuning.files.before)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    soft, now_soft, hard, before = (int(word) for word in result.stdout.split())
    assert soft == now_soft == (hard if hard != -1 else 1_048_576)
    assert before == min(256, hard if hard != -1 else 256)
