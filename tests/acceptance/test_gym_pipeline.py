"""NeMo Gym's own pipeline around genrm-trio: the real nemo-gym 0.7.0, its runner, simple_agent,
openai_model and collector, with genrm-trio's fake policy and fake judge.

A Gym virtual environment is made once per Gym version, Python and pyproject.toml under the
test environment's prefix (`<venv>/nemo-gym/0.7.0-py3.X-<hash>`), with nemo-gym (installed with
`--ignore-requires-python`, as Gym 0.7.0 asks for a newer 3.13 patch release than this machine
may have) and this checkout.
Gym's runner (`gym env start`) then starts every server of the shipped
`resources_servers/genrm_trio/configs/genrm_trio.yaml` from prepared server venvs (links to that
one environment, with `skip_venv_if_present`), and `gym eval run --no-serve` collects 8 tasks x 4
repeats. Tasks 4-7 have one answer the fake judge cannot compare (HTTP 400), so each of those
groups masks the rollout and its two neighbours and scores the fourth.

Checked: every row (rewards, masks, failure fields), the failures sidecar, the metrics file
against Gym's own `compute_aggregate_metrics` over the same rows, `--resume` after judge
failures, a fresh run of the same tasks, `--resume` after a killed collector, `gym eval
reverify`, and a collection with Gym's observability on. Without Python >= 3.13 the module is
skipped, saying so.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
GYM_VERSION = "0.7.0"
SHIPPED = ROOT / "resources_servers" / "genrm_trio" / "configs" / "genrm_trio.yaml"
AGENT = "genrm_trio_simple_agent"
N = 4
TASKS = 8
BROKEN_TASKS = range(4, 8)
# Guards against a hung process only; no assertion depends on them.
INSTALL_SAFETY_S = 1800.0
START_SAFETY_S = 300.0
COMMAND_SAFETY_S = 600.0
# The server venvs Gym's runner looks for under uv_venv_dir: <type>/<server>/.venv.
SERVER_DIRS = (
    "resources_servers/genrm_trio",
    "responses_api_agents/simple_agent",
    "responses_api_models/openai_model",
    "environment_servers/legacy_agent",
)
POLICY_CONFIG = """\
policy_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: ${policy_base_url}
      openai_api_key: fake
      openai_model: fake-policy
      openai_default_headers: {}
      drop_input_reasoning_items: false
"""
# Every comparison with the quality-9 answer fails for good: that rollout and both of its
# circular neighbours are masked; the fourth rollout of the group is scored.
JUDGE_RULES = [
    {"match": {"response_1": "[[q=9]]", "any_order": True}, "action": "http_status", "status": 400}
]
QUALITY = re.compile(r"\[\[q=([0-9.]+)\]\]")


def python_313() -> str | None:
    """An interpreter of Python >= 3.13 on this machine (PATH, then pyenv), if any."""
    candidates = [sys.executable]
    candidates += [shutil.which(f"python3.{minor}") or "" for minor in range(13, 20)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(str(p) for p in pyenv.glob("3.1[3-9]*/bin/python3"))
    for candidate in filter(None, candidates):
        try:
            found = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info >= (3, 13))"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if found.stdout.strip() == "True":
            return candidate
    return None


PYTHON = python_313()
pytestmark = pytest.mark.skipif(
    PYTHON is None,
    reason="NeMo Gym 0.7.0 needs Python >= 3.13, and none was found on PATH or under pyenv",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until(condition: Callable[[], bool], safety_s: float, what: str) -> None:
    limit = time.monotonic() + safety_s
    while not condition():
        assert time.monotonic() < limit, f"{what}: still not the case after {safety_s} s"
        time.sleep(0.1)


def gym_venv() -> Path:
    """The cached Gym environment, made on first use (about three minutes)."""
    assert PYTHON is not None
    minor = subprocess.run(
        [PYTHON, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Keyed by what is installed: Gym's version, the Python, and genrm-trio's dependencies.
    project = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:12]
    venv = Path(sys.prefix) / "nemo-gym" / f"{GYM_VERSION}-py{minor}-{project}"
    ready = venv / ".genrm-trio-ready"
    if ready.exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([PYTHON, "-m", "venv", str(venv)], check=True, timeout=INSTALL_SAFETY_S)
    installed = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--ignore-requires-python",
            f"nemo-gym=={GYM_VERSION}",
            "-e",
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=INSTALL_SAFETY_S,
    )
    assert installed.returncode == 0, installed.stderr[-4000:]
    ready.write_text(GYM_VERSION, encoding="utf-8")
    return venv


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Ray's workers leave the runner's process group)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def stop_group(process: subprocess.Popen[Any], first: int = signal.SIGINT) -> None:
    """Stop a process started in its own session, and everything it started."""
    below = descendants(process.pid)
    try:
        os.killpg(process.pid, first)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    for pid in [process.pid, *below, *descendants(process.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


@dataclass
class Fake:
    process: subprocess.Popen[str]
    url: str


def start_fake(kind: str, *args: str) -> Fake:
    process = subprocess.Popen(
        [sys.executable, "-m", "genrm_trio.cli", kind, "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert " listening on " in line, line
    return Fake(process, line.rsplit(" ", 1)[1].strip())


def gym_command(venv: Path, workdir: Path, overrides: list[str], *args: str) -> list[str]:
    """A `gym` command on the run's two config files, with the run's overrides."""
    configs = ["--config", str(SHIPPED), "--config", str(workdir / "policy.yaml")]
    return [str(venv / "bin" / "gym"), *args, *configs, *overrides]


def gym_env(venv: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}


@dataclass
class GymRun:
    """A running Gym environment (runner and servers) and how to call Gym's commands on it."""

    venv: Path
    workdir: Path
    overrides: list[str]
    runner: subprocess.Popen[str]
    log: Path
    judge: Fake
    policy: Fake
    commands: list[subprocess.Popen[str]] = field(default_factory=list)

    def command(self, *args: str) -> list[str]:
        return gym_command(self.venv, self.workdir, self.overrides, *args)

    def env(self) -> dict[str, str]:
        return gym_env(self.venv)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args),
            cwd=self.workdir,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=COMMAND_SAFETY_S,
        )

    def run_alone(self, *args: str) -> tuple[int, str]:
        """Run a command that starts servers of its own, in a session of its own, then stop
        whatever it left running (`gym eval reverify` leaves its servers up when it refuses)."""
        out = self.workdir / f"command-{len(self.commands)}.log"
        with out.open("w", encoding="utf-8") as sink:
            process = subprocess.Popen(
                self.command(*args),
                cwd=self.workdir,
                env=self.env(),
                stdout=sink,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        self.commands.append(process)
        try:
            process.wait(timeout=COMMAND_SAFETY_S)
        finally:
            for sig in (signal.SIGINT, signal.SIGKILL):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(2)
        return process.returncode, out.read_text(encoding="utf-8", errors="replace")

    def start(self, *args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            self.command(*args),
            cwd=self.workdir,
            env=self.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.commands.append(process)
        return process

    def collect(self, output: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.run(
            "eval",
            "run",
            "--no-serve",
            "--agent",
            AGENT,
            "--input",
            str(self.workdir / "tasks.jsonl"),
            "--output",
            str(self.workdir / output),
            "--num-repeats",
            str(N),
            *extra,
        )

    def server_log(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def judge_calls(self) -> int:
        stats = httpx.get(self.judge.url.removesuffix("/v1") + "/_fake/stats", timeout=10)
        return int(stats.json()["requests_total"])

    def set_judge_rules(self, rules: list[dict[str, Any]]) -> None:
        reply = httpx.put(
            self.judge.url.removesuffix("/v1") + "/_fake/rules", json=rules, timeout=10
        )
        assert reply.status_code == 200, reply.text


def write_inputs(workdir: Path) -> None:
    with (workdir / "tasks.jsonl").open("w", encoding="utf-8") as tasks:
        for task in range(TASKS):
            qualities = "2,3,4,9" if task in BROKEN_TASKS else "1,2,3,4"
            prompt = f"Task {task}: answer briefly [[qualities={qualities}]]"
            row = {"responses_create_params": {"input": [{"role": "user", "content": prompt}]}}
            tasks.write(json.dumps(row) + "\n")
    (workdir / "policy.yaml").write_text(POLICY_CONFIG, encoding="utf-8")
    (workdir / "judge-rules.json").write_text(json.dumps(JUDGE_RULES), encoding="utf-8")


def start_gym(venv: Path, workdir: Path, *extra: str) -> GymRun:
    workdir.mkdir(parents=True, exist_ok=True)
    write_inputs(workdir)
    for server in SERVER_DIRS:
        link = workdir / "venvs" / server / ".venv"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(venv)
    judge = start_fake("fake-judge", "--rules", str(workdir / "judge-rules.json"))
    policy = start_fake("fake-policy", "--latency", "none")
    overrides = [
        f"++policy_base_url={policy.url}",
        f"++genrm_judge_base_url={judge.url}",
        "++genrm_judge_model=fake-judge",
        f"++genrm_trio_resources_server.resources_servers.genrm_trio.num_rollouts_per_prompt={N}",
        "++skip_venv_if_present=true",
        f"++uv_venv_dir={workdir / 'venvs'}",
        "++head_server.host=127.0.0.1",
        f"++head_server.port={free_port()}",
        *extra,
    ]
    log = workdir / "gym-env.log"
    with log.open("w", encoding="utf-8") as sink:
        runner = subprocess.Popen(
            gym_command(venv, workdir, overrides, "env", "start", "--search-dir", str(ROOT)),
            cwd=workdir,
            env=gym_env(venv),
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    run = GymRun(venv, workdir, overrides, runner, log, judge, policy)
    ready = re.compile(r"All (\d+) / \1 servers ready")
    wait_until(
        lambda: run.runner.poll() is not None or ready.search(run.server_log()) is not None,
        START_SAFETY_S,
        "Gym's runner reporting every server ready",
    )
    assert run.runner.poll() is None, run.server_log()[-4000:]
    return run


def stop_gym(run: GymRun) -> None:
    for process in run.commands:
        if process.poll() is None:
            stop_group(process, signal.SIGKILL)
    stop_group(run.runner)
    for fake in (run.judge, run.policy):
        stop_group(fake.process, signal.SIGTERM)


@pytest.fixture(scope="module")
def gym(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GymRun]:
    run = start_gym(gym_venv(), tmp_path_factory.mktemp("gym"))
    try:
        yield run
    finally:
        stop_gym(run)


# ---- reading what Gym wrote ------------------------------------------------------------------


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def sidecar(output: Path) -> Path:
    return output.with_name(output.stem + "_failures.jsonl")


def answer_text(row: dict[str, Any]) -> str:
    texts = [
        part["text"]
        for item in row["response"]["output"]
        if item.get("type") == "message"
        for part in item["content"]
        if part.get("type") == "output_text"
    ]
    return "".join(texts)


def quality(row: dict[str, Any]) -> float:
    return float(QUALITY.findall(answer_text(row))[-1])


def check_group(scored: list[dict[str, Any]], masked: list[dict[str, Any]], task: int) -> None:
    """One task's final rows: rewards are the fake judge's qualities, and exactly the rollouts
    that met the broken answer are masked, with Gym's failure fields."""
    slots = sorted(row["_ng_rollout_index"] for row in scored + masked)
    assert slots == list(range(N)), (task, slots)
    for row in scored:
        assert row["mask_sample"] is False and row["failure_kind"] is None
        assert row["reward"] == quality(row), (task, row["_ng_rollout_index"])
    by_slot = {row["_ng_rollout_index"]: row for row in scored + masked}
    if task not in BROKEN_TASKS:
        assert not masked, task
        return
    broken = next(slot for slot, row in by_slot.items() if quality(row) == 9)
    expected = {(broken - 1) % N, broken, (broken + 1) % N}
    assert {row["_ng_rollout_index"] for row in masked} == expected, task
    for row in masked:
        assert row["mask_sample"] is True and row["reward"] == 0.0
        assert row["failure_kind"] == row["_ng_failure_class"] == "judge_failed"
        assert row["instance_config"]["mask_sample"] is True
        assert (row["principle"], row["prompt_id"]) == (None, None)
        assert row["failure_reason"] == row["_ng_failure_judge_error"]


def final_rows(output: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The main rows, and for each (task, rollout) not in them its first sidecar row: the row
    its group gave it (a later one answers a resend, with a regenerated answer)."""
    main = read_rows(output)
    done = {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in main}
    first: dict[tuple[int, int], dict[str, Any]] = {}
    for row in read_rows(sidecar(output)):
        key = (row["_ng_task_index"], row["_ng_rollout_index"])
        if key not in done:
            first.setdefault(key, row)
    return main, list(first.values())


def check_run(output: Path) -> None:
    main, failed = final_rows(output)
    assert len(main) + len(failed) == TASKS * N
    assert len(main) == len({(r["_ng_task_index"], r["_ng_rollout_index"]) for r in main})
    for task in range(TASKS):
        check_group(
            [r for r in main if r["_ng_task_index"] == task],
            [r for r in failed if r["_ng_task_index"] == task],
            task,
        )


GYMS_AGGREGATE = """
import json, sys
from nemo_gym.reward_profile import compute_aggregate_metrics
rows = []
for line in open(sys.argv[1]):
    row = json.loads(line)
    entry = {k: v for k, v in row.items() if k not in ("response", "responses_create_params")}
    usage = (row.get("response") or {}).get("usage")
    if usage is not None:
        entry["response"] = {"usage": usage}
    rows.append(entry)
print(json.dumps(compute_aggregate_metrics(rows).model_dump(mode="json")))
"""


def gyms_own_metrics(run: GymRun, output: Path) -> dict[str, Any]:
    """What Gym's own resources servers report over the rows Gym aggregates (the main file)."""
    computed = subprocess.run(
        [str(run.venv / "bin" / "python"), "-c", GYMS_AGGREGATE, str(output)],
        capture_output=True,
        text=True,
        timeout=COMMAND_SAFETY_S,
        check=True,
    )
    metrics: dict[str, Any] = json.loads(computed.stdout)
    return metrics


def same(ours: Any, gyms: Any, where: str) -> None:
    if isinstance(gyms, dict):
        assert isinstance(ours, dict), where
        for key in gyms:
            assert key in ours, f"{where}: {key} missing"
            same(ours[key], gyms[key], f"{where}.{key}")
    elif isinstance(gyms, list):
        assert isinstance(ours, list) and len(ours) == len(gyms), where
        for index, (a, b) in enumerate(zip(ours, gyms, strict=True)):
            same(a, b, f"{where}[{index}]")
    elif isinstance(gyms, float):
        assert abs(ours - gyms) <= 1e-9 * max(1.0, abs(gyms)), f"{where}: {ours} != {gyms}"
    else:
        assert ours == gyms, where


# ---- the pipeline ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def first_run(gym: GymRun) -> Path:
    output = gym.workdir / "run1" / "rollouts.jsonl"
    done = gym.collect(str(output.relative_to(gym.workdir)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return output


def test_gym_starts_genrm_trio_from_the_shipped_config(gym: GymRun) -> None:
    log = gym.server_log()
    assert "DEPRECATED: agents without an environment server" not in log
    assert "genrm-trio serving judge_api=chat_completions" in log and f"N={N}" in log


def test_gyms_collector_gets_every_row_right(gym: GymRun, first_run: Path) -> None:
    check_run(first_run)
    main, failed = final_rows(first_run)
    assert (len(main), len(failed)) == (20, 12)
    # A first run is never answered as a resend, and no group waited for absent members.
    assert "sent again on its own" not in "".join(r["failure_reason"] for r in failed)
    assert "starts a new group under the same key" not in gym.server_log()


def test_the_metrics_file_is_gyms_with_the_masked_rollouts_counted(
    gym: GymRun, first_run: Path
) -> None:
    path = first_run.with_name(first_run.stem + "_aggregate_metrics.json")
    (entry,) = json.loads(path.read_text(encoding="utf-8"))
    assert entry["agent_ref"] == {"name": AGENT}
    gyms = gyms_own_metrics(gym, first_run)
    for part in ("agent_metrics", "key_metrics", "group_level_metrics", "repeat_level_metrics"):
        same(entry[part], gyms[part], part)
    agent = entry["agent_metrics"]
    # Gym kept the 12 masked rows out; genrm-trio still counts them.
    assert (agent["rows"], agent["scored"], agent["rollouts"]) == (20, 20, 32)
    assert (agent["failed"], agent["masked_by_server"]) == (12, 12)
    assert agent["mask_rate"] == 12 / 32 == entry["key_metrics"]["mask_rate"]
    assert agent["std/reward"] > 0 and "ci_low_95_across_repeats/mean/reward" in agent
    groups = {group["_ng_task_index"]: group for group in entry["group_level_metrics"]}
    for task in range(TASKS):
        assert groups[task]["rollouts"] == N
        assert groups[task]["mask_rate"] == (3 / N if task in BROKEN_TASKS else 0.0)


def test_gyms_resume_after_judge_failures_answers_every_resent_row_at_once(
    gym: GymRun, first_run: Path
) -> None:
    before = read_rows(sidecar(first_run))
    calls = gym.judge_calls()
    resumed = gym.collect(str(first_run.relative_to(gym.workdir)), "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert gym.judge_calls() == calls  # a lone rollout is never judged
    check_run(first_run)
    added = read_rows(sidecar(first_run))[len(before) :]
    assert len(added) == 12
    assert {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in added} == {
        (r["_ng_task_index"], r["_ng_rollout_index"]) for r in before
    }
    for row in added:
        assert row["_ng_attempt_index"] == 1 and row["mask_sample"] is True
        reason = row["failure_reason"]
        assert "was sent again on its own (_ng_attempt_index=1)" in reason
        assert "its group completed" in reason
    health = httpx.get(resources_server_url(gym) + "/healthz", timeout=10).json()
    assert health["active_groups"] == 0 and health["legacy_resends_collecting"] == 0


def resources_server_url(gym: GymRun) -> str:
    found = re.findall(r"genrm-trio listening on (http://\S+)", gym.server_log())
    assert found, "genrm-trio's listening line"
    return str(found[-1])


def test_a_fresh_gym_run_of_the_same_tasks_is_judged(gym: GymRun, first_run: Path) -> None:
    calls = gym.judge_calls()
    output = gym.workdir / "run2" / "rollouts.jsonl"
    fresh = gym.collect(str(output.relative_to(gym.workdir)))
    assert fresh.returncode == 0, fresh.stdout[-3000:] + fresh.stderr[-3000:]
    check_run(output)
    # Every group was judged again: 4 circular comparisons per group of 4, one call each (the
    # judge's HTTP 400 is final, so the broken comparisons are not retried).
    assert gym.judge_calls() - calls == TASKS * N


def test_gyms_resume_after_a_killed_collector_finishes_the_run(gym: GymRun) -> None:
    output = gym.workdir / "run3" / "rollouts.jsonl"
    # The broken tasks' comparisons are held at the judge, so that the collector can be killed
    # with the clean tasks written and the broken tasks' groups in flight.
    gym.set_judge_rules([{**JUDGE_RULES[0], "delay_s": 5}])
    try:
        collector = gym.start(
            "eval",
            "run",
            "--no-serve",
            "--agent",
            AGENT,
            "--input",
            str(gym.workdir / "tasks.jsonl"),
            "--output",
            str(output),
            "--num-repeats",
            str(N),
        )
        wait_until(
            lambda: len(read_rows(output)) >= 16 or collector.poll() is not None,
            COMMAND_SAFETY_S,
            "the clean tasks written",
        )
        stop_group(collector, signal.SIGKILL)
        assert len(read_rows(output)) < TASKS * N - 12, "the collector finished before the kill"
        url = resources_server_url(gym)
        wait_until(
            lambda: httpx.get(url + "/healthz", timeout=10).json()["active_groups"] == 0,
            COMMAND_SAFETY_S,
            "the groups in flight at the kill finished",
        )
    finally:
        gym.set_judge_rules(JUDGE_RULES)
    resumed = gym.collect(str(output.relative_to(gym.workdir)), "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    check_run(output)


def test_gyms_reverify_is_refused_as_gym_expects(gym: GymRun, first_run: Path) -> None:
    # `gym eval reverify` starts the run's servers itself, under a head server of its own.
    own_head = [o for o in gym.overrides if not o.startswith("++head_server.port=")]
    own_head.append(f"++head_server.port={free_port()}")
    reverifying = GymRun(
        gym.venv, gym.workdir, own_head, gym.runner, gym.log, gym.judge, gym.policy
    )
    status, said = reverifying.run_alone(
        "eval",
        "reverify",
        "--rollouts",
        str(first_run),
        "--inputs",
        str(first_run.with_name(first_run.stem + "_materialized_inputs.jsonl")),
        "--output",
        str(gym.workdir / "reverified.jsonl"),
        "--search-dir",
        str(ROOT),
    )
    assert status != 0, said[-3000:]
    said = " ".join(said.split())  # Gym wraps its messages
    assert (
        "Error: Resource server(s) ['genrm_trio_resources_server'] have "
        "reverify_mode=UNSUPPORTED or UNKNOWN." in said
    ), said[-3000:]
    assert "Traceback" not in said
    assert not (gym.workdir / "reverified.jsonl").exists()


def test_gyms_collector_with_observability_on(
    gym: GymRun, tmp_path_factory: pytest.TempPathFactory
) -> None:
    capture = tmp_path_factory.mktemp("captures")
    run = start_gym(
        gym.venv,
        tmp_path_factory.mktemp("gym-observed"),
        "++observability_enabled=true",
        f"++model_call_capture_dir={capture}",
    )
    try:
        output = run.workdir / "run" / "rollouts.jsonl"
        done = run.collect(str(output.relative_to(run.workdir)))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        check_run(output)
        # Observability was on: Gym captured every rollout's model calls under its rollout id,
        # the id it also put in front of every route it called on genrm-trio.
        captured = {path.name for path in capture.glob("*.capture.jsonl")}
        assert captured == {f"{t}-{r}.capture.jsonl" for t in range(TASKS) for r in range(N)}
    finally:
        stop_gym(run)
