"""How group records, watermarks and ended records are written to a shared store.

A record is the core's ``Record`` as msgpack: fingerprints (the raw-bytes digest and the
canonical fingerprint of C-21), compact scoring texts while active, per-slot outcomes (a masked
slot's with its reward placeholder), the failure, its id, the evaluation's fencing token and
lease, and its deadlines in the store's clock. Waiters and bodies are never written: they stay
in the process that holds the request. The comparison plan is not written either; it follows
from the configuration and the group's inputs. An ended record is written apart for the waiters
of other processes (``encode_ended``): only each slot's answer.
"""

from __future__ import annotations

import msgspec

from genrm_trio.core.identity import ResponseIdentity
from genrm_trio.core.outcomes import Ended, Masked, Rejected, Scored
from genrm_trio.core.records import (
    Failure,
    FailureKind,
    GroupInputs,
    Member,
    MemberTexts,
    Phase,
    Record,
    Watermark,
)

__all__ = [
    "decode_ended",
    "decode_record",
    "decode_watermark",
    "encode_ended",
    "encode_record",
    "encode_watermark",
]


class _Outcome(msgspec.Struct, array_like=True, omit_defaults=True):
    masked: bool
    # A scored slot's reward, or a masked slot's placeholder (W-33); records written before
    # the placeholder was configurable hold 0.0 here, which is what their rows carried.
    reward: float = 0.0
    text: str = ""
    suffix: str = ""


class _Member(msgspec.Struct, array_like=True, omit_defaults=True):
    slot: int
    digest: bytes | None
    canonical: bytes
    texts: tuple[str, str] | None = None
    outcome: _Outcome | None = None


class _Inputs(msgspec.Struct, array_like=True):
    history: list[dict[str, str]]
    principle: str | None
    baseline: str | None
    baseline_digest: str | None


class _Record(msgspec.Struct, array_like=True, omit_defaults=True):
    rid: str
    key: str
    group_id: str | None
    attempt: int
    digest: str
    legacy_key: str | None
    size: int
    started_at: float
    phase: str
    collection_due: float
    members: list[_Member] = []
    inputs: _Inputs | None = None
    failure_kind: str | None = None
    failure_text: str | None = None
    terminal_time: float | None = None
    legacy_resend: bool = False
    fence: int = 0
    lease_until: float | None = None
    evaluation_due: float | None = None
    # The group metrics, the same on every scored row (W-35), kept once per record.
    metrics: dict[str, float] | None = None


class _Ended(msgspec.Struct, array_like=True, omit_defaults=True):
    rid: str
    outcomes: dict[int, _Outcome] = {}
    metrics: dict[str, float] | None = None
    # A failed record's one answer: a masked row, or a rejection with this status.
    failure: _Outcome | None = None
    failure_status: int = 0


class _Watermark(msgspec.Struct, array_like=True):
    attempt: int
    digest: str
    idle_since: float | None


_encoder = msgspec.msgpack.Encoder()
_record_decoder = msgspec.msgpack.Decoder(_Record)
_watermark_decoder = msgspec.msgpack.Decoder(_Watermark)
_ended_decoder = msgspec.msgpack.Decoder(_Ended)


def _fingerprints(fingerprint: bytes | ResponseIdentity) -> tuple[bytes | None, bytes]:
    if isinstance(fingerprint, bytes):
        return None, fingerprint
    return fingerprint.digest(), fingerprint.canonical()


def _encode_outcome(outcome: Scored | Masked | None) -> _Outcome | None:
    if outcome is None:
        return None
    if isinstance(outcome, Masked):
        return _Outcome(True, reward=outcome.placeholder, text=outcome.text, suffix=outcome.suffix)
    return _Outcome(False, reward=outcome.reward)


def _decode_outcome(
    stored: _Outcome | None, metrics: dict[str, float] | None
) -> Scored | Masked | None:
    if stored is None:
        return None
    if stored.masked:
        return Masked(stored.text, stored.suffix, stored.reward)
    return Scored(stored.reward, metrics)


def encode_record(record: Record) -> bytes:
    members = []
    metrics: dict[str, float] | None = None
    for slot in sorted(record.members):
        member = record.members[slot]
        digest, canonical = _fingerprints(member.fingerprint)
        texts = (member.texts.reasoning, member.texts.answer) if member.texts else None
        if isinstance(member.outcome, Scored) and member.outcome.metrics is not None:
            metrics = dict(member.outcome.metrics)
        members.append(_Member(slot, digest, canonical, texts, _encode_outcome(member.outcome)))
    inputs = record.inputs
    return _encoder.encode(
        _Record(
            rid=record.rid,
            key=record.key,
            group_id=record.group_id,
            attempt=record.attempt,
            digest=record.digest,
            legacy_key=record.legacy_key,
            size=record.size,
            started_at=record.started_at,
            phase=record.phase.value,
            collection_due=record.collection_due,
            members=members,
            inputs=_Inputs(*inputs) if inputs is not None else None,
            failure_kind=record.failure.kind.value if record.failure else None,
            failure_text=record.failure.text if record.failure else None,
            terminal_time=record.terminal_time,
            legacy_resend=record.legacy_resend,
            fence=record.fence,
            lease_until=record.lease_until,
            evaluation_due=record.evaluation_due,
            metrics=metrics,
        )
    )


def decode_record(data: bytes) -> Record:
    stored = _record_decoder.decode(data)
    record = Record(
        rid=stored.rid,
        key=stored.key,
        group_id=stored.group_id,
        attempt=stored.attempt,
        digest=stored.digest,
        legacy_key=stored.legacy_key,
        size=stored.size,
        started_at=stored.started_at,
        collection_due=stored.collection_due,
        phase=Phase(stored.phase),
        fence=stored.fence,
        lease_until=stored.lease_until,
        evaluation_due=stored.evaluation_due,
    )
    for member in stored.members:
        record.members[member.slot] = Member(
            member.slot,
            ResponseIdentity.settled_from(member.digest, member.canonical),
            MemberTexts(*member.texts) if member.texts is not None else None,
            _decode_outcome(member.outcome, stored.metrics),
        )
    if stored.inputs is not None:
        i = stored.inputs
        record.inputs = GroupInputs(i.history, i.principle, i.baseline, i.baseline_digest)
    if stored.failure_kind is not None:
        record.failure = Failure(FailureKind(stored.failure_kind), stored.failure_text or "")
    record.terminal_time = stored.terminal_time
    record.legacy_resend = stored.legacy_resend
    return record


def encode_ended(ended: Ended) -> bytes:
    failure = ended.failure
    metrics: dict[str, float] | None = None
    outcomes: dict[int, _Outcome] = {}
    for slot, outcome in ended.outcomes.items():
        if isinstance(outcome, Scored) and outcome.metrics is not None:
            metrics = dict(outcome.metrics)
        stored = _encode_outcome(outcome)
        assert stored is not None
        outcomes[slot] = stored
    if isinstance(failure, Rejected):
        stored_failure = _Outcome(False, text=failure.detail)
        return _encoder.encode(
            _Ended(ended.rid, failure=stored_failure, failure_status=failure.status)
        )
    return _encoder.encode(
        _Ended(ended.rid, outcomes, metrics, _encode_outcome(failure) if failure else None)
    )


def decode_ended(data: bytes) -> Ended:
    stored = _ended_decoder.decode(data)
    failure: Scored | Masked | Rejected | None = None
    if stored.failure is not None:
        if stored.failure_status:
            failure = Rejected(stored.failure_status, stored.failure.text)
        else:
            failure = _decode_outcome(stored.failure, None)
    outcomes: dict[int, Scored | Masked] = {}
    for slot, outcome in stored.outcomes.items():
        decoded = _decode_outcome(outcome, stored.metrics)
        assert decoded is not None
        outcomes[slot] = decoded
    return Ended(stored.rid, outcomes, failure)


def encode_watermark(mark: Watermark, idle_since: float | None) -> bytes:
    return _encoder.encode(_Watermark(mark.attempt, mark.digest, idle_since))


def decode_watermark(data: bytes) -> tuple[Watermark, float | None]:
    stored = _watermark_decoder.decode(data)
    return Watermark(stored.attempt, stored.digest), stored.idle_since
