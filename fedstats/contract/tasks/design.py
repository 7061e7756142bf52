"""The wire of ``describe`` (variables' kinds and levels) and ``prepare`` (build the design)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedstats.contract.design import DesignSpec
from fedstats.contract.task_spec import TaskSpec
from fedstats.errors import MalformedRequestError
from fedstats.schema import Number, Text, Values

MAX_LEVELS_ON_WIRE = 1000


def describe_schema(args: dict[str, Any]) -> dict:
    variables = _string_list(args, "variables")
    _string_list(args, "levels_for")
    _string_list(args, "levels_known")
    if not isinstance(args.get("list_levels"), bool):
        raise MalformedRequestError(site=None, task=None, reason="'list_levels' must be a boolean")
    schema: dict = {}
    for var in variables:
        schema[f"{var}.kind"] = Text(max_chars=20)
        schema[f"{var}.levels"] = Values(max_items=MAX_LEVELS_ON_WIRE)
    return schema


def prepare_schema(args: dict[str, Any]) -> dict:
    spec_from_args(args)
    return {"n_obs": Number(), "n_dropped": Number(), "n_events": Number()}


MAX_GROUPS = 50
"""Most group levels a grouped request may name."""


def checked_group_levels(levels: Any, minimum: int) -> list:
    """A request's group ``levels``: ``minimum`` to :data:`MAX_GROUPS` numbers or strings."""
    if not (
        isinstance(levels, list)
        and minimum <= len(levels) <= MAX_GROUPS
        and all(isinstance(v, int | float | str) for v in levels)
    ):
        raise MalformedRequestError(
            site=None, task=None, reason=f"'levels' must list {minimum} to {MAX_GROUPS} groups"
        )
    return levels


def checked_beta(site: str | None, args: dict[str, Any], p: int) -> np.ndarray:
    """The request's coefficients ``beta``: ``p`` finite numbers, as float64."""
    beta = args.get("beta")
    if not (isinstance(beta, np.ndarray) and beta.shape == (p,)):
        raise MalformedRequestError(
            site=site, task=None, reason=f"'beta' must be an array of {p} numbers"
        )
    if not np.isfinite(beta).all():
        raise MalformedRequestError(site=site, task=None, reason="'beta' has non-finite values")
    return beta.astype(np.float64)


def spec_from_args(args: dict[str, Any]) -> DesignSpec:
    try:
        return DesignSpec.from_wire(args.get("design"))
    except ValueError as exc:
        raise MalformedRequestError(site=None, task=None, reason=str(exc)) from None


def _string_list(args: dict[str, Any], key: str) -> list[str]:
    value = args.get(key)
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise MalformedRequestError(site=None, task=None, reason=f"{key!r} must be a list of names")
    return value


DESCRIBE = TaskSpec(
    name="describe",
    schema=describe_schema,
    description="kind of each variable and levels of categorical ones",
    about_patients=False,
)
PREPARE = TaskSpec(
    name="prepare",
    schema=prepare_schema,
    description="build the agreed design; patients, dropped rows and events",
    private=True,
)
