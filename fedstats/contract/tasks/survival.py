"""The wire of ``survival.counts``: at-risk and event counts per cell on a time grid."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedstats.contract.design import normalise_level
from fedstats.contract.task_spec import TaskSpec
from fedstats.contract.tasks.design import MAX_GROUPS, checked_group_levels
from fedstats.errors import MalformedRequestError
from fedstats.schema import Array, Number

MAX_GRID = 5_000
"""Most grid points a request may name."""


MAX_STRATA = 3
"""Most strata columns a request may name."""


MAX_CELLS = 200
"""Most cells (strata times groups) a request may split its counts into."""


@dataclass(frozen=True)
class CountsRequest:
    """The arguments of a ``survival.counts`` request, checked."""

    grid: np.ndarray
    time: str
    event: str
    group: str | None
    levels: list
    strata: tuple[str, ...] = ()
    strata_levels: tuple[list, ...] = ()
    weights: str | None = None
    defer: bool = False

    @property
    def n_groups(self) -> int:
        return max(len(self.levels), 1)

    @property
    def n_strata(self) -> int:
        return math.prod(len(levels) for levels in self.strata_levels)

    @property
    def n_cells(self) -> int:
        """Rows of the reply's arrays: strata times groups."""
        return self.n_strata * self.n_groups

    @property
    def split(self) -> bool:
        """Whether the counts are split into cells (grouped or stratified)."""
        return self.group is not None or bool(self.strata)

    def columns(self) -> list[str]:
        """Every column the request reads."""
        named = [self.time, self.event, self.group, *self.strata, self.weights]
        return [c for c in named if c is not None]


def grid_problem(grid: object) -> str | None:
    """Why ``grid`` is not a time grid (1 to MAX_GRID increasing, finite times >= 0), or None."""
    if (
        isinstance(grid, np.ndarray)
        and grid.ndim == 1
        and 1 <= len(grid) <= MAX_GRID
        and np.issubdtype(grid.dtype, np.number)
        and np.isfinite(grid).all()
        and (np.diff(grid) > 0).all()
        and grid[0] >= 0
    ):
        return None
    return f"the grid must be 1 to {MAX_GRID} increasing, finite times >= 0"


def checked_grid(args: dict[str, Any]) -> np.ndarray:
    """The request's ``grid``, checked, as float64."""
    grid = args.get("grid")
    problem = grid_problem(grid)
    if problem is not None:
        raise MalformedRequestError(site=None, task=None, reason=problem)
    return np.asarray(grid, dtype=np.float64)


def read_counts_request(args: dict[str, Any]) -> CountsRequest:
    """The request's arguments, each checked for type and size (never against the rows)."""
    grid = checked_grid(args)
    names = [args.get("time"), args.get("event")]
    group = args.get("group")
    if not all(_is_name(n) for n in names) or not (group is None or _is_name(group)):
        raise _malformed("'time' and 'event' name columns; 'group' too, or null")
    if args.get("sparse_events", "end") not in ("end", "defer"):
        raise _malformed("'sparse_events' must be 'end' or 'defer'")
    levels = [] if group is None else _distinct(checked_group_levels(args.get("levels"), 1))
    strata = args.get("strata")
    strata_levels = args.get("strata_levels")
    if strata is None and strata_levels is None:
        strata, strata_levels = [], []
    elif not (
        isinstance(strata, list)
        and 1 <= len(strata) <= MAX_STRATA
        and all(_is_name(s) for s in strata)
        and isinstance(strata_levels, list)
        and len(strata_levels) == len(strata)
    ):
        raise _malformed(
            f"'strata' names 1 to {MAX_STRATA} columns and 'strata_levels' lists the agreed "
            "levels of each, or both are null"
        )
    checked_levels = tuple(_distinct(checked_group_levels(each, 1)) for each in strata_levels)
    weights = args.get("weights")
    if not (weights is None or _is_name(weights)):
        raise _malformed("'weights' names a column of frequency weights, or is null")
    named = [*names, group, *strata, weights]
    named = [n for n in named if n is not None]
    if len(set(named)) != len(named):
        raise _malformed("time, event, group, strata and weights must be different columns")
    request = CountsRequest(
        grid=grid,
        time=names[0],
        event=names[1],
        group=group,
        levels=levels,
        strata=tuple(strata),
        strata_levels=checked_levels,
        weights=weights,
        defer=args.get("sparse_events") == "defer",
    )
    if request.n_cells > MAX_CELLS or request.n_cells * len(grid) > MAX_GROUPS * MAX_GRID:
        raise _malformed(
            f"{request.n_cells} cells (strata times groups) on {len(grid)} grid points is more "
            f"than a request may ask for (at most {MAX_CELLS} cells and "
            f"{MAX_GROUPS * MAX_GRID:,} cell-points)"
        )
    return request


def _distinct(levels: list) -> list:
    """``levels`` if they are distinct (1 and 1.0 are one level) and none is NaN."""
    normalised = [normalise_level(v) for v in levels]
    if any(isinstance(v, float) and math.isnan(v) for v in normalised) or len(
        set(normalised)
    ) != len(normalised):
        raise _malformed("a column's levels must be distinct values, none of them NaN")
    return levels


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _malformed(reason: str) -> MalformedRequestError:
    return MalformedRequestError(site=None, task=None, reason=reason)


TASK = "survival.counts"


def counts_schema(args: dict[str, Any]) -> dict:
    request = read_counts_request(args)
    shape = (request.n_cells, len(request.grid))
    if args.get("dp") is not None:
        return {"events": Array(shape), "censored": Array(shape)}
    return {
        "at_risk": Array(shape),
        "events": Array(shape),
        "truncated": Number(),
        "n_obs": Number(),
    }


COUNTS = TaskSpec(
    name=TASK,
    schema=counts_schema,
    description="at-risk and event counts per group on a time grid (k-protected)",
    private=True,
)
