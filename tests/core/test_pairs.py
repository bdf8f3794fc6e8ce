"""Pairing and comparison order (S-10…S-13) and the fixed_baseline presentation order (S-51)."""

from __future__ import annotations

import hashlib
import json

import pytest

from genrm_trio.core.pairs import Comparison, baseline_order_digest, plan_comparisons


def pairs(strategy: str, n: int) -> list[tuple[int, int]]:
    return [c.pair for c in plan_comparisons(strategy, n, 1)]


def test_s10_circular_pairs() -> None:
    assert pairs("circular", 2) == [(0, 1), (1, 0)]
    assert pairs("circular", 3) == [(0, 1), (1, 2), (2, 0)]
    assert pairs("circular", 4) == [(0, 1), (1, 2), (2, 3), (3, 0)]


def test_s10_every_answer_is_shown_once_in_each_position() -> None:
    plan = pairs("circular", 7)
    assert sorted(i for i, _ in plan) == list(range(7))
    assert sorted(j for _, j in plan) == list(range(7))


def test_circular_with_one_or_no_answer_compares_nothing() -> None:
    assert plan_comparisons("circular", 1, 3) == []
    assert plan_comparisons("circular", 0, 1) == []
    assert plan_comparisons("all_pairs", 1, 2) == []


def test_s11_all_pairs() -> None:
    assert pairs("all_pairs", 2) == [(0, 1)]
    assert pairs("all_pairs", 4) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert len(pairs("all_pairs", 16)) == 120


@pytest.mark.parametrize(("strategy", "count"), [("circular", 12), ("all_pairs", 18)])
def test_s12_s13_comparisons_are_pass_major_with_the_same_order_each_pass(
    strategy: str, count: int
) -> None:
    plan = plan_comparisons(strategy, 4, 3)
    assert len(plan) == count
    per_pass = count // 3
    assert [c.index for c in plan] == list(range(count))
    assert [c.judge_pass for c in plan] == [p for p in range(3) for _ in range(per_pass)]
    first_pass = [c.pair for c in plan[:per_pass]]
    for p in range(3):
        assert [c.pair for c in plan[p * per_pass : (p + 1) * per_pass]] == first_pass
    assert not any(c.swapped for c in plan)
    assert all(c.oriented == c.pair for c in plan)


def test_unknown_strategy_and_missing_baseline_digest_are_errors() -> None:
    with pytest.raises(ValueError, match="ring"):
        plan_comparisons("ring", 4, 1)
    with pytest.raises(ValueError):
        plan_comparisons("fixed_baseline", 4, 1)


def _independent_digest(baseline: str, history: list[dict[str, str]], principle: str | None) -> str:
    # For ASCII text without control characters, sorted compact json.dumps is the C-20 form.
    form = json.dumps(
        {"baseline": baseline, "history": history, "principle": principle},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(form.encode()).hexdigest()


def _rollout_first(digest: str, k: int, p: int) -> bool:
    return (int(hashlib.sha256(f"{digest}:{k}".encode()).hexdigest(), 16) + p) % 2 == 0


def test_s51_baseline_order_digest_is_d() -> None:
    history = [{"role": "user", "content": "What is 2+2?"}]
    assert baseline_order_digest("BASE", history, None) == _independent_digest(
        "BASE", history, None
    )
    assert baseline_order_digest("BASE", history, "Be fair.") == _independent_digest(
        "BASE", history, "Be fair."
    )
    assert baseline_order_digest("BASE", history, "Be fair.") != baseline_order_digest(
        "BASE", history, None
    )


def test_s51_baseline_order_digest_uses_the_canonical_escapes() -> None:
    history = [{"role": "user", "content": "é\n"}]
    form = (
        b'{"baseline":"B","history":[{"content":"\\u00e9\\u000a","role":"user"}],"principle":null}'
    )
    assert baseline_order_digest("B", history, None) == hashlib.sha256(form).hexdigest()


def test_s50_s51_fixed_baseline_plan() -> None:
    history = [{"role": "user", "content": "Say hi"}]
    digest = baseline_order_digest("BASE", history, None)
    n, passes = 4, 2
    plan = plan_comparisons("fixed_baseline", n, passes, baseline_digest=digest)
    assert len(plan) == n * passes
    for c in plan:
        p, k = divmod(c.index, n)
        assert c.judge_pass == p
        if _rollout_first(_independent_digest("BASE", history, None), k, p):
            assert (c.first, c.second, c.swapped) == (k, n, False)
        else:
            assert (c.first, c.second, c.swapped) == (n, k, True)
        assert c.oriented == (k, n)


def test_s51_each_rollout_alternates_who_goes_first_across_passes() -> None:
    plan = plan_comparisons("fixed_baseline", 8, 2, baseline_digest="d" * 64)
    for k in range(8):
        assert plan[k].swapped != plan[8 + k].swapped
    assert {c.swapped for c in plan} == {True, False}


def test_s53_a_single_rollout_is_judged_against_the_baseline() -> None:
    plan = plan_comparisons("fixed_baseline", 1, 2, baseline_digest="0" * 64)
    assert [c.oriented for c in plan] == [(0, 1), (0, 1)]
    assert [c.index for c in plan] == [0, 1]


def test_comparison_orientation() -> None:
    assert Comparison(5, 4, 2, 1, swapped=True).oriented == (2, 4)
    assert Comparison(5, 4, 2, 1, swapped=True).pair == (4, 2)
    assert Comparison(0, 1, 0, 0).oriented == (1, 0)
