"""A validated group-mode /verify request as the group state machine sees it.

An ``Arrival`` names its group, attempt and slot, carries the response's identity, and holds
the decoded values its member's scoring texts and its group's judge inputs are made from. Those
are extracted only when the state machine accepts the request as a new member (C-31), and at
most once however often a store runs the transition again; a member that arrived first also has
its group's inputs converted (C-32). Both are plain functions of the request and the
configuration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from genrm_trio.config import Config
from genrm_trio.core.identity import ResponseIdentity
from genrm_trio.core.pairs import baseline_order_digest
from genrm_trio.core.records import GroupInputs, MemberTexts
from genrm_trio.core.texts import convert_history, effective_principle, extract_scoring_text

__all__ = ["Arrival", "MemberSource", "ScoringSource"]


class ScoringSource(Protocol):
    """Where an arrival's scoring texts and its group's judge inputs come from."""

    def texts(self) -> MemberTexts:
        """The member's reasoning and answer texts; may raise (the group then fails)."""
        ...

    def inputs(self) -> GroupInputs:
        """The group's judge inputs, asked of its first member only; may raise."""
        ...


class MemberSource:
    """The decoded response and prompt of one request, turned into scoring texts and judge
    inputs when first asked (then kept), with a count of what was computed."""

    __slots__ = (
        "_baseline",
        "_config",
        "_fault",
        "_input",
        "_inputs",
        "_principle",
        "_response",
        "_texts",
        "converted",
        "extracted",
    )

    def __init__(
        self,
        response: Any,
        input_value: Any,
        principle: str | None,
        baseline: str | None,
        config: Config,
        *,
        fault: Callable[[], None] | None = None,
    ) -> None:
        """``fault``: called before the texts are extracted; it may raise (fault injection,
        I-20), and the member's group then fails as for any failed conversion."""
        self._response = response
        self._input = input_value
        self._principle = principle
        self._baseline = baseline
        self._config = config
        self._fault = fault
        self._texts: MemberTexts | None = None
        self._inputs: GroupInputs | None = None
        self.extracted = False
        self.converted = False

    def texts(self) -> MemberTexts:
        """The member's reasoning and answer texts (S-1); may raise."""
        if self._texts is None:
            if self._fault is not None:
                self._fault()
            reasoning, answer = extract_scoring_text(self._response)
            self._texts = MemberTexts(reasoning, answer)
            self.extracted = True
            self._response = None  # nothing else of the response is kept (C-30)
        return self._texts

    def inputs(self) -> GroupInputs:
        """The group's judge inputs from this member's prompt (J-7, S-51); may raise."""
        if self._inputs is None:
            config = self._config
            self.converted = True
            history = convert_history(self._input)
            principle = effective_principle(
                self._principle, config.default_principle, config.use_principle
            )
            baseline = self._baseline if config.comparison_strategy == "fixed_baseline" else None
            order = (
                baseline_order_digest(baseline, history, principle)
                if baseline is not None
                else None
            )
            self._inputs = GroupInputs(history, principle, baseline, order)
        return self._inputs


@dataclass(slots=True)
class Arrival:
    """A validated group-mode /verify request, reduced to what the state machine needs."""

    group_id: str | None
    attempt: int
    slot: int
    task_index: int | None
    prompt_id: str | None
    digest: str
    # The response's identity (C-21, C-24): a canonical fingerprint, or a ResponseIdentity
    # that holds the raw bytes until the engine settles or releases it.
    fingerprint: bytes | ResponseIdentity
    source: ScoringSource
    # Why the row is a resend of one rollout (C-99), as its masked row says; None for a row of a
    # first dispatch. Only legacy groups read it.
    resend: str | None = None
