"""`genrm-trio collect` checks the server before it sends anything: a group size other than
--repeats, or a server that is not ready to judge, ends the run at once with exit 2 and says why.

Over real loopback against a stand-in for the server (and the policy) that answers `/healthz`
and `/readyz` as the server's contract says (testing/_stand_in_server.py), so that the test also
sees that nothing was posted.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from genrm_trio.cli import main
from genrm_trio.collect._preflight import group_size_refusal
from genrm_trio.testing._stand_in_server import Answer, stand_in_server

DEAD_REPLICA = "judge replica http://127.0.0.1:9/v1 unreachable: ConnectError: Connection refused"
NOT_READY: Answer = (
    503,
    {
        "status": "not_ready",
        "reasons": [DEAD_REPLICA],
        "judge_replicas": [],
        "group_store_available": True,
    },
)
READY: Answer = (200, {"status": "ready", "judge_replicas": [], "group_store_available": True})
MODELS: Answer = (200, {"object": "list", "data": [{"id": "policy"}]})
VERIFY_TIMEOUT_S = 600


def health(size: int | None) -> Answer:
    return (
        200,
        {
            "status": "ok",
            "num_rollouts_per_prompt": size,
            "comparison_strategy": "circular",
            "judge_replicas": [],
        },
    )


def collect(tmp_path: Path, url: str, repeats: int, wait_ready: float) -> tuple[int, float]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"responses_create_params": {"input": "x"}}\n')
    started = time.monotonic()
    status = main(
        [
            "collect", "--policy-url", f"{url}/v1", "--server-url", url,
            "--input", str(tasks), "--output", str(tmp_path / "out.jsonl"),
            "--repeats", str(repeats), "--wait-ready", str(wait_ready),
            "--verify-timeout", str(VERIFY_TIMEOUT_S),
        ]
    )  # fmt: skip
    return status, time.monotonic() - started


def test_a_group_size_other_than_repeats_exits_2_before_anything_is_sent(
    tmp_path: Path, capsys: Any
) -> None:
    answers = {"GET /healthz": [health(8)], "GET /readyz": [READY], "GET /v1/models": [MODELS]}
    with stand_in_server(answers) as server:
        status, took = collect(tmp_path, server.url, 4, wait_ready=30)
    assert status == 2
    assert capsys.readouterr().err == (
        "genrm-trio collect: error: --repeats 4 does not match the server's group size"
        f" (num_rollouts_per_prompt: 8 at {server.url}); pass --repeats 8, or serve with"
        " num_rollouts_per_prompt: 4; nothing sent\n"
    )
    # Checked on the first answer of /healthz: not even the policy was asked.
    assert server.requests == ["GET /healthz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.jsonl"]
    assert took < VERIFY_TIMEOUT_S


def test_a_server_that_does_not_judge_groups_exits_2(tmp_path: Path, capsys: Any) -> None:
    with stand_in_server({"GET /healthz": [health(None)]}) as server:
        status, _ = collect(tmp_path, server.url, 4, wait_ready=30)
    assert status == 2
    assert "does not judge groups (num_rollouts_per_prompt: null)" in capsys.readouterr().err
    assert server.requests == ["GET /healthz"]


def test_a_server_that_is_not_ready_exits_2_with_its_reasons(tmp_path: Path, capsys: Any) -> None:
    answers = {"GET /healthz": [health(4)], "GET /readyz": [NOT_READY], "GET /v1/models": [MODELS]}
    with stand_in_server(answers) as server:
        status, took = collect(tmp_path, server.url, 4, wait_ready=2)
    assert status == 2
    assert capsys.readouterr().err == (
        f"genrm-trio collect: error: genrm-trio server {server.url} is not ready (waited 2s):"
        f" {DEAD_REPLICA}; nothing sent\n"
    )
    # /readyz was asked while --wait-ready lasted, and no rollout was posted.
    assert server.requests[:2] == ["GET /healthz", "GET /v1/models"]
    assert set(server.requests[2:]) == {"GET /readyz"} and len(server.requests) >= 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.jsonl"]
    assert took < VERIFY_TIMEOUT_S


def test_the_group_size_check() -> None:
    url = "http://genrm:8000"
    assert group_size_refusal({"num_rollouts_per_prompt": 4}, 4, url) is None
    assert group_size_refusal({"num_rollouts_per_prompt": 8}, 4, url) == (
        "--repeats 4 does not match the server's group size (num_rollouts_per_prompt: 8 at"
        " http://genrm:8000); pass --repeats 8, or serve with num_rollouts_per_prompt: 4"
    )
    # A server that does not report its size (older than this check) is not checked.
    assert group_size_refusal({"status": "ok"}, 4, url) is None
    assert group_size_refusal(None, 4, url) is None
