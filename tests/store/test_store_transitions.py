"""The store's side of a transition without a server: the record codec, and which writes one
core transition turns into (the same EXEC holds the record, its sets and its notification)."""

from __future__ import annotations

from typing import Any

from genrm_trio.config import Config
from genrm_trio.core.arrivals import Arrival
from genrm_trio.core.identity import ResponseIdentity, same_response
from genrm_trio.core.outcomes import Masked, Scored
from genrm_trio.core.records import GroupInputs, Member, MemberTexts, Phase, Record, Watermark
from genrm_trio.core.transition import Arrive, Decision, Event, Finish, Wait
from genrm_trio.core.verdicts import Verdict
from genrm_trio.store._records import (
    decode_record,
    decode_watermark,
    encode_record,
    encode_watermark,
)
from genrm_trio.store.redis_store import RedisGroupStore
from genrm_trio.store.resp import StoreAddress, encode_command

CONFIG = Config(
    judge_base_url="http://judge/v1",
    judge_model="m",
    num_rollouts_per_prompt=2,
    cohort_collection_timeout_s=30.0,
    cohort_evaluation_timeout_s=60.0,
    cohort_result_ttl_s=10.0,
)


def store() -> RedisGroupStore:
    return RedisGroupStore(CONFIG, StoreAddress.parse("redis://127.0.0.1:1/0"), "p:", 5.0)


class Source:
    def __init__(self, slot: int) -> None:
        self.slot = slot

    def texts(self) -> MemberTexts:
        return MemberTexts(f"why-{self.slot}", f"answer-{self.slot}")

    def inputs(self) -> GroupInputs:
        return GroupInputs([{"role": "user", "content": "q"}], "be fair", None, None)


def arrive(slot: int, response: bytes, a: int = 0) -> Arrive:
    identity = ResponseIdentity(response)
    return Arrive([Arrival("g", a, slot, None, None, "digest", identity, Source(slot))])


def run(
    s: RedisGroupStore,
    record: bytes | None,
    mark: bytes | None,
    now: float,
    event: Event,
) -> tuple[Decision, list[list[Any]]]:
    return s._run("e:g", record, mark, now, event)


def written(writes: list[list[Any]], command: str, key: str) -> list[Any] | None:
    for write in writes:
        if write[0] == command and write[1] == key:
            return write
    return None


def test_a_new_group_round_trips_through_the_codec() -> None:
    s = store()
    _, writes = run(
        s,
        None,
        None,
        1000.0,
        arrive(0, b'{"a":1}'),
    )
    first = written(writes, "SET", "p:r:e:g")
    assert first is not None
    record = decode_record(first[2])
    assert record.phase is Phase.COLLECTING and record.started_at == 1000.0
    member = record.members[0]
    assert member.texts == MemberTexts("why-0", "answer-0")
    assert record.inputs == GroupInputs([{"role": "user", "content": "q"}], "be fair", None, None)
    assert record.collection_due == 1030.0 and record.lease_until is None
    # The member is known again by the same bytes and by a different spelling of the same JSON.
    assert same_response(member.fingerprint, ResponseIdentity(b'{"a":1}'))
    assert same_response(member.fingerprint, ResponseIdentity(b'{ "a" : 1 }'))
    assert not same_response(member.fingerprint, ResponseIdentity(b'{"a":1.0}'))
    assert encode_record(record) == first[2]
    mark = written(writes, "SET", "p:w:g")
    assert mark is not None and decode_watermark(mark[2]) == (Watermark(0, "digest"), None)
    assert encode_watermark(Watermark(0, "digest"), None) == mark[2]
    assert ["ZADD", "p:collection-due", 1030.0, "e:g"] in writes


def test_filling_the_group_claims_its_evaluation_in_the_same_transaction() -> None:
    s = store()
    _, writes = run(
        s,
        None,
        None,
        1000.0,
        arrive(0, b'{"a":1}'),
    )
    stored = written(writes, "SET", "p:r:e:g")
    mark = written(writes, "SET", "p:w:g")
    assert stored is not None and mark is not None
    decision, writes = run(
        s,
        stored[2],
        mark[2],
        1001.0,
        arrive(1, b'{"a":2}'),
    )
    assert isinstance(decision.replies[0], Wait)
    assert decision.claim is not None and decision.claim.work.fence == 1
    claimed = decode_record(written(writes, "SET", "p:r:e:g")[2])
    assert (claimed.fence, claimed.lease_until, claimed.evaluation_due) == (1, 1006.0, 1061.0)
    assert ["ZADD", "p:leases", 1006.0, "e:g"] in writes
    assert ["ZREM", "p:collection-due", "e:g"] in writes
    # A duplicate of a member changes nothing in the store (its waiter stays local).
    again = written(writes, "SET", "p:r:e:g")
    assert again is not None
    decision, nothing = run(s, again[2], mark[2], 1002.0, arrive(0, b'{"a":1}'))
    assert isinstance(decision.replies[0], Wait) and nothing == []


def test_publication_writes_the_outcome_key_and_the_notification() -> None:
    s = store()
    _, writes = run(
        s,
        None,
        None,
        1000.0,
        arrive(0, b'{"a":1}'),
    )
    mark = written(writes, "SET", "p:w:g")
    stored = written(writes, "SET", "p:r:e:g")
    assert stored is not None and mark is not None
    decision, writes = run(s, stored[2], mark[2], 1001.0, arrive(1, b'{"a":2}'))
    stored = written(writes, "SET", "p:r:e:g")
    assert stored is not None and written(writes, "SET", "p:w:g") is None  # unchanged
    assert decision.claim is not None
    rid, fence = decision.claim.work.rid, decision.claim.work.fence
    verdicts = {0: Verdict(8.0, 2.0, None), 1: Verdict(8.0, 2.0, None)}
    decision, writes = run(
        s, stored[2], mark[2], 1003.0, Finish(rid, fence, verdicts, {}, 2, False)
    )
    assert [f.ended.rid for f in decision.finished] == [rid]
    record_write = written(writes, "SET", "p:r:e:g")
    assert record_write is not None and record_write[3:] == ["PXAT", 1013000]
    done = decode_record(record_write[2])
    assert done.phase is Phase.COMPLETED
    assert all(m.texts is None for m in done.members.values()) and done.inputs is None
    assert all(isinstance(m.outcome, Scored) for m in done.members.values())
    # The group metrics are kept once and come back on every scored row.
    metrics = [m.outcome.metrics for m in done.members.values()]
    assert metrics[0] == metrics[1] and metrics[0] is not None
    assert metrics[0]["genrm_failed_comparison_rate_per_group"] == 0.0
    assert written(writes, "SET", f"p:o:{rid}") is not None
    assert ["PUBLISH", "p:outcomes", rid] in writes
    assert ["ZADD", "p:terminal", 1003.0, "e:g"] in writes
    assert ["ZADD", "p:idle", 1003.0, "g"] in writes
    # The finished record no longer needs the original bytes: a replay compares digests.
    assert done.members[0].fingerprint.settled


def _finished_record(placeholder: float) -> Record:
    record = Record("rid", "k", "g", 0, "digest", None, 2, 1.0, 31.0, phase=Phase.COMPLETED)
    fingerprint = ResponseIdentity.settled_from(b"d" * 32, b"c" * 32)
    record.members[0] = Member(0, fingerprint, None, Scored(4.0, {"m": 1.0}))
    record.members[1] = Member(1, fingerprint, None, Masked("lost", "", placeholder))
    record.terminal_time = 2.0
    return record


def test_a_masked_slot_keeps_its_reward_placeholder_through_the_codec() -> None:
    done = decode_record(encode_record(_finished_record(2.5)))
    assert done.members[1].outcome == Masked("lost", "", 2.5)
    assert done.members[0].outcome == Scored(4.0, {"m": 1.0})


# A finished record (slot 0 scored 4.0, slot 1 masked) as the codec wrote it before a masked
# slot's reward placeholder could be anything but 0.0.
_OLD_RECORD = (
    b"\xdc\x00\x14\xa3rid\xa1k\xa1g\x00\xa6digest\xc0\x02\xcb?\xf0\x00\x00\x00\x00\x00\x00"
    b"\xa9completed\xcb@?\x00\x00\x00\x00\x00\x00\x92\x95\x00\xc4 "
    + b"d" * 32
    + b"\xc4 "
    + b"c" * 32
    + b"\xc0\x94\xc2\xcb@\x10\x00\x00\x00\x00\x00\x00\xa0\xa0\x95\x01\xc4 "
    + b"d" * 32
    + b"\xc4 "
    + b"c" * 32
    + b"\xc0\x94\xc3\xcb\x00\x00\x00\x00\x00\x00\x00\x00"
    b"\xa4lost\xa0\xc0\xc0\xc0\xcb@\x00\x00\x00\x00\x00\x00\x00\xc2\x00\xc0\xc0\x81\xa1m"
    b"\xcb?\xf0\x00\x00\x00\x00\x00\x00"
)


def test_a_record_written_before_placeholders_decodes_with_zero() -> None:
    done = decode_record(_OLD_RECORD)
    assert done.members[1].outcome == Masked("lost", "", 0.0)
    assert done.members[0].outcome == Scored(4.0, {"m": 1.0})
    # The default placeholder writes the same bytes: stores shared with older servers agree.
    assert encode_record(_finished_record(0.0)) == _OLD_RECORD


def test_commands_are_framed_as_resp_arrays() -> None:
    assert encode_command(["SET", "k", b"v\r\n", 5, 1.5]) == (
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n$1\r\n5\r\n$3\r\n1.5\r\n"
    )
