"""Where groups live: the store interface the engine runs every transition through, the memory
store, and a Redis/Valkey store shared by several server processes (with the watcher that
follows them).

The face is the modules named in ``__all__``: ``group_store`` (the interface), the two stores,
``configured`` (the store a configuration names), ``resp`` (the client's addresses and
errors) and ``embedded`` (the server ``serve --workers`` starts); the modules whose names begin
with ``_`` are the Redis store's own.
"""

__all__ = ["configured", "embedded", "group_store", "memory_store", "redis_store", "resp"]
