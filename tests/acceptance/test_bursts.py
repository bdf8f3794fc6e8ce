"""A trainer's burst of fresh connections against `genrm-trio serve` as a real process.

Each rollout is posted on its own new connection, all at once, as NeMo Gym's agent does at the
end of a generation wave; and a server whose open-file limit is too low for the burst answers the
excess with a clear 503, says so in its log, and recovers.
"""

from __future__ import annotations

import json
import resource
import signal
from typing import Any

import trio

from genrm_trio.testing._one_shot_http import post_json

GROUP_SIZE = 16
SAFETY_S = 60.0
LIMIT_DETAIL = "server at its connection limit"


def body(group: str, slot: int) -> bytes:
    """A /verify body whose answer quality is 1 + slot % 5 for the fake judge."""
    value = {
        "responses_create_params": {"input": "2+2?"},
        "response": {
            "id": f"r-{group}-{slot}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"[[q={1 + slot % 5}]] {slot}"}],
                }
            ],
        },
        "_ng_group_id": group,
        "_ng_group_attempt": 0,
        "_ng_rollout_index": slot,
    }
    return json.dumps(value).encode()


def expected_reward(slot: int) -> float:
    """Circular pairing with the fake judge's verdicts: a rollout scores its own quality in both
    of its comparisons (ties between neighbours of equal quality move neither), so its reward is
    its quality."""
    return float(1 + slot % 5)


async def post_all(
    port: int, payloads: list[tuple[str, int, bytes]]
) -> dict[tuple[str, int], tuple[int, dict[str, Any]]]:
    """Every payload at once, each on its own connection."""
    replies: dict[tuple[str, int], tuple[int, dict[str, Any]]] = {}

    async def one(group: str, slot: int, payload: bytes) -> None:
        replies[group, slot] = await post_json(port, payload)

    with trio.fail_after(SAFETY_S):
        async with trio.open_nursery() as nursery:
            for group, slot, payload in payloads:
                nursery.start_soon(one, group, slot, payload)
    return replies


def serve_sets(judge_url: str, *extra: str) -> list[str]:
    sets = [f"judge_base_url={judge_url}", "judge_model=genrm", *extra]
    return [arg for setting in sets for arg in ("--set", setting)]


def stop(process: Any) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(SAFETY_S) == 0


async def test_2048_fresh_connections_at_once_all_get_their_rows(
    cli: Any, many_files: None
) -> None:
    judge, judge_url = cli.start_fake_judge()
    process, url, _ = cli.start_serve(*serve_sets(judge_url, "judge_max_concurrency=64"))
    port = int(url.rsplit(":", 1)[1])
    payloads = [(f"g{g}", slot, body(f"g{g}", slot)) for g in range(128) for slot in range(16)]

    replies = await post_all(port, payloads)

    assert len(replies) == 2048
    for (group, slot), (status, row) in replies.items():
        assert status == 200, row
        assert row.get("mask_sample") is not True, row
        assert row["_ng_group_id"] == group
        assert row["_ng_rollout_index"] == slot
        assert row["reward"] == expected_reward(slot)
    stop(process)
    stop(judge)


def low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


async def test_a_low_open_file_limit_answers_the_excess_with_503_and_recovers(
    cli: Any, many_files: None
) -> None:
    judge, judge_url = cli.start_fake_judge()
    collection_s = 3.0
    process, url, _ = cli.start_serve(
        *serve_sets(
            judge_url, "judge_max_concurrency=16", f"cohort_collection_timeout_s={collection_s}"
        ),
        preexec_fn=low_file_limit,
    )
    port = int(url.rsplit(":", 1)[1])
    # 512 groups of which only the first rollout ever comes: every request waits for its group
    # until the collection deadline, far more waiting requests than 256 descriptors can hold.
    waiting = [(f"w{g}", 0, body(f"w{g}", 0)) for g in range(512)]

    replies = await post_all(port, waiting)

    assert len(replies) == 512
    over_limit = [row for status, row in replies.values() if LIMIT_DETAIL in row["detail"]]
    held = [(status, row) for status, row in replies.values() if LIMIT_DETAIL not in row["detail"]]
    # 256 descriptors less those kept for 16 judge connections and the process.
    assert len(held) == 144
    assert len(over_limit) == 512 - 144
    assert all(status == 503 for status, _ in replies.values())
    assert all("open-file limit 256" in row["detail"] for row in over_limit)
    # The requests the server did hold were answered by their group's own deadline.
    for _, row in held:
        assert row["detail"].endswith(
            f"did not collect 16 unique rollout indices within {collection_s}s"
        )

    # Every waiting request has been answered: a whole group now goes through.
    group = [("after", slot, body("after", slot)) for slot in range(GROUP_SIZE)]
    after = await post_all(port, group)
    for (_, slot), (status, row) in after.items():
        assert status == 200, row
        assert row["reward"] == expected_reward(slot)

    stop(process)
    stop(judge)
    log = process.stderr()
    assert "open-file limit 256 (hard limit 256): up to 144 client connections" in log
    assert "connection limit reached: 144 client connections are open" in log
    assert f"accepting client connections again after answering {len(over_limit)} with 503" in log
