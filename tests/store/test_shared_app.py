"""Two in-process servers configured with ``group_store: redis://…`` (X-4): /verify over
the app, /healthz reporting the store, and the 503 that names it while it is down."""

from __future__ import annotations

import trio
from prometheus_client.parser import text_string_to_metric_families

from genrm_trio.testing import FakeJudge, pair_rule
from genrm_trio.testing.harness import Reply, Server, member, running_server
from genrm_trio.testing.redis_server import RedisServer


async def test_two_servers_share_groups_and_health_reports_the_store(
    redis_server: RedisServer,
) -> None:
    judge = FakeJudge()
    settings = {"group_store": redis_server.url, "group_store_poll_s": 0.05}
    async with (
        running_server(settings, judge=judge) as a,
        running_server(settings, judge=judge) as b,
    ):
        replies = {}

        async def send(server, i, q):  # type: ignore[no-untyped-def]
            replies[i] = await server.verify(member(i, q))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, a, 0, 4)
                nursery.start_soon(send, b, 1, 2)
        assert [replies[i].reward for i in (0, 1)] == [4.0, 2.0]
        assert replies[0].body["response"] == member(0, 4)["response"]  # the echo is whole
        assert judge.stats()["requests_total"] == 2
        health = await b.get("/healthz")
        assert health.status == 200
        assert health.body["group_store"] == f"redis://127.0.0.1:{redis_server.port}/0"
        assert health.body["group_store_available"] is True
        assert (health.body["retained_records"], health.body["watermarks"]) == (1, 1)
        # /metrics counts what each process answered and the groups it ended.
        texts = [(await s.client.get("/metrics")).text for s in (a, b)]
        scored = [t.count('genrm_verify_requests_total{outcome="scored"} 1.0') for t in texts]
        assert scored == [1, 1]
        assert (
            sum(
                'disposition="completed"' in line and line.endswith(" 1.0")
                for t in texts
                for line in t.splitlines()
            )
            == 1
        )

        redis_server.kill()
        down = await a.verify(member(0, 4, g="other"))
        assert down.status == 503
        assert down.detail.startswith(
            f"GenRM group store redis://127.0.0.1:{redis_server.port}/0 is unavailable: "
        )
        health = await a.get("/healthz")
        assert health.status == 200 and health.body["group_store_available"] is False

        redis_server.start()
        again = await a.verify(member(1, 2))
        assert again.reward == 2.0  # a replay from the store that came back
        assert (await a.get("/healthz")).body["group_store_available"] is True
        assert judge.stats()["requests_total"] == 2


async def test_memory_store_is_the_default_and_health_says_so() -> None:
    async with running_server() as server:
        health = await server.get("/healthz")
        assert (health.body["group_store"], health.body["group_store_available"]) == (
            "memory",
            True,
        )


async def test_a_legacy_resend_is_answered_at_once_by_another_process(
    redis_server: RedisServer,
) -> None:
    # C-99 over a shared store: the group completed through one process, the resend reaches
    # the other, which knows the key's completion from the store and opens nothing.
    judge = FakeJudge()
    settings = {"group_store": redis_server.url, "group_store_poll_s": 0.05}
    async with (
        running_server(settings, judge=judge) as a,
        running_server(settings, judge=judge) as b,
    ):
        with trio.fail_after(30):
            first = await a.verify_all(
                [member(i, 3 + i, None, None, _ng_task_index=4) for i in range(2)]
            )
            resent = member(1, 2, None, None, regenerated=True, _ng_task_index=4)
            again = await b.verify(resent | {"_ng_attempt_index": 1})
        assert [r.reward for r in first] == [3.0, 4.0]
        assert again.status == 200 and again.masked
        assert "its group completed" in again.body["failure_reason"]
        assert judge.stats()["requests_total"] == 2
        assert (await b.get("/healthz")).body["active_groups"] == 0


async def test_group_mean_placeholders_replay_the_same_bytes_from_the_store(
    shared_redis_server: RedisServer,
) -> None:
    # AS-174. N = 4, pair (1, 2) fails: rows 1 and 2 masked, rows 0 and 3 scored 4.0 and 1.0.
    judge = FakeJudge(rules=[pair_rule(1, 2, "http_status", status=400)])
    settings = {
        "group_store": shared_redis_server.url,
        "group_store_poll_s": 0.05,
        "num_rollouts_per_prompt": 4,
    }
    bodies = [member(i, q, g="placeholders") for i, q in enumerate([4, 2, 3, 1])]
    group_mean = {**settings, "masked_reward_placeholder": "group_mean"}
    async with (
        running_server(group_mean, judge=judge) as a,
        running_server(group_mean, judge=judge) as b,
    ):
        first: dict[int, Reply] = {}

        async def send(server: Server, slot: int) -> None:
            first[slot] = await server.verify(bodies[slot])

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for slot in range(4):
                    nursery.start_soon(send, (a, b)[slot % 2], slot)
        assert [first[i].masked for i in range(4)] == [False, True, True, False]
        assert [first[i].reward for i in range(4)] == [4.0, 2.5, 2.5, 1.0]
        calls = judge.stats()["requests_total"]
        for server in (a, b):
            assert [(await server.verify(body)).raw for body in bodies] == [
                first[i].raw for i in range(4)
            ]
    # A process that never saw the group, configured with zero, answers the stored placeholder:
    # it was decided once, when the outcome was computed.
    async with running_server({**settings, "masked_reward_placeholder": "zero"}, judge=judge) as c:
        assert [(await c.verify(body)).raw for body in bodies] == [first[i].raw for i in range(4)]
    assert judge.stats()["requests_total"] == calls


def gauges(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        if family.type == "gauge"
        for sample in family.samples
    }


async def test_every_process_reports_the_deployment_s_groups_and_a_stuck_one(
    redis_server: RedisServer,
) -> None:
    judge = FakeJudge()
    settings = {"group_store": redis_server.url, "group_store_poll_s": 0.05}
    async with (
        running_server(settings, judge=judge) as a,
        running_server(settings, judge=judge) as b,
    ):
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a.verify, member(0, 4, g="done"))
                nursery.start_soon(b.verify, member(1, 2, g="done"))
            async with trio.open_nursery() as nursery:
                # A group whose second member never comes, and a legacy group (no watermark)
                # collecting as well; both clients give up, the groups stay.
                stuck = a.start_verify(nursery, member(0, 4, g="stuck"))
                legacy = b.start_verify(nursery, member(0, 4, None, None, _ng_task_index=7))
                while (await a.get("/healthz")).body["active_groups"] < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)
                first = [gauges((await s.client.get("/metrics")).text) for s in (a, b)]
                await trio.sleep(0.1)
                later = [gauges((await s.client.get("/metrics")).text) for s in (a, b)]
                stuck.disconnect()
                legacy.disconnect()
        for seen in (*first, *later):
            assert seen[("genrm_groups_active", (("phase", "collecting"),))] == 2
            assert seen[("genrm_groups_active", (("phase", "evaluating"),))] == 0
            assert seen[("genrm_retained_records", ())] == 1
            assert seen[("genrm_watermarks", ())] == 2  # "done" and "stuck"
            assert seen[("genrm_group_evaluations_running", ())] == 0
        # The stuck group ages at every process, whichever holds its member.
        for before, after in zip(first, later, strict=True):
            age = ("genrm_oldest_collecting_group_seconds", ())
            assert 0 < before[age] < after[age]
        health = (await b.get("/healthz")).body
        assert (health["active_groups"], health["retained_records"], health["watermarks"]) == (
            2,
            1,
            2,
        )
