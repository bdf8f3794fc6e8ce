"""A client for trainers that hold whole groups: a prompt and its N responses in, N results
(reward, mask, failure kind and reason) out, never a number for a masked rollout.

`GenRMClient` is async and runs under Trio or asyncio; `BlockingGenRMClient` blocks;
`genrm_trio.client.trl.GenRMRewardFunction` is a reward function for TRL's GRPOTrainer.
"""

from genrm_trio.client.blocking import BlockingGenRMClient
from genrm_trio.client.resend import ResendPolicy
from genrm_trio.client.results import JUDGE_FAILED, VERIFY_FAILED, RolloutResult
from genrm_trio.client.session import GenRMClient, GroupRefused

__all__ = [
    "JUDGE_FAILED",
    "VERIFY_FAILED",
    "BlockingGenRMClient",
    "GenRMClient",
    "GroupRefused",
    "ResendPolicy",
    "RolloutResult",
]
