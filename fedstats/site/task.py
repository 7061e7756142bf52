"""What a site task is: a handler bound to a task of the contract, and the registry routing to it.

The contract (:mod:`fedstats.contract.tasks`) names each task and declares its
reply schema from the request; a site binds a handler to it
(:meth:`Task.serving`) and adds what only the site decides: how it releases the
reply privately, what it checks before a charge, and what work it allows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from fedstats.contract.dp_request import NoisyGroup
from fedstats.contract.task_spec import TaskSpec, imported_family
from fedstats.errors import ExtraNotInstalledError, FedstatsError, StudyConfigurationError
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
    verified_paths: bool = False
    """Whether exact requests of an iterative fit are answered only at points the site
    re-derives (:mod:`fedstats.site.verified_paths`)."""
    trusts_client_level: bool = False
    """Whether a client-level private fit's exact requests (``clip`` without ``dp``) are
    answered off any verified path: their coefficients carry the coordinator's own noise,
    which no site can re-derive, so the site trusts the coordinator, as client-level DP
    does (McMahan et al., ICLR 2018)."""
    reply_schema: Any = None
    """``(task, args) -> ReplySchema | None``: a task's plain reply schema from the site's
    registry (:func:`plain_schema`), which lays out the masked replies a path
    relays from inside secure aggregation."""
    linkages: Any = None
    """The linkages the site accepted (:class:`fedstats.site.linked_rows.LinkageStore`)."""
    paillier_keys: Any = None
    """The Paillier keys the site made for vertical fits
    (:class:`fedstats.site.ciphertext_replies.PaillierKeys`)."""
    identifiers: Any = None
    """The site's identifier table, linkage schema and linkage sessions
    (:class:`fedstats.site.identifiers.SiteIdentifiers`), or ``None`` when it links nothing."""
    path_round: int | None = None
    """The round of the verified path the current request lies on (set by the silo before
    the handler runs; ``None`` off a verified path): a deep task checks round 1's seeded
    network itself."""

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
    """Run for a private request before the charge, so a request that fails is refused before
    any budget is spent: for ``private_training`` tasks every check the handler will make;
    for ``private_release`` tasks the refusals decided by the site's public layout (e.g. a
    frame with several rows per patient), never by a patient's values."""
    cost: Callable[[SiteContext, dict[str, Any]], float] | None = None
    """The work the request asks for (for training: local steps x parameters), checked
    against the site's :class:`~fedstats.site.resource_limits.RequestLimits` before any work."""

    @classmethod
    def serving(
        cls,
        spec: TaskSpec,
        handler: Callable[[SiteContext, dict[str, Any]], TaskReply],
        *,
        private_release: Callable[[dict[str, Any]], list[NoisyGroup]] | None = None,
        private_training: Callable[[dict[str, Any]], Any] | None = None,
        validate: Callable[[SiteContext, dict[str, Any]], None] | None = None,
        cost: Callable[[SiteContext, dict[str, Any]], float] | None = None,
    ) -> Task:
        """The site's task that answers the contract's ``spec`` with ``handler``.

        Name, reply schema, description and ``about_patients`` come from the spec,
        so the site checks its replies against the schema the coordinator checks
        them against. A spec marked ``private`` needs a private form here
        (``private_release`` or ``private_training``), and only such a spec may
        have one; otherwise :class:`~fedstats.errors.StudyConfigurationError`.
        """
        if spec.private != (private_release is not None or private_training is not None):
            raise StudyConfigurationError(
                f"task {spec.name!r}: the contract says it "
                + ("has" if spec.private else "has no")
                + " differentially private form, and the site must serve it so"
            )
        return cls(
            name=spec.name,
            handler=handler,
            schema=spec.schema,
            description=spec.description,
            private_release=private_release,
            about_patients=spec.about_patients,
            private_training=private_training,
            validate=validate,
            cost=cost,
        )


@dataclass(frozen=True)
class OptionalTasks:
    """Tasks served by an optional extra: their names, and the module that defines them.

    The module is imported the first time one of its tasks is asked for, so a
    site without the extra starts without it (no ``torch`` for a site that
    answers only statistical tasks) and refuses those tasks with
    :class:`~fedstats.errors.ExtraNotInstalledError`. The module must define
    ``SITE_TASKS``, a list of :class:`Task` with exactly these names.
    """

    names: tuple[str, ...]
    module: str
    extra: str


class TaskRegistry:
    """The set of tasks a silo answers, routed by name."""

    def __init__(
        self, tasks: list[Task] | None = None, optional: list[OptionalTasks] | None = None
    ) -> None:
        self._tasks: dict[str, Task] = {}
        self._optional: dict[str, OptionalTasks] = {}
        for task in tasks or []:
            self.add(task)
        for family in optional or []:
            for name in family.names:
                if name in self._tasks or name in self._optional:
                    raise StudyConfigurationError(f"task {name!r} is registered twice")
                self._optional[name] = family

    def add(self, task: Task) -> None:
        if task.name in self._tasks:
            raise StudyConfigurationError(f"task {task.name!r} is registered twice")
        self._tasks[task.name] = task

    def get(self, name: str) -> Task | None:
        """The task of this name; ``None`` for an unknown name.

        Raises :class:`~fedstats.errors.ExtraNotInstalledError` (with the site
        left for the caller to fill in) when the task belongs to an extra that
        is not installed.
        """
        if name not in self._tasks and name in self._optional:
            self._load(self._optional[name], asked=name)
        return self._tasks.get(name)

    def _load(self, family: OptionalTasks, asked: str) -> None:
        defined = imported_family(family.module, family.names, family.extra, asked, "SITE_TASKS")
        for name in family.names:
            self._optional.pop(name)
            self.add(defined[name])

    def available(self) -> list[Task]:
        """Every task this site can answer: the extras that are installed are loaded."""
        for family in {id(f): f for f in self._optional.values()}.values():
            try:
                self._load(family, asked=family.names[0])
            except ExtraNotInstalledError:
                continue
        return list(self._tasks.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tasks or name in self._optional

    def __iter__(self) -> Iterator[Task]:
        return iter(self.available())

    def names(self) -> list[str]:
        """Every task name, those of extras included whether installed or not."""
        return sorted([*self._tasks, *self._optional])


def plain_schema(registry: Any, name: str, args: dict[str, Any]) -> ReplySchema | None:
    """The plain reply schema of task ``name`` for ``args`` in ``registry`` (``None`` for a task
    it does not know or arguments the task cannot lay out)."""
    try:
        task = registry.get(name)
        return None if task is None else task.schema(args)
    except (FedstatsError, KeyError, TypeError, ValueError, IndexError, AttributeError):
        return None
