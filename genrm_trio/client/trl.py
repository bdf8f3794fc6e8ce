"""A reward function for TRL's `GRPOTrainer` (and `RLOOTrainer`), in TRL's calling convention:
``reward(prompts=..., completions=..., completion_ids=..., **columns)`` returning one reward
per completion, None for a completion genrm-trio masked.

TRL itself is not imported: the function only follows its convention (TRL 1.9.0). The batch
holds `num_generations` completions of each prompt, consecutively; each such run is one group,
scored through `/verify_group`. TRL turns a None into NaN and leaves that completion out of its
group's mean and standard deviation, with advantage 0 (docs/trainers.md cites the lines).

A batch whose every completion is masked because the judge or the server could not be reached
would train on nothing: by default the function raises `RewardsUnavailable` then, and with
``on_unreachable="warn"`` it logs a WARNING and returns the Nones.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

from genrm_trio.client._blocking import BlockingGenRMClient
from genrm_trio.client._bodies import Prompt, Response
from genrm_trio.client._readiness import RewardsUnavailable
from genrm_trio.client._resend import ResendPolicy
from genrm_trio.client._results import RolloutResult, unreachable
from genrm_trio.client._session import DEFAULT_READY_WAIT_S

log = logging.getLogger("genrm_trio.client")
OnUnreachable = Literal["raise", "warn"]
_ON_UNREACHABLE: Final = ("raise", "warn")


class GenRMRewardFunction:
    """Scores a TRL batch group by group on a genrm-trio server.

    ``num_generations`` must be GRPOConfig's `num_generations` (and `num_generations_eval`, if
    set), and the server's `num_rollouts_per_prompt`. Each process must hold whole groups: with
    several processes, `per_device_train_batch_size x steps_per_generation` must be a multiple
    of `num_generations` (TRL lays a group's completions out consecutively and may split one
    across processes otherwise); a batch that does not hold whole groups raises ValueError.

    The first call waits up to ``ready_wait_s`` seconds for the server's `/readyz` and raises
    `ServerNotReady` if the server is not ready (None skips the check). A batch whose every
    completion comes back masked because the judge or the server could not be reached raises
    `RewardsUnavailable` (``on_unreachable="raise"``, the default) or, with
    ``on_unreachable="warn"``, is logged as a WARNING by the `genrm_trio.client` logger and
    returned as Nones. A server that does not answer at all gives that after the client's
    resends, or at ``deadline_s`` if that comes first.
    """

    def __init__(
        self,
        base_url: str,
        num_generations: int,
        *,
        policy: ResendPolicy | None = None,
        deadline_s: float | None = None,
        rng: random.Random | None = None,
        name: str = "genrm",
        ready_wait_s: float | None = DEFAULT_READY_WAIT_S,
        on_unreachable: OnUnreachable = "raise",
    ) -> None:
        if num_generations < 1:
            raise ValueError(f"num_generations {num_generations}: expected >= 1")
        if on_unreachable not in _ON_UNREACHABLE:
            raise ValueError(f"on_unreachable {on_unreachable!r}: expected 'raise' or 'warn'")
        self.num_generations = num_generations
        self.on_unreachable = on_unreachable
        self.client = BlockingGenRMClient(
            base_url, policy=policy, deadline_s=deadline_s, rng=rng, ready_wait_s=ready_wait_s
        )
        # TRL names a reward function by its __name__ in its logs and metrics.
        self.__name__ = name
        self.last_results: list[RolloutResult] = []

    def __call__(
        self,
        prompts: Sequence[Prompt],
        completions: Sequence[Response],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        groups = self.groups(prompts, completions)
        results = [r for group in self.client.score_groups(groups) for r in group]
        self.last_results = results
        masked = sum(r.mask_sample for r in results)
        log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
        if log_metric is not None and results:
            log_metric(f"{self.__name__}/masked_fraction", masked / len(results))
        log_extra: Callable[[str, list[Any]], None] | None = kwargs.get("log_extra")
        if log_extra is not None:
            log_extra(f"{self.__name__}_failure", [r.failure_reason or "" for r in results])
        if results and all(unreachable(r) for r in results):
            first = results[0].failure_reason or ""
            error = RewardsUnavailable(self.client.base_url, len(results), first)
            if self.on_unreachable == "raise":
                raise error
            log.warning("genrm: %s; returning None for every completion", error)
        elif masked:
            log.warning(
                "genrm: %d of %d completions masked (reward None); first reason: %s",
                masked,
                len(results),
                next(r.failure_reason for r in results if r.mask_sample),
            )
        return [r.reward for r in results]

    def groups(
        self, prompts: Sequence[Prompt], completions: Sequence[Response]
    ) -> list[tuple[Prompt, Sequence[Response]]]:
        """The batch cut into groups of `num_generations` consecutive completions."""
        size = self.num_generations
        if len(prompts) != len(completions):
            raise ValueError(
                f"{len(prompts)} prompts for {len(completions)} completions: expected one each"
            )
        if len(completions) % size:
            raise ValueError(
                f"a batch of {len(completions)} completions does not hold whole groups of "
                f"num_generations={size}; make per_device_train_batch_size x "
                "steps_per_generation a multiple of num_generations"
            )
        groups = []
        for start in range(0, len(completions), size):
            prompt = prompts[start]
            if any(p != prompt for p in prompts[start : start + size]):
                raise ValueError(
                    f"completions {start}..{start + size - 1} do not share one prompt: the batch "
                    f"does not hold consecutive groups of num_generations={size}"
                )
            groups.append((prompt, completions[start : start + size]))
        return groups
