"""The judge client's own HTTP/1.1 framing over real TCP: chunked, gzip, 1xx, close-delimited.

A scripted server answers each judge request with exact bytes, so every framing a real judge
(vLLM behind a proxy, say) may use is read the way the spec's reply rules expect.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable

import trio

from genrm_trio.config import Config
from genrm_trio.core.verdicts import Verdict
from genrm_trio.judge.client import JudgeClient, JudgeFailure, JudgeTask, JudgeVerdict

VERDICT = Verdict(4, 2, 1)
CHAT_REPLY = json.dumps(
    {
        "choices": [
            {
                "message": {"content": '```json\n{"score_1": 4, "score_2": 2, "ranking": 1}\n```'},
                "finish_reason": "stop",
            }
        ]
    }
).encode()
TASK = JudgeTask(
    history=[{"role": "user", "content": "2+2?"}],
    principle=None,
    text_1="four",
    text_2="five",
    pair=(0, 1),
    judge_pass=0,
)


def chunked(body: bytes, size: int = 7) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return framed + b"0\r\n\r\n"


async def scripted_judge(
    replies: list[Callable[[], bytes]], *, close_after: bool, task_status: trio.TaskStatus[int]
) -> None:
    """Answer the n-th request on any connection with replies[n]; count requests seen."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    served = [0]

    async def handle(stream: trio.SocketStream) -> None:
        buffer = b""
        async with stream:
            while served[0] < len(replies):
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(buffer) < length:
                    buffer += await stream.receive_some(65536)
                buffer = buffer[length:]
                reply = replies[served[0]]()
                served[0] += 1
                await stream.send_all(reply)
                if close_after:
                    return

    task_status.started(port)
    await trio.serve_listeners(handle, listeners)


async def judge_once(
    nursery: trio.Nursery, replies: list[Callable[[], bytes]], *, close_after: bool = False
) -> JudgeVerdict | JudgeFailure:
    port = await nursery.start(
        lambda task_status: scripted_judge(
            replies, close_after=close_after, task_status=task_status
        )
    )
    config = Config(
        judge_base_url=f"http://127.0.0.1:{port}/v1",
        judge_model="m",
        genrm_parse_retries=len(replies) - 1,
        genrm_parse_retry_sleep_s=0.0,
        judge_request_timeout_s=5.0,
    )
    client = JudgeClient(config)
    try:
        return await client.judge(TASK)
    finally:
        await client.aclose()
        nursery.cancel_scope.cancel()


def head(*lines: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + b"".join(line + b"\r\n" for line in lines)
        + b"\r\n"
    )


async def test_chunked_reply_is_read_whole() -> None:
    async with trio.open_nursery() as nursery:
        result = await judge_once(
            nursery, [lambda: head(b"transfer-encoding: chunked") + chunked(CHAT_REPLY)]
        )
    assert isinstance(result, JudgeVerdict) and result.verdict == VERDICT


async def test_gzip_reply_is_decoded() -> None:
    body = gzip.compress(CHAT_REPLY)
    async with trio.open_nursery() as nursery:
        result = await judge_once(
            nursery,
            [lambda: head(b"content-encoding: gzip", b"content-length: %d" % len(body)) + body],
        )
    assert isinstance(result, JudgeVerdict) and result.verdict == VERDICT


async def test_informational_reply_before_the_real_one_is_skipped() -> None:
    reply = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        + head(b"content-length: %d" % len(CHAT_REPLY))
        + CHAT_REPLY
    )
    async with trio.open_nursery() as nursery:
        result = await judge_once(nursery, [lambda: reply])
    assert isinstance(result, JudgeVerdict) and result.verdict == VERDICT


async def test_reply_delimited_by_close_is_read_to_the_end() -> None:
    async with trio.open_nursery() as nursery:
        result = await judge_once(
            nursery, [lambda: head(b"connection: close") + CHAT_REPLY], close_after=True
        )
    assert isinstance(result, JudgeVerdict) and result.verdict == VERDICT


async def test_chunked_reply_cut_short_is_a_transient_failure_then_retried() -> None:
    cut = head(b"transfer-encoding: chunked") + chunked(CHAT_REPLY)[:40]
    whole = head(b"content-length: %d" % len(CHAT_REPLY)) + CHAT_REPLY
    async with trio.open_nursery() as nursery:
        result = await judge_once(nursery, [lambda: cut, lambda: whole], close_after=True)
    assert isinstance(result, JudgeVerdict) and result.attempts == 2


async def test_chunked_reply_cut_short_every_time_names_the_transport_error() -> None:
    cut = head(b"transfer-encoding: chunked") + chunked(CHAT_REPLY)[:40]
    async with trio.open_nursery() as nursery:
        result = await judge_once(nursery, [lambda: cut, lambda: cut], close_after=True)
    assert isinstance(result, JudgeFailure)
    assert "attempt=2/2" in result.text and "RemoteProtocolError: the judge closed" in result.text
