"""`genrm-trio` as an operator runs it: configuration errors, serving, signals (§10.1, AS-153).

Every test here starts real processes and talks to them over TCP.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import importlib.metadata
import json
import re
import signal
import socket
import subprocess
import time
from typing import Any

import httpx
import pytest

import genrm_trio

SAFETY_S = 20.0
DEADLINE_KEYS = (
    "cohort_collection_timeout_s",
    "cohort_evaluation_timeout_s",
    "judge_request_timeout_s",
)
# (YAML spelling in the file, how the error line shows the value)
BAD_DEADLINES = (("null", "null"), ("0", "0"), ("-1", "-1"), (".inf", "inf"), (".nan", "nan"))
LOG_LINE = re.compile(r"^\S+ (DEBUG|INFO|WARNING|ERROR) genrm_trio ")


def required_yaml(judge_url: str = "http://127.0.0.1:9/v1") -> str:
    return f"judge_base_url: {judge_url}\njudge_model: genrm\n"


def judge_sets(judge_url: str) -> list[str]:
    return ["--set", f"judge_base_url={judge_url}", "--set", "judge_model=genrm"]


def idle_judge_url(cli: Any) -> str:
    """A judge nobody listens on: serving never calls it in these tests."""
    return f"http://127.0.0.1:{cli.free_port()}/v1"


def log_levels(stderr: str) -> list[str]:
    return [m.group(1) for line in stderr.splitlines() if (m := LOG_LINE.match(line))]


def stop_and_time(process: Any, sig: signal.Signals = signal.SIGTERM) -> tuple[int, float]:
    started = time.monotonic()
    process.send_signal(sig)
    status = process.wait(SAFETY_S)
    return status, time.monotonic() - started


def occupied_port() -> socket.socket:
    """A listening socket on a free port; while it is open nobody else can bind that port."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    return taken


# --- exit status 2: configuration errors, reported before any port is bound -----------------


@pytest.mark.parametrize("key", DEADLINE_KEYS)
@pytest.mark.parametrize(("text", "shown"), BAD_DEADLINES)
def test_bad_deadline_exits_2_before_binding(cli: Any, key: str, text: str, shown: str) -> None:
    # AS-2
    path = cli.write("genrm.yaml", required_yaml() + f"{key}: {text}\n")
    with occupied_port() as taken:
        port = taken.getsockname()[1]
        # The port is held: a server that bound before validating would exit 1 instead.
        result = cli.run("serve", "--config", str(path), "--port", str(port))
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"invalid configuration: {key}: must be a finite number > 0 (got {shown})" in (
        result.stderr.splitlines()
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def test_bad_deadline_leaves_a_free_port_unbound(cli: Any) -> None:
    # AS-2
    port = cli.free_port()
    path = cli.write("genrm.yaml", required_yaml() + "judge_request_timeout_s: 0\n")
    process = cli.start("serve", "--config", str(path), "--port", str(port))
    seen_listening = False
    while process.popen.poll() is None:
        with socket.socket() as probe:
            seen_listening |= probe.connect_ex(("127.0.0.1", port)) == 0
        time.sleep(0.005)
    assert process.wait() == 2
    assert not seen_listening
    assert process.stdout() == ""
    assert (
        "invalid configuration: judge_request_timeout_s: must be a finite number > 0 (got 0)"
        in process.stderr().splitlines()
    )


@pytest.mark.parametrize("source", ["file", "set"])
def test_unknown_key_exits_2(cli: Any, source: str) -> None:
    # AS-3
    text = required_yaml()
    args: list[str] = []
    if source == "file":
        text += "cohort_timeout_s: 5\n"
    else:
        args = ["--set", "cohort_timeout_s=5"]
    path = cli.write("genrm.yaml", text)
    result = cli.run("serve", "--config", str(path), *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert (
        "unknown configuration key 'cohort_timeout_s' (did you mean 'compare_timeout_s'?)"
        in result.stderr.splitlines()
    )


@pytest.mark.parametrize("split", [False, True], ids=["both-in-file", "file-and-set"])
def test_two_invalid_keys_are_both_reported(cli: Any, split: bool) -> None:
    # AS-4
    text = required_yaml() + "cohort_collection_timeout_s: 0\n"
    args: list[str] = []
    if split:
        args = ["--set", "comparison_strategy=ring"]
    else:
        text += "comparison_strategy: ring\n"
    path = cli.write("genrm.yaml", text)
    result = cli.run("serve", "--config", str(path), *args)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert (
        "invalid configuration: cohort_collection_timeout_s: must be a finite number > 0 (got 0)"
        in lines
    )
    assert (
        "invalid configuration: comparison_strategy: must be one of circular, all_pairs, "
        "fixed_baseline (got 'ring')" in lines
    )
    assert sum(line.startswith("invalid configuration: ") for line in lines) == 2


@pytest.mark.parametrize(
    ("yaml_line", "key", "shown"),
    [
        ("num_rollouts_per_prompt: 16.5", "num_rollouts_per_prompt", "16.5"),
        ("num_rollouts_per_prompt: true", "num_rollouts_per_prompt", "true"),
        ('num_rollouts_per_prompt: "16"', "num_rollouts_per_prompt", "'16'"),
        ("top_percentile: 1.5", "top_percentile", "1.5"),
        ("answer_bonus: -0.1", "answer_bonus", "-0.1"),
        ("comparison_strategy: ring", "comparison_strategy", "'ring'"),
        ("aggregator_method: mean", "aggregator_method", "'mean'"),
    ],
)
def test_invalid_value_is_rejected_naming_its_key(
    cli: Any, yaml_line: str, key: str, shown: str
) -> None:
    # AS-5
    path = cli.write("genrm.yaml", required_yaml() + yaml_line + "\n")
    result = cli.run("serve", "--config", str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    problems = [line for line in result.stderr.splitlines() if line.startswith("invalid ")]
    assert len(problems) == 1
    assert problems[0].startswith(f"invalid configuration: {key}: ")
    assert problems[0].endswith(f" (got {shown})")
    if key == "comparison_strategy":
        assert "must be one of circular, all_pairs, fixed_baseline" in problems[0]
    if key == "aggregator_method":
        assert "simple_tiebreaker" in problems[0]


# --- serving --------------------------------------------------------------------------------


def test_long_judge_deadline_starts_with_one_warning(cli: Any) -> None:
    # AS-9
    path = cli.write(
        "genrm.yaml",
        required_yaml(f"http://127.0.0.1:{cli.free_port()}/v1")
        + "judge_request_timeout_s: 3600\ncohort_evaluation_timeout_s: 1800\n",
    )
    process, url, _ = cli.start_serve("--config", str(path))
    with cli.http_client(url) as client:
        assert client.get("/healthz").status_code == 200
    status, _ = stop_and_time(process)
    assert status == 0
    assert log_levels(process.stderr()).count("WARNING") == 1
    warning = next(line for line in process.stderr().splitlines() if " WARNING " in line)
    assert "judge_request_timeout_s" in warning


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_on_a_free_port_then_stop(cli: Any, sig: signal.Signals) -> None:
    # AS-10 (and AS-8: the key from the environment never reaches the process's output)
    secret = "sk-env-5f1c9b7e"
    judge_url = idle_judge_url(cli)
    process, url, line = cli.start_serve(
        *judge_sets(judge_url), env={"GENRM_JUDGE_API_KEY": secret}
    )
    match = re.fullmatch(r"genrm-trio listening on http://127\.0\.0\.1:(\d+)", line)
    assert match is not None, line
    assert int(match.group(1)) > 0
    with cli.http_client(url) as client:
        health = client.get("/healthz")
        assert health.status_code == 200
        assert cli.json_of(health) == {
            "status": "ok",
            "active_groups": 0,
            "retained_records": 0,
            "watermarks": 0,
            "judge_in_flight": 0,
            "legacy_resends_collecting": 0,
            "judge_attempts_total": 0,
            "group_store": "memory",
            "group_store_available": True,
            "body_bytes_receiving": 0,
            "body_bytes_in_memory": 0,
            "body_bytes_spooled": 0,
            "num_rollouts_per_prompt": 16,
            "comparison_strategy": "circular",
            "judge_replicas": health.json()["judge_replicas"],
        }
        [replica] = health.json()["judge_replicas"]
        assert replica["url"] == judge_url
    status, elapsed = stop_and_time(process, sig)
    assert status == 0
    assert elapsed <= 5.0 + 2.0  # shutdown_grace_s (default 5) + 2 s
    assert process.stdout() == line + "\n"
    assert "WARNING" not in log_levels(process.stderr())
    assert secret not in process.stderr()


def test_logs_are_single_dated_lines_with_the_startup_summary(cli: Any) -> None:
    # AS-10 (§9.1 log lines, O-1 startup summary); a healthy start logs nothing above INFO
    _, judge_url = cli.start_fake_judge()
    process, url, _ = cli.start_serve(*judge_sets(judge_url), "--set", "num_rollouts_per_prompt=4")
    with cli.http_client(url) as client:
        cli.wait_until(lambda: client.get("/readyz").status_code == 200)
    status, _ = stop_and_time(process)
    assert status == 0
    lines = process.stderr().splitlines()
    assert lines
    for line in lines:
        stamp, level, name, _message = line.split(" ", 3)
        datetime.datetime.fromisoformat(stamp)
        assert (level, name) == ("INFO", "genrm_trio")
    summary = (
        f"genrm-trio serving judge_api=chat_completions judge={judge_url} model=genrm N=4 "
        "strategy=circular passes=1"
    )
    assert sum(line.split(" ", 3)[3].startswith(summary) for line in lines) == 1


def test_port_in_use_exits_1(cli: Any) -> None:
    # AS-11
    with occupied_port() as taken:
        port = taken.getsockname()[1]
        result = cli.run("serve", *judge_sets(idle_judge_url(cli)), "--port", str(port))
    assert result.returncode == 1
    assert result.stdout == ""
    messages = [
        line
        for line in result.stderr.splitlines()
        if line.strip() and not re.match(r"^\S+ (DEBUG|INFO) genrm_trio ", line)
    ]
    assert messages, result.stderr


def test_version(cli: Any) -> None:
    # CL §8: `genrm-trio --version` prints the version
    script = cli.console_script()
    result = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=SAFETY_S, check=False
    )
    assert result.returncode == 0
    assert result.stdout.split() == ["genrm-trio", genrm_trio.__version__]
    assert genrm_trio.__version__ == importlib.metadata.version("genrm-trio")


# --- shutdown with waiting requests ---------------------------------------------------------


def member(i: int, g: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": "2+2?"},
        "response": {
            "id": f"r-{g}-0-{i}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"answer-{i} [[q=3]]"}],
                }
            ],
        },
        "_ng_group_id": g,
        "_ng_group_attempt": 0,
        "_ng_rollout_index": i,
    }


def post_verify(url: str, body: dict[str, Any]) -> tuple[int, Any] | Exception:
    """A /verify from a separate client; a connection error is returned, not raised."""
    try:
        with httpx.Client(base_url=url, timeout=SAFETY_S, trust_env=False) as client:
            reply = client.post("/verify", content=json.dumps(body))
            return reply.status_code, reply.json()
    except httpx.TimeoutException:
        raise
    except httpx.TransportError as exc:
        return exc


def test_sigterm_answers_waiting_requests_and_exits(cli: Any) -> None:
    # AS-153
    rules = cli.write("rules.yaml", "- action: hang\n")
    judge, judge_url = cli.start_fake_judge("--rules", str(rules))
    grace = 2.0
    process, url, _ = cli.start_serve(
        "--set", f"judge_base_url={judge_url}",
        "--set", "judge_model=genrm",
        "--set", "num_rollouts_per_prompt=2",
        "--set", f"shutdown_grace_s={grace}",
    )  # fmt: skip
    judge_control = cli.http_client(judge_url.removesuffix("/v1"))
    server = cli.http_client(url)
    bodies = [member(0, "collecting"), member(0, "evaluating"), member(1, "evaluating")]
    with judge_control, server, concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        futures = [pool.submit(post_verify, url, body) for body in bodies]
        cli.wait_until(lambda: server.get("/healthz").json()["active_groups"] == 2)
        cli.wait_until(lambda: judge_control.get("/_fake/stats").json()["in_flight"] == 2)
        assert server.get("/healthz").json()["judge_in_flight"] == 2

        status, elapsed = stop_and_time(process)
        outcomes = [future.result(SAFETY_S) for future in futures]

        assert status == 0
        assert elapsed <= grace + 2.0
        for outcome in outcomes:
            if not isinstance(outcome, Exception):
                assert outcome == (503, {"detail": "GenRM server is shutting down"})
        cli.wait_until(
            lambda: judge_control.get("/_fake/stats").json()["in_flight"] == 0, timeout=1.0
        )
    judge.send_signal(signal.SIGTERM)
    assert judge.wait() == 0


# --- large bodies through the deployed server ---------------------------------------------------


def test_large_bodies_are_scored_and_echoed_byte_for_byte(cli: Any) -> None:
    # W-21 through hypercorn as `serve` configures it: each body spans dozens of socket reads.
    judge, judge_url = cli.start_fake_judge()
    process, url, _ = cli.start_serve(*judge_sets(judge_url), "--set", "num_rollouts_per_prompt=2")
    texts = []
    for i in range(2):
        body = member(i, "large")
        message = body["response"]["output"][0]
        tokens = range(60_000)
        message["generation_token_ids"] = [(i * 7_919 + k * 104_729) % 151_936 for k in tokens]
        message["generation_log_probs"] = [-((k % 997) + 0.5) / 1_000.3 for k in tokens]
        texts.append(json.dumps(body).encode())
    assert all(len(text) > 1_000_000 for text in texts)

    def post(text: bytes) -> httpx.Response:
        with httpx.Client(base_url=url, timeout=SAFETY_S, trust_env=False) as client:
            return client.post("/verify", content=text)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(post, texts))

    for text, reply in zip(texts, replies, strict=True):
        assert reply.status_code == 200, reply.text
        row = reply.json()
        assert row.get("mask_sample") is not True
        assert isinstance(row["reward"], float)
        sent = json.loads(text)
        response_text = json.dumps(sent["response"]).encode()
        assert reply.content.count(response_text) == 1
    process.send_signal(signal.SIGTERM)
    assert process.wait(SAFETY_S) == 0
    judge.send_signal(signal.SIGTERM)
    assert judge.wait(SAFETY_S) == 0
