"""Group lifecycle through /verify: waiting, replay, duplicates, conflicts, legacy (§10.8)."""

from __future__ import annotations

import trio
import trio.testing

from genrm_trio.testing import FakeJudge
from genrm_trio.testing.harness import member, running_server


async def test_first_member_waits_then_both_are_scored_and_replay_is_free(autojump_clock) -> None:
    # AS-86
    async with running_server() as server, trio.open_nursery() as nursery:
        pending = server.start_verify(nursery, member(0))
        await trio.sleep(0.2)
        assert not pending.done.is_set()
        assert server.calls() == 0
        second = await server.verify(member(1))
        first = await pending.result()
        assert (first.status, first.reward, second.reward) == (200, 3.0, 3.0)
        replay = await server.verify(member(0))
        assert replay.reward == 3.0
        assert server.calls() == 2


async def test_rewards_map_to_slots_not_arrival_order() -> None:
    # AS-87
    async with running_server(num_rollouts_per_prompt=3) as server, trio.open_nursery() as n:
        pending = {}
        for slot in (2, 0, 1):
            pending[slot] = server.start_verify(n, member(slot, q=slot + 1))
            await server.settle()
        rewards = [(await pending[slot].result()).reward for slot in range(3)]
    assert rewards == [1.0, 2.0, 3.0]
    seen = [
        (r["body"]["messages"][-2]["content"], r["body"]["messages"][-1]["content"])
        for r in server.judge.requests(10)
    ]
    assert sorted(seen) == sorted(
        [
            ("answer-0 [[q=1]]", "answer-1 [[q=2]]"),
            ("answer-1 [[q=2]]", "answer-2 [[q=3]]"),
            ("answer-2 [[q=3]]", "answer-0 [[q=1]]"),
        ]
    )


async def test_identical_requests_share_one_slot() -> None:
    # AS-88
    async with running_server() as server:
        replies = await server.verify_all([member(0), member(0), member(1)])
        assert [r.status for r in replies] == [200, 200, 200]
        assert server.calls() == 2


async def test_different_response_during_collection_is_a_conflict() -> None:
    # AS-89
    async with running_server() as server, trio.open_nursery() as nursery:
        first = server.start_verify(nursery, member(0, q=4))
        await server.settle()
        conflict = await server.verify(member(0, q=4, regenerated=True))
        assert conflict.status == 409
        assert conflict.detail == (
            "GenRM cohort 'group_id::g::group_attempt::0' already has a different response "
            "for rollout_index=0"
        )
        await server.verify(member(1, q=2))
        assert (await first.result()).reward == 4.0


async def test_token_change_after_completion_is_a_conflict(autojump_clock) -> None:
    # AS-91
    async with running_server() as server:
        bodies = [member(i) for i in range(2)]
        for body in bodies:
            body["response"]["generation_token_ids"] = [1, 2, 3]
        await server.verify_all(bodies)
        changed = member(0)
        changed["response"]["generation_token_ids"] = [1, 2, 4]
        assert (await server.verify(changed)).status == 409
        assert (await server.verify(bodies[0])).reward == 3.0
        assert server.calls() == 2


async def test_interleaved_groups_keep_their_own_rewards() -> None:
    # AS-92
    async with running_server() as server:
        replies = await server.verify_all(
            [
                member(0, 1, "run-a"),
                member(0, 4, "run-b"),
                member(1, 2, "run-a"),
                member(1, 5, "run-b"),
            ]
        )
        assert [r.reward for r in replies] == [1.0, 4.0, 2.0, 5.0]
        assert server.calls() == 4


async def test_legacy_groups_complete_and_are_judged_again_on_a_second_run() -> None:
    # AS-93, AS-94
    async with running_server() as server:
        anonymous = await server.verify_all([member(i, g=None, a=None) for i in range(2)])
        assert [r.status for r in anonymous] == [200, 200]
        first = await server.verify_all([member(i, g=None, _ng_task_index=7) for i in range(2)])
        second = await server.verify_all(
            [member(i, 4, g=None, regenerated=True, _ng_task_index=7) for i in range(2)]
        )
        assert [r.reward for r in first] == [3.0, 3.0]
        assert [r.reward for r in second] == [4.0, 4.0]
        assert server.calls() == 6


async def test_legacy_attempts_form_separate_groups_and_explicit_id_wins() -> None:
    # AS-95, AS-96
    async with running_server() as server:
        await server.verify_all(
            [member(i, g=None, a=a, _ng_task_index=7) for a in (0, 1) for i in range(2)]
        )
        assert server.calls() == 4
        await server.verify_all([member(0, _ng_task_index=1), member(1, _ng_task_index=2)])
        assert server.calls() == 6


async def test_two_instances_share_nothing() -> None:
    # AS-97
    judge = FakeJudge()
    async with running_server(judge=judge) as one, running_server(judge=judge) as two:
        async with trio.open_nursery() as nursery:
            waiting = one.start_verify(nursery, member(0))
            await one.settle()
            with trio.move_on_after(0.5):
                await two.verify(member(1))
            assert not waiting.done.is_set()
            waiting.disconnect()


async def test_slow_group_does_not_hold_back_a_fast_one(autojump_clock) -> None:
    # AS-98
    slow_pair = {"response_1": "answer-0 [[q=3]]", "response_2": "answer-1 [[q=3]]"}
    judge = FakeJudge(
        rules=[
            {
                "match": slow_pair,
                "delay_s": 2.0,
                "action": "verdict",
                "score_1": 3,
                "score_2": 3,
                "ranking": 3.5,
            }
        ]
    )
    async with running_server(judge=judge, num_rollouts_per_prompt=4) as server:
        done: dict[str, float] = {}

        async def run(group: str) -> None:
            await server.complete(group, qualities=[3 if group == "slow" else 2] * 4)
            done[group] = trio.current_time()

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "slow")
            nursery.start_soon(run, "fast")
        assert done["fast"] - start < 0.5
        assert done["slow"] - start >= 2.0
        assert server.calls() == 8
