"""Benchmark what a masked row's reward placeholder does to the advantages of its scored
siblings when a trainer counts the row in its group statistics (`masked_reward_placeholder`,
W-33).

Caveat: arithmetic on simulated groups, not a training run: no server, no judge, no model. The
rewards come from the project's own scoring (core/scoring.py: pairing, aggregation, masking) on
verdicts drawn at random, so their spread and ties are those of a GenRM that writes whole scores
from 1 to 5; a judge with another score distribution moves the absolute errors, while the
comparison between the placeholders holds. The figures repeat for a given seed, whatever the
machine.

Each group: N drawn from 4 to 16; every rollout gets a true quality drawn from [1, 5]; each
comparison's verdict is the fake judge's rule (fakes/judge.py, CL-13) on the two
qualities plus Gaussian noise (sd `--noise`), rounded to whole scores. A masked share is drawn
from [0, 50%] and comparisons fail at random until at least that share of rollouts is masked
(M-2); a draw that masks more than half the group is drawn again. The scored rows' rewards are
`score_group`'s, and the group_mean placeholder is `masked_reward_placeholder`'s.

For every scored row, the advantage of four estimators is computed three ways: with the masked
rows left out of the group statistics (the truth: a trainer that honours the mask), and with
them counted at the `zero` and at the `group_mean` placeholder. Estimators:
- GRPO: (r - group mean) / (group std + 1e-6), sample std (torch.std's default);
- RLOO: r - mean of the other rows;
- Dr. GRPO: r - group mean;
- NeMo RL default: leave-one-out mean and leave-one-out sample std, r - baseline divided by
  std + 1e-6 when the std is above 0 (nemo_rl/algorithms/utils.py,
  calculate_baseline_and_std_per_prompt, with use_leave_one_out_baseline and normalize_rewards
  on, as in its GRPO examples); a std below 1e-9 counts as 0 here, so that siblings whose
  rewards differ only by rounding do not divide by almost nothing.
Reported over the scored rows of all groups: the mean absolute error against the truth, that
error relative to the mean absolute true advantage, and sign flips (rows whose advantage has
another sign than the truth's, zero counting as a sign).

    python benchmarks/bench_masked_baselines.py             # 20,000 groups
    python benchmarks/bench_masked_baselines.py --short     # 2,000 groups
    python benchmarks/bench_masked_baselines.py --strategy all_pairs
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from _common import machine_line, parser, table

from genrm_trio.config import Config, config_from_mapping
from genrm_trio.core.pairs import plan_comparisons
from genrm_trio.core.scoring import masked_reward_placeholder, masked_slots, score_group
from genrm_trio.core.verdicts import Verdict
from genrm_trio.fakes.judge import verdict_for_qualities

EPSILON = 1e-6
# An advantage this close to zero has no sign: rewards are sums of halves and quarters, but the
# means and stds they go through are not exact.
SIGN_TOLERANCE = 1e-9

# One estimator: the advantage of row `i` among the rewards counted in its group statistics.
Estimator = Callable[[Sequence[float], int], float]


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _sample_std(values: Sequence[float]) -> float:
    # statistics.stdev is exact and slow (fractions); a trainer's float arithmetic is this.
    if len(values) < 2:
        return 0.0
    mean = _mean(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def grpo(rewards: Sequence[float], i: int) -> float:
    return (rewards[i] - _mean(rewards)) / (_sample_std(rewards) + EPSILON)


def rloo(rewards: Sequence[float], i: int) -> float:
    others = [r for k, r in enumerate(rewards) if k != i]
    return rewards[i] - _mean(others)


def dr_grpo(rewards: Sequence[float], i: int) -> float:
    return rewards[i] - _mean(rewards)


def nemo_rl_default(rewards: Sequence[float], i: int) -> float:
    others = [r for k, r in enumerate(rewards) if k != i]
    advantage = rewards[i] - _mean(others)
    std = _sample_std(others)
    # NeMo RL tests `std > 0`; here rewards that differ only by rounding count as equal, or one
    # such pair of siblings would make a spike of 1e9 that says nothing about placeholders.
    return advantage / (std + EPSILON) if std > SIGN_TOLERANCE else advantage


ESTIMATORS: dict[str, Estimator] = {
    "GRPO (mean, std)": grpo,
    "RLOO (leave-one-out mean)": rloo,
    "Dr. GRPO (mean only)": dr_grpo,
    "NeMo RL default (leave-one-out mean and std)": nemo_rl_default,
}
PLACEHOLDERS = ("zero", "group_mean")


@dataclass
class Group:
    rewards: dict[int, float]  # scored slot -> reward
    masked: set[int]
    size: int


def draw_group(rng: random.Random, config: Config, noise: float) -> Group:
    size = rng.randint(4, 16)
    qualities = [rng.uniform(1.0, 5.0) for _ in range(size)]
    plan = plan_comparisons(config.comparison_strategy, size, config.num_judges_per_comparison)
    while True:
        wanted = round(rng.uniform(0.0, 0.5) * size)
        failed: set[int] = set()
        order = list(range(len(plan)))
        rng.shuffle(order)
        masked: set[int] = set()
        for index in order:
            if len(masked) >= wanted:
                break
            failed.add(index)
            masked = masked_slots(plan, failed, size)
        if len(masked) <= size // 2:
            break
    verdicts: dict[int, Verdict] = {}
    for comparison in plan:
        if comparison.index in failed:
            continue
        first = round(qualities[comparison.first] + rng.gauss(0.0, noise))
        second = round(qualities[comparison.second] + rng.gauss(0.0, noise))
        verdicts[comparison.index] = Verdict(*verdict_for_qualities(first, second))
    texts = [("", f"answer-{slot}") for slot in range(size)]
    score = score_group(size, texts, plan, verdicts, masked, config)
    return Group(score.rewards, masked, size)


@dataclass
class Errors:
    absolute: list[float] = field(default_factory=list)
    truth: list[float] = field(default_factory=list)
    bucket: list[int] = field(default_factory=list)  # the row's group's masked-share bucket
    flips: int = 0

    def relative(self, bucket: int | None = None) -> str:
        chosen = [k for k, b in enumerate(self.bucket) if bucket is None or b == bucket]
        scale = math.fsum(self.truth[k] for k in chosen)
        if not scale:
            return "n/a"
        return f"{math.fsum(self.absolute[k] for k in chosen) / scale:.1%}"


BUCKETS = ("none masked", "up to 25%", "25-37.5%", "37.5-50%")


def share_bucket(group: Group) -> int:
    share = len(group.masked) / group.size
    return 0 if share == 0 else 1 if share <= 0.25 else 2 if share <= 0.375 else 3


def _sign(value: float) -> int:
    return 0 if abs(value) <= SIGN_TOLERANCE else (1 if value > 0 else -1)


def measure(groups: Sequence[Group]) -> dict[tuple[str, str], Errors]:
    errors = {(name, p): Errors() for name in ESTIMATORS for p in PLACEHOLDERS}
    for group in groups:
        bucket = share_bucket(group)
        scored = sorted(group.rewards)
        valid = [group.rewards[slot] for slot in scored]
        counted = {
            policy: [
                group.rewards.get(slot, masked_reward_placeholder(policy, group.rewards.values()))
                for slot in range(group.size)
            ]
            for policy in PLACEHOLDERS
        }
        for name, estimator in ESTIMATORS.items():
            for position, slot in enumerate(scored):
                truth = estimator(valid, position)
                for policy in PLACEHOLDERS:
                    got = estimator(counted[policy], slot)
                    entry = errors[name, policy]
                    entry.absolute.append(abs(got - truth))
                    entry.truth.append(abs(truth))
                    entry.bucket.append(bucket)
                    entry.flips += _sign(got) != _sign(truth)
    return errors


def main() -> None:
    arguments = parser(__doc__.splitlines()[0] if __doc__ else "")
    arguments.add_argument("--groups", type=int, default=None, help="groups to draw")
    arguments.add_argument("--seed", type=int, default=0)
    arguments.add_argument("--noise", type=float, default=0.75, help="judge noise (sd)")
    arguments.add_argument("--strategy", choices=("circular", "all_pairs"), default="circular")
    args = arguments.parse_args()
    count = args.groups or (2_000 if args.short else 20_000)
    print(__doc__.split("\n\n")[1].strip() if __doc__ else "", flush=True)
    print(machine_line())
    config = config_from_mapping(
        {
            "judge_base_url": "http://judge/v1",
            "judge_model": "judge",
            "comparison_strategy": args.strategy,
        }
    )
    rng = random.Random(args.seed)
    groups = [draw_group(rng, config, args.noise) for _ in range(count)]
    rows_total = sum(group.size for group in groups)
    masked_total = sum(len(group.masked) for group in groups)
    scored_total = rows_total - masked_total
    shares = Counter(share_bucket(group) for group in groups)
    print(
        f"\n{count} groups ({args.strategy}, seed {args.seed}, judge noise {args.noise}): "
        f"{rows_total} rows, {masked_total} masked ({masked_total / rows_total:.1%}), "
        f"{scored_total} scored rows measured; groups by masked share: "
        + ", ".join(f"{label} {shares[bucket]}" for bucket, label in enumerate(BUCKETS))
    )
    errors = measure(groups)
    body = []
    for name in ESTIMATORS:
        for policy in PLACEHOLDERS:
            entry = errors[name, policy]
            body.append(
                [
                    name,
                    f"`{policy}`",
                    f"{statistics.fmean(entry.absolute):.4f}",
                    entry.relative(),
                    f"{entry.flips} ({entry.flips / len(entry.absolute):.1%})",
                ]
            )
    print()
    print(
        table(
            [
                "estimator",
                "placeholder counted",
                "MAE",
                "MAE / mean |true advantage|",
                "sign flips (scored rows)",
            ],
            body,
        )
    )
    print("\nMAE / mean |true advantage| by the group's masked share:\n")
    print(
        table(
            ["estimator", "placeholder counted", *BUCKETS],
            [
                [name, f"`{policy}`", *(errors[name, policy].relative(b) for b in range(4))]
                for name in ESTIMATORS
                for policy in PLACEHOLDERS
            ],
        )
    )


if __name__ == "__main__":
    main()
