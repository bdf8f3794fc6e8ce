"""The state machine's tests' own store in miniature: groups by ref, each transition applied at
a time the test gives, every group checked after every transition."""

from __future__ import annotations

from typing import Any

from genrm_trio.config import config_from_mapping
from genrm_trio.core.arrivals import Arrival
from genrm_trio.core.invariants import check_group
from genrm_trio.core.outcomes import Ended, Outcome
from genrm_trio.core.ownership import Tenure
from genrm_trio.core.records import GroupInputs, MemberTexts, Record, group_key
from genrm_trio.core.transition import Arrive, Decision, Event, Group, Rules, Wait, transition

BASE = {"judge_base_url": "http://judge/v1", "judge_model": "m"}


class Source:
    """Scoring texts ``answer-<slot>``; a fixed one-turn history."""

    def __init__(self, slot: int, fail: bool = False) -> None:
        self.slot = slot
        self.fail = fail

    def texts(self) -> MemberTexts:
        if self.fail:
            raise RuntimeError("bad request conversion")
        return MemberTexts("", f"answer-{self.slot}")

    def inputs(self) -> GroupInputs:
        return GroupInputs([{"role": "user", "content": "q"}], None, None, None)


def arrival(
    slot: int,
    g: str | None = "g",
    a: int = 0,
    *,
    fp: bytes | None = None,
    digest: str = "d",
    task: int | None = None,
    fail: bool = False,
    resend: str | None = None,
) -> Arrival:
    return Arrival(
        group_id=g,
        attempt=a,
        slot=slot,
        task_index=task,
        prompt_id=None,
        digest=digest,
        fingerprint=fp if fp is not None else bytes([slot]) * 32,
        source=Source(slot, fail),
        resend=resend,
    )


def ref_of(item: Arrival) -> str:
    if item.group_id is not None:
        return f"e:{item.group_id}"
    return "l:" + group_key(None, item.attempt, item.task_index, item.prompt_id, item.digest)


class Groups:
    """Groups by ref under one configuration and tenure (no lease unless ``lease_s``)."""

    def __init__(self, lease_s: float | None = None, **overrides: Any) -> None:
        values = {**BASE, "num_rollouts_per_prompt": 2, "cohort_result_ttl_s": 10.0, **overrides}
        self.rules = Rules(config_from_mapping(values), Tenure(lease_s))
        self.groups: dict[str, Group] = {}
        self.ended: dict[str, Ended] = {}
        self._count = 0

    @property
    def size(self) -> int:
        return self.rules.config.num_rollouts_per_prompt

    def send(self, ref: str, event: Event, now: float = 0.0) -> Decision:
        group = self.groups.setdefault(ref, Group(ref))
        self._count += 1
        decision = transition(group, event, now=now, rules=self.rules, rid=f"r{self._count}")
        check_group(group)
        for finished in decision.finished:
            self.ended[finished.ended.rid] = finished.ended
        return decision

    def arrive(self, *items: Arrival, now: float = 0.0, hand_over: int | None = None) -> Decision:
        return self.send(ref_of(items[0]), Arrive(items, hand_over), now)

    def record(self, ref: str = "e:g") -> Record:
        record = self.groups[ref].record
        assert record is not None
        return record

    def answer(self, decision: Decision, index: int = 0) -> Outcome | None:
        """What request ``index`` of ``decision`` was (or is now) answered with: its answer,
        or its record's end; None while it waits."""
        reply = decision.replies[index]
        if isinstance(reply, Wait):
            ended = self.ended.get(reply.rid)
            return None if ended is None else ended.outcome(reply.slot)
        return reply.outcome
