"""genrm-trio inside a NeMo Gym run, over TCP, without Gym.

test_gym_pipeline.py runs the real Gym where a Python >= 3.13 is at hand; this suite imitates
its runner's exact calls for what that run does not cover (Gym's shipped genrm_compare config,
a judge behind `genrm_model_server`, a dry run, a bad block): like `gym env start`, it writes the
merged config of the run with every server's host and port assigned, starts
`<venv python> app.py` in the server's directory with that config as YAML in
NEMO_GYM_CONFIG_DICT, the server's name in NEMO_GYM_CONFIG_PATH and the directory on PYTHONPATH,
waits until `GET /` answers anything, then talks to the server at the address the config names,
as Gym's simple agent and rollout collector do, and stops it with SIGINT.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml

from genrm_trio.testing.harness import member

SAFETY_S = 20.0  # only guards against a hung process

ROOT = Path(__file__).resolve().parents[2]
SERVER_DIR = ROOT / "resources_servers" / "genrm_trio"
GYM_SHIPPED = ROOT / "tests" / "data" / "gym_genrm_compare.yaml"
INSTANCE = "genrm_compare_resources_server"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until(condition: Callable[[], bool]) -> None:
    limit = time.monotonic() + SAFETY_S
    while not condition():
        assert time.monotonic() < limit, f"condition still false after {SAFETY_S} s"
        time.sleep(0.05)


def gym_run_config(judge_url: str, port: int) -> dict[str, Any]:
    """Gym's shipped genrm_compare config with its one substitution (the server type names
    genrm-trio's directory), merged the way Gym's runner merges a run's config."""
    text = GYM_SHIPPED.read_text(encoding="utf-8")
    assert text.count("    genrm_compare:\n") == 1
    document: dict[str, Any] = yaml.safe_load(
        text.replace("    genrm_compare:\n", "    genrm_trio:\n")
    )
    judge = httpx.URL(judge_url)
    # What the runner fills in before it starts any server: addresses, the head server, the
    # values given on its command line (here ++genrm_model_name) and its own settings.
    document[INSTANCE]["resources_servers"]["genrm_trio"].update(host="127.0.0.1", port=port)
    model = document["genrm_model"]["responses_api_models"]["genrm_model"]
    model.update(host=judge.host, port=judge.port)
    for agent in ("genrm_simple_agent", "genrm_simple_agent_reasoning_off"):
        document[agent]["responses_api_agents"]["simple_agent"].update(
            host="127.0.0.1", port=free_port()
        )
    document["genrm_model_name"] = "fake-genrm"
    document["head_server"] = {"host": "127.0.0.1", "port": free_port()}
    document["dry_run"] = False
    document["disallowed_ports"] = [port]
    return document


def start_like_gym(config: dict[str, Any], instance: str = INSTANCE) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "GENRM_JUDGE_API_KEY"}
    env["NEMO_GYM_CONFIG_DICT"] = yaml.safe_dump(config, sort_keys=False)
    env["NEMO_GYM_CONFIG_PATH"] = instance
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SERVER_DIR), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "app.py"],
        cwd=SERVER_DIR,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def gym_started() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=SAFETY_S)


def gym_ready(url: str) -> bool:
    """Gym's readiness poll: any HTTP answer at `/` counts, whatever its status."""
    try:
        httpx.get(url + "/", timeout=1.0)
    except httpx.TransportError:
        return False
    return True


def address_of(config: dict[str, Any], name: str) -> str:
    """How Gym's clients find a server: by name, through the run's config."""
    block = next(iter(next(iter(config[name].values())).values()))
    return f"http://{block['host']}:{block['port']}"


async def test_gyms_runner_starts_genrm_trio_from_gyms_own_config(
    cli: Any, gym_started: list[subprocess.Popen[str]]
) -> None:
    judge, judge_url = cli.start_fake_judge()
    config = gym_run_config(judge_url, free_port())
    server = start_like_gym(config)
    gym_started.append(server)
    url = address_of(config, INSTANCE)
    wait_until(lambda: server.poll() is not None or gym_ready(url))
    assert server.poll() is None

    rows: list[Any] = [None] * 16
    async with httpx.AsyncClient(base_url=url, timeout=SAFETY_S, trust_env=False) as client:
        seeded = await client.post("/seed_session", json={"responses_create_params": {}})
        assert (seeded.status_code, seeded.json()) == (200, {})

        async def rollout(i: int) -> None:
            reply = await client.post(
                "/verify", json=member(i, 1 + i % 5, g="t0", _ng_task_index=0)
            )
            rows[i] = reply.json()

        async with trio.open_nursery() as nursery:
            for i in range(16):
                nursery.start_soon(rollout, i)
        metrics = await client.post("/aggregate_metrics", json={"verify_responses": rows})
        # The judge is Gym's genrm_model server as the config names it: Responses API calls.
        stats_url = judge_url.removesuffix("/v1") + "/_fake/stats"
        by_api = (await client.get(stats_url)).json()["by_api"]
    assert (by_api["responses"], by_api["chat_completions"]) == (16, 0)
    assert [row["reward"] for row in rows] == [1 + i % 5 for i in range(16)]
    assert metrics.json()["agent_metrics"]["scored"] == 16

    server.send_signal(signal.SIGINT)  # how Gym's runner stops its servers
    out, err = server.communicate(timeout=SAFETY_S)
    assert server.returncode == 0
    assert out.splitlines()[0] == f"genrm-trio listening on {url}"
    note = next(line for line in err.splitlines() if "NeMo Gym config:" in line)
    assert note.endswith(
        f"NeMo Gym config: serving block '{INSTANCE}' (resources_servers.genrm_trio); ignored "
        "Gym keys description, domain, entrypoint, value, verified; judge from "
        "genrm_model_server 'genrm_model'; other servers of the run left to Gym: genrm_model, "
        "genrm_simple_agent, genrm_simple_agent_reasoning_off"
    )
    assert "judge_api=responses" in err and f"judge={judge_url}" in err
    judge.kill()


def test_a_gym_dry_run_checks_the_config_and_serves_nothing(
    gym_started: list[subprocess.Popen[str]],
) -> None:
    port = free_port()
    config = gym_run_config("http://127.0.0.1:9/v1", port)
    config["dry_run"] = True
    server = start_like_gym(config)
    gym_started.append(server)
    out, err = server.communicate(timeout=SAFETY_S)
    assert server.returncode == 0, err
    assert out == f"genrm-trio gym server: configuration of '{INSTANCE}' is valid\n"
    assert not gym_ready(f"http://127.0.0.1:{port}")


def test_a_bad_gym_block_exits_2_naming_the_key(gym_started: list[subprocess.Popen[str]]) -> None:
    config = gym_run_config("http://127.0.0.1:9/v1", free_port())
    block = config[INSTANCE]["resources_servers"]["genrm_trio"]
    block["comparison_strategy"] = "ring"
    server = start_like_gym(config)
    gym_started.append(server)
    out, err = server.communicate(timeout=SAFETY_S)
    assert (server.returncode, out) == (2, "")
    assert err == (
        "invalid configuration: comparison_strategy: must be one of circular, all_pairs, "
        "fixed_baseline (got 'ring')\n"
    )


def test_outside_gym_the_entrypoint_says_what_it_needs(
    gym_started: list[subprocess.Popen[str]],
) -> None:
    server = start_like_gym({}, instance="")
    gym_started.append(server)
    _, err = server.communicate(timeout=SAFETY_S)
    assert server.returncode == 2
    assert err.startswith("genrm-trio gym server: NEMO_GYM_CONFIG_DICT and NEMO_GYM_CONFIG_PATH ")


def test_serve_takes_gyms_shipped_config_with_the_judge_set(cli: Any) -> None:
    refused = cli.run("serve", "--config", str(GYM_SHIPPED))
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        "invalid configuration: genrm_model_server: names NeMo Gym's model server 'genrm_model'"
    )
    judge, judge_url = cli.start_fake_judge()
    server, url, _ = cli.start_serve(
        "--config",
        str(GYM_SHIPPED),
        "--set",
        f"judge_base_url={judge_url}",
        "--set",
        "judge_model=genrm",
    )
    with cli.http_client(url) as client:
        assert client.get("/healthz").json()["status"] == "ok"
    server.send_signal(signal.SIGTERM)
    assert server.wait() == 0
    assert "ignored Gym keys description, domain, entrypoint, value, verified" in server.stderr()
    judge.kill()
