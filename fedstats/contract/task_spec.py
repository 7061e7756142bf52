"""What a task is on the wire: its name, what its reply must hold, and whether it is private.

A :class:`TaskSpec` is the part of a site task both sides agree on: the name
a request routes by, the reply schema its arguments declare (a function of the
request, never of a site's rows, which also refuses a malformed request), a
description, whether the reply is about patients, and whether the task has a
differentially private form. A site binds each spec to the handler that
answers it (:meth:`fedstats.site.task.Task.serving`); the coordinator checks
every reply against the spec alone (:class:`fedstats.models.federation.Federation`),
through :func:`reply_schema`, the one place that adds what secure aggregation
and differential privacy change in a reply.

A :class:`TaskCatalogue` holds the specs of a study's wire
(:data:`fedstats.contract.tasks.TASKS`); the tasks of an optional extra
(:class:`OptionalSpecs`) are named here and their specs imported from the
extra's module the first time one is asked for, so a coordinator without the
extra never imports it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fedstats.contract.dp_request import DP_REPLY_FIELDS
from fedstats.contract.secure_aggregation import masked_schema
from fedstats.errors import ExtraNotInstalledError, StudyConfigurationError
from fedstats.schema import ReplySchema


class DescribedTask(Protocol):
    """What reply checking reads of a task: a :class:`TaskSpec`, or a site's task bound to one."""

    @property
    def name(self) -> str: ...

    @property
    def schema(self) -> Callable[[dict[str, Any]], ReplySchema]: ...


class Catalogue(Protocol):
    """Tasks by name (a :class:`TaskCatalogue`, or a site's task registry)."""

    def get(self, name: str) -> DescribedTask | None: ...


@dataclass(frozen=True)
class TaskSpec:
    """A task as both sides of the wire know it.

    ``schema`` maps the request's arguments to the exact fields and sizes of
    the reply, raising :class:`~fedstats.errors.MalformedRequestError` for
    arguments the task refuses. ``about_patients`` is false only for tasks
    whose reply describes no patient (a schema, a budget, a key). ``private``
    says whether the task has a differentially private form; a request with a
    ``dp`` block for any other task is refused by the site.
    """

    name: str
    schema: Callable[[dict[str, Any]], ReplySchema]
    description: str
    about_patients: bool = True
    private: bool = False


@dataclass(frozen=True)
class OptionalSpecs:
    """Tasks of an optional extra: their names, and the module whose ``TASK_SPECS`` defines them."""

    names: tuple[str, ...]
    module: str
    extra: str


def imported_family(
    module: str, names: tuple[str, ...], extra: str, asked: str, listed: str
) -> dict[str, Any]:
    """The tasks an extra's ``module`` lists under ``listed`` (each with a ``name``), by name,
    which must be exactly ``names``. Raises
    :class:`~fedstats.errors.ExtraNotInstalledError` (no site named) when the extra that
    ``asked`` belongs to is not installed; a missing fedstats module is a bug and raises."""
    try:
        imported = importlib.import_module(module)
    except ImportError as error:
        missing = getattr(error, "name", None) or ""
        if missing.split(".")[0] == "fedstats":
            raise
        raise ExtraNotInstalledError(site=None, task=asked, extra=extra) from error
    defined = {item.name: item for item in getattr(imported, listed)}
    if set(defined) != set(names):
        raise StudyConfigurationError(
            f"{module} defines tasks {sorted(defined)}, not {sorted(names)}"
        )
    return defined


class TaskCatalogue:
    """The task specs of a wire, by name; those of an extra are imported on first use."""

    def __init__(self, specs: list[TaskSpec], optional: list[OptionalSpecs] | None = None) -> None:
        self._specs: dict[str, TaskSpec] = {}
        self._optional: dict[str, OptionalSpecs] = {}
        for spec in specs:
            self._add(spec)
        for family in optional or []:
            for name in family.names:
                if name in self._specs or name in self._optional:
                    raise StudyConfigurationError(f"task {name!r} is specified twice")
                self._optional[name] = family

    def _add(self, spec: TaskSpec) -> None:
        if spec.name in self._specs:
            raise StudyConfigurationError(f"task {spec.name!r} is specified twice")
        self._specs[spec.name] = spec

    def get(self, name: str) -> TaskSpec | None:
        """The spec of this name; ``None`` for an unknown name.

        Raises :class:`~fedstats.errors.ExtraNotInstalledError` (with no site)
        when the task belongs to an extra that is not installed.
        """
        if name not in self._specs and name in self._optional:
            family = self._optional[name]
            defined = imported_family(family.module, family.names, family.extra, name, "TASK_SPECS")
            for each in family.names:
                self._optional.pop(each)
                self._add(defined[each])
        return self._specs.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._specs or name in self._optional

    def names(self) -> list[str]:
        """Every task name, those of extras included whether installed or not."""
        return sorted([*self._specs, *self._optional])


def reply_schema(
    task: DescribedTask, args: dict[str, Any], plain: ReplySchema | None = None
) -> ReplySchema:
    """The task's declared reply, plus the public privacy facts when the request is private.

    Under secure aggregation (a ``secagg`` block) the numeric fields travel as
    one masked ring vector (:func:`fedstats.contract.secure_aggregation.masked_schema`).
    ``plain`` is ``task.schema(args)`` when the caller has it already.
    """
    schema = dict(task.schema(args) if plain is None else plain)
    if args.get("secagg") is not None:
        schema = dict(masked_schema(schema, task=task.name))
    if args.get("dp") is not None:
        schema.update(DP_REPLY_FIELDS)
    return schema
