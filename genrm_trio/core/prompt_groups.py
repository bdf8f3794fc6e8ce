"""Groups made from samples that carry only their prompt (OpenRLHF's remote reward protocol):
which group and slot each arriving sample takes. Synchronous; time is passed in.

Theory of operation. A sample names its prompt and its response text, nothing else. Samples of
one prompt fill the slots of that prompt's open group in arrival order; the N-th fills it, and
the next sample of that prompt opens a new group under a fresh id. A group is forgotten once
every slot's requester has had its answer, or when it is older than the horizon.

A client that resends a sample (OpenRLHF does after an error or its 180 s timeout) must get its
old slot back, or the group would gain a member it never had. Nothing in a sample tells a resend
from a second sample with the same text, so the rule is: a sample whose text equals that of a
slot of its prompt whose requester went away before being answered takes that slot again;
otherwise it takes a new slot. Two samples with equal texts are interchangeable, so either
reading fills the same slots with the same texts.

A group whose requests were answered with a failure (a 503 or 409) is closed: the prompt's next
sample opens a new group instead of joining one that can only fail again.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple


class Placement(NamedTuple):
    """Where one sample goes: its group id and slot."""

    group_id: str
    slot: int


@dataclass(slots=True)
class _Slot:
    text: str
    waiting: int = 1
    answered: bool = False


@dataclass(slots=True)
class _Group:
    group_id: str
    prompt_key: str
    opened_at: float
    slots: list[_Slot] = field(default_factory=list)
    closed: bool = False


class PromptGroups:
    """The open groups of every prompt, in one process."""

    def __init__(self, size: int, id_prefix: str, horizon_s: float) -> None:
        if size < 1:
            raise ValueError(f"group size {size}: expected >= 1")
        self.size = size
        self.id_prefix = id_prefix
        self.horizon_s = horizon_s
        self._opened = 0
        self._by_prompt: dict[str, list[_Group]] = {}
        self._by_id: OrderedDict[str, _Group] = OrderedDict()

    def place(self, prompt: str, text: str, now: float) -> Placement:
        """The group and slot for a sample that has just arrived."""
        self._prune(now)
        key = hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()
        groups = self._by_prompt.setdefault(key, [])
        for group in groups:
            if group.closed:
                continue
            for index, slot in enumerate(group.slots):
                if slot.text == text and slot.waiting == 0 and not slot.answered:
                    slot.waiting = 1
                    return Placement(group.group_id, index)
        open_group = next((g for g in groups if not g.closed and len(g.slots) < self.size), None)
        if open_group is None:
            open_group = _Group(f"{self.id_prefix}-{key[:12]}-{self._opened}", key, now)
            self._opened += 1
            groups.append(open_group)
            self._by_id[open_group.group_id] = open_group
        open_group.slots.append(_Slot(text))
        return Placement(open_group.group_id, len(open_group.slots) - 1)

    def release(self, placement: Placement, *, answered: bool, failed: bool = False) -> None:
        """A sample's request ended: answered (with a row, or with a failure) or gone."""
        group = self._by_id.get(placement.group_id)
        if group is None:
            return
        slot = group.slots[placement.slot]
        slot.waiting -= 1
        if answered:
            slot.answered = True
        if failed:
            group.closed = True
        if len(group.slots) == self.size and all(s.answered for s in group.slots):
            self._forget(group)

    def open_groups(self) -> int:
        return len(self._by_id)

    def _prune(self, now: float) -> None:
        # Groups are in opening order, so only the oldest ones need looking at.
        while self._by_id:
            oldest = next(iter(self._by_id.values()))
            if now - oldest.opened_at < self.horizon_s:
                return
            self._forget(oldest)

    def _forget(self, group: _Group) -> None:
        self._by_id.pop(group.group_id, None)
        groups = self._by_prompt.get(group.prompt_key)
        if groups is not None:
            groups.remove(group)
            if not groups:
                del self._by_prompt[group.prompt_key]
