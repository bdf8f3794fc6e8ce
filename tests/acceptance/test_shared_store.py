"""Several `genrm-trio serve` processes sharing one Redis group store (X-4, X-1), as a user
runs them: real processes behind a round-robin balancer, the fake judge as its own process, and a
real Redis server that the test stops, kills and restarts.

Every answer is checked against what the fake judge's qualities predict (CL-13: under circular
pairing a rollout's reward is its own quality), and the judge's own record of the calls it got
is checked against the comparisons the groups require.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from genrm_trio.testing._balancer import RoundRobinBalancer
from genrm_trio.testing._one_shot_http import post_json
from genrm_trio.testing.redis_server import RedisServer

GROUP_SIZE = 16
SAFETY_S = 120.0
KEY_PREFIX = "genrm-test"


def quality(group: str, slot: int) -> int:
    return 1 + (slot * 7 + len(group)) % 5


def answer(group: str, slot: int, *, variant: str = "") -> str:
    """The answer text: its quality directive for the fake judge, then who it is, so every
    judge call names its group and slots."""
    return f"[[q={quality(group, slot)}]] {group}:{slot}{variant}"


def body(group: str, slot: int, *, attempt: int = 0, variant: str = "") -> dict[str, Any]:
    return {
        "responses_create_params": {"input": f"prompt of {group}"},
        "response": {
            "id": f"r-{group}-{slot}{variant}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": answer(group, slot, variant=variant)}
                    ],
                }
            ],
        },
        "_ng_group_id": group,
        "_ng_group_attempt": attempt,
        "_ng_rollout_index": slot,
    }


def circular_pairs(group: str) -> Counter[tuple[str, str]]:
    """The judge calls one circular group needs: (i, i+1 mod N), once each."""
    return Counter(
        (answer(group, i), answer(group, (i + 1) % GROUP_SIZE)) for i in range(GROUP_SIZE)
    )


def assert_scored(group: str, slot: int, status: int, row: dict[str, Any]) -> None:
    assert status == 200, row
    assert row.get("mask_sample") is not True, row
    assert row["_ng_group_id"] == group
    assert row["_ng_rollout_index"] == slot
    assert row["reward"] == float(quality(group, slot)), (group, slot, row)


class Deployment:
    """A fake judge, a Redis server and genrm-trio processes on fixed ports sharing it."""

    def __init__(self, cli: Any, redis: RedisServer, *judge_args: str) -> None:
        self.cli = cli
        self.redis = redis
        self.judge, judge_url = cli.start_fake_judge(*judge_args)
        self.judge_control = judge_url.removesuffix("/v1")
        self.settings = [
            f"judge_base_url={judge_url}",
            "judge_model=genrm",
            "judge_max_concurrency=64",
            f"group_store={redis.url}",
            f"group_store_key_prefix={KEY_PREFIX}",
        ]
        self.processes: dict[int, Any] = {}

    def start(self, port: int | None = None, *extra: str) -> int:
        """Start (or restart) `genrm-trio serve` on `port`; returns the port."""
        port = port or self.cli.free_port()
        sets = [arg for setting in (*self.settings, *extra) for arg in ("--set", setting)]
        process = self.cli.start("serve", "--port", str(port), *sets)
        line = process.read_line(SAFETY_S)
        assert line == f"genrm-trio listening on http://127.0.0.1:{port}", line
        self.processes[port] = process
        return port

    def kill(self, port: int) -> None:
        """SIGKILL: the process gets no chance to clean up or write anything."""
        process = self.processes.pop(port)
        process.send_signal(signal.SIGKILL)
        assert process.wait(SAFETY_S) == -signal.SIGKILL

    def kill_and_restart_all(self, *extra: str) -> None:
        """SIGKILL every serve process, then start each again on its port."""
        ports = list(self.processes)
        for port in ports:
            self.kill(port)
        for port in ports:
            self.start(port, *extra)

    def stop_all(self) -> None:
        for port in list(self.processes):
            process = self.processes.pop(port)
            process.send_signal(signal.SIGTERM)
            assert process.wait(SAFETY_S) == 0, process.stderr()
        self.judge.send_signal(signal.SIGTERM)
        assert self.judge.wait(SAFETY_S) == 0

    def judge_stats(self) -> dict[str, Any]:
        with httpx.Client(trust_env=False, timeout=SAFETY_S) as client:
            stats: dict[str, Any] = client.get(f"{self.judge_control}/_fake/stats").json()
            return stats

    def judged_pairs(self) -> Counter[tuple[str, str]]:
        """(response_1, response_2) of every judge call since the last reset (up to 1000)."""
        with httpx.Client(trust_env=False, timeout=SAFETY_S) as client:
            recorded = client.get(f"{self.judge_control}/_fake/requests?limit=1000").json()
        pairs: Counter[tuple[str, str]] = Counter()
        for request in recorded:
            messages = request["body"]["messages"]
            pairs[messages[-2]["content"], messages[-1]["content"]] += 1
        return pairs

    def reset_judge(self) -> None:
        with httpx.Client(trust_env=False, timeout=SAFETY_S) as client:
            assert client.post(f"{self.judge_control}/_fake/reset").status_code == 200

    def set_judge_rules(self, rules: list[dict[str, Any]]) -> None:
        with httpx.Client(trust_env=False, timeout=SAFETY_S) as client:
            reply = client.put(f"{self.judge_control}/_fake/rules", json=rules)
            assert reply.status_code == 200, reply.text

    def health(self, port: int) -> tuple[int, dict[str, Any]]:
        with httpx.Client(trust_env=False, timeout=SAFETY_S) as client:
            reply = client.get(f"http://127.0.0.1:{port}/healthz")
            health: dict[str, Any] = reply.json()
            return reply.status_code, health


@pytest.fixture
def deployment(cli: Any, redis_server: RedisServer) -> Deployment:
    return Deployment(cli, redis_server)


@asynccontextmanager
async def balanced(ports: list[int]) -> AsyncIterator[tuple[RoundRobinBalancer, int]]:
    balancer = RoundRobinBalancer([("127.0.0.1", port) for port in ports])
    async with trio.open_nursery() as nursery:
        port = await nursery.start(balancer.serve)
        yield balancer, port
        nursery.cancel_scope.cancel()


async def post(port: int, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One /verify on a new connection, as a trainer's worker posts a rollout, so a
    round-robin balancer spreads the requests."""
    status, row = await post_json(port, json.dumps(payload).encode())
    assert isinstance(row, dict)
    return status, row


Posts = list[tuple[int, dict[str, Any]]]


async def post_all(posts: Posts) -> list[tuple[int, dict[str, Any]]]:
    """Every (port, body) at once, each on its own connection; replies in the same order."""
    replies: list[tuple[int, dict[str, Any]]] = [(0, {})] * len(posts)

    async def one(index: int, port: int, payload: dict[str, Any]) -> None:
        replies[index] = await post(port, payload)

    with trio.fail_after(SAFETY_S):
        async with trio.open_nursery() as nursery:
            for index, (port, payload) in enumerate(posts):
                nursery.start_soon(one, index, port, payload)
    return replies


def group_posts(port: int, group: str, slots: range = range(GROUP_SIZE), **kw: Any) -> Posts:
    return [(port, body(group, slot, **kw)) for slot in slots]


async def test_two_processes_behind_a_round_robin_balancer_serve_64_groups_of_16(
    deployment: Deployment, many_files: None
) -> None:
    a, b = deployment.start(), deployment.start()
    groups = [f"wave{g}" for g in range(64)]
    first: list[tuple[int, dict[str, Any]]] = []
    async with balanced([a, b]) as (balancer, port):
        for half in (groups[:32], groups[32:]):
            deployment.reset_judge()
            posts = [item for group in half for item in group_posts(port, group)]
            replies = await post_all(posts)
            for (_, payload), (status, row) in zip(posts, replies, strict=True):
                assert_scored(payload["_ng_group_id"], payload["_ng_rollout_index"], status, row)
            # Exactly the required comparisons, each judged once, by whichever process.
            expected: Counter[tuple[str, str]] = Counter()
            for group in half:
                expected += circular_pairs(group)
            assert deployment.judged_pairs() == expected
            assert deployment.judge_stats()["requests_total"] == 32 * GROUP_SIZE
            first += replies
        # Round robin gave each process half of the 1024 connections, so members of one group
        # reached both.
        assert balancer.connections == {("127.0.0.1", a): 512, ("127.0.0.1", b): 512}
        # Between them the processes judged each comparison once; which one judges a group is
        # whichever stored its last member, a race that a loaded machine can tip all one way.
        attempts = [deployment.health(p)[1]["judge_attempts_total"] for p in (a, b)]
        assert sum(attempts) == 64 * GROUP_SIZE

        # Both processes killed with SIGKILL and started again: every request of every group
        # sent again through the balancer gets the same row, without a judge call.
        deployment.kill_and_restart_all()
        posts = [item for group in groups for item in group_posts(port, group)]
        assert await post_all(posts) == first
    assert deployment.judge_stats()["requests_total"] == 32 * GROUP_SIZE  # since the reset
    assert [deployment.health(p)[1]["judge_attempts_total"] for p in (a, b)] == [0, 0]
    deployment.stop_all()


async def test_members_of_one_group_at_different_processes_form_one_group(
    deployment: Deployment,
) -> None:
    a, b = deployment.start(), deployment.start()
    # Even slots at one process, odd slots at the other, and a duplicate of slot 0 at the
    # other process while the group collects: it waits for the same outcome.
    posts = [(a if slot % 2 == 0 else b, body("split", slot)) for slot in range(GROUP_SIZE)]
    posts.append((b, body("split", 0)))
    replies = await post_all(posts)
    for (_, payload), (status, row) in zip(posts, replies, strict=True):
        assert_scored("split", payload["_ng_rollout_index"], status, row)
    assert deployment.judged_pairs() == circular_pairs("split")
    # A different response for a taken slot is a conflict at either process.
    for port in (a, b):
        status, row = await post(port, body("split", 3, variant=" again"))
        assert status == 409, row
        assert "already has a different response for rollout_index=3" in row["detail"]
    assert deployment.judge_stats()["requests_total"] == GROUP_SIZE
    deployment.stop_all()


def failing_rules(*markers: str) -> list[dict[str, Any]]:
    """Judge rules that answer 400 (a fatal judge error, J-21) to any call naming a marker."""
    return [
        {"match": {side: marker}, "action": "http_status", "status": 400}
        for marker in markers
        for side in ("response_1", "response_2")
    ]


async def test_after_sigkill_of_every_process_finished_groups_replay_without_the_judge(
    deployment: Deployment,
) -> None:
    collection_s = 5.0
    extra = f"cohort_collection_timeout_s={collection_s}"
    a, b = deployment.start(None, extra), deployment.start(None, extra)
    # Slot 5 of "masked" fails both its comparisons, so 4, 5 and 6 are masked and the others
    # scored; every comparison of "allmasked" fails, so the group fails (M-3).
    deployment.set_judge_rules(failing_rules("masked:5", "allmasked:"))
    scored = [f"done{g}" for g in range(4)]
    posts: Posts = []
    for index, group in enumerate([*scored, "masked", "allmasked"]):
        # Each group's members alternate between the two processes.
        posts += [(a if (slot + index) % 2 else b, body(group, slot)) for slot in range(16)]
    # Three members of a group that never completes: it fails at its collection deadline.
    posts += [(a, body("partial", 0)), (b, body("partial", 1)), (a, body("partial", 2))]
    first = await post_all(posts)

    by_key = {
        (p["_ng_group_id"], p["_ng_rollout_index"]): reply
        for (_, p), reply in zip(posts, first, strict=True)
    }
    for group in scored:
        for slot in range(GROUP_SIZE):
            assert_scored(group, slot, *by_key[group, slot])
    for slot in range(GROUP_SIZE):
        status, row = by_key["masked", slot]
        if slot in (4, 5, 6):
            assert status == 200 and row["mask_sample"] is True, row
            assert f"GenRM rollout_index={slot} lost a comparison" in row["failure_reason"]
        else:
            assert_scored("masked", slot, status, row)
        # A judge-kind group failure answers masked rows (W-30).
        status, row = by_key["allmasked", slot]
        assert status == 200 and row["mask_sample"] is True, row
        assert "every rollout was masked" in row["failure_reason"]
    for slot in range(3):
        status, row = by_key["partial", slot]
        assert status == 503, row
        assert row["detail"].endswith(
            f"did not collect 16 unique rollout indices within {collection_s}s"
        )
    calls = deployment.judge_stats()["requests_total"]
    assert calls == 6 * GROUP_SIZE

    deployment.kill_and_restart_all(extra)

    # Every request again, each at the other process than the first time: the same status and
    # the same row, byte for byte in JSON terms, and no judge call.
    again = await post_all([(b if port == a else a, payload) for port, payload in posts])
    assert again == first
    # A regenerated answer for a masked member gets its masked row (M-8); for a scored member
    # it is a conflict; a new member of a failed group gets the recorded failure.
    status, row = await post(a, body("masked", 5, variant=" regenerated"))
    assert (status, row["failure_reason"]) == (200, by_key["masked", 5][1]["failure_reason"])
    status, row = await post(b, body("done0", 1, variant=" regenerated"))
    assert status == 409 and "already has a different response" in row["detail"], row
    assert await post(b, body("partial", 9)) == (503, by_key["partial", 0][1])
    assert deployment.judge_stats()["requests_total"] == calls
    deployment.stop_all()


async def test_attempt_fences_and_retention_order_survive_sigkill_of_every_process(
    deployment: Deployment,
) -> None:
    extra = "max_terminal_cohorts=2"
    a, b = deployment.start(None, extra), deployment.start(None, extra)
    for group in ("X", "Y"):
        for status, row in await post_all(group_posts(a, group)):
            assert status == 200, row
    # Replaying X moves its watermark behind Y's in the idle order; its result stays oldest.
    assert (await post(b, body("X", 0)))[0] == 200
    async with trio.open_nursery() as nursery:
        superseded: list[tuple[int, dict[str, Any]]] = []

        async def wait_in_attempt_0() -> None:
            superseded.append(await post(a, body("Z", 0, attempt=0)))

        nursery.start_soon(wait_in_attempt_0)
        await trio.sleep(1.0)
        for status, row in await post_all(group_posts(b, "Z", attempt=1)):
            assert status == 200, row
    assert superseded[0][0] == 503
    assert "superseded by attempt 1" in superseded[0][1]["detail"]
    calls = deployment.judge_stats()["requests_total"]
    assert calls == 3 * GROUP_SIZE

    deployment.kill_and_restart_all(extra)

    # Two results and two watermarks are kept: X's result (the oldest) and Y's watermark (idle
    # longest) are evicted, exactly as one process that never stopped would have done.
    status, row = await post(a, body("X", 0))
    assert status == 409, row
    assert "already finished and its result is no longer retained" in row["detail"]
    assert_scored("Y", 3, *await post(b, body("Y", 3)))
    status, row = await post(a, body("Z", 0, attempt=0))
    assert status == 409 and "attempt 0 was superseded by attempt 1" in row["detail"], row
    assert_scored("Z", 2, *await post(b, body("Z", 2, attempt=1)))
    assert deployment.judge_stats()["requests_total"] == calls
    deployment.stop_all()


async def test_a_process_killed_during_collection_leaves_its_members_to_the_others(
    deployment: Deployment,
) -> None:
    a, b = deployment.start(), deployment.start()
    async with trio.open_nursery() as nursery:
        lost: list[BaseException] = []

        async def member_at_a(slot: int) -> None:
            try:
                await post(a, body("orphan", slot))
            except ConnectionError as error:
                lost.append(error)

        for slot in range(8):
            nursery.start_soon(member_at_a, slot)
        # Time for eight local requests to be stored; if they were not, the group below could
        # not complete without them and the test fails.
        await trio.sleep(2.0)
        await trio.to_thread.run_sync(deployment.kill, a)
    # The trainer's requests to the dead process failed at the transport level; nothing was
    # judged yet.
    assert len(lost) == 8
    assert deployment.judge_stats()["requests_total"] == 0
    # The other members arrive at the surviving process: the members the dead process stored
    # count (they are not sent again first), the group completes there, and the retried
    # requests replay the same rewards.
    for slot, (status, row) in zip(
        range(8, 16), await post_all(group_posts(b, "orphan", range(8, 16))), strict=True
    ):
        assert_scored("orphan", slot, status, row)
    for slot, (status, row) in zip(
        range(8), await post_all(group_posts(b, "orphan", range(8))), strict=True
    ):
        assert_scored("orphan", slot, status, row)
    assert deployment.judged_pairs() == circular_pairs("orphan")
    deployment.stop_all()


async def test_a_process_killed_during_evaluation_is_taken_over_after_its_lease(
    deployment: Deployment,
) -> None:
    lease = "group_store_lease_s=2"
    a, b = deployment.start(None, lease), deployment.start(None, lease)
    # The judge holds every call of the first evaluation until its caller goes away.
    deployment.set_judge_rules([{"match": {"response_1": "owned:"}, "times": 16, "action": "hang"}])
    async with trio.open_nursery() as nursery:
        for port, payload in group_posts(a, "owned"):
            nursery.start_soon(post_ignoring_transport_errors, port, payload)
        await eventually(lambda: deployment.judge_stats()["in_flight"] == GROUP_SIZE)
        await trio.to_thread.run_sync(deployment.kill, a)
    # The trainer retries at the surviving process; once the dead owner's lease has expired,
    # that process claims the evaluation and judges the group again.
    replies = await post_all(group_posts(b, "owned"))
    for slot, (status, row) in enumerate(replies):
        assert_scored("owned", slot, status, row)
    stats = deployment.judge_stats()
    assert stats["by_action"]["hang"] == GROUP_SIZE
    assert deployment.judged_pairs() == circular_pairs("owned") + circular_pairs("owned")
    # A restarted owner finds the published outcome and judges nothing.
    deployment.start(a, lease)
    assert_scored("owned", 7, *await post(a, body("owned", 7)))
    assert deployment.judge_stats()["requests_total"] == 2 * GROUP_SIZE
    deployment.stop_all()


async def test_an_owner_stalled_past_its_lease_cannot_publish_its_late_result(
    deployment: Deployment,
) -> None:
    lease = "group_store_lease_s=2"
    a, b = deployment.start(None, lease), deployment.start(None, lease)
    # The first evaluation's calls answer after 6 s with verdicts that would give every rollout
    # of the group another reward than its quality; later calls answer as usual.
    deployment.set_judge_rules(
        [
            {
                "match": {"response_1": "stalled:"},
                "times": 16,
                "delay_s": 6,
                "action": "verdict",
                "score_1": 5,
                "score_2": 1,
                "ranking": 1,
            }
        ]
    )
    async with trio.open_nursery() as nursery:
        at_a: list[tuple[int, dict[str, Any]]] = []

        async def wait_at_a() -> None:
            at_a.extend(await post_all(group_posts(a, "stalled")))

        nursery.start_soon(wait_at_a)
        await eventually(lambda: deployment.judge_stats()["requests_total"] == GROUP_SIZE)
        # The owner stops (as under a long GC pause or SIGSTOP) while its calls are out; its
        # lease expires and the other process takes the group over and publishes.
        deployment.processes[a].send_signal(signal.SIGSTOP)
        try:
            for slot, (status, row) in enumerate(await post_all(group_posts(b, "stalled"))):
                assert_scored("stalled", slot, status, row)
        finally:
            deployment.processes[a].send_signal(signal.SIGCONT)
    # The owner wakes, gets its late verdicts and is refused by the fence: its own waiting
    # requests get the published outcome, not its result.
    for slot, (status, row) in enumerate(at_a):
        assert_scored("stalled", slot, status, row)
    assert_scored("stalled", 5, *await post(a, body("stalled", 5)))
    assert deployment.judge_stats()["requests_total"] == 2 * GROUP_SIZE
    deployment.stop_all()


async def eventually(condition: Callable[[], bool]) -> None:
    """Until `condition()` (run in a worker thread) holds; fails the test after SAFETY_S."""
    with trio.fail_after(SAFETY_S):
        while True:
            if await trio.to_thread.run_sync(condition):
                return
            await trio.sleep(0.05)


async def post_ignoring_transport_errors(port: int, payload: dict[str, Any]) -> None:
    try:
        await post(port, payload)
    except ConnectionError:
        pass


async def test_redis_down_answers_503_naming_the_store_and_the_servers_recover(
    deployment: Deployment,
) -> None:
    a, b = deployment.start(), deployment.start()
    for slot, (status, row) in enumerate(await post_all(group_posts(a, "before"))):
        assert_scored("before", slot, status, row)
    status, health = deployment.health(a)
    assert status == 200 and health["group_store_available"] is True, health
    store_name = health["group_store"]
    assert store_name.startswith(f"redis://127.0.0.1:{deployment.redis.port}/0"), store_name

    deployment.redis.stop()
    for port, payload in [(a, body("during", 0)), (b, body("before", 3))]:
        status, row = await post(port, payload)
        assert status == 503, row
        assert store_name in row["detail"], row
    status, health = deployment.health(b)
    assert health["group_store_available"] is False, health

    deployment.redis.start()
    # Each process recovers by itself: its first request once Redis is back is answered, not
    # sent on a connection Redis closed while it was down.
    for port in (a, b):
        status, row = await post(port, body("before", 3))
        assert status == 200, row
    # Nothing of the refused request was written: its slot takes another answer without a
    # conflict, and the group is judged once.
    posts = [(a, body("during", 0, variant=" regenerated"))]
    posts += group_posts(b, "during", range(1, 16))
    replies = await post_all(posts)
    for slot, (status, row) in enumerate(replies):
        assert_scored("during", slot, status, row)
    assert deployment.judge_stats()["requests_total"] == 2 * GROUP_SIZE
    for port in (a, b):
        status, health = deployment.health(port)
        assert status == 200 and health["group_store_available"] is True, health
    deployment.stop_all()


async def post_burst(
    posts: Posts, *, resend_to: int | None = None
) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """Every (port, body) at once on its own connection, as a trainer posts a whole step.

    A request whose connection dies (its process was killed) is sent again to `resend_to`, as
    a trainer resends it; without `resend_to` that is a failure. Returns the replies in order and
    how many requests were resent.
    """
    replies: list[tuple[int, dict[str, Any]]] = [(0, {})] * len(posts)
    resent = 0

    async def one(index: int, port: int, payload: dict[str, Any]) -> None:
        nonlocal resent
        try:
            replies[index] = await post(port, payload)
        except ConnectionError:
            if resend_to is None:
                raise
            resent += 1
            replies[index] = await post(resend_to, payload)

    with trio.fail_after(SAFETY_S * 2):
        async with trio.open_nursery() as nursery:
            for index, (port, payload) in enumerate(posts):
                nursery.start_soon(one, index, port, payload)
    return replies, resent


def alternating(ports: list[int], groups: list[str]) -> Posts:
    """Every member of every group, the members of each group alternating between the ports,
    as a trainer behind a plain load balancer spreads them."""
    return [
        (ports[slot % len(ports)], body(group, slot))
        for group in groups
        for slot in range(GROUP_SIZE)
    ]


async def test_2048_rollouts_posted_at_once_over_two_processes_are_all_scored_once(
    deployment: Deployment, many_files: None
) -> None:
    # 1,024 connections at each process at once: descriptors above 1,024 in every process,
    # the Redis client's among them.
    a, b = deployment.start(), deployment.start()
    groups = [f"step{g}" for g in range(128)]
    posts = alternating([a, b], groups)
    replies, _ = await post_burst(posts)
    for (_, payload), (status, row) in zip(posts, replies, strict=True):
        assert_scored(payload["_ng_group_id"], payload["_ng_rollout_index"], status, row)
    # Each of the 2,048 required comparisons judged once: a group judged twice would need
    # more calls than this, and a group not judged could not have been scored.
    assert deployment.judge_stats()["requests_total"] == len(groups) * GROUP_SIZE
    # Both processes restarted: the whole step resent gets the same rows, with no judge call.
    deployment.kill_and_restart_all()
    again, _ = await post_burst(alternating([b, a], groups))
    assert sorted(map(_row_key, again)) == sorted(map(_row_key, replies))
    assert deployment.judge_stats()["requests_total"] == len(groups) * GROUP_SIZE
    for port in (a, b):
        status, health = deployment.health(port)
        assert status == 200 and health["active_groups"] == 0, health
    deployment.stop_all()


def _row_key(reply: tuple[int, dict[str, Any]]) -> str:
    return json.dumps(reply, sort_keys=True)


async def test_a_process_killed_with_a_burst_in_flight_costs_no_wrong_row(
    cli: Any, redis_server: RedisServer, many_files: None
) -> None:
    # Every judge call takes a moment, so the kill finds groups collecting and evaluating.
    deployment = Deployment(cli, redis_server, "--latency", "fixed:0.5")
    lease = "group_store_lease_s=2"
    a, b = deployment.start(None, lease), deployment.start(None, lease)
    groups = [f"kill{g}" for g in range(32)]
    async with trio.open_nursery() as nursery:
        outcome: list[tuple[list[tuple[int, dict[str, Any]]], int]] = []

        async def step() -> None:
            outcome.append(await post_burst(alternating([a, b], groups), resend_to=b))

        nursery.start_soon(step)
        await eventually(lambda: deployment.judge_stats()["in_flight"] > 0)
        await trio.to_thread.run_sync(deployment.kill, a)
    replies, resent = outcome[0]
    assert resent > 0  # the kill cut requests off
    for group_index, group in enumerate(groups):
        for slot in range(GROUP_SIZE):
            status, row = replies[group_index * GROUP_SIZE + slot]
            assert_scored(group, slot, status, row)
    # The groups the dead process was judging were judged again after its lease: more calls
    # than required, never a different reward. A resend of the step replays every row.
    assert deployment.judge_stats()["requests_total"] >= len(groups) * GROUP_SIZE
    calls = deployment.judge_stats()["requests_total"]
    again, _ = await post_burst(alternating([b], groups))
    assert again == replies
    assert deployment.judge_stats()["requests_total"] == calls
    deployment.stop_all()


async def test_two_processes_never_send_the_judge_more_than_judge_max_concurrency(
    cli: Any, redis_server: RedisServer
) -> None:
    # Each call takes a moment, so calls overlap and the judge counts how many at once.
    deployment = Deployment(cli, redis_server, "--latency", "fixed:0.05")
    budget = "judge_max_concurrency=8"
    a, b = deployment.start(None, budget), deployment.start(None, budget)
    # Every member of a group to one process, the groups alternating: each process judges 16
    # groups (256 comparisons), enough to fill 8 slots of its own many times over.
    groups = [f"budget{g}" for g in range(32)]
    posts = [
        ((a, b)[g % 2], body(group, slot)) for g, group in enumerate(groups) for slot in range(16)
    ]
    replies, _ = await post_burst(posts)
    for (_, payload), (status, row) in zip(posts, replies, strict=True):
        assert_scored(payload["_ng_group_id"], payload["_ng_rollout_index"], status, row)
    stats = deployment.judge_stats()
    assert stats["requests_total"] == len(groups) * GROUP_SIZE
    assert stats["max_in_flight"] == 8  # the budget was used, and never more
    # Both judged (a group filled at one may be offered to the other, judging fewer).
    attempts = [deployment.health(p)[1]["judge_attempts_total"] for p in (a, b)]
    assert sum(attempts) == 512 and min(attempts) > 0
    deployment.stop_all()
