"""Long rollouts sent to `genrm-trio serve` as a real process, under the process settings `serve`
makes for itself (glibc's mmap threshold fixed at 128 KiB among them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from genrm_trio.testing._one_shot_http import post_json

SAFETY_S = 60.0
TOKENS = 300_000  # about 2 MB of body, as a 64k-token rollout with its log-probs


def body(group: str, slot: int) -> bytes:
    value = {
        "responses_create_params": {"input": "2+2?"},
        "response": {
            "id": f"r-{slot}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"[[q={1 + slot}]] {slot}"}],
                }
            ],
            "generation_token_ids": list(range(slot, TOKENS + slot)),
        },
        "_ng_group_id": group,
        "_ng_group_attempt": 0,
        "_ng_rollout_index": slot,
    }
    return json.dumps(value).encode()


def resident_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_bytes()
    return int(status.split(b"VmRSS:", 1)[1].split()[0]) * 1024


async def post_in_pieces(port: int, payload: bytes, pid: int) -> tuple[int, Any, int]:
    """POST ``payload`` 1,000 bytes at a time; (status, decoded body, the most the server's
    resident memory grew by while it came)."""
    head = (
        b"POST /verify HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(payload)
    )
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(head)
        before = resident_bytes(pid)
        grown = 0
        for start in range(0, len(payload), 1000):
            # Measured before each piece: the body is not whole yet, so not yet joined or parsed.
            grown = max(grown, resident_bytes(pid) - before)
            await stream.send_all(payload[start : start + 1000])
            await trio.sleep(0.001)  # so that the server reads each piece on its own
        chunks = []
        while data := await stream.receive_some(1 << 20):
            chunks.append(data)
    reply_head, _, reply_body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(reply_head.split(b" ", 2)[1]), json.loads(reply_body), grown


async def test_a_long_rollout_sent_in_small_pieces_gets_its_row_and_costs_about_its_size(
    cli: Any,
) -> None:
    judge, judge_url = cli.start_fake_judge()
    sets = [f"judge_base_url={judge_url}", "judge_model=genrm", "num_rollouts_per_prompt=2"]
    process, url, _ = cli.start_serve(*[arg for s in sets for arg in ("--set", s)])
    port = int(url.rsplit(":", 1)[1])
    rows: dict[str, list[Any]] = {}

    async def at_once(group: str, slot: int) -> None:
        status, row = await post_json(port, body(group, slot))
        assert status == 200, row
        rows[group][slot] = row

    async def in_pieces(group: str) -> None:
        status, row, grown = await post_in_pieces(port, body(group, 0), process.pid)
        assert status == 200, row
        rows[group][0] = row
        # What came so far is held, with what each piece costs besides its bytes (1.5-1.8
        # times the bytes here), not in a page per piece of 1,000 bytes (over 4 times), which
        # is what a read buffer over the mmap threshold becomes once shrunk to what it got.
        assert grown < 3 * len(body(group, 0))

    with trio.fail_after(SAFETY_S):
        for group in ("sent at once", "sent slowly"):
            rows[group] = [None, None]
            async with trio.open_nursery() as nursery:
                if group == "sent slowly":
                    nursery.start_soon(in_pieces, group)
                else:
                    nursery.start_soon(at_once, group, 0)
                nursery.start_soon(at_once, group, 1)

    for slot in range(2):
        slowly, quickly = rows["sent slowly"][slot], rows["sent at once"][slot]
        assert slowly.pop("_ng_group_id") == "sent slowly"
        assert quickly.pop("_ng_group_id") == "sent at once"
        assert slowly == quickly
        assert slowly["mask_sample"] is False
        assert slowly["response"]["generation_token_ids"][-1] == TOKENS + slot - 1
    judge.kill()
    process.kill()
