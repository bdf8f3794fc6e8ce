"""Checks of §6 beyond a store's own ``check_invariants``, run after every scenario step.

Each check returns `Violation`s naming the invariant it guards; none of them raises.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from genrm_trio.core.outcomes import Scored
from genrm_trio.core.records import Phase, Record
from genrm_trio.core.statistics import Statistics
from genrm_trio.core.transition import Group
from genrm_trio.runtime.engine import Engine
from genrm_trio.testing.controlled_judge import ControlledJudge, JudgeCall
from genrm_trio.testing.instrument import CriticalSectionInstrument

OutcomeKind = Literal["scored", "masked", "rejected"]
# (marker group, attempt, pair): how the controlled judge tells comparisons of one group apart
CallKey = tuple[str | None, int | None, tuple[int, int] | None]

_ABS_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: its contract id, where the run was, and what was seen."""

    invariant: str
    step: str
    message: str

    def __str__(self) -> str:
        return f"[{self.invariant}] step {self.step}: {self.message}"


@dataclass(frozen=True, slots=True)
class Seen:
    """What one /verify request was answered with, whichever layer answered it."""

    kind: OutcomeKind
    status: int
    text: str = ""  # masked failure text (legacy suffix included) or the rejection detail
    reward: float | None = None
    metrics: Mapping[str, float] | None = None


@dataclass(frozen=True, slots=True)
class Expected:
    """What the model says a request must be answered with.

    When ``prefix`` is true only the beginning of ``text`` is known (a judge error cause that
    carries a library's own message); ``suffix`` is the legacy migration suffix, if any.
    """

    kind: OutcomeKind
    status: int = 200
    text: str = ""
    prefix: bool = False
    suffix: str = ""
    reward: float | None = None
    metrics: Mapping[str, float] | None = None

    def describe(self) -> str:
        if self.kind == "scored":
            return f"scored reward={self.reward!r}"
        more = "…" if self.prefix else ""
        tail = " + legacy suffix" if self.suffix else ""
        return f"{self.kind} {self.status} {self.text!r}{more}{tail}"


def describe(seen: Seen) -> str:
    if seen.kind == "scored":
        return f"scored reward={seen.reward!r}"
    return f"{seen.kind} {seen.status} {seen.text!r}"


# ---- I-2, I-3, I-5 (the registry's own check) ---------------------------------------------------


def _registry_label(message: str) -> str:
    if "waiters" in message or "texts" in message or "inputs" in message:
        return "I-3"
    if "rewards" in message:
        return "I-5"
    if "after shutdown" in message or "owned tasks" in message:
        return "I-4"
    return "I-2"


def registry_violations(engine: Engine, step: str) -> list[Violation]:
    """`Engine.check_invariants()` (I-2…I-4, I-12), reported instead of raised."""
    try:
        engine.check_invariants()
    except AssertionError as exc:
        message = str(exc) or type(exc).__name__
        return [Violation(_registry_label(message), step, message)]
    return []


def publication_violations(records: Iterable[Record], step: str) -> list[Violation]:
    """I-5, I-7: outcomes appear all at once, one per slot, finite, and never on a failed record."""
    found: list[Violation] = []
    for record in records:
        outcomes = [m.outcome for m in record.members.values()]
        published = sum(1 for outcome in outcomes if outcome is not None)
        if record.phase.active and published:
            found.append(
                Violation(
                    "I-5",
                    step,
                    f"{record.key}: {published} of {record.size} outcomes published while "
                    f"{record.phase.value}",
                )
            )
        elif record.phase is Phase.COMPLETED:
            if sorted(record.members) != list(range(record.size)) or published != record.size:
                found.append(
                    Violation(
                        "I-5",
                        step,
                        f"{record.key}: completed with outcomes for {published} of "
                        f"{record.size} slots",
                    )
                )
            for slot, outcome in sorted(record.members.items()):
                if isinstance(outcome.outcome, Scored) and not _finite(outcome.outcome):
                    found.append(
                        Violation(
                            "I-7", step, f"{record.key}: slot {slot} holds a non-finite reward"
                        )
                    )
        elif record.phase is Phase.FAILED and published:
            found.append(Violation("I-5", step, f"{record.key}: a failed record holds rewards"))
    return found


def _finite(outcome: Scored) -> bool:
    values = [outcome.reward, *(outcome.metrics or {}).values()]
    return all(math.isfinite(v) for v in values)


def retention_violations(
    groups: Iterable[Group],
    idle: Sequence[str],
    terminal: Sequence[str],
    watermarks: Mapping[str, int],
    idle_order: Sequence[str],
    terminal_order: Sequence[str],
    step: str,
) -> list[Violation]:
    """R-1…R-4: which groups keep a watermark (at which attempt), and the exact order of the
    idle order (group ids) and of the terminal index (record keys), which decides what pruning
    removes next."""
    found = []
    seen = {g.ref[2:]: g.watermark.attempt for g in groups if g.watermark is not None}
    if seen != dict(watermarks):
        found.append(Violation("R-1", step, f"watermarks {seen}, expected {dict(watermarks)}"))
    if list(idle) != list(idle_order):
        found.append(
            Violation("R-1", step, f"idle order {list(idle)}, expected {list(idle_order)}")
        )
    if list(terminal) != list(terminal_order):
        found.append(
            Violation(
                "R-1", step, f"terminal index {list(terminal)}, expected {list(terminal_order)}"
            )
        )
    return found


# ---- I-1 -------------------------------------------------------------------------------------


def instrument_violations(
    instrument: CriticalSectionInstrument, already_reported: int, step: str
) -> list[Violation]:
    """I-1: every task step that ended inside a critical section since the last check."""
    return [
        Violation("I-1", step, f"task {name!r} reached a checkpoint inside a critical section")
        for name in instrument.violations[already_reported:]
    ]


# ---- I-9 -------------------------------------------------------------------------------------


def prune_violations(
    visits_before: int, visits_after: int, removed: int, prunes: int, step: str
) -> list[Violation]:
    """I-9, R-4: pruning looks at the entries it removes plus at most one head per index."""
    visits = visits_after - visits_before
    bound = removed + 2 * prunes
    if visits > bound:
        return [
            Violation(
                "I-9",
                step,
                f"pruning visited {visits} entries to remove {removed} in {prunes} prune(s); "
                f"the bound is {bound}",
            )
        ]
    if visits < removed:
        return [Violation("I-9", step, f"prune_visits grew by {visits} but {removed} removed")]
    return []


# ---- I-21 and waiter accounting (I-4) -----------------------------------------------------------

_STATISTIC_LABELS = {
    "waiters": "I-4",
    "owned_tasks": "I-12",
    "judge_in_flight": "I-6",
}


def statistics_violations(
    actual: Statistics, expected: Mapping[str, int], step: str
) -> list[Violation]:
    """The engine's statistics() against the model's counts (prune_visits is checked apart)."""
    found = []
    for name, value in expected.items():
        seen = getattr(actual, name)
        if seen != value:
            label = _STATISTIC_LABELS.get(name, "I-21")
            found.append(Violation(label, step, f"statistics().{name} is {seen}, expected {value}"))
    return found


def waiter_violations(
    answered: Mapping[int, Seen],
    expected: Mapping[int, Expected],
    cancelled: Iterable[int],
    expected_cancelled: Iterable[int],
    step: str,
) -> list[Violation]:
    """I-4: a request is answered exactly when the model resolves it, or ends by its own
    cancellation; never left waiting, never answered early."""
    found = []
    for request in sorted(answered.keys() - expected.keys()):
        found.append(
            Violation(
                "I-4",
                step,
                f"request {request} was answered ({describe(answered[request])}) while it "
                "should still wait",
            )
        )
    for request in sorted(expected.keys() - answered.keys()):
        found.append(
            Violation(
                "I-4",
                step,
                f"request {request} is still waiting; expected {expected[request].describe()}",
            )
        )
    gone, expected_gone = set(cancelled), set(expected_cancelled)
    for request in sorted(gone ^ expected_gone):
        what = "ended by cancellation" if request in gone else "should have been cancelled"
        found.append(Violation("I-4", step, f"request {request} {what}"))
    return found


# ---- I-7, M-2 and the exact answer -----------------------------------------------------------


def outcome_violations(request: int, expected: Expected, seen: Seen, step: str) -> list[Violation]:
    """Compare one answer with the model: rewards by slot (I-7), masks (M-2), texts (§2.6)."""
    where = f"request {request}"
    if seen.kind == "scored":
        values = [seen.reward, *(seen.metrics or {}).values()]
        if any(v is None or not math.isfinite(v) for v in values):
            return [
                Violation("I-7", step, f"{where}: non-finite reward or metric {describe(seen)}")
            ]
    if {expected.kind, seen.kind} == {"scored", "masked"}:
        return [
            Violation("M-2", step, f"{where}: {describe(seen)}, expected {expected.describe()}")
        ]
    if expected.kind != seen.kind or expected.status != seen.status:
        return [
            Violation("C-43", step, f"{where}: {describe(seen)}, expected {expected.describe()}")
        ]
    if seen.kind == "scored":
        assert expected.reward is not None and seen.reward is not None
        if not math.isclose(seen.reward, expected.reward, rel_tol=0, abs_tol=_ABS_TOLERANCE):
            return [
                Violation(
                    "I-7",
                    step,
                    f"{where}: reward {seen.reward!r}, expected {expected.reward!r} for its slot",
                )
            ]
        return _metric_violations(where, expected.metrics or {}, seen.metrics or {}, step)
    if not _text_matches(expected, seen.text):
        label = "M-5" if seen.kind == "masked" else "C-43"
        return [
            Violation(label, step, f"{where}: {describe(seen)}, expected {expected.describe()}")
        ]
    return []


def _text_matches(expected: Expected, text: str) -> bool:
    if expected.suffix:
        if not text.endswith(expected.suffix):
            return False
        text = text[: len(text) - len(expected.suffix)]
    if expected.prefix:
        return text.startswith(expected.text)
    return text == expected.text


def _metric_violations(
    where: str, expected: Mapping[str, float], seen: Mapping[str, float], step: str
) -> list[Violation]:
    found = []
    for name, value in expected.items():
        got = seen.get(name)
        if got is None or not math.isclose(got, value, rel_tol=0, abs_tol=_ABS_TOLERANCE):
            found.append(Violation("M-6", step, f"{where}: {name} is {got!r}, expected {value!r}"))
    return found


# ---- I-6 -------------------------------------------------------------------------------------


class JudgeLedger:
    """Counts the controlled judge's calls per (group, attempt, pair) as they arrive."""

    def __init__(self) -> None:
        self.counts: Counter[CallKey] = Counter()
        self._consumed = 0

    def update(self, judge: ControlledJudge) -> set[CallKey]:
        """Take in the calls made since the last update; returns the keys that changed."""
        calls: list[JudgeCall] = judge.calls
        changed = set()
        for call in calls[self._consumed :]:
            key = (call.group, call.attempt, call.pair)
            self.counts[key] += 1
            changed.add(key)
        self._consumed = len(calls)
        return changed


def judge_call_violations(
    observed: Mapping[CallKey, int],
    expected: Mapping[CallKey, int],
    keys: Iterable[CallKey],
    step: str,
) -> list[Violation]:
    """I-6: exactly the attempts each required comparison used; none for anything else."""
    found = []
    for key in sorted(keys, key=repr):
        seen, wanted = observed.get(key, 0), expected.get(key, 0)
        if seen != wanted:
            group, attempt, pair = key
            found.append(
                Violation(
                    "I-6",
                    step,
                    f"judge calls for group {group!r} attempt {attempt} pair {pair}: {seen}, "
                    f"expected {wanted}",
                )
            )
    return found


def in_flight_violations(judge: ControlledJudge, expected: int, step: str) -> list[Violation]:
    """I-6: judge calls still running are exactly those of comparisons still being judged."""
    in_flight = judge.in_flight
    if in_flight != expected:
        return [Violation("I-6", step, f"{in_flight} judge calls in flight, expected {expected}")]
    return []
