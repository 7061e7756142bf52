"""The wire of ``privacy.status``: a site's privacy budget for a study."""

from __future__ import annotations

from typing import Any

from fedstats.contract.task_spec import TaskSpec
from fedstats.errors import MalformedRequestError
from fedstats.schema import Number


def status_schema(args: dict[str, Any]) -> dict:
    _arguments(args)
    return {"epsilon_spent": Number(), "budget_epsilon": Number(), "fits": Number()}


def _arguments(args: dict[str, Any]) -> tuple[str, str]:
    study, planned = args.get("study"), args.get("planned")
    if not (isinstance(study, str) and study and isinstance(planned, str)):
        raise MalformedRequestError(
            site=None, task=None, reason="'study' and 'planned' (an event as JSON) are needed"
        )
    return study, planned


TASK = "privacy.status"
STATUS = TaskSpec(
    name=TASK,
    schema=status_schema,
    description="the site's privacy budget for a study and whether a planned fit fits",
    about_patients=False,
)
