"""The Redis/Valkey group store: each transition of the core, applied atomically to one group.

A transaction loads one group's state (its record, its watermark, the legacy completion stamp)
under WATCH, files it in a fresh ``GroupRegistry`` (``adopt``), runs the core's own transition on
it, and writes back what changed in one MULTI/EXEC: the record, the watermark, the retention
sorted sets, the deadline and lease sets, and for a record that just finished, its outcome key
and a notification. If another process changed the group in between, EXEC does nothing and the
transaction runs again on the new state. The rules of §5 therefore live only in
``core/groups.py``; this module knows keys, clocks and retention bookkeeping.

Every time is the store's clock (``TIME``), so deadlines written by one process mean the same
to every other. A test harness may give the store a clock of its own (``clock``): every time it
stores, and every deadline it looks up, then comes from that clock instead.
"""

from __future__ import annotations

import hashlib
import logging
import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import trio

from genrm_trio.config import Config
from genrm_trio.core.critical import critical_section
from genrm_trio.core.groups import GroupCounts, GroupRegistry, Phase, Record, Statistics
from genrm_trio.store.group_store import (
    BeforeCommit,
    StoreFailed,
    Transaction,
    find_record,
    group_ref,
    record_ref,
    split_ref,
)
from genrm_trio.store.records import (
    StoreMeta,
    decode_record,
    decode_watermark,
    encode_record,
    encode_watermark,
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
    "Transaction",
    "check_store_invariants",
    "group_ref",
    "record_ref",
]

T = TypeVar("T")

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


class Script:
    """A Lua script run by EVALSHA; loaded again when the server answers NOSCRIPT (a restart,
    SCRIPT FLUSH)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    def command(self, keys: list[Arg], args: list[Arg]) -> list[Arg]:
        return ["EVALSHA", self.sha, len(keys), *keys, *args]

    @staticmethod
    def missing(reply: Any) -> bool:
        return isinstance(reply, ServerError) and str(reply).startswith("NOSCRIPT")


_TRIM_SCRIPT = Script(_TRIM)
_DUE_SCRIPT = Script(_DUE)


class RedisGroupStore:
    """Groups of one deployment (one key prefix) in one Redis/Valkey database."""

    shared = True
    holds_waiters = False  # a stored record has no waiters: they stay with their requests
    batches_arrivals = True

    def __init__(
        self,
        config: Config,
        address: StoreAddress,
        prefix: str,
        lease_s: float,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        # None: the store's own clock (TIME). A harness on a mock clock passes its own.
        self.clock = clock
        self.address = address
        self.name = address.public()
        self.prefix = prefix
        self.lease_s = lease_s
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
        # This process's tallies of the groups its transactions ended, for /metrics and
        # /aggregate_metrics (each process counts the ones it ended).
        self.registry = GroupRegistry(config, log=log.log)
        self.last_counts: GroupCounts | None = None  # the deployment's, as last read
        self.counted = False  # the last attempt to read them succeeded
        self.processes = 0  # processes following the outcomes channel, as last read

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
        self,
        ref: str,
        step: Callable[[Transaction[Any]], T],
        *,
        before_commit: BeforeCommit | None = None,
    ) -> Transaction[T]:
        """Run ``step`` (a core transition, synchronous) on the group ``ref`` until it commits.

        ``before_commit`` runs after the step, before EXEC is sent, and may return an undo that
        runs if the EXEC does not apply (a conflict, or the store failing).
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
                        tx, writes = self._run_step(
                            ref, group_id, legacy_key, replies[1], replies[2], now, step
                        )
                    except BaseException:
                        connection.broken = True  # still WATCHing: never hand it on
                        raise
                    undo = before_commit(tx) if before_commit is not None else None
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
                        self._emit(tx)
                        self._tally(tx)
                        self._reached()
                        return tx
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

    def _run_step(
        self,
        ref: str,
        group_id: str | None,
        legacy_key: str | None,
        record_data: bytes | None,
        second: Any,
        now: float,
        step: Callable[[Transaction[Any]], Any],
    ) -> tuple[Transaction[Any], list[list[Arg]]]:
        """Load, transition and diff, in one critical section: no checkpoint in between."""
        with critical_section():
            logs: list[tuple[int, str, dict[str, Any]]] = []
            registry = GroupRegistry(
                self.config, log=lambda level, text, **fields: logs.append((level, text, fields))
            )
            loaded = decode_record(record_data) if record_data is not None else None
            if loaded is not None and loaded.phase.active and loaded.inputs is not None:
                loaded.plan = registry.plan_for(loaded.inputs)
            watermark_before: bytes | None = None
            legacy_before: float | None = None
            if group_id is not None:
                watermark_before = second
                mark = decode_watermark(second) if second is not None else None
                registry.adopt(loaded, (group_id, *mark) if mark is not None else None)
            else:
                legacy_before = float(second) if second is not None else None
                done = (legacy_key or "", legacy_before) if legacy_before is not None else None
                registry.adopt(loaded, None, done)
            was_active = loaded is not None and loaded.phase.active
            tx: Transaction[Any] = Transaction(registry, now, loaded, logs)
            tx.result = step(tx)
            if was_active and loaded is not None and not loaded.phase.active:
                tx.finished = loaded
            return tx, self._writes(
                tx, ref, group_id, legacy_key, record_data, watermark_before, legacy_before
            )

    def _writes(
        self,
        tx: Transaction[Any],
        ref: str,
        group_id: str | None,
        legacy_key: str | None,
        record_before: bytes | None,
        watermark_before: bytes | None,
        legacy_before: float | None,
    ) -> list[list[Arg]]:
        registry = tx.registry
        now = tx.now
        ttl = self.config.cohort_result_ttl_s
        writes: list[list[Arg]] = []
        record = find_record(registry, ref)
        if record is not None and record.meta is None:
            record.meta = StoreMeta(
                uuid.uuid4().hex, record.started_at + self.config.cohort_collection_timeout_s
            )
        if record is not None:
            meta = record.meta
            assert meta is not None
            if record.phase is Phase.EVALUATING and meta.lease_until is None:
                # The move to evaluating and the claim of the evaluation are one transition.
                meta.evaluation_due = now + self.config.cohort_evaluation_timeout_s
                if tx.hand_over is None:
                    tx.claim(record, self.lease_s)
                else:
                    # Offered: no owner yet (fencing token 0), a lease that has already run
                    # out, so any process may claim it as it takes over an expired one.
                    meta.lease_until = now
                    tx.offered = record
        finished = tx.finished
        record_after = encode_record(record) if record is not None else None
        key = self.record_key(ref)
        if record_after != record_before or finished is not None:
            if record is None:
                writes.append(["DEL", key])
            else:
                assert record_after is not None
                meta = record.meta
                assert meta is not None
                command: list[Arg] = ["SET", key, record_after]
                terminal = record.terminal_time if not record.phase.active else None
                if terminal is not None and ttl is not None:
                    command += ["PXAT", int((terminal + ttl) * 1000)]
                writes.append(command)
                if terminal is not None and id(record) in registry.terminal_index:
                    writes.append(["ZADD", self._terminal, terminal, ref])
                else:
                    writes.append(["ZREM", self._terminal, ref])
                if record.phase is Phase.COLLECTING:
                    writes.append(["ZADD", self.due_set, meta.collection_due, ref])
                else:
                    writes.append(["ZREM", self.due_set, ref])
                if record.phase is Phase.EVALUATING and meta.lease_until is not None:
                    writes.append(["ZADD", self.lease_set, meta.lease_until, ref])
                else:
                    writes.append(["ZREM", self.lease_set, ref])
                if group_id is None:
                    writes.append(
                        ["SADD" if record.phase.active else "SREM", self.legacy_active, ref]
                    )
            if record is None:
                writes += [
                    ["ZREM", self._terminal, ref],
                    ["ZREM", self.due_set, ref],
                    ["ZREM", self.lease_set, ref],
                    ["SREM", self.legacy_active, ref],
                ]
        if group_id is not None:
            mark = registry.watermarks.get(group_id)
            idle_since = registry.idle_order.stamped(group_id)
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
        else:
            stamped = registry.completed_legacy.stamped(legacy_key or "")
            if stamped != legacy_before:
                if stamped is None:
                    writes.append(["ZREM", self._legacy_done, legacy_key or ""])
                else:
                    writes.append(["ZADD", self._legacy_done, stamped, legacy_key or ""])
        if tx.offered is not None:
            writes.append(["PUBLISH", self.offers_channel, f"{tx.hand_over} {ref}"])
        if finished is not None:
            # Waiters in every process read the finished record here (it may be superseded,
            # retired or evicted from its own key by then), after the EXEC that stored it.
            meta = finished.meta
            assert meta is not None
            outcome_key = self.outcome_key(meta.rid)
            writes.append(["SET", outcome_key, encode_record(finished), "EX", OUTCOME_KEY_TTL_S])
            writes.append(["PUBLISH", self.channel, meta.rid])
        return writes

    def _trim_command(self, now: float) -> list[Arg]:
        ttl = self.config.cohort_result_ttl_s
        cutoff: Arg = "none" if ttl is None else repr(now - ttl)
        return _TRIM_SCRIPT.command(
            [self._terminal, self._idle, self._legacy_done],
            [self.config.max_terminal_cohorts, cutoff, f"{self.prefix}r:", f"{self.prefix}w:"],
        )

    @staticmethod
    def _emit(tx: Transaction[Any]) -> None:
        # Logged only once the transition is stored: a transaction run again logs once.
        for level, text, fields in tx.logs:
            log.log(level, text, **fields)

    def _tally(self, tx: Transaction[Any]) -> None:
        """Count what a stored transaction ended in this process's own registry."""
        mine = self.registry
        for key, count in tx.registry.finished.items():
            mine.finished[key] = mine.finished.get(key, 0) + count
        mine.rollouts_masked += tx.registry.rollouts_masked
        for group, stamped, slots in tx.registry.masked_answers.items():
            mine.masked_answers.stamp(group, slots, stamped)
        mine.masked_answers.prune(
            tx.now,
            self.config.cohort_result_ttl_s,
            self.config.max_terminal_cohorts,
            lambda group, slots: None,
        )

    # ---- what the engine leaves to the store -----------------------------------------------

    def shut_down(self, now: float) -> list[Record]:
        return []  # the groups stay for the other processes; an evaluation here is taken over

    def evaluation_cancelled(self, record: Record, now: float) -> None:
        pass  # its lease expires and another process takes it over

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

    async def refresh_counts(self) -> None:
        try:
            self.last_counts, self.processes = await self.counts()
        except StoreFailed:
            self.counted = False
        else:
            self.counted = True

    def check_invariants(self) -> None:
        pass  # the deployment's groups are checked by check_store_invariants, which reads them

    # ---- reads -----------------------------------------------------------------------------

    async def finished_records(self, rids: list[str]) -> dict[str, Record]:
        """The finished records among ``rids`` (their outcome keys), by record id."""
        if not rids:
            return {}
        replies = await self.call("MGET", *[self.outcome_key(rid) for rid in rids])
        return {rid: decode_record(data) for rid, data in zip(rids, replies, strict=True) if data}

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


async def check_store_invariants(store: RedisGroupStore, config: Config) -> GroupRegistry:
    """Load every group of the store into one registry and check I-2..I-4 on it.

    Also checks that the store's sorted sets name exactly the records and watermarks they stand
    for. For tests and operators; it reads every key under the prefix.
    """
    registry = GroupRegistry(config)
    cursor = b"0"
    keys: list[bytes] = []
    while True:
        cursor, batch = await store.call("SCAN", cursor, "MATCH", f"{store.prefix}*", "COUNT", 500)
        keys += batch
        if cursor == b"0":
            break
    records: dict[str, Record] = {}
    marks: dict[str, bytes] = {}
    for key in keys:
        name = key.decode()[len(store.prefix) :]
        if name.startswith("r:"):
            data = await store.call("GET", key)
            if data is not None:
                records[name[2:]] = decode_record(data)
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

    for record in records.values():
        if not expired(record.terminal_time):
            registry.adopt(record)
    for group_id, data in marks.items():
        mark, idle_since = decode_watermark(data)
        if not expired(idle_since):
            registry.adopt(None, (group_id, mark, idle_since))
    registry.check_invariants()

    async def live(name: str) -> set[str]:
        flat = await store.call("ZRANGE", f"{store.prefix}{name}", 0, -1, "WITHSCORES")
        pairs = zip(flat[::2], flat[1::2], strict=True)
        return {m.decode() for m, score in pairs if ttl is None or now - float(score) < ttl}

    expected = {ref for ref, r in records.items() if not r.phase.active}
    expected = {ref for ref in expected if not expired(records[ref].terminal_time)}
    terminal = await live("terminal")
    if terminal != expected:
        raise AssertionError(f"terminal set {sorted(terminal)} != records {sorted(expected)}")
    if await live("idle") != set(registry.idle_order.keys()):
        raise AssertionError("idle set != idle watermarks")
    legacy_active = {m.decode() for m in await store.call("SMEMBERS", store.legacy_active)}
    active_legacy = {ref for ref, r in records.items() if r.group_id is None and r.phase.active}
    if legacy_active != active_legacy:
        raise AssertionError(f"legacy-active set {sorted(legacy_active)} != active legacy records")
    return registry
