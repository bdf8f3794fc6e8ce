"""Retention of finished work: the terminal index and the idle order, pruned from the head only.

Both indexes are insertion-ordered by a time that never decreases, so the oldest entry is always
at the head and pruning costs the entries it removes plus one look (R-3, R-4).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class AgedIndex(Generic[K, V]):
    """Entries ordered by the time they were (re)stamped; the head is the oldest."""

    __slots__ = ("_entries", "evicted", "expired")

    def __init__(self) -> None:
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        # Entries pruned since creation: past the TTL, and over the count cap.
        self.expired = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def stamp(self, key: K, value: V, now: float) -> None:
        """Add the entry, or move it to the tail with a fresh time."""
        self._entries[key] = (now, value)
        self._entries.move_to_end(key)

    def stamped(self, key: K) -> float | None:
        """When the entry was last stamped, or None if it is not there."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def get(self, key: K) -> V | None:
        """The entry's value, or None if it is not there."""
        entry = self._entries.get(key)
        return None if entry is None else entry[1]

    def items(self) -> list[tuple[K, float, V]]:
        """(key, stamp, value) from the head."""
        return [(key, stamped, value) for key, (stamped, value) in self._entries.items()]

    def discard(self, key: K) -> None:
        self._entries.pop(key, None)

    def keys(self) -> list[K]:
        return list(self._entries)

    def values(self) -> list[V]:
        return [value for _, value in self._entries.values()]

    def clear(self) -> None:
        self._entries.clear()

    def prune(
        self, now: float, ttl: float | None, cap: int, on_remove: Callable[[K, V], None]
    ) -> int:
        """Remove expired or excess entries from the head; return how many were looked at."""
        visits = 0
        entries = self._entries
        while entries:
            visits += 1
            key, (stamped, value) = next(iter(entries.items()))
            expired = ttl is not None and now - stamped >= ttl
            if not expired and len(entries) <= cap:
                break
            del entries[key]
            if expired:
                self.expired += 1
            else:
                self.evicted += 1
            on_remove(key, value)
        return visits
