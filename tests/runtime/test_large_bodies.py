"""Rollouts with NeMo Gym's token arrays, large enough to take the scanned split: the echo is
byte-exact, the same response in another spelling is the same member, and any change of training
data is a conflict (W-21, C-21, C-24, C-43)."""

from __future__ import annotations

import json
import random
import re
import struct
from typing import Any

from genrm_trio.testing.harness import member, running_server
from genrm_trio.wire._json_scan import SCAN_MIN_BYTES

TOKENS = 4_096


def rollout(slot: int, q: float) -> dict[str, Any]:
    rng = random.Random(slot)
    body = member(slot, q)
    message = body["response"]["output"][0]
    message["prompt_token_ids"] = [rng.randrange(151_936) for _ in range(TOKENS // 4)]
    message["generation_token_ids"] = [rng.randrange(151_936) for _ in range(TOKENS)]
    # float32 log-probs widened to Python floats, as vLLM reports them
    message["generation_log_probs"] = [
        struct.unpack("<f", struct.pack("<f", -rng.expovariate(1.5)))[0] for _ in range(TOKENS)
    ]
    body["response"]["usage"] = {"input_tokens": TOKENS // 4, "output_tokens": TOKENS}
    return body


def spelled(body: dict[str, Any], style: str) -> bytes:
    if style == "python":
        return json.dumps(body).encode()
    if style == "compact":
        return json.dumps(body, separators=(",", ":")).encode()
    # sorted keys, indented, and every non-ASCII character escaped
    return json.dumps(body, sort_keys=True, indent=2, ensure_ascii=True).encode()


def response_text(raw: bytes) -> bytes:
    start = raw.index(b'"response"')
    return raw[raw.index(b"{", start) : raw.index(b', "_ng_group_id"', start)]


async def test_large_rollouts_are_echoed_byte_for_byte_and_respellings_are_replays() -> None:
    async with running_server() as server:
        bodies = [spelled(rollout(0, 4), "python"), spelled(rollout(1, 2), "compact")]
        assert all(len(body) >= SCAN_MIN_BYTES for body in bodies)
        replies = await server.verify_all(bodies)
        assert [(r.status, r.reward) for r in replies] == [(200, 4.0), (200, 2.0)]
        assert response_text(bodies[0]) in replies[0].raw
        compact = bodies[1][bodies[1].index(b'"response":') + 11 :]
        assert compact[: compact.index(b',"_ng_group_id"')] in replies[1].raw
        calls = server.calls()

        for style in ("compact", "sorted"):
            replay = await server.verify(spelled(rollout(0, 4), style))
            assert (replay.status, replay.reward) == (200, 4.0)
        assert server.calls() == calls


async def test_one_changed_token_or_log_prob_in_a_large_rollout_is_a_conflict() -> None:
    async with running_server() as server:
        replies = await server.verify_all([rollout(0, 4), rollout(1, 2)])
        assert [r.status for r in replies] == [200, 200]
        for field, index, value in (
            ("generation_token_ids", 4_000, 7),
            ("generation_log_probs", 17, -0.25),
            ("prompt_token_ids", 0, 151_935),
        ):
            changed = rollout(0, 4)
            changed["response"]["output"][0][field][index] = value
            conflict = await server.verify(changed)
            assert conflict.status == 409
            assert "already has a different response for rollout_index=0" in conflict.detail


async def test_non_standard_literals_in_a_large_rollout_keep_their_identity() -> None:
    # -Infinity, -1e400 and NaN as Python clients write them (W-8, C-21).
    async with running_server() as server:
        body = rollout(0, 4)
        body["response"]["output"][0]["generation_log_probs"][:2] = [float("-inf"), float("nan")]
        text = spelled(body, "python")
        assert b"[-Infinity, NaN," in text
        replies = await server.verify_all([text, rollout(1, 2)])
        assert [(r.status, r.reward) for r in replies] == [(200, 4.0), (200, 2.0)]
        assert b"[-Infinity, NaN," in replies[0].raw
        other_spelling = re.sub(rb"\[-Infinity, NaN,", b"[-1e400,NaN,", text)
        assert (await server.verify(other_spelling)).reward == 4.0
        changed = text.replace(b"[-Infinity, NaN,", b"[-Infinity, null,")
        assert (await server.verify(changed)).status == 409
