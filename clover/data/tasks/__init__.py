"""Synthetic tasks: a registry from name to task class.

``get_task(name, **options)`` builds a task; options go to its constructor (e.g.
``get_task("airspace", max_notices=20)``).
"""

from __future__ import annotations

from typing import Any

from clover.data.tasks.airspace import AirspaceTask
from clover.data.tasks.base import SPLITS, Example, Task, split_of
from clover.data.tasks.copy import CopyTask
from clover.data.tasks.facts import FactLookupTask
from clover.data.tasks.joint import JointTask
from clover.data.tasks.record import RecordTask
from clover.data.tasks.rules import RuleLookupTask

TASKS: dict[str, type[Task]] = {
    AirspaceTask.name: AirspaceTask,
    JointTask.name: JointTask,
    RecordTask.name: RecordTask,
    CopyTask.name: CopyTask,
    RuleLookupTask.name: RuleLookupTask,
    FactLookupTask.name: FactLookupTask,
}
# What `clover eval` and the default mixtures use: every task but the curriculum ones.
EVAL_TASKS: tuple[str, ...] = tuple(name for name, cls in TASKS.items() if not cls.curriculum)


def task_names(names=()) -> tuple[str, ...]:
    """`names`, or every evaluated task when it is empty (what a mixture with no task list trains)."""
    return tuple(names) or EVAL_TASKS


def get_task(name: str, **options: Any) -> Task:
    """The task registered as ``name``, constructed with ``options``."""
    try:
        cls = TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known: {sorted(TASKS)}") from None
    return cls(**options)


__all__ = ["EVAL_TASKS", "TASKS", "SPLITS", "Example", "Task", "get_task", "split_of", "task_names"]
