"""`/metrics` and `/healthz` of `serve` processes run as `serve --workers 2` runs its workers: the
test sets the parent's variables (a private metrics directory, each worker's index, the count)
and shares a real Redis group store between them, with the fake judge as its own process.

A scrape of either worker counts the whole server; a worker killed outright and marked dead, as
the parent does, takes its gauges out of the sums and leaves its counts in the totals; a worker
that stops cleanly publishes its last counts and takes its own gauges out.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import trio
from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.parser import text_string_to_metric_families

from genrm_trio.http._prometheus import CONTENT_TYPE
from genrm_trio.testing._one_shot_http import post_json
from genrm_trio.testing.redis_server import RedisServer

GROUP_SIZE = 16
# Only guards against a hung process or a number that never arrives; no assertion depends on it.
SAFETY_S = 60.0
JUDGE_CONCURRENCY = 64

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def body(group: str, slot: int) -> dict[str, Any]:
    quality = 1 + (slot * 7 + len(group)) % 5
    return {
        "responses_create_params": {"input": f"prompt of {group}"},
        "response": {
            "id": f"r-{group}-{slot}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"[[q={quality}]] {group}:{slot}"}],
                }
            ],
        },
        "_ng_group_id": group,
        "_ng_group_attempt": 0,
        "_ng_rollout_index": slot,
    }


class Workers:
    """`genrm-trio serve` processes started with the environment the parent gives its workers."""

    def __init__(self, cli: Any, redis: RedisServer, directory: Path) -> None:
        self.cli = cli
        self.directory = directory
        self.judge, judge_url = cli.start_fake_judge()
        self.judge_control = judge_url.removesuffix("/v1")
        self.settings = [
            f"judge_base_url={judge_url}",
            "judge_model=genrm",
            f"judge_max_concurrency={JUDGE_CONCURRENCY}",
            f"num_rollouts_per_prompt={GROUP_SIZE}",
            f"group_store={redis.url}",
            "group_store_key_prefix=genrm-worker-metrics",
        ]
        self.processes: dict[int, Any] = {}  # port -> process

    def start(self, index: int) -> int:
        port = self.cli.free_port()
        sets = [arg for setting in self.settings for arg in ("--set", setting)]
        env = {
            "PROMETHEUS_MULTIPROC_DIR": str(self.directory),
            "GENRM_WORKER_INDEX": str(index),
            "GENRM_WORKERS": "2",
        }
        process = self.cli.start("serve", "--port", str(port), *sets, env=env)
        line = process.read_line(SAFETY_S)
        assert line == f"genrm-trio listening on http://127.0.0.1:{port}", line
        self.processes[port] = process
        return port

    def kill_and_mark_dead(self, port: int) -> None:
        """SIGKILL, then what the parent does for a worker that died."""
        process = self.processes.pop(port)
        process.send_signal(signal.SIGKILL)
        assert process.wait(SAFETY_S) == -signal.SIGKILL
        mark_process_dead(process.pid, str(self.directory))

    def stop(self, port: int) -> None:
        """SIGTERM: the worker drains and exits 0 (nobody marks it dead here)."""
        process = self.processes.pop(port)
        process.send_signal(signal.SIGTERM)
        assert process.wait(SAFETY_S) == 0, process.stderr()

    def judge_calls(self) -> int:
        with httpx.Client(trust_env=False, timeout=SAFETY_S) as client:
            calls: int = client.get(f"{self.judge_control}/_fake/stats").json()["requests_total"]
            return calls


def scrape(port: int) -> Samples:
    with httpx.Client(trust_env=False, timeout=SAFETY_S) as client:
        reply = client.get(f"http://127.0.0.1:{port}/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"] == CONTENT_TYPE  # as a server alone answers
    samples = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def health(port: int) -> dict[str, Any]:
    with httpx.Client(trust_env=False, timeout=SAFETY_S) as client:
        reply = client.get(f"http://127.0.0.1:{port}/healthz")
    assert reply.status_code == 200
    answer: dict[str, Any] = reply.json()
    return answer


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def total(samples: Samples, name: str) -> float:
    return sum(v for (sample, _), v in samples.items() if sample == name)


def counts(samples: Samples) -> Samples:
    """The series that may only grow: counters and histogram buckets, counts and sums."""
    suffixes = ("_total", "_bucket", "_count", "_sum")
    return {key: v for key, v in samples.items() if key[0].endswith(suffixes)}


async def post_group(ports: list[int], group: str, *, masked: bool = False) -> None:
    """Every member at once, alternating between the workers, each on its own connection; every
    one must come back scored (or, with `masked`, masked)."""
    replies: list[tuple[int, Any]] = []

    async def one(slot: int) -> None:
        payload = json.dumps(body(group, slot)).encode()
        replies.append(await post_json(ports[slot % len(ports)], payload))

    with trio.fail_after(SAFETY_S):
        async with trio.open_nursery() as nursery:
            for slot in range(GROUP_SIZE):
                nursery.start_soon(one, slot)
    for status, row in replies:
        assert status == 200 and row["mask_sample"] is masked, row


async def scrape_until(port: int, condition: Callable[[Samples], bool]) -> Samples:
    """Scrape until `condition` holds: the other workers' numbers reach the files within a
    publication period."""
    with trio.fail_after(SAFETY_S):
        while True:
            samples = await trio.to_thread.run_sync(scrape, port)
            if condition(samples):
                return samples
            await trio.sleep(0.05)


def scored(samples: Samples) -> float:
    return value(samples, "genrm_verify_requests_total", outcome="scored")


async def test_one_worker_scrape_counts_the_whole_server_and_a_dead_worker_only_leaves_gauges(
    cli: Any, redis_server: RedisServer, tmp_path: Path
) -> None:
    directory = tmp_path / "metrics"
    directory.mkdir()
    workers = Workers(cli, redis_server, directory)
    a, b = workers.start(0), workers.start(1)

    await post_group([a, b], "step0")
    assert workers.judge_calls() == GROUP_SIZE  # circular pairing: one call per rollout
    # Each worker answered 8 of the 16 rollouts; only one of them judged the group.
    whole = await scrape_until(a, lambda samples: scored(samples) == GROUP_SIZE)
    assert total(whole, "genrm_judge_attempts_total") == GROUP_SIZE
    assert value(whole, "genrm_comparisons_total", outcome="verdict") == GROUP_SIZE
    assert value(whole, "genrm_groups_finished_total", disposition="completed", kind="none") == 1
    assert total(whole, "genrm_judge_attempt_duration_seconds_count") == GROUP_SIZE
    assert value(whole, "genrm_judge_slot_wait_seconds_count") == GROUP_SIZE
    assert value(whole, "genrm_workers_up") == 2
    # judge_max_concurrency is one budget for both workers: the server's cap is the setting.
    assert value(whole, "genrm_judge_concurrency_limit") == JUDGE_CONCURRENCY
    assert value(whole, "genrm_judge_in_flight") == 0
    assert value(whole, "genrm_waiters") == 0
    # Every series of a server alone is there, with its labels and no worker label.
    assert value(whole, "genrm_verify_requests_total", outcome="unavailable") == 0
    assert all(name != "pid" for _, labels in whole for name, _ in labels)
    # /healthz answers for the worker that takes it, and says which one that is.
    at_a, at_b = health(a), health(b)
    for answer, index in ((at_a, 0), (at_b, 1)):
        assert {k: answer[k] for k in ("worker", "workers_up", "workers")} == {
            "worker": index,
            "workers_up": 2,
            "workers": 2,
        }
    assert at_a["judge_attempts_total"] + at_b["judge_attempts_total"] == GROUP_SIZE

    workers.kill_and_mark_dead(b)
    after = scrape(a)
    assert value(after, "genrm_workers_up") == 1
    assert value(after, "genrm_judge_concurrency_limit") == JUDGE_CONCURRENCY
    assert health(a)["workers_up"] == 1
    # Counts never go down: the dead worker's totals stay in the whole server's.
    before = counts(whole)
    assert {key: counts(after).get(key) for key in before} == before

    # A replacement takes the dead worker's place and half of the next group; it then stops
    # cleanly and its last counts are in the totals at once, without waiting for a period.
    c = workers.start(1)
    assert health(a)["workers_up"] == 2
    await post_group([a, c], "step1")
    workers.stop(c)
    final = scrape(a)
    assert scored(final) == 2 * GROUP_SIZE
    assert total(final, "genrm_judge_attempts_total") == 2 * GROUP_SIZE == workers.judge_calls()
    assert value(final, "genrm_workers_up") == 1
    assert health(a)["workers_up"] == 1


async def test_the_masked_share_of_two_workers_is_the_whole_server_s(
    cli: Any, redis_server: RedisServer, tmp_path: Path
) -> None:
    directory = tmp_path / "metrics"
    directory.mkdir()
    workers = Workers(cli, redis_server, directory)
    a, b = workers.start(0), workers.start(1)
    await post_group([a, b], "healthy")
    async with httpx.AsyncClient(trust_env=False, timeout=SAFETY_S) as client:
        dead = [{"action": "http_status", "status": 503}]
        (await client.put(f"{workers.judge_control}/_fake/rules", json=dead)).raise_for_status()
    await post_group([a, b], "dead", masked=True)

    # Each worker answered 8 scored and 8 masked rollouts: the server masked 16 of 32.
    def window(samples: Samples, outcome: str) -> float:
        return value(samples, "genrm_mask_window_rollouts", outcome=outcome)

    for port in (a, b):
        whole = await scrape_until(port, lambda s: window(s, "masked") == GROUP_SIZE)
        assert window(whole, "scored") == GROUP_SIZE
        assert value(whole, "genrm_masked_rollout_ratio") == 0.5
        by_reason = value(whole, "genrm_mask_window_masked_rollouts", reason="judge HTTP 503")
        assert by_reason == GROUP_SIZE
    workers.stop(b)
    # A worker that stopped takes its window out: the share is the one left, 8 of 16.
    alone = scrape(a)
    assert window(alone, "masked") == GROUP_SIZE / 2
    assert value(alone, "genrm_masked_rollout_ratio") == 0.5
    workers.stop(a)
