"""What a site task is: a named handler with a reply schema declared from the request."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from fedstats.errors import StudyConfigurationError
from fedstats.schema import ReplySchema
from fedstats.site.disclosure import DisclosurePolicy


@dataclass
class SiteContext:
    """What a task handler may use: the site's own frame, policy and cache.

    Only :class:`~fedstats.site.silo.Silo` builds a context; handlers never see
    another site's context nor the coordinator.
    """

    name: str
    frame: pd.DataFrame
    policy: DisclosurePolicy
    ledger: Any = None
    cache: dict[str, Any] = field(default_factory=dict)
    protocol: Any = None
    """The protocol the site approved (:class:`fedstats.site.protocol.Protocol`), or ``None``."""
    secure_aggregation: Any = None
    """The site's pinned secure-aggregation roster and signing key
    (:class:`fedstats.secagg.roster.RosterPin`), or ``None`` when not pinned."""
    guard: Any = None
    """The site's differencing guard (:class:`fedstats.site.differencing.DifferencingGuard`)."""
    deadline: float | None = None
    """``time.monotonic()`` value by which the current request must be answered."""
    exact: bool = True
    """Whether the current request asks for an exact (not differentially private) release:
    the small-cell rules and the differencing guard apply to exact releases."""

    def private(self, args: dict[str, Any]) -> bool:
        """Whether this request asks for a differentially private release."""
        return args.get("dp") is not None


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
class NoisyGroup:
    """Reply fields released together by one Gaussian mechanism.

    ``l2_sensitivity`` bounds how far the fields (flattened and stacked; for a
    ``symmetric`` matrix, its upper triangle) can move when one patient is
    added or removed. The handler must enforce the bound (by clipping) when
    the request asks for differential privacy; the silo then adds
    ``N(0, (noise_multiplier * l2_sensitivity)^2)`` to every released entry.
    """

    fields: tuple[str, ...]
    l2_sensitivity: float
    symmetric: bool = False


@dataclass(frozen=True)
class Task:
    """A named site task.

    ``schema`` maps the request's arguments, never the site's data, to the
    exact fields and sizes of the reply. ``private_release``, when present,
    maps the arguments to the noisy groups the task can release under
    differential privacy; a task without it is refused under privacy.
    ``private_training``, for tasks whose handler applies the privacy
    mechanism itself (DP-SGD), maps the arguments to the ``dp_accounting``
    event the handler will run — e.g. ``steps`` Poisson-sampled Gaussian
    steps — which the silo charges before calling the handler; the handler
    must run exactly that mechanism and release only its output.
    ``cost`` declares the work a request asks for, refused over the site's limit.
    ``about_patients`` is false only for tasks whose reply describes no
    patient (a schema, a budget); a site that requires privacy answers
    every other task only as a charged private release.
    """

    name: str
    handler: Callable[[SiteContext, dict[str, Any]], TaskReply]
    schema: Callable[[dict[str, Any]], ReplySchema]
    description: str
    private_release: Callable[[dict[str, Any]], list[NoisyGroup]] | None = None
    about_patients: bool = True
    private_training: Callable[[dict[str, Any]], Any] | None = None
    validate: Callable[[SiteContext, dict[str, Any]], None] | None = None
    """For ``private_training`` tasks: every data check the handler will make, run before
    the charge, so a request that fails is refused before any budget is spent."""
    cost: Callable[[SiteContext, dict[str, Any]], float] | None = None
    """The work the request asks for (for training: local steps x parameters), checked
    against the site's :class:`~fedstats.site.resource_limits.RequestLimits` before any work."""


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
