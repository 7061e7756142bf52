"""The wire of ``fairness.summaries``: per-group soft true-positive sums and AUC pair counts."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedstats.contract.fairness import penalty_weight
from fedstats.contract.task_spec import TaskSpec
from fedstats.contract.tasks.design import checked_group_levels, spec_from_args
from fedstats.errors import MalformedRequestError
from fedstats.schema import Array, Number

TASK = "fairness.summaries"


SITE_GROUPS = "site"


def summaries_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)
    levels, _, _ = _arguments(args)
    G, p = len(levels), spec.n_params
    schema: dict = {"positives": Array((G,)), "soft": Array((G,)), "gradient": Array((G, p))}
    if _flag(args, "likelihood"):
        schema |= {"loglik": Number(), "score": Array((p,)), "information": Array((p, p))}
    if not np.isfinite(penalty_weight(args)):
        raise MalformedRequestError(site=None, task=None, reason="'gamma' must be a number >= 0")
    if _wants_auc(args):
        schema |= {"auc_concordant": Number(), "auc_tied": Number(), "auc_pairs": Number()}
    return schema


def _wants_auc(args: dict[str, Any]) -> bool:
    return _flag(args, "auc")


def _flag(args: dict[str, Any], name: str) -> bool:
    value = args.get(name, False)
    if not isinstance(value, bool):
        raise MalformedRequestError(site=None, task=None, reason=f"{name!r} must be true or false")
    return value


def _arguments(args: dict[str, Any]) -> tuple[list, str, float]:
    levels, group, temperature = args.get("levels"), args.get("group"), args.get("temperature")
    if not (isinstance(group, str) and group):
        raise MalformedRequestError(site=None, task=None, reason="'group' must name a column")
    levels = checked_group_levels(levels, 2)
    if not (isinstance(temperature, int | float) and np.isfinite(temperature) and temperature > 0):
        raise MalformedRequestError(site=None, task=None, reason="'temperature' must be > 0")
    return levels, group, float(temperature)


SUMMARIES = TaskSpec(
    name=TASK,
    schema=summaries_schema,
    description="per-group soft true-positive sums, their gradients, and AUC pair counts",
)
