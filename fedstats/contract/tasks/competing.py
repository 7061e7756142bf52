"""The wire of ``competing.counts``: at-risk, cause and competing-cause counts on a time grid."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedstats.contract.task_spec import TaskSpec
from fedstats.contract.tasks.design import checked_group_levels
from fedstats.contract.tasks.survival import checked_grid
from fedstats.errors import MalformedRequestError
from fedstats.schema import Array, Number

TASK = "competing.counts"


MAX_CAUSE = 1_000
"""The largest cause code a request may name."""


def checked_cause(args: dict[str, Any]) -> int:
    """The request's ``cause``: a positive integer (at most :data:`MAX_CAUSE`)."""
    cause = args.get("cause")
    if not (type(cause) is int and 1 <= cause <= MAX_CAUSE):
        raise MalformedRequestError(
            site=None,
            task=None,
            reason=f"'cause' must be a positive integer up to {MAX_CAUSE} (0 means censored)",
        )
    return cause


def counts_schema(args: dict[str, Any]) -> dict:
    grid, _, _, _, levels = _arguments(args)
    checked_cause(args)
    if args.get("dp") is not None:
        raise MalformedRequestError(
            site=None, task=None, reason="differentially private competing-risks counts are "
            "not offered yet",
        )  # fmt: skip
    shape = (max(len(levels), 1), len(grid))
    return {
        "at_risk": Array(shape),
        "events": Array(shape),
        "competing": Array(shape),
        "truncated": Number(),
        "n_obs": Number(),
    }


def _arguments(args: dict[str, Any]) -> tuple[np.ndarray, str, str, str | None, list]:
    grid = checked_grid(args)
    names = [args.get("time"), args.get("event")]
    group = args.get("group")
    if not all(isinstance(n, str) and n for n in names) or not (
        group is None or (isinstance(group, str) and group)
    ):
        raise MalformedRequestError(
            site=None, task=None, reason="'time' and 'event' name columns; 'group' too, or null"
        )
    levels = [] if group is None else checked_group_levels(args.get("levels"), 1)
    return grid, names[0], names[1], group, levels


COUNTS = TaskSpec(
    name=TASK,
    schema=counts_schema,
    description="at-risk, cause and competing-cause counts per group on a time grid (k-protected)",
)
