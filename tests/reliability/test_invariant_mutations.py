"""Every invariant check catches its invariant broken on purpose (mutation tests).

Each test monkeypatches one defect into the product, plays a short scenario that reaches it,
and asserts that the runner reports the invariant it breaks. The same scenario passes without
the defect.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import trio

from genrm_trio.core import _publication as publication
from genrm_trio.core import messages
from genrm_trio.core.critical import critical_section
from genrm_trio.core.outcomes import Ended, Scored
from genrm_trio.core.records import FailureKind, Phase, Record
from genrm_trio.core.retention import AgedIndex
from genrm_trio.core.transition import Finish, _Step
from genrm_trio.judge.client import JudgeClient, JudgeFailure, JudgeTask, JudgeVerdict
from genrm_trio.runtime._waiters import Waiters
from genrm_trio.runtime.engine import Engine
from genrm_trio.store.memory_store import MemoryGroupStore
from genrm_trio.testing.scenarios import (
    Disconnect,
    Fault,
    Post,
    Scenario,
    ScenarioReport,
    Shutdown,
    Step,
    generate,
    run_scenario,
)

SETTINGS: dict[str, Any] = {
    "num_rollouts_per_prompt": 2,
    "comparison_strategy": "circular",
    "num_judges_per_comparison": 1,
    "genrm_parse_retries": 1,
    "judge_request_timeout_s": 2.0,
    "cohort_result_ttl_s": 10.0,
    "max_terminal_cohorts": 8,
}


class Script:
    """A hand-written scenario: unique request ids, whole groups in one call."""

    def __init__(self, **settings: Any) -> None:
        self.settings = {**SETTINGS, **settings}
        self.steps: list[Step] = []
        self.faults: list[Fault] = []
        self._ids = itertools.count()

    @property
    def size(self) -> int:
        return int(self.settings["num_rollouts_per_prompt"])

    def post(self, slot: int, g: str = "g", a: int = 0, q: int = 3, **options: Any) -> int:
        request = next(self._ids)
        self.steps.append(Post((request,), g, a, slot, q, **options))
        return request

    def complete(self, g: str = "g", a: int = 0, qualities: list[int] | None = None) -> None:
        for slot in range(self.size):
            self.post(slot, g, a, (qualities or [3] * self.size)[slot])

    def fault(self, pair: tuple[int, int], kind: str, g: str = "g", a: int = 0) -> None:
        self.faults.append(Fault(g, a, pair, kind))

    def then(self, step: Step) -> None:
        self.steps.append(step)

    def scenario(self) -> Scenario:
        return Scenario(0, self.settings, tuple(self.faults), tuple(self.steps))


def play(script: Script) -> ScenarioReport:
    return run_scenario(script.scenario(), shrink_failures=False)


def invariants_caught(report: ScenarioReport) -> set[str]:
    return {v.invariant for v in report.violations}


# A defect: the attribute ``name`` of ``target`` replaced by ``value`` while the script plays.
Defect = tuple[Any, str, Any]


def play_with(script: Script, *defects: Defect) -> ScenarioReport:
    """The report of ``script`` played with ``defects`` in place; it passes without them."""
    clean = play(script)
    assert clean.ok, clean.summary()
    with pytest.MonkeyPatch.context() as patch:
        for target, name, value in defects:
            patch.setattr(target, name, value)
        return play(script)


def assert_catches(script: Script, invariant: str, *defects: Defect) -> None:
    report = play_with(script, *defects)
    assert invariant in invariants_caught(report), report.summary()


_SCORE_GROUP = publication.score_group


def swapped_rewards(*args: Any, **kwargs: Any) -> Any:
    """``score_group`` with the rewards handed to the slots in reverse order."""
    score = _SCORE_GROUP(*args, **kwargs)
    slots = sorted(score.rewards)
    values = [score.rewards[slot] for slot in reversed(slots)]
    return score._replace(rewards=dict(zip(slots, values, strict=True)))


# ---- I-1: no checkpoint inside bookkeeping -----------------------------------------------------


def test_a_checkpoint_inside_arrival_bookkeeping_is_caught() -> None:
    script = Script()
    script.complete()

    verify = Engine._verify

    async def verify_with_await(self: Engine, request: Any, fingerprints: Any) -> Any:
        with critical_section():
            await trio.lowlevel.checkpoint()  # an await slipped into resolution
        return await verify(self, request, fingerprints)

    assert_catches(script, "I-1", (Engine, "_verify", verify_with_await))


def test_a_checkpoint_inside_evaluation_bookkeeping_is_caught() -> None:
    script = Script()
    script.complete()

    judge = JudgeClient.judge

    async def judge_inside(self: JudgeClient, task: Any, *, deadline: float = math.inf) -> Any:
        with critical_section():
            return await judge(self, task, deadline=deadline)

    assert_catches(script, "I-1", (JudgeClient, "judge", judge_inside))


# ---- I-2: index consistency ----------------------------------------------------------------


def test_supersession_that_leaves_the_old_result_indexed_is_caught() -> None:
    script = Script()
    script.complete(a=0)
    script.post(0, a=1)
    file = MemoryGroupStore._file

    def file_keeping_old_result(self: MemoryGroupStore, group: Any, before: Any) -> None:
        file(self, group, before)
        if before.terminal_time is not None and before.record is not group.record:
            self._terminal.stamp(group.ref, group, before.terminal_time)

    assert_catches(script, "I-2", (MemoryGroupStore, "_file", file_keeping_old_result))


def test_a_finished_group_missing_from_the_idle_order_is_caught() -> None:
    script = Script()
    script.complete()

    assert_catches(script, "I-2", (_Step, "_stamp_idle", lambda self: None))


# ---- R-1 … R-4: retention order ----------------------------------------------------------


def test_a_refresh_that_keeps_the_old_idle_position_is_caught() -> None:
    # A replay moves its group to the end of the idle order (C-41, R-5.1); the defect updates
    # the time but leaves the entry where it was, so count eviction would remove the wrong one.
    script = Script()
    script.complete(g="a")
    script.complete(g="b")
    script.post(0, g="a")

    def stamp_in_place(self: AgedIndex[Any, Any], key: Any, value: Any, now: float) -> None:
        self._entries[key] = (now, value)

    assert_catches(script, "R-1", (AgedIndex, "stamp", stamp_in_place))


# ---- I-3: terminal records keep nothing they no longer need ------------------------------------


def test_a_published_record_that_keeps_its_texts_is_caught() -> None:
    script = Script()
    script.complete()
    publish = _Step._publish

    def publish_keeping_texts(self: _Step, record: Record, failed: int) -> None:
        texts = {slot: member.texts for slot, member in record.members.items()}
        publish(self, record, failed)
        for slot, member in record.members.items():
            member.texts = texts[slot]

    assert_catches(script, "I-3", (_Step, "_publish", publish_keeping_texts))


# ---- I-4: no waiter left behind ------------------------------------------------------------


def test_a_disconnect_that_leaves_its_waiter_is_caught() -> None:
    script = Script()
    request = script.post(0)
    script.then(Disconnect(request))

    assert_catches(script, "I-4", (Waiters, "remove", lambda self, rid, waiter: None))


def test_a_shutdown_that_forgets_waiting_requests_is_caught() -> None:
    script = Script()
    script.post(0, g="collecting")
    script.fault((0, 1), "hold", g="evaluating")
    script.complete(g="evaluating")
    script.then(Shutdown())

    def close_only(self: MemoryGroupStore, now: float) -> list[Any]:
        self.closed = True
        return []

    assert_catches(
        script,
        "I-4",
        (MemoryGroupStore, "shut_down", close_only),
        (MemoryGroupStore, "evaluation_cancelled", lambda self, ref, rid: None),
        (Waiters, "resolve_all", lambda self, outcome: None),
    )


# ---- I-5: no partial publication ----------------------------------------------------------


def test_a_failed_group_that_keeps_its_rewards_is_caught() -> None:
    script = Script()
    script.complete()

    def finish_storing_first(self: _Step, record: Record, event: Finish) -> None:
        # The outcomes are stored before a check that then fails the group.
        for member in record.members.values():
            member.outcome = Scored(3.0, {})
        self._fail(record, FailureKind.COHORT, messages.NON_FINITE_REWARDS)

    assert_catches(script, "I-5", (_Step, "_finish", finish_storing_first))


# ---- I-6: exact judge calls ------------------------------------------------------------------


def test_judging_a_comparison_twice_is_caught() -> None:
    script = Script()
    script.complete()
    judge = JudgeClient.judge

    async def judge_twice(self: JudgeClient, task: Any, *, deadline: float = math.inf) -> Any:
        await judge(self, task, deadline=deadline)
        return await judge(self, task, deadline=deadline)

    assert_catches(script, "I-6", (JudgeClient, "judge", judge_twice))


def test_a_superseded_group_that_keeps_judging_is_caught() -> None:
    script = Script()
    script.fault((0, 1), "hold", a=0)
    script.complete(a=0)
    script.post(0, a=1)

    def deliver_only(self: Engine, ended: Ended) -> None:
        self.waiters.deliver(ended)  # its evaluation is not cancelled

    assert_catches(script, "I-6", (Engine, "ended_elsewhere", deliver_only))


def test_a_replay_that_calls_the_judge_is_caught() -> None:
    script = Script()
    script.complete()
    script.post(0)
    verify = Engine._verify

    def replayed_task(record: Record) -> JudgeTask:
        text = f"answer-0 [[q=3]] [[group={record.group_id}:{record.attempt}]]"
        return JudgeTask([], None, text, text.replace("answer-0", "answer-1"), (0, 1), 0)

    async def verify_and_rejudge(self: Engine, request: Any, fingerprints: Any) -> Any:
        answered = await verify(self, request, fingerprints)
        group = self.store.group(f"e:{request.group_id}")  # type: ignore[attr-defined]
        record = group.record if group is not None else None
        if record is not None and record.phase is Phase.COMPLETED and request.rollout_index == 0:
            await self.judge.judge(replayed_task(record))
        return answered

    assert_catches(script, "I-6", (Engine, "_verify", verify_and_rejudge))


# ---- I-7: finite rewards, one per slot, mapped by slot -------------------------------------


def test_rewards_given_to_the_wrong_slots_are_caught() -> None:
    script = Script()
    script.complete(qualities=[5, 1])
    assert_catches(script, "I-7", (publication, "score_group", swapped_rewards))


def test_a_non_finite_published_reward_is_caught() -> None:
    script = Script()
    script.complete()
    score_group = publication.score_group

    def infinite(*args: Any, **kwargs: Any) -> Any:
        score = score_group(*args, **kwargs)
        return score._replace(rewards={**score.rewards, 0: math.inf})

    assert_catches(
        script,
        "I-7",
        (publication, "score_group", infinite),
        (publication, "check_publishable", lambda *args: None),
    )


# ---- M-2: masks exactly the rollouts of failed comparisons -------------------------------------


def test_masking_a_rollout_whose_comparisons_all_succeeded_is_caught() -> None:
    # An unparseable but completed reply is a successful comparison (M-1): the defect counts
    # it as failed and masks rollouts that must be scored with the default verdict.
    script = Script(num_rollouts_per_prompt=4)
    script.fault((0, 1), "unparseable")
    script.complete(qualities=[1, 2, 4, 5])

    judge = JudgeClient.judge

    async def judge_failing_fallbacks(
        self: JudgeClient, task: Any, *, deadline: Any = math.inf
    ) -> Any:
        result = await judge(self, task, deadline=deadline)
        if isinstance(result, JudgeVerdict) and result.fallback:
            return JudgeFailure("unparseable reply", result.attempts)
        return result

    assert_catches(script, "M-2", (JudgeClient, "judge", judge_failing_fallbacks))


def test_masking_only_one_rollout_of_a_failed_pair_is_caught() -> None:
    script = Script(num_rollouts_per_prompt=4)
    script.fault((0, 1), "fatal")
    script.complete()

    def first_only(plan: Any, failed: Any, n: int) -> set[int]:
        return {c.first for c in plan if c.index in failed}

    report = play_with(script, (publication, "masked_slots", first_only))
    # Slot 1 cannot be scored without its failed comparison, so the group fails instead of
    # masking rollouts 0 and 1: the answers disagree with the model.
    first = report.violations[0]
    assert first.invariant == "C-43", report.summary()
    assert "rejected 503 'GenRM cohort evaluation failed" in first.message
    assert "expected masked 200 'GenRM rollout_index=0 lost a comparison" in first.message


# ---- I-9: pruning cost bounded by what it removes ---------------------------------------------


def test_pruning_that_scans_every_entry_is_caught() -> None:
    script = Script(cohort_result_ttl_s=None, max_terminal_cohorts=8)
    for k in range(4):
        script.complete(g=f"g{k}")
    script.post(0, g="next")

    def scanning_prune(
        self: AgedIndex[Any, Any], now: float, ttl: float | None, cap: int, on_remove: Any
    ) -> int:
        visits = 0
        for key, (stamped, value) in list(self._entries.items()):
            visits += 1
            if (ttl is not None and now - stamped >= ttl) or len(self._entries) > cap:
                del self._entries[key]
                on_remove(key, value)
        return visits

    assert_catches(script, "I-9", (AgedIndex, "prune", scanning_prune))


# ---- the randomized run finds defects by itself, and shrinks them ----------------------------


def test_random_seeds_find_a_defect_and_print_a_minimal_reproduction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(publication, "score_group", swapped_rewards)
    failing = None
    for seed in range(20):
        report = run_scenario(generate(seed))
        if not report.ok:
            failing = report
            break
    assert failing is not None, "20 random seeds did not notice rewards given to the wrong slots"
    assert failing.minimal is not None
    minimal = failing.minimal
    assert len(minimal.steps) < len(failing.scenario.steps)
    text = failing.reproduction()
    assert text.startswith(f"genrm-trio race scenario, seed {failing.scenario.seed} via engine:")
    assert f"{len(minimal.steps)} of {len(failing.scenario.steps)} generated steps" in text
    assert "step 0: post r" in text
    assert text.splitlines()[-1] == minimal.to_json()
    assert str(failing.minimal_violations[0]) in text.splitlines()[0]
    replayed = run_scenario(Scenario.from_json(minimal.to_json()), shrink_failures=False)
    assert failing.violations[0].invariant in invariants_caught(replayed)
    # Removing any one step of the minimal scenario makes the defect disappear.
    for index in range(len(minimal.steps)):
        fewer = minimal.steps[:index] + minimal.steps[index + 1 :]
        if fewer:
            smaller = Scenario(minimal.seed, minimal.settings, minimal.faults, fewer)
            assert run_scenario(smaller, shrink_failures=False).ok
