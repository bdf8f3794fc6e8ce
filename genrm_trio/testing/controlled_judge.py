"""A fake judge whose calls a test holds, releases, fails or delays, one group or pair at a time.

Verdicts and fault replies come from `FakeJudge`; controls only decide when a call is answered
and, when they say so, with which fault.

A call is told apart by markers in the answer texts it carries: ``answer-<i>`` names the slot
(as in §10's ``member(i)``) and ``[[group=<g>:<a>]]`` names the group and attempt (see
`group_marker`). Selectors match on these: ``judge.hold(group="g", pair=(0, 1))``.

Controls are consulted in the order they were added; the first that matches a new call and
has uses left decides it:

- ``hold``: the call waits until ``release`` answers it (normally, or with a fault);
- ``delay``: the call is answered after ``seconds`` of Trio time;
- ``fail``: the call is answered with a fake-judge action (``http_status``, ``close``,
  ``truncated_body``, ``non_json``, ``budget_exhausted``, ``hang``, ``text`` …).

Calls no control matches get the fake judge's own reply (its rules, faults and verdicts).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from itertools import product
from typing import Any, Literal

import trio

from genrm_trio.fakes.judge import FakeJudge
from genrm_trio.fakes.judge_http import observe_until
from genrm_trio.fakes.memory_transport import MemoryTransport
from genrm_trio.judge.transport import (
    JudgeEndpoint,
    JudgeReply,
    JudgeTransport,
    TransportFactory,
    TransportStatistics,
)

__all__ = ["CallState", "Control", "ControlledJudge", "JudgeCall", "group_marker"]

CallState = Literal["arrived", "held", "delayed", "answering", "answered", "cancelled"]
Effect = Literal["hold", "delay", "fail"]

_SLOT = re.compile(r"answer-(\d+)(?!\d)")
_GROUP = re.compile(r"\[\[group=([^\]]*)\]\]")


def group_marker(group: str, attempt: int) -> str:
    """The text to put in an answer so the judge can tell which group attempt a call is for."""
    return f"[[group={group}:{attempt}]]"


def _parse_group(text: str) -> tuple[str | None, int | None]:
    found = _GROUP.search(text)
    if found is None:
        return None, None
    name, _, attempt = found.group(1).rpartition(":")
    if name and attempt.isdigit():
        return name, int(attempt)
    return found.group(1), None


def _parse_slot(text: str) -> int | None:
    found = _SLOT.search(text)
    return int(found.group(1)) if found else None


@dataclass(eq=False)
class JudgeCall:
    """One HTTP request the server made to the judge, and what became of it."""

    number: int
    api: str
    response_1: str
    response_2: str
    group: str | None
    attempt: int | None
    pair: tuple[int, int] | None
    arrived_at: float
    state: CallState = "arrived"
    action: str | None = None  # the fault a control answered it with; None for the fake's own
    ended_at: float | None = None
    _released: trio.Event = field(default_factory=trio.Event, repr=False)
    _forced: tuple[str, FakeJudge] | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class _Selector:
    group: str | None = None
    attempt: int | None = None
    pair: tuple[int, int] | None = None
    match: Callable[[JudgeCall], bool] | None = None

    def matches(self, call: JudgeCall) -> bool:
        return (
            (self.group is None or call.group == self.group)
            and (self.attempt is None or call.attempt == self.attempt)
            and (self.pair is None or call.pair == self.pair)
            and (self.match is None or self.match(call))
        )

    @property
    def bucket(self) -> tuple[str | None, int | None, tuple[int, int] | None]:
        return self.group, self.attempt, self.pair


@dataclass(eq=False)
class Control:
    """One standing instruction for future calls; `remove()` withdraws it."""

    effect: Effect
    selector: _Selector
    sequence: int
    times: int | None
    seconds: float = 0.0
    action: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    used: int = 0
    _owner: ControlledJudge | None = field(default=None, repr=False)
    _answers: FakeJudge | None = field(default=None, repr=False)  # the fake that fails calls

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.used >= self.times

    def remove(self) -> None:
        if self._owner is not None:
            self._owner._forget(self)
            self._owner = None


class ControlledJudge(FakeJudge):
    """A `FakeJudge` whose calls can be held, released, failed or delayed per group and pair.

    Takes the same keyword arguments as `FakeJudge`. Use `transport()` as the server's
    ``judge_transport`` (a judge transport in memory, see fakes/memory_transport.py); `calls`
    lists every call with its state.
    """

    def __init__(self, **fake_judge_options: Any) -> None:
        super().__init__(**fake_judge_options)
        self._options = fake_judge_options
        self._buckets: dict[tuple[Any, Any, Any], list[Control]] = {}
        self._sequence = 0
        self._fault_judges: dict[str, FakeJudge] = {}
        self._calls: list[JudgeCall] = []
        self._counts: dict[str, int] = {"requests_total": 0, "in_flight": 0, "cancelled": 0}
        self._max_in_flight = 0

    # ---- controls ------------------------------------------------------------------------

    def hold(
        self,
        *,
        group: str | None = None,
        attempt: int | None = None,
        pair: tuple[int, int] | None = None,
        match: Callable[[JudgeCall], bool] | None = None,
        times: int | None = None,
    ) -> Control:
        """Hold matching calls until `release`; the server's own deadlines still apply."""
        return self._add("hold", _Selector(group, attempt, pair, match), times)

    def delay(
        self,
        seconds: float,
        *,
        group: str | None = None,
        attempt: int | None = None,
        pair: tuple[int, int] | None = None,
        match: Callable[[JudgeCall], bool] | None = None,
        times: int | None = None,
    ) -> Control:
        """Answer matching calls after `seconds` of Trio time (instant under a mock clock)."""
        if not seconds >= 0:
            raise ValueError(f"delay must be a number of seconds >= 0, got {seconds!r}")
        control = self._add("delay", _Selector(group, attempt, pair, match), times)
        control.seconds = float(seconds)
        return control

    def fail(
        self,
        action: str,
        *,
        group: str | None = None,
        attempt: int | None = None,
        pair: tuple[int, int] | None = None,
        match: Callable[[JudgeCall], bool] | None = None,
        times: int | None = None,
        **fields: Any,
    ) -> Control:
        """Answer matching calls with a fake-judge action, e.g.
        ``fail("http_status", pair=(0, 1), status=500)`` or ``fail("close", times=1)``."""
        answers = self._fault_judge(action, fields)  # rejects a bad action or fields now
        control = self._add("fail", _Selector(group, attempt, pair, match), times)
        control.action = action
        control.fields = dict(fields)
        control._answers = answers
        return control

    def release(
        self,
        *,
        group: str | None = None,
        attempt: int | None = None,
        pair: tuple[int, int] | None = None,
        match: Callable[[JudgeCall], bool] | None = None,
        action: str | None = None,
        **fields: Any,
    ) -> int:
        """Answer the held calls that match, normally or with ``action``; returns how many.

        Standing ``hold`` controls stay: a later call (a retry) is held again unless the
        control's ``times`` ran out or it was removed.
        """
        forced = None
        if action is not None:
            forced = (action, self._fault_judge(action, fields))
        selector = _Selector(group, attempt, pair, match)
        released = 0
        for call in self._calls:
            if call.state == "held" and not call._released.is_set() and selector.matches(call):
                call._forced = forced
                call._released.set()
                released += 1
        return released

    def clear(self) -> None:
        """Withdraw every control; calls already held stay held until released."""
        for controls in self._buckets.values():
            for control in controls:
                control._owner = None
        self._buckets.clear()

    def controls(self) -> list[Control]:
        return sorted(
            (c for controls in self._buckets.values() for c in controls),
            key=lambda c: c.sequence,
        )

    def _add(self, effect: Effect, selector: _Selector, times: int | None) -> Control:
        if times is not None and times < 0:
            raise ValueError(f"times must be >= 0 or None, got {times!r}")
        self._sequence += 1
        control = Control(effect, selector, self._sequence, times, _owner=self)
        self._buckets.setdefault(selector.bucket, []).append(control)
        return control

    def _forget(self, control: Control) -> None:
        controls = self._buckets.get(control.selector.bucket)
        if controls is not None and control in controls:
            controls.remove(control)
            if not controls:
                del self._buckets[control.selector.bucket]

    def _control_for(self, call: JudgeCall) -> Control | None:
        """The earliest-added control that applies to this call, with one use taken."""
        best: Control | None = None
        buckets = dict.fromkeys(
            product((call.group, None), (call.attempt, None), (call.pair, None))
        )
        for bucket in buckets:
            for control in self._buckets.get(bucket, ()):
                if best is not None and control.sequence > best.sequence:
                    break
                if not control.exhausted and control.selector.matches(call):
                    best = control
                    break
        if best is not None:
            best.used += 1
            if best.exhausted:
                best.remove()
        return best

    def _fault_judge(self, action: str, fields: Mapping[str, Any]) -> FakeJudge:
        """A fake judge that answers every call with this action (built once per action)."""
        key = json.dumps([action, fields], sort_keys=True, default=repr)
        judge = self._fault_judges.get(key)
        if judge is None:
            options = {
                k: v
                for k, v in self._options.items()
                if k not in ("rules", "latency", "fault_rates")
            }
            judge = FakeJudge(**options, rules=[{"action": action, **fields}])
            self._fault_judges[key] = judge
        return judge

    # ---- observation -----------------------------------------------------------------------

    @property
    def calls(self) -> list[JudgeCall]:
        """Every call so far, oldest first (the list grows; do not modify it)."""
        return self._calls

    def matching(
        self,
        *,
        group: str | None = None,
        attempt: int | None = None,
        pair: tuple[int, int] | None = None,
        match: Callable[[JudgeCall], bool] | None = None,
        state: CallState | None = None,
    ) -> list[JudgeCall]:
        selector = _Selector(group, attempt, pair, match)
        return [
            c for c in self._calls if selector.matches(c) and (state is None or c.state == state)
        ]

    @property
    def in_flight(self) -> int:
        """Calls the server is still waiting on (held, delayed or being answered)."""
        return self._counts["in_flight"]

    def held(self, **selector: Any) -> list[JudgeCall]:
        """The calls waiting for `release` now."""
        return self.matching(state="held", **selector)

    async def wait_for_calls(
        self,
        count: int = 1,
        *,
        group: str | None = None,
        attempt: int | None = None,
        pair: tuple[int, int] | None = None,
        match: Callable[[JudgeCall], bool] | None = None,
        state: CallState | None = None,
    ) -> list[JudgeCall]:
        """Wait until at least `count` matching calls exist (in `state`, if given)."""
        probe = partial(
            self.matching, group=group, attempt=attempt, pair=pair, match=match, state=state
        )
        return await observe_until(self, probe, lambda found: len(found) >= count)

    def stats(self) -> dict[str, Any]:
        """FakeJudge's statistics over every call, held ones included, plus ``held``."""
        by_action: dict[str, int] = dict(super().stats()["by_action"])
        for judge in self._fault_judges.values():
            for action, count in judge.stats()["by_action"].items():
                by_action[action] = by_action.get(action, 0) + count
        by_api: dict[str, int] = {}
        for call in self._calls:
            by_api[call.api] = by_api.get(call.api, 0) + 1
        return {
            "requests_total": self._counts["requests_total"],
            "by_api": by_api,
            "by_action": by_action,
            "in_flight": self._counts["in_flight"],
            "max_in_flight": self._max_in_flight,
            "cancelled": self._counts["cancelled"],
            "held": sum(1 for c in self._calls if c.state == "held"),
        }

    def reset(self) -> None:
        """Zero the counters and forget past calls; controls and held calls stay."""
        self._calls = [c for c in self._calls if c.state in ("held", "delayed", "answering")]
        self._counts["requests_total"] = 0
        self._counts["cancelled"] = 0
        self._max_in_flight = self._counts["in_flight"]
        for judge in self._fault_judges.values():
            judge.reset()
        super().reset()

    def transport(self) -> TransportFactory:
        return partial(_ControlledTransport, self)

    # ---- serving -------------------------------------------------------------------------

    def _arrive(self, target: str, body: bytes) -> JudgeCall:
        api = "responses" if target.partition("?")[0].endswith("/responses") else "chat_completions"
        text_1, text_2 = _response_texts(body)
        slot_1, slot_2 = _parse_slot(text_1), _parse_slot(text_2)
        group, attempt = _parse_group(text_1)
        if group is None:
            group, attempt = _parse_group(text_2)
        call = JudgeCall(
            number=self._counts["requests_total"],
            api=api,
            response_1=text_1,
            response_2=text_2,
            group=group,
            attempt=attempt,
            pair=(slot_1, slot_2) if slot_1 is not None and slot_2 is not None else None,
            arrived_at=trio.current_time(),
        )
        self._calls.append(call)
        self._counts["requests_total"] += 1
        self._counts["in_flight"] += 1
        self._max_in_flight = max(self._max_in_flight, self._counts["in_flight"])
        return call

    def _set_state(self, call: JudgeCall, state: CallState) -> None:
        call.state = state
        self._notify()

    async def _serve(self, memory: MemoryTransport, body: bytes) -> JudgeReply:
        call = self._arrive(memory.target, body)
        try:
            control = self._control_for(call)
            forced: tuple[str, FakeJudge] | None = None
            if control is not None and control.effect == "hold":
                self._set_state(call, "held")
                await call._released.wait()
                forced = call._forced
            elif control is not None and control.effect == "delay":
                self._set_state(call, "delayed")
                await trio.sleep(control.seconds)
            elif control is not None:
                assert control.action is not None and control._answers is not None
                forced = (control.action, control._answers)
            self._set_state(call, "answering")
            answers: FakeJudge = self
            if forced is not None:
                call.action, answers = forced
            reply = await memory.serve(answers, body)
        except trio.Cancelled:
            self._counts["cancelled"] += 1
            self._end(call, "cancelled")
            raise
        except BaseException:
            # A broken connection (close, truncated body) is the judge's answer too.
            self._end(call, "answered")
            raise
        self._end(call, "answered")
        return reply

    def _end(self, call: JudgeCall, state: CallState) -> None:
        call.ended_at = trio.current_time()
        self._counts["in_flight"] -= 1
        self._set_state(call, state)


class _ControlledTransport(JudgeTransport):
    """The in-memory transport with the controls consulted before the fake judge answers."""

    def __init__(self, judge: ControlledJudge, endpoint: JudgeEndpoint) -> None:
        self.judge = judge
        self._memory = MemoryTransport(judge, endpoint)

    async def send(self, body: bytes) -> JudgeReply:
        if self._memory.closed:
            raise RuntimeError("the judge transport has been closed")
        return await self.judge._serve(self._memory, body)

    async def aclose(self) -> None:
        await self._memory.aclose()

    def statistics(self) -> TransportStatistics:
        return self._memory.statistics()


def _response_texts(body: bytes) -> tuple[str, str]:
    """response_1 and response_2 of a chat or responses request ("" when not found)."""
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return "", ""
    if not isinstance(value, dict):
        return "", ""
    messages = value.get("messages")
    if isinstance(messages, list) and len(messages) >= 2:
        return _text(messages[-2]), _text(messages[-1])
    metadata = value.get("metadata")
    if isinstance(metadata, dict):
        return str(metadata.get("response_1", "")), str(metadata.get("response_2", ""))
    return "", ""


def _text(message: Any) -> str:
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        return str(message["content"])
    return ""
