"""Long rollouts sent to `genrm-trio serve` as a real process, under the process settings `serve`
makes for itself (glibc's mmap threshold fixed at 128 KiB among them), and beyond the memory
budget for waiting bodies, where `serve` stops reading a body's connection until it has room."""

from __future__ import annotations

import json
import socket
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


def head(length: int) -> bytes:
    return (
        b"POST /verify HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % length
    )


def fill(sock: socket.socket, data: memoryview) -> int:
    """Send from ``data`` until the kernel takes no more; the bytes sent."""
    sent = 0
    while sent < len(data):
        try:
            sent += sock.send(data[sent : sent + (1 << 20)])
        except BlockingIOError:
            break
    return sent


async def kernel_buffers() -> int:
    """What the kernel holds of a loopback connection whose peer reads nothing, filled the way
    the test fills its request's."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
        with client, peer:
            client.setblocking(False)
            data = memoryview(bytes(64 << 20))
            sent = fill(client, data)
            await trio.sleep(0.5)
            return sent + fill(client, data[sent:])


async def test_a_long_rollout_beyond_the_memory_budget_waits_unread_while_the_slots_are_busy(
    cli: Any, tmp_path: Path
) -> None:
    judge, judge_url = cli.start_fake_judge()
    sets = [
        f"judge_base_url={judge_url}",
        "judge_model=genrm",
        "num_rollouts_per_prompt=2",
        "waiting_body_memory_bytes=0",
        f"spool_dir={tmp_path / 'spool'}",
    ]
    process, url, _ = cli.start_serve(*[arg for s in sets for arg in ("--set", s)])
    port = int(url.rsplit(":", 1)[1])
    client = cli.http_client(url)

    def receiving() -> int:
        return int(cli.json_of(client.get("/healthz"))["body_bytes_receiving"])

    # Both spool slots busy: two bodies beyond the budget, each read within its slot, whose
    # clients stop sending halfway.
    holders = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    for holder in holders:
        holder.sendall(head(2_000_000) + b"x" * 100_000)
    cli.wait_until(lambda: receiving() == 200_000)
    # A third waits for a slot with its connection's reads stopped: its client can send no more
    # than the kernel holds. Read instead, hypercorn's queue would take another 10 MiB or so.
    waiting = socket.create_connection(("127.0.0.1", port))
    waiting.setblocking(False)
    start = head(48_000_000)
    request = memoryview(bytearray(len(start) + 48_000_000))
    request[: len(start)] = start
    sent = fill(waiting, request)
    await trio.sleep(0.5)
    sent += fill(waiting, request[sent:])
    assert sent <= await kernel_buffers() + (1 << 20)
    assert receiving() == 200_000
    for sock in (*holders, waiting):
        sock.close()
    client.close()
    judge.kill()
    process.kill()
