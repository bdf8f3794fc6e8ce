"""The race harness as a user sees it: the pytest fixtures and the controlled judge."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from genrm_trio.core.critical import critical_section
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.testing.controlled_judge import ControlledJudge, group_marker
from genrm_trio.testing.instrument import CriticalSectionInstrument

if TYPE_CHECKING:
    from genrm_trio.testing.fixtures import GenRMServer


SUPERSEDED = "GenRM group 'g' attempt 0 was superseded by attempt 1"
Factory = Callable[..., AbstractAsyncContextManager["GenRMServer"]]


async def test_the_server_fixture_judges_a_group(genrm_server: GenRMServer) -> None:
    replies = await genrm_server.post_group(qualities=[4, 2])
    assert [r.reward for r in replies] == [4.0, 2.0]
    assert genrm_server.calls() == 2
    assert sorted((c.group, c.attempt, c.pair) for c in genrm_server.judge.calls) == [
        ("g", 0, (0, 1)),
        ("g", 0, (1, 0)),
    ]
    stats = genrm_server.statistics()
    assert (stats.active_groups, stats.retained_records, stats.watermarks) == (0, 1, 1)


@pytest.mark.parametrize(
    "genrm_settings", [{"num_rollouts_per_prompt": 4, "comparison_strategy": "all_pairs"}]
)
async def test_settings_configure_the_server(genrm_server: GenRMServer) -> None:
    assert genrm_server.size == 4
    replies = await genrm_server.post_group(qualities=[1, 2, 3, 4])
    assert [r.reward for r in replies] == [1.0, 2.0, 3.0, 4.0]
    assert genrm_server.calls() == 6


async def test_a_held_pair_keeps_the_group_waiting_until_released(
    genrm_server: GenRMServer, genrm_judge: ControlledJudge
) -> None:
    genrm_judge.hold(pair=(1, 0))
    async with trio.open_nursery() as nursery:
        pending = genrm_server.start_group(nursery, qualities=[5, 1])
        held = await genrm_judge.wait_for_calls(1, state="held")
        assert [c.pair for c in held] == [(1, 0)]
        await trio.testing.wait_all_tasks_blocked()
        assert not any(p.done.is_set() for p in pending)
        assert genrm_judge.stats()["held"] == 1
        assert genrm_judge.release(pair=(1, 0)) == 1
        replies = [await p.result() for p in pending]
    assert [r.reward for r in replies] == [5.0, 1.0]
    assert genrm_judge.stats()["held"] == 0


async def test_a_held_call_released_with_a_fault_masks_its_pair(
    genrm_server: GenRMServer, genrm_judge: ControlledJudge
) -> None:
    genrm_judge.hold(pair=(0, 1))
    async with trio.open_nursery() as nursery:
        pending = genrm_server.start_group(nursery)
        await genrm_judge.wait_for_calls(1, state="held")
        genrm_judge.release(pair=(0, 1), action="http_status", status=400)
        replies = [await p.result() for p in pending]
    assert [r.masked for r in replies] == [True, True]
    reason = replies[0].body["failure_reason"]
    assert "pair=(0, 1) judge=0 attempt=1/4" in reason
    assert "HTTPStatusError: HTTP 400" in reason
    assert genrm_server.calls() == 2


@pytest.mark.parametrize("genrm_settings", [{"num_rollouts_per_prompt": 3}])
async def test_a_failing_pair_retries_then_masks_exactly_its_two_rollouts(
    genrm_server: GenRMServer, genrm_judge: ControlledJudge
) -> None:
    genrm_judge.fail("http_status", pair=(0, 1), status=500)
    replies = await genrm_server.post_group(qualities=[1, 2, 3])
    assert [r.masked for r in replies] == [True, True, False]
    assert replies[2].reward == 3.0
    reason = replies[0].body["failure_reason"]
    assert reason == (
        "GenRM rollout_index=0 lost a comparison to a judge failure (1 of 3 comparisons "
        "failed): GenRM judge http://fake-judge/v1/chat/completions pair=(0, 1) judge=0 "
        'attempt=4/4 deadline=2.0s: HTTPStatusError: HTTP 500; response={"error":"injected"}'
    )
    assert genrm_server.calls() == 4 + 2
    assert genrm_judge.stats()["by_action"] == {"http_status": 4, "verdict": 2}


async def test_a_fault_limited_to_some_calls_is_retried_into_a_verdict(
    genrm_server: GenRMServer, genrm_judge: ControlledJudge
) -> None:
    genrm_judge.fail("close", pair=(0, 1), times=2)
    replies = await genrm_server.post_group(qualities=[4, 2])
    assert [r.reward for r in replies] == [4.0, 2.0]
    assert len(genrm_judge.matching(pair=(0, 1))) == 3
    assert genrm_judge.controls() == []


async def test_controls_select_one_group_attempt(
    genrm_server: GenRMServer, genrm_judge: ControlledJudge
) -> None:
    genrm_judge.hold(group="slow")
    async with trio.open_nursery() as nursery:
        slow = genrm_server.start_group(nursery, "slow")
        fast = await genrm_server.post_group("fast")
        assert [r.reward for r in fast] == [3.0, 3.0]
        assert len(genrm_judge.held(group="slow")) == 2
        assert not any(p.done.is_set() for p in slow)
        genrm_judge.release(group="slow")
    assert [(await p.result()).reward for p in slow] == [3.0, 3.0]


async def test_a_delayed_pair_answers_after_its_delay(
    genrm_server: GenRMServer, genrm_judge: ControlledJudge, autojump_clock: trio.abc.Clock
) -> None:
    genrm_judge.delay(1.5, pair=(0, 1))
    start = trio.current_time()
    replies = await genrm_server.post_group()
    assert trio.current_time() - start == 1.5
    assert [r.reward for r in replies] == [3.0, 3.0]


@pytest.mark.parametrize("genrm_settings", [{"judge_request_timeout_s": 0.5}])
async def test_a_held_call_times_out_and_is_counted_as_cancelled(
    genrm_server: GenRMServer, genrm_judge: ControlledJudge, autojump_clock: trio.abc.Clock
) -> None:
    genrm_judge.hold(pair=(0, 1))
    replies = await genrm_server.post_group()
    assert all(r.masked for r in replies)
    assert "TimeoutError: no complete reply within 0.5s" in replies[0].body["failure_reason"]
    stats = genrm_judge.stats()
    assert (stats["cancelled"], stats["in_flight"], stats["held"]) == (1, 0, 0)
    assert {c.pair: c.state for c in genrm_judge.calls} == {
        (0, 1): "cancelled",
        (1, 0): "answered",
    }


async def test_disconnect_removes_only_that_waiter(genrm_server: GenRMServer) -> None:
    async with trio.open_nursery() as nursery:
        first = genrm_server.start_member(nursery, 0)
        await trio.testing.wait_all_tasks_blocked()
        assert genrm_server.statistics().waiters == 1
        await genrm_server.disconnect(first)
        assert first.reply is None and genrm_server.statistics().waiters == 0
        replies = await genrm_server.post_group()
    assert [r.reward for r in replies] == [3.0, 3.0]
    assert genrm_server.calls() == 2


async def test_new_attempt_supersedes_the_waiting_one(genrm_server: GenRMServer) -> None:
    async with trio.open_nursery() as nursery:
        old = genrm_server.start_member(nursery, 0)
        await trio.testing.wait_all_tasks_blocked()
        assert genrm_server.next_attempt() == 1
        replies = await genrm_server.new_attempt(qualities=[4, 2])
        stale = await old.result()
    assert (stale.status, stale.detail) == (503, SUPERSEDED)
    assert [r.reward for r in replies] == [4.0, 2.0]
    assert genrm_server.next_attempt() == 2


async def test_shutdown_answers_every_waiter(
    genrm_server: GenRMServer, genrm_judge: ControlledJudge
) -> None:
    genrm_judge.hold(group="judging")
    async with trio.open_nursery() as nursery:
        collecting = genrm_server.start_member(nursery, 0, g="collecting")
        judging = genrm_server.start_group(nursery, "judging")
        await genrm_judge.wait_for_calls(2, state="held")
        await genrm_server.shutdown()
        for pending in [collecting, *judging]:
            reply = await pending.result()
            assert (reply.status, reply.detail) == (503, "GenRM server is shutting down")
    stats = genrm_server.statistics()
    assert (stats.active_groups, stats.waiters, stats.owned_tasks) == (0, 0, 0)
    assert genrm_judge.stats()["in_flight"] == 0


async def test_the_factory_runs_independent_servers(genrm_server_factory: Factory) -> None:
    async with genrm_server_factory(num_rollouts_per_prompt=3) as three:
        async with genrm_server_factory() as two:
            assert (three.size, two.size) == (3, 2)
            assert [r.reward for r in await two.post_group()] == [3.0, 3.0]
            assert three.statistics().watermarks == 0


async def test_a_server_reports_a_checkpoint_inside_a_critical_section() -> None:
    # AS-161: a test-only hook that awaits inside a critical section is reported (I-23).
    async def checkpoint_inside(i: int, j: int, p: int) -> None:
        with critical_section():
            await trio.lowlevel.checkpoint()

    from genrm_trio.testing.fixtures import serve

    async with serve(hooks=Hooks(on_comparison_start=checkpoint_inside)) as server:
        await server.post_group()
        # Both comparison tasks, and any task that ran while one was suspended inside.
        assert len(server.instrument.violations) >= 2
        with pytest.raises(AssertionError, match=r"critical section \(I-1\)"):
            server.check_invariants()
        server.instrument.violations.clear()


async def test_the_instrument_names_the_task_that_checkpointed() -> None:
    # AS-161 at the level of one task.
    instrument = CriticalSectionInstrument()
    trio.lowlevel.add_instrument(instrument)
    try:

        async def offender() -> None:
            with critical_section():
                await trio.lowlevel.checkpoint()

        async def bystander() -> None:
            await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(offender, name="offender")
            nursery.start_soon(bystander, name="bystander")
    finally:
        trio.lowlevel.remove_instrument(instrument)
    # The offender's step is reported; the bystander's too if it ran while the offender was
    # suspended inside the critical section.
    assert instrument.violations[0] == "offender"
    assert set(instrument.violations) <= {"offender", "bystander"}
    assert instrument.steps > 0


def test_tagged_members_carry_their_group_attempt() -> None:
    from genrm_trio.testing.fixtures import tagged_member

    body: dict[str, Any] = tagged_member(1, 4, "g7", 2)
    text = body["response"]["output"][0]["content"][0]["text"]
    assert text == f"answer-1 [[q=4]] {group_marker('g7', 2)}"
    assert group_marker("g7", 2) == "[[group=g7:2]]"


def test_a_bad_fault_action_is_rejected_when_the_control_is_added() -> None:
    judge = ControlledJudge()
    with pytest.raises(ValueError, match="unknown action 'explode'"):
        judge.fail("explode", pair=(0, 1))
    with pytest.raises(ValueError, match="needs status"):
        judge.fail("http_status")
    assert judge.controls() == []


def test_a_user_suite_enables_the_plugin_and_its_marker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["genrm_trio.testing.fixtures"]\n')
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.genrm_config(num_rollouts_per_prompt=3)
            async def test_group(genrm_server, genrm_judge, autojump_clock):
                genrm_judge.fail("http_status", pair=(2, 0), status=400)
                replies = await genrm_server.post_group(qualities=[1, 2, 3])
                assert [r.masked for r in replies] == [True, False, True]
                assert replies[1].reward == 2.0
            """
        )
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "error::pytest.PytestUnknownMarkWarning",
            "-o",
            "trio_mode=true",
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
