"""`genrm-trio fake-judge` flags (CL-10) and the process: ready line, serving, signals, exits.
The process tests run the module directly, so they do not depend on the top-level CLI."""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from _fake_judge_support import chat_body, chat_verdict

from genrm_trio.fakes.judge_command import (
    add_arguments,
    judge_from_args,
    listening_line,
    run,
)

# Only guards against a hung test; no assertion depends on it.
SAFETY_S = 20


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="genrm-trio fake-judge")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults() -> None:
    args = parse()
    assert (args.host, args.port, args.seed, args.latency) == ("127.0.0.1", 9000, 0, "none")
    assert (args.model, args.api_key, args.rules, args.fault_rate) == (None, None, None, [])
    assert (args.position_bias, args.tie_ranking) == (0.0, 3.5)
    judge = judge_from_args(args)
    assert judge.verdict("[[q=3]]", "[[q=3]]") == (3, 3, 3.5)
    assert judge.rules == []


def test_every_flag_reaches_the_judge(tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(
        "- match: {response_1: 'answer-4 ', response_2: 'answer-5 '}\n"
        "  action: http_status\n"
        "  status: 500\n"
    )
    args = parse(
        "--host", "0.0.0.0", "--port", "0", "--model", "genrm", "--api-key", "k",
        "--seed", "7", "--latency", "uniform:0.1:0.2", "--position-bias", "1",
        "--tie-ranking", "3", "--rules", str(rules_file),
        "--fault-rate", "http_status:503=0.01", "--fault-rate", "budget_exhausted=0.05",
        "--prefix-cache", "64:0.25",
    )  # fmt: skip
    assert args.fault_rate == [("http_status:503", 0.01), ("budget_exhausted", 0.05)]
    judge = judge_from_args(args)
    assert (judge.seed, judge.model, judge.api_key) == (7, "genrm", "k")
    assert judge.prefix_cache is not None
    assert (judge.prefix_cache.capacity, judge.prefix_cache.miss_s) == (64, 0.25)
    assert judge.verdict("[[q=3]]", "[[q=4]]") == (4, 4, 3)
    assert judge.rules == [
        {
            "match": {"response_1": "answer-4 ", "response_2": "answer-5 "},
            "action": "http_status",
            "status": 500,
        }
    ]


def test_json_rules_file(tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps([{"action": "close", "times": 1}]))
    assert judge_from_args(parse("--rules", str(rules_file))).rules == [
        {"action": "close", "times": 1}
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["--latency", "slow"],
        ["--latency", "uniform:3:1"],
        ["--prefix-cache", "0:1"],
        ["--prefix-cache", "fast"],
        ["--fault-rate", "budget_exhausted"],
        ["--fault-rate", "explode=0.1"],
        ["--fault-rate", "close=2"],
        ["--fault-rate", "http_status=0.1"],
        ["--port", "70000"],
        ["--seed", "x"],
    ],
)
def test_bad_flags_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_bad_rules_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text("- action: explode\n")
    assert run(parse("--rules", str(rules_file), "--port", "0")) == 2
    assert "rule 0: unknown action 'explode'" in capsys.readouterr().err
    assert run(parse("--rules", str(tmp_path / "missing.yaml"))) == 2


def test_listening_line() -> None:
    assert listening_line("127.0.0.1", 9000) == "fake judge listening on http://127.0.0.1:9000/v1"
    assert listening_line("::1", 9001) == "fake judge listening on http://[::1]:9001/v1"


def start(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "genrm_trio.fakes.judge_command", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_process_serves_and_exits_0_on_signal(stop: signal.Signals) -> None:
    process = start("--port", "0", "--model", "genrm", "--api-key", "k")
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("fake judge listening on http://127.0.0.1:")
        base_url = line.split(" on ")[1].strip()
        assert base_url.endswith("/v1")
        with httpx.Client(base_url=base_url, timeout=SAFETY_S) as client:
            reply = client.post(
                "/chat/completions",
                json=chat_body("[[q=5]]", "[[q=1]]", model="genrm"),
                headers={"Authorization": "Bearer k"},
            )
            assert chat_verdict(reply.json()) == {"score_1": 5, "score_2": 1, "ranking": 1}
            assert client.post("/chat/completions", json=chat_body("a", "b")).status_code == 401
        process.send_signal(stop)
        assert process.wait(SAFETY_S) == 0
        assert process.stdout.read() == ""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_port_in_use_exits_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = start("--port", str(port))
        try:
            _, err = process.communicate(timeout=SAFETY_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 1
    assert "cannot listen" in err
