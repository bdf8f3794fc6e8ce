"""Judge readiness as an operator meets it: `serve --wait-for-judge`, and /readyz of `serve` and
of `serve --workers 2`, with a real fake judge process or a closed port.

Every test here starts real processes and talks to them over TCP.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

SAFETY_S = 20.0
PROBE_SETS = ("--set", "judge_probe_interval_s=0.2", "--set", "judge_probe_timeout_s=1")


def judge_sets(judge_url: str) -> list[str]:
    return ["--set", f"judge_base_url={judge_url}", "--set", "judge_model=genrm"]


def nobody_listens(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_wait_for_a_dead_judge_exits_1_naming_the_replica_and_its_error(cli: Any) -> None:
    judge_port = cli.free_port()
    judge_url = f"http://127.0.0.1:{judge_port}/v1"
    port = cli.free_port()
    started = time.monotonic()
    process = cli.start(
        "serve", *judge_sets(judge_url), *PROBE_SETS, "--port", str(port), "--wait-for-judge", "1"
    )
    seen_listening = False
    while process.popen.poll() is None:
        seen_listening |= not nobody_listens(port)
        time.sleep(0.01)
    assert process.wait() == 1
    assert time.monotonic() - started >= 1.0
    assert not seen_listening
    assert process.stdout() == ""
    lines = process.stderr().splitlines()
    assert (
        "genrm-trio: no judge replica answered GET <base>/models within 1 s (--wait-for-judge); "
        "not serving"
    ) in lines
    assert (
        f"genrm-trio: judge replica {judge_url} unreachable: ConnectError: cannot connect to "
        f"127.0.0.1:{judge_port}: Connection refused"
    ) in lines


def test_wait_for_the_judge_holds_the_listener_back_until_it_answers(cli: Any) -> None:
    judge_port = cli.free_port()
    port = cli.free_port()
    process = cli.start(
        "serve",
        *judge_sets(f"http://127.0.0.1:{judge_port}/v1"),
        "--port", str(port),
        "--wait-for-judge", str(SAFETY_S),
    )  # fmt: skip
    time.sleep(1.0)  # it probes a closed port meanwhile
    assert process.popen.poll() is None
    assert nobody_listens(port)
    cli.start("fake-judge", "--port", str(judge_port))
    line = process.read_line()
    assert line == f"genrm-trio listening on http://127.0.0.1:{port}"
    with cli.http_client(f"http://127.0.0.1:{port}") as client:
        cli.wait_until(lambda: client.get("/readyz").status_code == 200)
    assert "answered after" in process.stderr()
    assert " ERROR " not in process.stderr()


def test_wait_for_the_judge_needs_probing_on(cli: Any) -> None:
    result = cli.run(
        "serve",
        *judge_sets("http://127.0.0.1:9/v1"),
        "--set", "judge_probe_path=null",
        "--wait-for-judge", "5",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stdout == ""
    assert (
        "genrm-trio: --wait-for-judge needs judge_probe_path, which is null (probing off)"
        in result.stderr.splitlines()
    )


def test_readyz_of_a_serve_process_follows_its_judge(cli: Any) -> None:
    judge_port = cli.free_port()
    judge_url = f"http://127.0.0.1:{judge_port}/v1"
    process, url, _ = cli.start_serve(*judge_sets(judge_url), *PROBE_SETS)
    with cli.http_client(url) as client:
        started = time.monotonic()
        cli.wait_until(
            lambda: client.get("/readyz").json()["judge_replicas"][0]["reachable"] is False
        )
        assert time.monotonic() - started < 5.0
        reply = client.get("/readyz")
        assert reply.status_code == 503
        assert reply.json()["reasons"][0].startswith(f"judge replica {judge_url} unreachable: ")
        assert client.get("/healthz").status_code == 200
        judge = cli.start("fake-judge", "--port", str(judge_port))
        cli.wait_until(lambda: client.get("/readyz").status_code == 200)
        judge.kill()
        cli.wait_until(lambda: client.get("/readyz").status_code == 503)
    errors = [line for line in process.stderr().splitlines() if " ERROR " in line]
    assert len(errors) == 1
    assert f"GET {judge_url}/models (ConnectError: " in errors[0]


def reachable_gauge(text: str) -> dict[str, float]:
    return {
        sample.labels["replica"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "genrm_judge_replica_reachable"
    }


def test_workers_answer_readyz_for_the_whole_deployment(cli: Any) -> None:
    judge_port = cli.free_port()
    judge_url = f"http://127.0.0.1:{judge_port}/v1"
    _, url, _ = cli.start_serve(*judge_sets(judge_url), *PROBE_SETS, "--workers", "2")
    # Fresh connections: the kernel hands each to whichever worker accepts first.
    with cli.http_client(url) as client:
        cli.wait_until(
            lambda: client.get("/readyz").json()["judge_replicas"][0]["reachable"] is False
        )
        down = client.get("/readyz")
        assert down.status_code == 503
        assert down.json()["reasons"][0].startswith(f"judge replica {judge_url} unreachable: ")
        cli.start("fake-judge", "--port", str(judge_port))
        cli.wait_until(lambda: client.get("/readyz").status_code == 200)
        replies = []
        for _ in range(10):
            with cli.http_client(url) as fresh:
                replies.append(fresh.get("/readyz"))
        assert {reply.status_code for reply in replies} == {200}
        health = client.get("/healthz").json()
        assert health["workers"] == 2
        assert health["judge_replicas"][0]["reachable"] is True
        assert reachable_gauge(client.get("/metrics").text) == {judge_url: 1.0}


def test_workers_wait_for_a_dead_judge_then_exit_1(cli: Any) -> None:
    judge_url = f"http://127.0.0.1:{cli.free_port()}/v1"
    result = cli.run(
        "serve", *judge_sets(judge_url), *PROBE_SETS, "--workers", "2", "--wait-for-judge", "1"
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"genrm-trio: judge replica {judge_url} unreachable: ConnectError: " in result.stderr
    # The deployment never started: no store server, no worker.
    assert "group store for 2 workers" not in result.stderr
