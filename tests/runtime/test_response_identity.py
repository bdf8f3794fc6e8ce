"""Member identity through /verify (C-20, C-21, C-24, C-34): the same response in another spelling
is the same member, a different one is a 409, whether the member is still waiting, has left, or
belongs to a finished group; exact retries never pay for a canonical fingerprint."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from genrm_trio.testing import FakeJudge
from genrm_trio.testing.harness import Server, running_server

CONFLICT = "already has a different response for rollout_index=0"


def response_text(log_probs: str, *, spaced: bool = True, keys_reversed: bool = False) -> str:
    """Slot 0's response, spelled as asked; ``log_probs`` is inserted as written."""
    output = (
        '[{"type": "message", "role": "assistant", '
        '"content": [{"type": "output_text", "text": "answer-0 [[q=3]]"}]}]'
    )
    members = ['"id": "r-0"', f'"output": {output}', f'"generation_log_probs": {log_probs}']
    if keys_reversed:
        members.reverse()
    text = "{" + ", ".join(members) + "}"
    if not spaced:
        text = text.replace(", ", ",").replace(": ", ":")
    return text


def body(slot: int, response: str, *, group: str | None = "g") -> bytes:
    coordinates = (
        f'"_ng_group_id": "{group}", "_ng_group_attempt": 0, '
        if group is not None
        else '"_ng_task_index": 7, '
    )
    return (
        '{"responses_create_params": {"input": "2+2?"}, "response": '
        + response
        + ", "
        + coordinates
        + f'"_ng_rollout_index": {slot}}}'
    ).encode()


def other_member(group: str | None = "g") -> bytes:
    return body(
        1,
        response_text("[-1.5]").replace("answer-0", "answer-1").replace("r-0", "r-1"),
        group=group,
    )


# Each pair: slot 0's response as first sent, and as sent again.
SAME = {
    "key order": (response_text("[-0.5]"), response_text("[-0.5]", keys_reversed=True)),
    "whitespace": (response_text("[-0.5]"), response_text("[-0.5]", spaced=False)),
    "one double, two spellings": (
        response_text("[0.1, 1e2]"),
        response_text("[0.10000000000000001, 100.0]"),
    ),
    "NaN and the infinities, respaced": (
        response_text("[NaN, Infinity, -Infinity]"),
        response_text("[NaN,Infinity,-Infinity]"),
    ),
    "an escaped and a raw code point": (
        response_text('["\\u00e9"]'),
        response_text('["\u00e9"]'),
    ),
}
DIFFERENT = {
    "0.1 and the next double": (response_text("[0.1]"), response_text("[0.10000000000000002]")),
    "1 and 1.0": (response_text("[1]"), response_text("[1.0]")),
    "0.0 and -0.0": (response_text("[0.0]"), response_text("[-0.0]")),
    "NaN and null": (response_text("[NaN]"), response_text("[null]")),
    "NaN and Infinity": (response_text("[NaN]"), response_text("[Infinity]")),
    "Infinity and -Infinity": (response_text("[Infinity]"), response_text("[-Infinity]")),
    "-Infinity and -0.5": (response_text("[-Infinity]"), response_text("[-0.5]")),
    "null and -0.5": (response_text("[null]"), response_text("[-0.5]")),
}
CASES = [(name, *pair, True) for name, pair in SAME.items()] + [
    (name, *pair, False) for name, pair in DIFFERENT.items()
]


@pytest.mark.parametrize(("case", "first", "again", "same"), CASES, ids=[c[0] for c in CASES])
async def test_a_finished_group_tells_spellings_from_different_responses(
    case: str, first: str, again: str, same: bool
) -> None:
    async with running_server() as server:
        replies = await server.verify_all([body(0, first), other_member()])
        assert [r.status for r in replies] == [200, 200]
        calls = server.calls()
        replay = await server.verify(body(0, again))
        if same:
            assert (replay.status, replay.reward) == (200, replies[0].reward)
            # The row echoes this request's own bytes.
            assert again.encode() in replay.raw
        else:
            assert replay.status == 409 and CONFLICT in replay.detail
        assert server.calls() == calls


@pytest.mark.parametrize(("case", "first", "again", "same"), CASES, ids=[c[0] for c in CASES])
async def test_a_waiting_member_tells_spellings_from_different_responses(
    case: str, first: str, again: str, same: bool
) -> None:
    async with running_server() as server, trio.open_nursery() as nursery:
        original = server.start_verify(nursery, body(0, first))
        await server.settle()
        if same:
            duplicate = server.start_verify(nursery, body(0, again))
            await server.settle()
            assert server.engine.statistics().waiters == 2
        else:
            rejected = await server.verify(body(0, again))
            assert rejected.status == 409 and CONFLICT in rejected.detail
        await server.verify(other_member())
        assert (await original.result()).status == 200
        if same:
            assert (await duplicate.result()).reward == (await original.result()).reward
        assert server.calls() == 2


@pytest.mark.parametrize(("case", "first", "again", "same"), CASES, ids=[c[0] for c in CASES])
async def test_a_member_whose_request_left_tells_spellings_from_different_responses(
    case: str, first: str, again: str, same: bool
) -> None:
    async with running_server() as server:
        async with trio.open_nursery() as nursery:
            original = server.start_verify(nursery, body(0, first))
            await server.settle()
            original.disconnect()
        assert server.engine.statistics().waiters == 0
        async with trio.open_nursery() as nursery:
            again_reply = server.start_verify(nursery, body(0, again))
            await server.settle()
            await server.verify(other_member())
        reply = await again_reply.result()
        if same:
            assert reply.status == 200
        else:
            assert reply.status == 409 and CONFLICT in reply.detail


# A shared store writes each member's canonical fingerprint with its record, for the other
# processes to compare with: it computes one per accepted member, whatever happens later.
KEPT_WITH_THE_RECORD = "the memory store computes a canonical fingerprint only when it must"


async def work(server: Server) -> tuple[int, int, int]:
    counters = server.engine.counters
    return counters.fingerprints, counters.response_digests, counters.canonical_fingerprints


@pytest.mark.stores("memory", why=KEPT_WITH_THE_RECORD)
async def test_exact_retries_are_known_by_their_bytes_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(judge=FakeJudge(latency="fixed:0.1")) as server:
        first = body(0, response_text("[-0.5, 0.25]"))
        async with trio.open_nursery() as nursery:
            original = server.start_verify(nursery, first)
            await server.settle()
            retries = [server.start_verify(nursery, first) for _ in range(3)]
            await server.settle()
            # Four requests, one digest each, and no canonical fingerprint while collecting.
            assert await work(server) == (4, 4, 0)
            await server.verify(other_member())
        rewards = {(await p.result()).reward for p in [original, *retries]}
        assert len(rewards) == 1
        # The finished group keeps both members' digests (slot 1's is new) and canonical
        # fingerprints for later replays.
        assert await work(server) == (5, 5, 2)
        replay = await server.verify(first)
        assert replay.status == 200
        assert await work(server) == (6, 6, 2)


@pytest.mark.stores("memory", why=KEPT_WITH_THE_RECORD)
async def test_groups_that_keep_no_result_compute_no_canonical_fingerprint(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server() as server:
        # A legacy group is removed once it completes (C-91); nothing replays against it.
        legacy = await server.verify_all(
            [body(0, response_text("[-0.5]"), group=None), other_member(group=None)]
        )
        assert [r.status for r in legacy] == [200, 200]
        # A failed group answers every later request with its failure (C-87).
        async with running_server(cohort_collection_timeout_s=0.05) as short:
            expired = await short.verify(body(0, response_text("[-0.5]")))
            assert expired.status == 503
            again = await short.verify(body(0, response_text("[-0.75]")))
            assert again.status == 503
            assert short.engine.counters.canonical_fingerprints == 0
        assert server.engine.counters.canonical_fingerprints == 0
