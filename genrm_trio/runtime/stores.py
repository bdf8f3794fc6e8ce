"""Which group store a server instance runs its engine on: its own memory, or a shared one."""

from __future__ import annotations

from genrm_trio.config import Config
from genrm_trio.judge.transport import TransportFactory
from genrm_trio.runtime.engine import Engine
from genrm_trio.runtime.hooks import Hooks


def build_engine(
    config: Config, *, judge_transport: TransportFactory | None = None, hooks: Hooks | None = None
) -> Engine:
    """The engine on the memory store for ``group_store: memory``, else on Redis/Valkey."""
    if config.group_store == "memory":
        return Engine(config, judge_transport=judge_transport, hooks=hooks)
    from genrm_trio.store.redis_store import RedisGroupStore
    from genrm_trio.store.resp import StoreAddress

    store = RedisGroupStore(
        config,
        StoreAddress.parse(config.group_store),
        config.group_store_key_prefix,
        config.group_store_lease_s,
    )
    return Engine(
        config,
        store,
        judge_transport=judge_transport,
        hooks=hooks,
        poll_s=config.group_store_poll_s,
    )
