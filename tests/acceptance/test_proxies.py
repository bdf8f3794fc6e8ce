"""Two `genrm-trio serve` processes sharing Redis behind real HAProxy and nginx, each configured
exactly as docs/running.md says (only the ports and file paths are the test's): one process is
killed with SIGKILL mid-step, while it holds waiting requests, and `genrm-trio collect` still
ends with every group whole and no failed row. A proxy that is not installed is skipped with the
reason.

Rollouts that fit HAProxy's buffer are sent to the other process by HAProxy itself; larger ones,
as real rollouts with token ids and log-probs are, it cannot send again, and `collect` resends
them. nginx buffers whole bodies of any size and sends them to the other process itself.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from genrm_trio.collect._rows import read_rows
from genrm_trio.testing.redis_server import RedisServer

RUNNING_MD = Path(__file__).resolve().parents[2] / "docs" / "running.md"
N = 8
TASKS = 24
SAFETY_S = 60.0
HAPROXY_BUFFER = 16384
# Filler words per answer: /verify bodies of about 1 KB, and of about 20 KB.
SMALL, LARGE = "4:24", "3500:3500"


def documented_block(language: str, marker: str) -> str:
    """The one ```language block of running.md that contains `marker`."""
    text = RUNNING_MD.read_text(encoding="utf-8")
    blocks = re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)
    found = [block for block in blocks if marker in block]
    assert len(found) == 1, f"running.md has {len(found)} {language} blocks with {marker!r}"
    return found[0]


def on_ports(config: str, front: int, a: int, b: int) -> str:
    """The documented config with the test's ports for 127.0.0.1:8000, :8001 and :8002."""
    for documented, port in (("8000", front), ("8001", a), ("8002", b)):
        config, count = re.subn(rf"127\.0\.0\.1:{documented}\b", f"127.0.0.1:{port}", config)
        assert count == 1, f"127.0.0.1:{documented} appears {count} times"
    return config


def haproxy_command(tmp_path: Path, front: int, a: int, b: int) -> tuple[list[str], Path | None]:
    config = on_ports(documented_block("haproxy", "backend genrm_trio"), front, a, b)
    # HAProxy refuses to start without two descriptors per maxconn; on a host whose hard limit
    # is lower than the documented value needs, the test takes what the host allows.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    match = re.search(r"^    maxconn (\d+)", config, flags=re.M)
    assert match is not None
    if hard != resource.RLIM_INFINITY and 2 * int(match.group(1)) + 1000 > hard:
        config = config.replace(match.group(0), f"    maxconn {(hard - 1000) // 2}")
    path = tmp_path / "haproxy.cfg"
    path.write_text(config, encoding="utf-8")
    # -db: in the foreground, its request log on stdout as configured.
    return ["haproxy", "-db", "-f", str(path)], None


def nginx_command(tmp_path: Path, front: int, a: int, b: int) -> tuple[list[str], Path | None]:
    main = documented_block("nginx", "worker_connections")
    site = on_ports(documented_block("nginx", "upstream genrm_trio"), front, a, b)
    access_log = tmp_path / "nginx-access.log"
    documented_log = "/var/log/nginx/genrm-trio.log"
    assert documented_log in site
    site = site.replace(documented_log, str(access_log))
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    # Where a packaged nginx keeps its files (pid, logs, temporary bodies) the test cannot
    # write: those go under its own directory; everything else is the documentation's.
    own = "\n".join(
        [
            "daemon off;",
            f"pid {prefix}/nginx.pid;",
            f"error_log {prefix}/error.log info;",
            *(["user root;"] if os.geteuid() == 0 else []),
        ]
    )
    temp_paths = "\n".join(
        f"    {kind}_temp_path {prefix}/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    config = f"{own}\n{main}\nhttp {{\n{temp_paths}\n{site}\n}}\n"
    path = prefix / "nginx.conf"
    path.write_text(config, encoding="utf-8")
    return ["nginx", "-p", str(prefix), "-e", f"{prefix}/error.log", "-c", str(path)], access_log


PROXIES: dict[str, Callable[[Path, int, int, int], tuple[list[str], Path | None]]] = {
    "haproxy": haproxy_command,
    "nginx": nginx_command,
}


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [stored.row for stored in read_rows(path.read_bytes(), path.name)[0]]


def _waiters(cli: Any, port: int) -> float:
    """Requests waiting for their group in the process on `port` (its own /metrics)."""
    with cli.http_client(f"http://127.0.0.1:{port}") as client:
        text = client.get("/metrics").text
    return float(re.search(r"^genrm_waiters (\S+)$", text, flags=re.M).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("proxy", "words"), [("haproxy", SMALL), ("haproxy", LARGE), ("nginx", LARGE)]
)
def test_a_process_killed_mid_step_behind_the_documented_proxy_costs_collect_no_row(
    proxy: str, words: str, cli: Any, redis_server: RedisServer, tmp_path: Path
) -> None:
    if shutil.which(proxy) is None:
        pytest.skip(f"{proxy} is not installed (Debian: apt-get install {proxy})")
    _, judge_url = cli.start_fake_judge("--latency", "fixed:0.4")
    settings = [
        f"judge_base_url={judge_url}",
        "judge_model=fake-judge",
        f"num_rollouts_per_prompt={N}",
        f"group_store={redis_server.url}",
        "group_store_lease_s=2",
    ]
    ports = [cli.free_port() for _ in range(3)]
    front, a, b = ports
    processes = {}
    for port in (a, b):
        sets = [arg for setting in settings for arg in ("--set", setting)]
        processes[port] = cli.start("serve", "--port", str(port), *sets)
    for port, process in processes.items():
        assert process.read_line() == f"genrm-trio listening on http://127.0.0.1:{port}"

    command, access_log = PROXIES[proxy](tmp_path, front, a, b)
    gateway = cli.start_program(command)
    front_url = f"http://127.0.0.1:{front}"

    def through_proxy() -> bool:
        try:
            with httpx.Client(trust_env=False, timeout=2) as client:
                return client.get(f"{front_url}/healthz").status_code == 200
        except httpx.HTTPError:
            assert gateway.popen.poll() is None, gateway.stderr() + gateway.stdout()
            return False

    cli.wait_until(through_proxy)

    policy = cli.start(
        "fake-policy", "--port", "0", "--seed", "3", "--latency", "uniform:0.05:0.3",
        "--words", words,
    )  # fmt: skip
    policy_url = policy.read_line().removeprefix("fake policy listening on ")
    tasks = cli.write(
        "tasks.jsonl",
        "".join(
            json.dumps({"responses_create_params": {"input": f"Explain item {i}."}}) + "\n"
            for i in range(TASKS)
        ),
    )
    out = tmp_path / "out.jsonl"
    run = cli.start(
        "collect", "--policy-url", policy_url, "--server-url", front_url, "--repeats", str(N),
        "--input", str(tasks), "--output", str(out), "--concurrency", "4",
    )  # fmt: skip
    # Mid-step: some groups written, and requests waiting in the process about to die.
    cli.wait_until(lambda: len(_rows(out)) >= 2 * N and _waiters(cli, a) >= 2)
    assert run.popen.poll() is None, "the run ended before a process could be killed"
    processes[a].send_signal(signal.SIGKILL)
    assert processes[a].wait() == -signal.SIGKILL

    assert run.wait(SAFETY_S) == 0, run.stderr()
    assert _rows(tmp_path / "out_failures.jsonl") == []
    rows = _rows(out)
    by_task: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_task.setdefault(row["_ng_task_index"], []).append(row)
    assert sorted(by_task) == list(range(TASKS))
    for task, group in by_task.items():
        assert sorted(r["_ng_rollout_index"] for r in group) == list(range(N)), task
        assert {r["_ng_group_attempt"] for r in group} == {0}, task
    large = len(json.dumps(rows[0])) > HAPROXY_BUFFER
    assert large == (words == LARGE)

    # The kill cut requests off. A proxy that holds a request whole sends it to the other
    # process itself; HAProxy cannot for a body over its buffer: it answers 502 or, on a
    # connection collect had used before, closes it without a reply (as for a browser), and
    # collect sends the request again.
    metrics = json.loads((tmp_path / "out_metrics.json").read_text())
    resends = metrics["this_run"]["verify_resends"]
    gateway.send_signal(signal.SIGTERM)
    gateway.wait()
    if access_log is None:
        log = gateway.stdout().splitlines()
        answered_502 = [line for line in log if " 502 " in line and " SH-- " in line]
        if large:
            assert resends >= len(answered_502) and resends > 0, "\n".join(log[-40:])
        else:
            assert answered_502 == [] and resends == 0, "\n".join(log[-40:])
    else:
        log = access_log.read_text(encoding="utf-8").splitlines()
        sent_elsewhere = [line for line in log if "upstream_status=502, 200" in line]
        assert sent_elsewhere, "\n".join(log[-40:])
    processes[b].send_signal(signal.SIGTERM)
    assert processes[b].wait() == 0
