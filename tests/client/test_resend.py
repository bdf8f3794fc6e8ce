"""What the client makes of each answer to a group request (client._resend), without I/O."""

from __future__ import annotations

import json
import random

import pytest

from genrm_trio.client._resend import Failed, Refused, Resend, ResendPolicy, Rows, decide
from genrm_trio.client._results import RolloutResult


def detail(text: str) -> bytes:
    return json.dumps({"detail": text}).encode()


def rows(*entries: tuple[float | None, bool]) -> bytes:
    return json.dumps(
        {
            "_ng_group_id": "g",
            "_ng_group_attempt": 0,
            "rows": [
                {
                    "_ng_rollout_index": slot,
                    "reward": reward,
                    "mask_sample": masked,
                    "failure_kind": "judge_failed" if masked else None,
                    "failure_reason": "judge down" if masked else None,
                }
                for slot, (reward, masked) in enumerate(entries)
            ],
        }
    ).encode()


def test_rows_become_results_and_a_masked_row_never_keeps_a_number() -> None:
    decision = decide(200, rows((3.5, False), (0.0, True)), None, 2)
    assert decision == Rows(
        [
            RolloutResult(reward=3.5, mask_sample=False),
            RolloutResult(
                reward=None,
                mask_sample=True,
                failure_kind="judge_failed",
                failure_reason="judge down",
            ),
        ]
    )


def test_rows_for_other_slots_fail_the_group() -> None:
    decision = decide(200, rows((3.0, False)), None, 2)
    assert isinstance(decision, Failed)
    assert "not 0..1" in decision.reason


@pytest.mark.parametrize(
    "text",
    [
        "GenRM server is shutting down",
        "GenRM group store redis://h:6379/0 is unavailable: ConnectionError: refused",
        "GenRM group store redis://h:6379/0: group 'g' changed under 32 transactions in a row; "
        "nothing was written, resend the request",
        "server at its connection limit: 10 client connections are open (open-file limit 64); "
        "retry later, or raise the open-file limit of genrm-trio serve",
        "GenRM cannot hold this request body while it waits: disk full",
    ],
)
def test_genrm_trios_resendable_503s_are_sent_again(text: str) -> None:
    assert decide(503, detail(text), "1", 2) == Resend(
        f"POST /verify_group answered 503: {text}", 1.0
    )


@pytest.mark.parametrize(
    ("status", "body"),
    [(502, b"<html>bad gateway</html>"), (504, b""), (503, b"<html>no upstream</html>")],
)
def test_a_gateway_in_front_is_answered_by_sending_again(status: int, body: bytes) -> None:
    assert isinstance(decide(status, body, None, 2), Resend)


@pytest.mark.parametrize(
    ("status", "text"),
    [
        (503, "GenRM cohort 'group_id::g::group_attempt::0' did not collect 2 unique rollout "
        "indices within 5.0s"),
        (409, "GenRM group 'g' attempt 0 was superseded by attempt 1"),
        (500, "Internal Server Error: boom"),
    ],
)  # fmt: skip
def test_a_group_failure_or_conflict_is_final(status: int, text: str) -> None:
    assert decide(status, detail(text), None, 2) == Failed(
        f"POST /verify_group answered {status}: {text}"
    )


def test_a_malformed_request_is_refused() -> None:
    assert decide(422, detail("responses: expected ..."), None, 2) == Refused(
        422, "responses: expected ..."
    )


def test_retry_after_as_an_http_date() -> None:
    decision = decide(503, b"", "Wed, 21 Oct 2015 07:28:10 GMT", 2, now=1445412480.0)
    assert decision == Resend("POST /verify_group answered 503: ", 10.0)


def test_backoff_is_full_jitter_under_a_doubling_cap_and_honours_retry_after() -> None:
    policy = ResendPolicy(max_resends=5, first_sleep_s=0.5, max_sleep_s=3.0)
    rng = random.Random(7)
    for resend, cap in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0), (9, 3.0)):
        draws = [policy.sleep_s(resend, rng, None) for _ in range(200)]
        assert 0.0 <= min(draws) and max(draws) <= cap
        assert max(draws) > cap * 0.8
    assert policy.sleep_s(1, rng, 5.0) == 5.0
    with pytest.raises(ValueError, match="max_resends"):
        ResendPolicy(max_resends=-1)
