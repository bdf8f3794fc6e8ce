"""The Redis/Valkey group store: each transition of the core, applied atomically to one group.

A transaction loads one group (its record, its watermark, the legacy completion stamp) under
WATCH, runs the core's one transition on it (core/transition.py), and writes back what changed
in one MULTI/EXEC: the record, the watermark, the retention sorted sets, the deadline and lease
sets, and for a record that ended, its answers under an outcome key and a notification. If
another process changed the group in between, EXEC does nothing and the transaction runs again
on the new state. The rules of §5 therefore live only in the core; this module knows keys,
clocks and retention bookkeeping. What the other processes' work asks of this one (ended
records, sweeps, take-over, offers, the judge budget) is the store's watcher
(store/_redis_watcher.py).

Every time is the store's clock (``TIME``), so deadlines written by one process mean the same
to every other. A test harness may give the store a clock of its own (``clock``): every time it
stores, and every deadline it looks up, then comes from that clock instead.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import trio

from genrm_trio.config import Config
from genrm_trio.core.invariants import check_group
from genrm_trio.core.outcomes import Ended
from genrm_trio.core.ownership import Tenure
from genrm_trio.core.records import Phase
from genrm_trio.core.statistics import GroupCounts, Statistics
from genrm_trio.core.transition import Decision, Event, Group, Rules, plan_for, transition
from genrm_trio.store._records import (
    decode_ended,
    decode_record,
    decode_watermark,
    encode_ended,
    encode_record,
    encode_watermark,
)
from genrm_trio.store._redis_watcher import RedisWatcher
from genrm_trio.store._scripts import Script
from genrm_trio.store.group_store import (
    BeforeCommit,
    StoreFailed,
    StoreView,
    Watched,
    Watcher,
    split_ref,
)
from genrm_trio.store.resp import (
    DEFAULT_MAX_CONNECTIONS,
    Arg,
    Client,
    Connection,
    ServerError,
    StoreAddress,
    StoreUnavailable,
)

log = logging.getLogger("genrm_trio")

__all__ = [
    "RedisGroupStore",
    "Script",
    "StoreContended",
    "StoreFailed",
    "check_store_invariants",
]

# How long a finished record's outcome stays readable by waiters in other processes, apart
# from retention: long enough for a waiter that missed its notification to poll it.
OUTCOME_KEY_TTL_S = 600

# Count caps and expired heads of the retention sets: pops from the head only, and
# deletes the record or watermark each entry stands for. Every transaction that changes a
# group adds or removes its entries in the same EXEC, so an entry here always stands for a
# retained terminal record (or an idle watermark) at the moment the script runs.
_TRIM = """
local cap = tonumber(ARGV[1])
local function trim(zset, prefix)
  if ARGV[2] ~= 'none' then
    local old = redis.call('ZRANGEBYSCORE', zset, '-inf', ARGV[2])
    for _, m in ipairs(old) do
      redis.call('ZREM', zset, m)
      if prefix ~= '' then redis.call('DEL', prefix .. m) end
    end
  end
  local n = redis.call('ZCARD', zset) - cap
  if n > 0 then
    local heads = redis.call('ZRANGE', zset, 0, n - 1)
    for _, m in ipairs(heads) do
      redis.call('ZREM', zset, m)
      if prefix ~= '' then redis.call('DEL', prefix .. m) end
    end
  end
end
trim(KEYS[1], ARGV[3])
trim(KEYS[2], ARGV[4])
trim(KEYS[3], '')
return 0
"""


_DUE = """
local now
if ARGV[2] then
  now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
"""


# WATCH conflicts on one group: retried at once, then after a jittered pause that doubles up to
# a cap, so the writers that collided spread out instead of colliding again in step. After the
# bound the request is answered 503 and may be resent; nothing of it was written.
MAX_CONFLICTS = 32
CONFLICT_PAUSE_S = 0.002
CONFLICT_PAUSE_CAP_S = 0.1


class StoreContended(StoreFailed):
    """The group's keys changed under every attempt up to the bound; nothing was applied."""

    def __init__(self, address: str, ref: str, attempts: int) -> None:
        Exception.__init__(
            self,
            f"GenRM group store {address}: group {ref!r} changed under {attempts} transactions "
            "in a row; nothing was written, resend the request",
        )


_TRIM_SCRIPT = Script(_TRIM)
_DUE_SCRIPT = Script(_DUE)


class RedisGroupStore:
    """Groups of one deployment (one key prefix) in one Redis/Valkey database."""

    def __init__(
        self,
        config: Config,
        address: StoreAddress,
        prefix: str,
        lease_s: float,
        *,
        clock: Callable[[], float] | None = None,
        poll_s: float = 1.0,
        notifications: bool = True,
    ) -> None:
        self.config = config
        self.rules = Rules(config, Tenure(lease_s))
        # None: the store's own clock (TIME). A harness on a mock clock passes its own.
        self.clock = clock
        self.address = address
        self.name = address.public()
        self.prefix = prefix
        self.lease_s = lease_s
        # How often the watcher sweeps (and the judge budget is renewed at the latest), and how
        # long a transition that found the store unreachable waits before it tries again.
        self.poll_s = self.retry_s = poll_s
        # Whether the watcher follows the store's notifications (else its sweeps find
        # everything).
        self.notifications = notifications
        # Idle connections kept up to the cap: a burst that lent them all out does not close
        # and reopen them as its transactions come and go.
        self.client = Client(address, max_idle=DEFAULT_MAX_CONNECTIONS)
        self.channel = f"{prefix}outcomes"
        self.offers_channel = f"{prefix}offers"  # evaluations offered to another process
        self._terminal = f"{prefix}terminal"
        self._idle = f"{prefix}idle"
        self._legacy_done = f"{prefix}legacy-done"
        # Active legacy groups: they have no watermark, so the watermark count leaves them out.
        self.legacy_active = f"{prefix}legacy-active"
        self.due_set = f"{prefix}collection-due"
        self.lease_set = f"{prefix}leases"
        self.transactions = 0
        self.conflicts = 0
        self.max_conflicts = MAX_CONFLICTS
        self.jitter = random.Random()  # a harness seeds it for repeatable runs
        self.available = True
        self.last_error: str | None = None
        self.last_counts: GroupCounts | None = None  # the deployment's, as last read
        self.counted = False  # the last attempt to read them succeeded
        self.processes = 0  # processes following the outcomes channel, as last read

    @property
    def tenure(self) -> Tenure:
        return self.rules.tenure

    @property
    def busy(self) -> bool:
        return self.client.in_use > 0

    # ---- keys ------------------------------------------------------------------------------

    def record_key(self, ref: str) -> str:
        return f"{self.prefix}r:{ref}"

    def watermark_key(self, group_id: str) -> str:
        return f"{self.prefix}w:{group_id}"

    def outcome_key(self, rid: str) -> str:
        return f"{self.prefix}o:{rid}"

    # ---- errors ----------------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> StoreFailed:
        self.available = False
        self.last_error = str(exc) or type(exc).__name__
        return StoreFailed(self.name, exc)

    def _reached(self) -> None:
        self.available = True
        self.last_error = None

    async def call(self, *args: Arg) -> Any:
        try:
            reply = await self.client.call(*args)
        except (StoreUnavailable, ServerError) as exc:
            raise self._failed(exc) from exc
        self._reached()
        return reply

    async def pipeline(self, commands: list[list[Arg]]) -> list[Any]:
        try:
            replies = await self.client.pipeline(commands)
        except StoreUnavailable as exc:
            raise self._failed(exc) from exc
        self._reached()
        return replies

    # ---- transactions ----------------------------------------------------------------------

    async def transact(
        self, ref: str, event: Event, *, before_commit: BeforeCommit | None = None
    ) -> Decision:
        """Apply ``event`` to the group ``ref`` until it commits.

        ``before_commit`` runs after the transition, before EXEC is sent, and may return an
        undo that runs if the EXEC does not apply (a conflict, or the store failing).
        """
        group_id, legacy_key = split_ref(ref)
        watched = [self.record_key(ref)]
        if group_id is not None:
            watched.append(self.watermark_key(group_id))
        fresh = False
        conflicts = 0
        try:
            while True:
                self.transactions += 1
                async with self.client.connection(fresh=fresh) as connection:
                    self.client.round_trips += 2
                    reads: list[list[Arg]] = [["WATCH", *watched], ["GET", watched[0]]]
                    if group_id is not None:
                        reads.append(["GET", watched[1]])
                    else:
                        reads.append(["ZSCORE", self._legacy_done, legacy_key or ""])
                    if self.clock is None:
                        reads.append(["TIME"])
                    try:
                        replies = await connection.pipeline(reads)
                    except StoreUnavailable:
                        if not connection.reused or fresh:
                            raise
                        # A pooled connection that outlived its server (a restart): the reads
                        # wrote nothing, so the transaction starts again on a new connection.
                        fresh = True
                        continue
                    for reply in replies:
                        if isinstance(reply, ServerError):
                            raise reply
                    if self.clock is None:
                        seconds, micros = replies[3]
                        now = int(seconds) + int(micros) / 1e6
                    else:
                        now = self.clock()
                    try:
                        decision, writes = self._run(ref, replies[1], replies[2], now, event)
                    except BaseException:
                        connection.broken = True  # still WATCHing: never hand it on
                        raise
                    undo = before_commit(decision) if before_commit is not None else None
                    # Even a transition that writes nothing (a duplicate attaching a local
                    # waiter, a replay) commits through EXEC: it tells whether the group stayed
                    # as read, so a waiter is never registered on a state already gone.
                    commands: list[list[Arg]] = [["MULTI"], *writes, ["EXEC"]]
                    if writes:
                        commands.append(self._trim_command(now))
                    try:
                        outcome = await connection.pipeline(commands)
                    except BaseException:
                        if undo is not None:
                            undo()
                        raise
                    committed = outcome[len(writes) + 1] is not None
                    if committed:
                        if writes and Script.missing(outcome[-1]):
                            # The trim runs after EXEC and only prunes: load it and run it again.
                            await self._load_and_trim(connection, now)
                            outcome.pop()
                        for reply in outcome:
                            if isinstance(reply, ServerError):
                                raise reply
                        self._reached()
                        return decision
                    if undo is not None:
                        undo()
                    self.conflicts += 1
                # Outside the connection's block: a pause holds no pooled connection.
                conflicts += 1
                if conflicts >= self.max_conflicts:
                    raise StoreContended(self.name, ref, conflicts)
                if conflicts > 1:
                    cap = min(CONFLICT_PAUSE_CAP_S, CONFLICT_PAUSE_S * 2 ** (conflicts - 2))
                    await trio.sleep(self.jitter.uniform(0, cap))
        except (StoreUnavailable, ServerError) as exc:
            raise self._failed(exc) from exc

    async def _load_and_trim(self, connection: Connection, now: float) -> None:
        loaded, trimmed = await connection.pipeline(
            [["SCRIPT", "LOAD", _TRIM_SCRIPT.text], self._trim_command(now)]
        )
        for reply in (loaded, trimmed):
            if isinstance(reply, ServerError):
                raise reply

    def _run(
        self, ref: str, record_data: bytes | None, second: Any, now: float, event: Event
    ) -> tuple[Decision, list[list[Arg]]]:
        """Load, transition and diff, with no checkpoint in between."""
        group = self.load(ref, record_data, second)
        watermark_before = second if ref.startswith("e:") else None
        completed_before = group.completed_at
        decision = transition(group, event, now=now, rules=self.rules, rid=uuid.uuid4().hex)
        writes = self._writes(group, decision, record_data, watermark_before, completed_before)
        return decision, writes

    def load(self, ref: str, record_data: bytes | None, second: Any) -> Group:
        """One group as stored: its record, and its watermark or legacy completion stamp."""
        record = decode_record(record_data) if record_data is not None else None
        if record is not None and record.phase.active and record.inputs is not None:
            record.plan = plan_for(self.config, record.size, record.inputs)
        group = Group(ref, record)
        if ref.startswith("e:"):
            if second is not None:
                group.watermark, group.idle_since = decode_watermark(second)
        elif second is not None:
            group.completed_at = float(second)
        return group

    def _writes(
        self,
        group: Group,
        decision: Decision,
        record_before: bytes | None,
        watermark_before: bytes | None,
        completed_before: float | None,
    ) -> list[list[Arg]]:
        ref = group.ref
        group_id, legacy_key = split_ref(ref)
        ttl = self.config.cohort_result_ttl_s
        writes: list[list[Arg]] = []
        record = group.record
        record_after = encode_record(record) if record is not None else None
        key = self.record_key(ref)
        if record_after != record_before or decision.finished:
            if record is None:
                writes += [
                    ["DEL", key],
                    ["ZREM", self._terminal, ref],
                    ["ZREM", self.due_set, ref],
                    ["ZREM", self.lease_set, ref],
                    ["SREM", self.legacy_active, ref],
                ]
            else:
                assert record_after is not None
                command: list[Arg] = ["SET", key, record_after]
                terminal = record.terminal_time if not record.phase.active else None
                if terminal is not None and ttl is not None:
                    command += ["PXAT", int((terminal + ttl) * 1000)]
                writes.append(command)
                if terminal is not None:
                    writes.append(["ZADD", self._terminal, terminal, ref])
                else:
                    writes.append(["ZREM", self._terminal, ref])
                if record.phase is Phase.COLLECTING:
                    writes.append(["ZADD", self.due_set, record.collection_due, ref])
                else:
                    writes.append(["ZREM", self.due_set, ref])
                if record.phase is Phase.EVALUATING and record.lease_until is not None:
                    writes.append(["ZADD", self.lease_set, record.lease_until, ref])
                else:
                    writes.append(["ZREM", self.lease_set, ref])
                if group_id is None:
                    writes.append(
                        ["SADD" if record.phase.active else "SREM", self.legacy_active, ref]
                    )
        if group_id is not None:
            mark = group.watermark
            idle_since = group.idle_since
            mark_after = encode_watermark(mark, idle_since) if mark is not None else None
            if mark_after != watermark_before:
                wkey = self.watermark_key(group_id)
                if mark_after is None:
                    writes += [["DEL", wkey], ["ZREM", self._idle, group_id]]
                else:
                    command = ["SET", wkey, mark_after]
                    if idle_since is not None and ttl is not None:
                        command += ["PXAT", int((idle_since + ttl) * 1000)]
                    writes.append(command)
                    if idle_since is not None:
                        writes.append(["ZADD", self._idle, idle_since, group_id])
                    else:
                        writes.append(["ZREM", self._idle, group_id])
        elif group.completed_at != completed_before:
            if group.completed_at is None:
                writes.append(["ZREM", self._legacy_done, legacy_key or ""])
            else:
                writes.append(["ZADD", self._legacy_done, group.completed_at, legacy_key or ""])
        if decision.offered is not None:
            writes.append(["PUBLISH", self.offers_channel, f"{decision.offered} {ref}"])
        for finished in decision.finished:
            # Waiters in every process read the ended record's answers here (the record may be
            # superseded, retired or evicted from its own key by then), after the EXEC.
            rid = finished.ended.rid
            writes.append(
                [
                    "SET",
                    self.outcome_key(rid),
                    encode_ended(finished.ended),
                    "EX",
                    OUTCOME_KEY_TTL_S,
                ]
            )
            writes.append(["PUBLISH", self.channel, rid])
        return writes

    def _trim_command(self, now: float) -> list[Arg]:
        ttl = self.config.cohort_result_ttl_s
        cutoff: Arg = "none" if ttl is None else repr(now - ttl)
        return _TRIM_SCRIPT.command(
            [self._terminal, self._idle, self._legacy_done],
            [self.config.max_terminal_cohorts, cutoff, f"{self.prefix}r:", f"{self.prefix}w:"],
        )

    # ---- what the engine leaves to the store -----------------------------------------------

    def watcher(self, engine: Watched) -> Watcher:
        return RedisWatcher(self, engine)

    def shut_down(self, now: float) -> list[Decision]:
        return []  # the groups stay for the other processes; an evaluation here is taken over

    def evaluation_cancelled(self, ref: str, rid: str) -> Decision | None:
        return None  # its lease expires and another process takes it over

    def statistics(self, local: Statistics) -> Statistics:
        return local  # the groups themselves are in the store

    def group_counts(self, now: float) -> GroupCounts:
        """The deployment's groups as counted last (at the last sweep, health check or
        scrape): the same at every process. Kept while the store is unreachable."""
        return self.last_counts or GroupCounts(0, 0, 0, 0, 0.0)

    def health(self, evaluating_here: int) -> Mapping[str, int]:
        """The deployment's groups as counted at this health check; this process's own
        evaluations while the store is unreachable."""
        counts = self.last_counts
        if counts is None or not self.counted:
            return {"active_groups": evaluating_here, "retained_records": 0, "watermarks": 0}
        return {
            "active_groups": counts.collecting + counts.evaluating,
            "retained_records": counts.retained_records,
            "watermarks": counts.watermarks,
        }

    def evictions(self) -> Mapping[tuple[str, str], int]:
        return {}  # Redis expires and trims them, uncounted

    async def refresh_counts(self) -> None:
        try:
            self.last_counts, self.processes = await self.counts()
        except StoreFailed:
            self.counted = False
        else:
            self.counted = True

    def check_invariants(self) -> None:
        pass  # the deployment's groups are checked by view(), which reads them

    async def view(self) -> StoreView:
        return await check_store_invariants(self)

    # ---- reads -----------------------------------------------------------------------------

    async def ended_records(self, rids: list[str]) -> dict[str, Ended]:
        """The ended records among ``rids`` (their outcome keys), by record id."""
        if not rids:
            return {}
        replies = await self.call("MGET", *[self.outcome_key(rid) for rid in rids])
        return {rid: decode_ended(data) for rid, data in zip(rids, replies, strict=True) if data}

    async def run_script(self, script: Script, keys: list[Arg], args: list[Arg]) -> Any:
        """Run a script by EVALSHA; loaded first if the server does not know it."""
        command = script.command(keys, args)
        replies = await self.pipeline([command])
        if Script.missing(replies[0]):
            _, replies[0] = await self.pipeline([["SCRIPT", "LOAD", script.text], command])
        if isinstance(replies[0], ServerError):
            raise self._failed(replies[0])
        return replies[0]

    def clock_args(self) -> list[Arg]:
        """A script's optional last argument: the harness's clock, else nothing (the script
        reads the store's TIME)."""
        return [] if self.clock is None else [repr(self.clock())]

    async def due(self, sorted_set: str, limit: int = 256) -> list[str]:
        """Groups whose collection deadline or evaluation lease has passed (store clock)."""
        members = await self.run_script(_DUE_SCRIPT, [sorted_set], [limit, *self.clock_args()])
        return [member.decode() for member in members]

    async def counts(self) -> tuple[GroupCounts, int]:
        """The deployment's groups by phase, retained records and watermarks, and the age of
        its oldest group still collecting: read from the sets every transition keeps (each
        O(1) or O(log n)), in one round trip; and how many processes follow the outcomes
        channel (the deployment's processes that take notifications)."""
        commands: list[list[Arg]] = [
            ["ZCARD", self.due_set],
            ["ZCARD", self.lease_set],
            ["ZCARD", self._terminal],
            ["ZCARD", self._idle],
            ["SCARD", self.legacy_active],
            ["ZRANGE", self.due_set, 0, 0, "WITHSCORES"],
            ["PUBSUB", "NUMSUB", self.channel],
        ]
        if self.clock is None:
            commands.append(["TIME"])
        replies = await self.pipeline(commands)
        for reply in replies:
            if isinstance(reply, ServerError):
                raise self._failed(reply)
        collecting, evaluating, retained, idle, legacy, first_due, (_, listening) = replies[:7]
        if self.clock is None:
            seconds, micros = replies[7]
            now = int(seconds) + int(micros) / 1e6
        else:
            now = self.clock()
        oldest = 0.0
        if first_due:
            # Its collection deadline was set at its start, cohort_collection_timeout_s later.
            started = float(first_due[1]) - self.config.cohort_collection_timeout_s
            oldest = max(0.0, now - started)
        # An explicit group has a watermark while it is active and while it is idle.
        watermarks = idle + collecting + evaluating - legacy
        return GroupCounts(collecting, evaluating, retained, watermarks, oldest), int(listening)

    async def time(self) -> float:
        if self.clock is not None:
            return self.clock()
        seconds, micros = await self.call("TIME")
        return int(seconds) + int(micros) / 1e6

    async def aclose(self) -> None:
        await self.client.aclose()


async def check_store_invariants(store: RedisGroupStore) -> StoreView:
    """Load every group of the store, check I-2..I-4 on each, and return them with the
    retention sets in score order (what expired by the store's clock left out).

    Also checks that the store's sorted sets name exactly the records and watermarks they stand
    for. For tests and operators; it reads every key under the prefix.
    """
    config = store.config
    cursor = b"0"
    keys: list[bytes] = []
    while True:
        cursor, batch = await store.call("SCAN", cursor, "MATCH", f"{store.prefix}*", "COUNT", 500)
        keys += batch
        if cursor == b"0":
            break
    records: dict[str, bytes] = {}
    marks: dict[str, bytes] = {}
    for key in keys:
        name = key.decode()[len(store.prefix) :]
        if name.startswith("r:"):
            data = await store.call("GET", key)
            if data is not None:
                records[name[2:]] = data
        elif name.startswith("w:"):
            data = await store.call("GET", key)
            if data is not None:
                marks[name[2:]] = data
    # Keys whose TTL has passed by the store's clock are gone for every reader: Redis expired
    # them, or, with a clock of the store's own, the next transaction that reads them prunes
    # them. They are not counted here, nor are the sorted-set entries that stand for them.
    now = await store.time()
    ttl = config.cohort_result_ttl_s

    def expired(stamped: float | None) -> bool:
        return ttl is not None and stamped is not None and now - stamped >= ttl

    groups: dict[str, Group] = {}
    for ref, data in records.items():
        group = store.load(ref, data, None)
        assert group.record is not None
        if expired(group.record.terminal_time):
            group.record = None
        groups[ref] = group
    for group_id, data in marks.items():
        ref = f"e:{group_id}"
        group = groups.setdefault(ref, Group(ref))
        group.watermark, group.idle_since = decode_watermark(data)
        if expired(group.idle_since):
            group.watermark = group.idle_since = None
    groups = {ref: group for ref, group in groups.items() if not group.empty}
    for group in groups.values():
        check_group(group)

    async def live(name: str) -> list[str]:
        flat = await store.call("ZRANGE", f"{store.prefix}{name}", 0, -1, "WITHSCORES")
        pairs = zip(flat[::2], flat[1::2], strict=True)
        return [m.decode() for m, score in pairs if ttl is None or now - float(score) < ttl]

    retained = {
        ref for ref, g in groups.items() if g.record is not None and not g.record.phase.active
    }
    terminal = await live("terminal")
    if set(terminal) != retained:
        raise AssertionError(f"terminal set {sorted(terminal)} != records {sorted(retained)}")
    idle = await live("idle")
    if set(idle) != {ref[2:] for ref, g in groups.items() if g.idle_since is not None}:
        raise AssertionError("idle set != idle watermarks")
    legacy_active = {m.decode() for m in await store.call("SMEMBERS", store.legacy_active)}
    active_legacy = {
        ref
        for ref, g in groups.items()
        if g.record is not None and g.record.legacy and g.record.phase.active
    }
    if legacy_active != active_legacy:
        raise AssertionError(f"legacy-active set {sorted(legacy_active)} != active legacy records")
    return StoreView(groups, idle, terminal, None)
