"""Whether a masked rollout's failure text says the judge could not be reached, as opposed to a
judge that answered without a usable verdict. Trainer adapters stop a run on the first kind
instead of training on placeholders; the texts read here are the J-40 judge errors and the group
texts of core.messages.

The judge could not be reached when a comparison ended in one of these causes: no connection
(`ConnectError`, `ConnectTimedOut`), a connection broken or closed before a whole reply
(`ReadError`, `RemoteProtocolError`), no complete reply within `judge_request_timeout_s`
(`TimeoutError`), or a gateway in front of the judge answering 502, 503 or 504 for it; or when
not one comparison of a group finished before its evaluation deadline. A non-JSON reply, a reply
without a verdict and any other HTTP status are answers, not reachability failures.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "UNREACHABLE_TRANSPORT_ERRORS",
    "group_unreachable",
    "judge_unreachable",
    "unreachable_refusal",
]

# The judge transport's error classes (judge/transport.py) that mean no reply came back.
UNREACHABLE_TRANSPORT_ERRORS: Final = (
    "ConnectError",
    "ConnectTimedOut",
    "ReadError",
    "RemoteProtocolError",
)
_CAUSE: Final = (
    rf"(?:(?:{'|'.join(UNREACHABLE_TRANSPORT_ERRORS)}): "
    r"|TimeoutError: no complete reply within "
    r"|HTTPStatusError: HTTP 50[234];)"
)
# J-40: `GenRM judge <url> pair=(<i>, <j>) judge=<p> attempt=<a>/<n> deadline=<t>s: <cause>`.
_JUDGE_ERROR: Final = (
    r"GenRM judge \S+ pair=\(\d+, \d+\) judge=\d+ attempt=\d+/\d+ deadline=[0-9.]+s: " + _CAUSE
)
_ANY_JUDGE_ERROR: Final = re.compile(_JUDGE_ERROR)
_EVERY_ROLLOUT_MASKED: Final = re.compile(
    r"GenRM cohort '.*' failed: every rollout was masked \(\d+ of \d+ comparisons failed\);"
    r" first failure: " + _JUDGE_ERROR,
    re.DOTALL,
)
_NOTHING_FINISHED: Final = re.compile(
    r"GenRM cohort evaluation deadline exceeded after [0-9.]+s \(0 of \d+ comparisons finished"
)


def judge_unreachable(text: str | None) -> bool:
    """True when a failure text (a masked row's `failure_reason`, a group's failure) says the
    judge could not be reached: a J-40 judge error with an unreachable cause, or a group in
    which no comparison finished before the evaluation deadline."""
    if not text:
        return False
    return group_unreachable(text) or _ANY_JUDGE_ERROR.search(text) is not None


def group_unreachable(text: str | None) -> bool:
    """True when the text is a whole group's failure because the judge could not be reached:
    every rollout masked and the first failure unreachable, or no comparison finished before
    the evaluation deadline. A rollout masked on its own (`lost a comparison`) is not one."""
    if not text:
        return False
    return bool(_EVERY_ROLLOUT_MASKED.match(text) or _NOTHING_FINISHED.match(text))


def unreachable_refusal(masked: int, first_failure: str) -> str:
    """The 503 detail of an OpenRLHF request whose every sample was masked because the judge
    could not be reached (`openrlhf_fail_on_transport_mask`)."""
    return (
        f"GenRM judge unreachable: all {masked} sample(s) of this request were masked because"
        f" the judge could not be reached; first failure: {first_failure[:2000]}"
    )
