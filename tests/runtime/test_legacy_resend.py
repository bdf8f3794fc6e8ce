"""Rows sent again under a legacy key (§5.14, C-99).

A row marked as a resend (NeMo Gym's `_ng_attempt_index` >= 1, or a masked row posted back) is
answered at once with a masked row saying why it is not judged, and never opens or joins a
group; an unmarked row is a new run's and opens a new group under a finished key. A lone
unmarked row reopening a completed key is seen at once: a WARNING at arrival with the hint, and
a count in /healthz while it waits."""

from __future__ import annotations

import logging

import msgspec
import pytest
import trio
import trio.testing

from genrm_trio.core.messages import MIGRATION_SUFFIX
from genrm_trio.testing import FakeJudge, pair_rule
from genrm_trio.testing.harness import member, running_server


async def test_a_lone_resent_row_is_logged_while_it_waits(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    async with running_server(
        num_rollouts_per_prompt=4, cohort_collection_timeout_s=60.0
    ) as server:
        first = await server.complete(None, None, _ng_task_index=7)
        assert [r.status for r in first] == [200] * 4
        async with trio.open_nursery() as nursery:
            # A collector resends one masked row of the finished group, without a group id.
            pending = server.start_verify(nursery, member(2, 3, None, None, _ng_task_index=7))
            await server.settle()
            warnings = [r.getMessage() for r in caplog.records if "GenRM legacy group" in r.message]
            assert len(warnings) == 1
            assert warnings[0].startswith("GenRM legacy group 'task_idx::7::")
            assert "rollout_index=2 starts a new group under the same key" in warnings[0]
            assert warnings[0].endswith(
                "send the whole group again under a fresh _ng_group_id shared by every member."
            )
            [record] = [r for r in caplog.records if "GenRM legacy group" in r.message]
            assert record.group_key.startswith("task_idx::7::")  # type: ignore[attr-defined]
            assert (record.group_attempt, record.slot) == (0, 2)  # type: ignore[attr-defined]
            reply = await pending.result()
        assert reply.status == 503 and "did not collect 4 unique rollout indices" in reply.detail
        server.engine.check_invariants()


@pytest.mark.stores(
    "memory", why="the count of /healthz is the process's own, and a shared store's is 0"
)
async def test_a_lone_resent_row_is_counted_while_it_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(
        num_rollouts_per_prompt=4, cohort_collection_timeout_s=60.0
    ) as server:
        await server.complete(None, None, _ng_task_index=7)
        assert (await server.get("/healthz")).body["legacy_resends_collecting"] == 0
        async with trio.open_nursery() as nursery:
            pending = server.start_verify(nursery, member(2, 3, None, None, _ng_task_index=7))
            await server.settle()
            assert (await server.get("/healthz")).body["legacy_resends_collecting"] == 1
            await pending.result()
        assert (await server.get("/healthz")).body["legacy_resends_collecting"] == 0


def resent(i: int, q: float, task: int = 7, attempt_index: int = 1) -> dict[str, object]:
    """Slot ``i`` of legacy task ``task`` as Gym's collector resends it on --resume: the
    answer regenerated, the retry counted in `_ng_attempt_index`."""
    return member(
        i, q, None, None, regenerated=True, _ng_task_index=task, _ng_attempt_index=attempt_index
    )


async def test_a_resent_row_of_a_finished_legacy_group_is_answered_masked_at_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    judge = FakeJudge(rules=[pair_rule(1, 2, "http_status", status=400)])
    async with running_server(
        judge=judge, num_rollouts_per_prompt=4, cohort_collection_timeout_s=60.0
    ) as server:
        first = await server.complete(None, None, qualities=[5, 4, 3, 2], _ng_task_index=7)
        assert [r.masked for r in first] == [False, True, True, False]
        calls, started = server.calls(), trio.current_time()
        again = await server.verify_all([resent(1, 4), resent(2, 3)])
        assert trio.current_time() == started  # answered, not left to a deadline
        assert server.calls() == calls
        health = (await server.get("/healthz")).body
        assert (health["active_groups"], health["legacy_resends_collecting"]) == (0, 0)
        server.engine.check_invariants()
    assert [r.status for r in again] == [200, 200] and all(r.masked for r in again)
    reason = again[0].body["failure_reason"]
    assert reason.startswith("GenRM legacy group 'task_idx::7::")
    assert "rollout_index=1 was sent again on its own (_ng_attempt_index=1)" in reason
    assert "its group completed 0.0s ago" in reason
    assert reason.endswith(
        "To have it judged, send the whole group again under a fresh _ng_group_id shared by "
        "every member."
    )
    # The resent answer is echoed, not the first run's.
    assert again[0].body["response"]["id"].endswith("-again")
    logged = [r for r in caplog.records if "was sent again on its own" in r.message]
    assert sorted((r.group_attempt, r.slot) for r in logged) == [(0, 1), (0, 2)]  # type: ignore[attr-defined]
    assert all(r.group_key.startswith("task_idx::7::") for r in logged)  # type: ignore[attr-defined]


async def test_a_new_run_of_the_same_tasks_after_resends_is_judged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(num_rollouts_per_prompt=4) as server:
        await server.complete(None, None, qualities=[5, 4, 3, 2], _ng_task_index=7)
        await server.verify_all([resent(2, 3)])
        calls = server.calls()
        fresh = await server.verify_all(
            [member(i, q, None, None, _ng_task_index=7) for i, q in enumerate([1, 2, 3, 4])]
        )
        assert server.calls() == calls + 4
    assert [r.reward for r in fresh] == [1.0, 2.0, 3.0, 4.0]


async def test_a_resend_for_a_key_the_server_never_saw_is_masked_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(num_rollouts_per_prompt=4) as server:
        reply = await server.verify(resent(3, 2, task=11, attempt_index=2))
        assert server.calls() == 0
        assert (await server.get("/healthz")).body["active_groups"] == 0
    assert reply.status == 200 and reply.masked
    assert "(_ng_attempt_index=2)" in reply.body["failure_reason"]
    assert "this server holds no group under this key" in reply.body["failure_reason"]


async def test_a_masked_row_posted_back_is_a_resend(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = FakeJudge(rules=[pair_rule(1, 2, "http_status", status=400)])
    async with running_server(judge=judge, num_rollouts_per_prompt=4) as server:
        first = await server.complete(None, None, qualities=[5, 4, 3, 2], _ng_task_index=7)
        calls = server.calls()
        again = await server.verify(first[2].body)
        assert server.calls() == calls
        assert (await server.get("/healthz")).body["active_groups"] == 0
    assert again.status == 200 and again.masked
    assert "(a masked row posted back)" in again.body["failure_reason"]


async def test_a_resend_to_a_failed_legacy_group_gets_its_failure_masked_never_503(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(num_rollouts_per_prompt=4, cohort_collection_timeout_s=1.0) as server:
        lone = await server.verify(member(0, 3, None, None, _ng_task_index=3))
        assert lone.status == 503 and "did not collect" in lone.detail
        again = await server.verify(resent(0, 3, task=3))
        assert server.calls() == 0
    assert again.status == 200 and again.masked
    reason = again.body["failure_reason"]
    assert "did not collect 4 unique rollout indices" in reason
    assert reason.endswith(MIGRATION_SUFFIX)


async def test_a_resend_never_joins_a_collecting_legacy_group(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(
        num_rollouts_per_prompt=2, cohort_collection_timeout_s=60.0
    ) as server:
        async with trio.open_nursery() as nursery:
            pending = server.start_verify(nursery, member(0, 3, None, None, _ng_task_index=5))
            await server.settle()
            again = await server.verify(resent(1, 4, task=5))
            assert again.status == 200 and again.masked
            assert "is collecting" in again.body["failure_reason"]
            finishing = await server.verify(member(1, 4, None, None, _ng_task_index=5))
            first = await pending.result()
    assert (first.reward, finishing.reward) == (3.0, 4.0)


async def test_explicit_groups_ignore_gyms_attempt_index(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # An explicit group's own attempt says which group a row belongs to; Gym's retry count
    # does not make its rows resends.
    async with running_server(num_rollouts_per_prompt=2) as server:
        rows = await server.complete("fresh", 0, qualities=[2, 4], _ng_attempt_index=1)
    assert [r.reward for r in rows] == [2.0, 4.0]


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        (b"true", "_ng_attempt_index: expected an integer >= 0 or null, got true"),
        (b"-1", "_ng_attempt_index: expected an integer >= 0 or null, got -1"),
        (b'"1"', '_ng_attempt_index: expected an integer >= 0 or null, got "1"'),
    ],
)
async def test_a_bad_attempt_index_gets_422_naming_the_field(value: bytes, detail: str) -> None:
    body = msgspec.json.encode(member(0, 3, None, None, _ng_task_index=1))
    body = body[:-1] + b',"_ng_attempt_index":' + value + b"}"
    async with running_server(num_rollouts_per_prompt=2) as server:
        reply = await server.verify(body)
    assert (reply.status, reply.detail) == (422, detail)
