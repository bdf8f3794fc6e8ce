"""A client for trainers that hold whole groups: a prompt and its N responses in, N results
(reward, mask, failure kind and reason) out, never a number for a masked rollout.

`GenRMClient` is async and runs under Trio or asyncio; `BlockingGenRMClient` blocks;
`genrm_trio.client.trl.GenRMRewardFunction` is a reward function for TRL's GRPOTrainer.
`RESENDABLE_503_PREFIXES` and `GATEWAY_STATUSES` say which answers the client sends again, for
a trainer that posts groups with its own HTTP client. `ServerNotReady` is raised at first use
when the server's `/readyz` does not say ready in time; `RewardsUnavailable` by the TRL reward
function when a whole batch is masked because the judge or the server could not be reached.
It loads nothing of the server.
"""

from genrm_trio.client._blocking import BlockingGenRMClient
from genrm_trio.client._readiness import RewardsUnavailable, ServerNotReady
from genrm_trio.client._resend import GATEWAY_STATUSES, RESENDABLE_503_PREFIXES, ResendPolicy
from genrm_trio.client._results import JUDGE_FAILED, VERIFY_FAILED, RolloutResult
from genrm_trio.client._session import GenRMClient, GroupRefused

__all__ = [
    "GATEWAY_STATUSES",
    "JUDGE_FAILED",
    "RESENDABLE_503_PREFIXES",
    "VERIFY_FAILED",
    "BlockingGenRMClient",
    "GenRMClient",
    "GroupRefused",
    "ResendPolicy",
    "RewardsUnavailable",
    "RolloutResult",
    "ServerNotReady",
]
