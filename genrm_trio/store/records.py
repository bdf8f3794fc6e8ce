"""How group records, watermarks and their store bookkeeping are written to a shared store.

A record is the core's ``Record`` as msgpack: fingerprints (the raw-bytes digest and the
canonical fingerprint of C-21), compact scoring texts while active, per-slot outcomes (a masked
slot's with its reward placeholder), the failure, and the store's own fields (``StoreMeta``:
the record's id, the evaluation lease and its fencing token, the deadlines in the store's
clock). Waiters and bodies are never written: they stay in the process that holds the request.
The comparison plan is not written either; it follows from the configuration and the group's
inputs.
"""

from __future__ import annotations

import msgspec

from genrm_trio.core.groups import (
    Failure,
    FailureKind,
    GroupInputs,
    Masked,
    Member,
    MemberTexts,
    Phase,
    Record,
    Scored,
    StoreMeta,
    Watermark,
)
from genrm_trio.core.identity import ResponseIdentity


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


class _Watermark(msgspec.Struct, array_like=True):
    attempt: int
    digest: str
    idle_since: float | None


_encoder = msgspec.msgpack.Encoder()
_record_decoder = msgspec.msgpack.Decoder(_Record)
_watermark_decoder = msgspec.msgpack.Decoder(_Watermark)


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
    meta = record.meta
    assert meta is not None, "a stored record carries its StoreMeta"
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
            rid=meta.rid,
            key=record.key,
            group_id=record.group_id,
            attempt=record.attempt,
            digest=record.digest,
            legacy_key=record.legacy_key,
            size=record.size,
            started_at=record.started_at,
            phase=record.phase.value,
            collection_due=meta.collection_due,
            members=members,
            inputs=_Inputs(*inputs) if inputs is not None else None,
            failure_kind=record.failure.kind.value if record.failure else None,
            failure_text=record.failure.text if record.failure else None,
            terminal_time=record.terminal_time,
            legacy_resend=record.legacy_resend,
            fence=meta.fence,
            lease_until=meta.lease_until,
            evaluation_due=meta.evaluation_due,
            metrics=metrics,
        )
    )


def decode_record(data: bytes) -> Record:
    stored = _record_decoder.decode(data)
    # The fields in the order Record declares them.
    record = Record(
        stored.key,
        stored.group_id,
        stored.attempt,
        stored.digest,
        stored.legacy_key,
        stored.size,
        stored.started_at,
        Phase(stored.phase),
    )
    for member in stored.members:
        record.members[member.slot] = Member(
            member.slot,
            ResponseIdentity.settled_from(member.digest, member.canonical),
            MemberTexts(*member.texts) if member.texts is not None else None,
            [],
            _decode_outcome(member.outcome, stored.metrics),
        )
    if stored.inputs is not None:
        i = stored.inputs
        record.inputs = GroupInputs(i.history, i.principle, i.baseline, i.baseline_digest)
    if stored.failure_kind is not None:
        record.failure = Failure(FailureKind(stored.failure_kind), stored.failure_text or "")
    record.terminal_time = stored.terminal_time
    record.legacy_resend = stored.legacy_resend
    record.meta = StoreMeta(
        stored.rid,
        stored.collection_due,
        stored.fence,
        stored.lease_until,
        stored.evaluation_due,
    )
    return record


def encode_watermark(mark: Watermark, idle_since: float | None) -> bytes:
    return _encoder.encode(_Watermark(mark.attempt, mark.digest, idle_since))


def decode_watermark(data: bytes) -> tuple[Watermark, float | None]:
    stored = _watermark_decoder.decode(data)
    return Watermark(stored.attempt, stored.digest), stored.idle_since
