"""The TRL reward function with a reward-server URL that does not answer: it raises after the
client's resends or its deadline, and never hands TRL a batch of Nones. Over real loopback
sockets: a closed port, and a port that accepts connections but never answers."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from genrm_trio.client import ResendPolicy, RewardsUnavailable, ServerNotReady
from genrm_trio.client.trl import GenRMRewardFunction

N = 2
FAST = ResendPolicy(max_resends=2, first_sleep_s=0.01, max_sleep_s=0.01)


@contextmanager
def silent_server() -> Iterator[str]:
    """A port whose kernel accepts connections for a server that never reads or answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_a_closed_port_raises_after_the_resends() -> None:
    reward = GenRMRewardFunction("http://127.0.0.1:9", N, policy=FAST, ready_wait_s=None)
    with pytest.raises(RewardsUnavailable) as raised:
        reward(prompts=["p"] * 2 * N, completions=["a", "b", "c", "d"])
    assert raised.value.masked == 2 * N
    assert raised.value.first_reason.startswith("no answer after 2 resends; last: ConnectError:")


def test_a_server_that_never_answers_raises_at_the_deadline() -> None:
    with silent_server() as url:
        reward = GenRMRewardFunction(url, N, deadline_s=0.5, ready_wait_s=None)
        with pytest.raises(RewardsUnavailable) as raised:
            reward(prompts=["p"] * N, completions=["a", "b"])
    assert raised.value.url == url
    assert raised.value.first_reason == "no results within the deadline of 0.5s"


def test_with_the_readiness_check_on_it_is_the_readiness_that_raises() -> None:
    with silent_server() as url:
        reward = GenRMRewardFunction(url, N, ready_wait_s=0.5)
        with pytest.raises(ServerNotReady) as raised:
            reward(prompts=["p"] * N, completions=["a", "b"])
    assert raised.value.url == url
    assert raised.value.reasons[0].startswith("no answer: ReadTimeout")


def test_on_unreachable_takes_raise_or_warn() -> None:
    with pytest.raises(ValueError, match="on_unreachable 'ignore': expected 'raise' or 'warn'"):
        GenRMRewardFunction("http://127.0.0.1:9", N, on_unreachable="ignore")  # type: ignore[arg-type]
