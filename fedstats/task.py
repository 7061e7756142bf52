"""What a site task is: a named handler with a reply schema declared from the request."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from fedstats.disclosure import DisclosurePolicy
from fedstats.errors import StudyConfigurationError
from fedstats.schema import ReplySchema


@dataclass
class SiteContext:
    """What a task handler may use: the site's own frame, policy and cache.

    Only :class:`~fedstats.silo.Silo` builds a context; handlers never see
    another site's context nor the coordinator.
    """

    name: str
    frame: pd.DataFrame
    policy: DisclosurePolicy
    cache: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskReply:
    """A handler's answer before the silo checks it.

    ``contributors`` is the number of patients behind the aggregate, checked
    against the site's disclosure threshold; ``None`` marks a reply that
    aggregates nothing about patients (e.g. an acknowledgement).
    """

    payload: dict[str, Any]
    contributors: int | None


@dataclass(frozen=True)
class Task:
    """A named site task.

    ``schema`` maps the request's arguments, never the site's data, to the
    exact fields and sizes of the reply.
    """

    name: str
    handler: Callable[[SiteContext, dict[str, Any]], TaskReply]
    schema: Callable[[dict[str, Any]], ReplySchema]
    description: str


class TaskRegistry:
    """The set of tasks a silo answers, routed by name."""

    def __init__(self, tasks: list[Task] | None = None) -> None:
        self._tasks: dict[str, Task] = {}
        for task in tasks or []:
            self.add(task)

    def add(self, task: Task) -> None:
        if task.name in self._tasks:
            raise StudyConfigurationError(f"task {task.name!r} is registered twice")
        self._tasks[task.name] = task

    def get(self, name: str) -> Task | None:
        return self._tasks.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())

    def names(self) -> list[str]:
        return sorted(self._tasks)
