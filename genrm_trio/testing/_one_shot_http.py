"""One HTTP/1.1 POST on a fresh loopback connection, read until the server closes it.

This is how a trainer's workers post rollouts (a new connection per rollout), and it costs far
less than a general HTTP client, so a test can hold thousands of waiting requests at once.
A connection that ends before a whole reply raises `ConnectionError`.
"""

from __future__ import annotations

import json
from typing import Any

import trio


async def post_json(
    port: int, payload: bytes, *, path: str = "/verify", host: str = "127.0.0.1"
) -> tuple[int, Any]:
    """POST `payload` and return the reply's status and its decoded JSON body."""
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n"
    ).encode()
    try:
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(head + payload)
            chunks = []
            while data := await stream.receive_some(65536):
                chunks.append(data)
    except trio.BrokenResourceError as error:
        raise ConnectionError(f"connection to port {port} broken: {error}") from error
    reply_head, sep, reply_body = b"".join(chunks).partition(b"\r\n\r\n")
    if not sep:
        raise ConnectionError(f"port {port} closed the connection before a whole reply")
    status = int(reply_head.split(b" ", 2)[1])
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in reply_head.split(b"\r\n")[1:]
            if line.lower().startswith(b"content-length:")
        ),
        len(reply_body),
    )
    if len(reply_body) < length:
        raise ConnectionError(f"port {port} closed the connection before a whole reply")
    return status, json.loads(reply_body)
