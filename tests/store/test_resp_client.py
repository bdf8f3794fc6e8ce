"""The store's Redis client against a real server: its pool after the server went away."""

from __future__ import annotations

import trio

from genrm_trio.store.resp import Client, StoreAddress
from genrm_trio.testing.redis_server import RedisServer


async def test_a_restarted_server_is_reached_again_on_the_first_command(
    redis_server: RedisServer,
) -> None:
    client = Client(StoreAddress.parse(redis_server.url))
    try:
        # Several idle connections in the pool, as a busy process has.
        async with trio.open_nursery() as nursery:
            for index in range(4):
                nursery.start_soon(client.call, "SET", f"k{index}", "v")
        redis_server.restart()
        assert await client.call("GET", "k0") == b"v"
        assert await client.call("PING") in (b"PONG", "PONG")
    finally:
        await client.aclose()
