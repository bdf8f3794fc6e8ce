"""Which slots the judge compares, in which presentation order, in which judge pass
(S-10…S-13, S-50, S-51).
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from genrm_trio.core.canonical import digest_hex

__all__ = ["Comparison", "baseline_order_digest", "plan_comparisons"]


class Comparison(NamedTuple):
    """One (pair, judge pass); `first` is shown as response_1, `second` as response_2.

    `swapped` is True iff this is a fixed_baseline comparison in which the baseline (slot N)
    went first.
    """

    index: int  # type: ignore[assignment]  # S-12 comparison index; shadows tuple.index
    first: int
    second: int
    judge_pass: int
    swapped: bool = False

    @property
    def pair(self) -> tuple[int, int]:
        """The pair in presentation order, as written in judge error texts (J-40)."""
        return self.first, self.second

    @property
    def oriented(self) -> tuple[int, int]:
        """The pair in rollout-first orientation, as aggregated: (k, N) under fixed_baseline."""
        return (self.second, self.first) if self.swapped else (self.first, self.second)


def plan_comparisons(
    strategy: str, n: int, passes: int, *, baseline_digest: str | None = None
) -> list[Comparison]:
    """Every comparison of a group of `n` rollouts, in comparison order (S-12).

    Under ``fixed_baseline`` the baseline is slot `n` and `baseline_digest` (D of S-51, see
    `baseline_order_digest`) decides who goes first.
    """
    if n < 0 or passes < 0:
        raise ValueError(f"cannot plan comparisons for n={n}, passes={passes}")
    if strategy == "fixed_baseline":
        if baseline_digest is None:
            raise ValueError("fixed_baseline needs the baseline order digest")
        return _plan_fixed_baseline(n, passes, baseline_digest)
    if strategy == "circular":
        pairs = [(i, (i + 1) % n) for i in range(n)] if n >= 2 else []
    elif strategy == "all_pairs":
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    else:
        raise ValueError(f"unknown comparison strategy {strategy!r}")
    return [
        Comparison(p * len(pairs) + k, first, second, p)
        for p in range(passes)
        for k, (first, second) in enumerate(pairs)
    ]


def baseline_order_digest(
    baseline: str, history: list[dict[str, str]], principle: str | None
) -> str:
    """D of S-51: `history` is the judge-facing history, `principle` the one sent (or None)."""
    return digest_hex({"baseline": baseline, "history": history, "principle": principle})


def _plan_fixed_baseline(n: int, passes: int, digest: str) -> list[Comparison]:
    # Parity of the rollout's hash plus the pass: each rollout alternates who goes first from
    # pass to pass, and across rollouts the order is balanced without depending on the answers.
    parity = [int(hashlib.sha256(f"{digest}:{k}".encode()).hexdigest(), 16) % 2 for k in range(n)]
    plan: list[Comparison] = []
    for p in range(passes):
        for k in range(n):
            rollout_first = (parity[k] + p) % 2 == 0
            if rollout_first:
                plan.append(Comparison(p * n + k, k, n, p, swapped=False))
            else:
                plan.append(Comparison(p * n + k, n, k, p, swapped=True))
    return plan
