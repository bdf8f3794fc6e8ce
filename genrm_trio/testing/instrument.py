"""A Trio instrument that proves critical sections never checkpoint (I-1, I-23).

Install it with `trio.lowlevel.add_instrument`; any task step that ends while a critical section
is open is recorded as a violation with the task's name.
"""

from __future__ import annotations

import trio

from genrm_trio.core.critical import inside_critical_section


class CriticalSectionInstrument(trio.abc.Instrument):
    """Records every task step that ends inside a critical section."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self.steps = 0

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1
        if inside_critical_section():
            self.violations.append(task.name)
