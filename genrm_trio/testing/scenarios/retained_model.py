"""The race harness's model of retention (R-1…R-4): the terminal index, the idle order and the
watermarks, their pruning from the head, and what a store that trims after every write holds."""

from __future__ import annotations

from collections import Counter, OrderedDict

from genrm_trio.config import Config
from genrm_trio.testing.scenarios.model_records import ModelRecord

__all__ = ["RetainedModel"]


class RetainedModel:
    """The retention indexes as §5.12 keeps them, pruned at arrivals (R-3)."""

    def __init__(self, config: Config, counts: Counter[str]) -> None:
        self.ttl = config.cohort_result_ttl_s
        self.cap = config.max_terminal_cohorts
        self.counts = counts
        self.watermarks: dict[str, tuple[int, str]] = {}
        self.terminal: OrderedDict[int, tuple[float, ModelRecord]] = OrderedDict()
        self.idle: OrderedDict[str, float] = OrderedDict()
        # since the runner last checked (I-9)
        self.prunes = 0
        self.removed = 0

    def expired(self, now: float, stamped: float, entries: int) -> bool:
        return (self.ttl is not None and now - stamped >= self.ttl) or entries > self.cap

    def prune(self, now: float) -> list[ModelRecord]:
        """R-3 at an arrival: the heads past the TTL or the count cap go; returns the records
        removed from the terminal index (the watermarks removed are gone already)."""
        self.prunes += 1
        dropped = []
        while self.terminal:
            stamped, record = next(iter(self.terminal.values()))
            if not self.expired(now, stamped, len(self.terminal)):
                break
            self.terminal.popitem(last=False)
            self.removed += 1
            self.counts["results pruned"] += 1
            dropped.append(record)
        while self.idle:
            gid, stamped = next(iter(self.idle.items()))
            if not self.expired(now, stamped, len(self.idle)):
                break
            self.idle.popitem(last=False)
            self.removed += 1
            self.counts["watermarks pruned"] += 1
            self.watermarks.pop(gid, None)
        return dropped

    def at(self, now: float, *, trimmed: bool) -> tuple[dict[str, int], list[str], list[str]]:
        """Watermarks (group -> attempt), the idle order and the terminal index (record keys):
        as they are, or (``trimmed``) as a prune at ``now`` would leave them, which is what a
        store that trims after every write and whose readers ignore what has expired holds."""
        terminal = list(self.terminal.values())
        idle = list(self.idle.items())
        dropped = set()
        if trimmed:
            while terminal and self.expired(now, terminal[0][0], len(terminal)):
                terminal.pop(0)
            while idle and self.expired(now, idle[0][1], len(idle)):
                dropped.add(idle.pop(0)[0])
        marks = {gid: mark[0] for gid, mark in self.watermarks.items() if gid not in dropped}
        return marks, [gid for gid, _ in idle], [record.key for _, record in terminal]

    def clear(self) -> None:
        self.watermarks.clear()
        self.terminal.clear()
        self.idle.clear()
