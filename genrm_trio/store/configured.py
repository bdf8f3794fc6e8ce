"""The group store a configuration names: this process's memory, or a shared Redis/Valkey."""

from __future__ import annotations

from genrm_trio.config import Config
from genrm_trio.store.group_store import GroupStore
from genrm_trio.store.memory_store import MemoryGroupStore

__all__ = ["configured_store"]


def configured_store(config: Config) -> GroupStore:
    """The memory store for ``group_store: memory``, else the Redis/Valkey store it names."""
    if config.group_store == "memory":
        return MemoryGroupStore(config)
    # Imported only for a shared store: a server on the memory store loads no Redis client.
    from genrm_trio.store.redis_store import RedisGroupStore
    from genrm_trio.store.resp import StoreAddress

    return RedisGroupStore(
        config,
        StoreAddress.parse(config.group_store),
        config.group_store_key_prefix,
        config.group_store_lease_s,
        poll_s=config.group_store_poll_s,
    )
