"""What the race harness's model keeps of groups: records, members and comparisons."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from genrm_trio.testing._invariants import Expected

__all__ = ["ModelComparison", "ModelMember", "ModelRecord", "Verdict"]

Verdict = tuple[float, float, float]


@dataclass(eq=False)
class ModelComparison:
    index: int
    first: int
    second: int
    judge_pass: int
    state: Literal["idle", "running", "held", "hang", "done", "cancelled"] = "idle"
    outcomes: list[str] = field(default_factory=list)  # attempt classes so far
    deadline: float = math.inf  # when a held or hanging attempt times out
    verdict: Verdict | None = None
    failure: str | None = None  # the judge error text, or its known beginning


@dataclass(eq=False)
class ModelMember:
    slot: int
    identity: tuple[str, int, int, int, int]
    quality: int
    waiters: list[int]
    outcome: Expected | None = None


@dataclass(eq=False)
class ModelRecord:
    key: str
    group: str | None  # explicit group id
    marker: str
    attempt: int
    digest: str
    legacy_key: str | None
    started_at: float
    phase: Literal["collecting", "evaluating", "completed", "failed"] = "collecting"
    members: dict[int, ModelMember] = field(default_factory=dict)
    comparisons: list[ModelComparison] = field(default_factory=list)
    evaluation_started: float = math.inf
    failure: Expected | None = None
    owner: int | None = None  # shared mode: the engine that claimed the evaluation
    orphaned: bool = False  # shared mode: its owner died; the group waits for its lease

    @property
    def active(self) -> bool:
        return self.phase in ("collecting", "evaluating")
