"""Site side of grid survival counts: patients at risk and events per interval of a time grid.

A site never releases its event times. The coordinator sends a grid
``g_1 < ... < g_K``; the site coarsens each follow-up time up to the next grid
point (``t -> min{g_k : g_k >= t}``; times after ``g_K`` are censored at
``g_K``) and returns, for every group (level of a grouping column, or one
group), the number at risk ``n_k = #{t* >= g_k}`` and the number of events
``d_k = #{t* = g_k, event}`` at each grid point.

Disclosure control, with ``k`` the site's ``min_count``: each group's curve
at this site ends at its *horizon*, the last grid point up to which every
interval holds either no event or at least ``k`` events and at least ``k``
patients remain at risk. (Releases of risk-set sums of covariates, as the
pooled Cox model's, also require that either nobody or at least ``k``
patients leave the risk set between grid points; see :func:`safe_horizon`.)
Patients followed beyond the horizon are censored there, and the counts
after it are released as 0; the reply says how many patients were so
censored. So every released non-zero count, at risk or
events, stands for at least ``k`` patients: no released message holds an
event time shared by fewer than ``k`` patients of the site (the output
checking rule of trusted research environments for survival tables, e.g.
the SDC Handbook, Griffiths et al., 2019: a minimum number of events behind
each step of a curve). Censoring everyone still at risk at a horizon fixed by
the past of the counting process leaves the Kaplan–Meier estimate up to it
unbiased (a stopping time; Andersen, Borgan, Gill & Keiding, 1993, IV.3); a
grid too fine for the site's events ends its curves early, which the
analyst sees in the truncation counts and cures with a coarser grid.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fedstats.errors import (
    InconsistentColumnError,
    MalformedRequestError,
    MissingColumnError,
    MissingValuesError,
    NonBinaryOutcomeError,
)
from fedstats.schema import Array, Number
from fedstats.site.handlers.design import as_agreed_categorical, checked_group_levels
from fedstats.site.survival_grid import require_study_grid
from fedstats.site.task import NoisyGroup, SiteContext, TaskReply

MAX_GRID = 5_000
TASK = "survival.counts"


def counts_schema(args: dict[str, Any]) -> dict:
    grid, _, _, _, levels = _arguments(args)
    shape = (max(len(levels), 1), len(grid))
    if args.get("dp") is not None:
        return {"events": Array(shape), "censored": Array(shape)}
    return {
        "at_risk": Array(shape),
        "events": Array(shape),
        "truncated": Number(),
        "n_obs": Number(),
    }


def counts(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """At-risk and event counts per group and grid point, under the rules above."""
    grid, time_name, event_name, group_name, levels = _arguments(args)
    if not ctx.private(args):
        require_study_grid(ctx, time_name, event_name, grid, task=TASK)
    frame = ctx.frame
    needed = [time_name, event_name] + ([group_name] if group_name else [])
    for column in needed:
        if column not in frame.columns:
            raise MissingColumnError(site=ctx.name, column=column)
    data = frame[needed]
    missing = data.isna().sum()
    if missing.any():
        column = str(missing[missing > 0].index[0])
        raise MissingValuesError(site=ctx.name, column=column, count=int(missing[column]))
    time = pd.to_numeric(data[time_name], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    bad = ~np.isfinite(time) | (time < 0)
    if bad.any():
        raise InconsistentColumnError(
            site=ctx.name,
            column=time_name,
            reason=f"has {int(bad.sum())} follow-up times that are not finite numbers >= 0",
        )
    raw = data[event_name]
    event = pd.to_numeric(raw.astype("float64") if raw.dtype == bool else raw, errors="coerce")
    event = event.to_numpy(np.float64, na_value=np.nan)
    other = int((~np.isin(event, (0.0, 1.0))).sum())
    if other:
        raise NonBinaryOutcomeError(site=ctx.name, column=event_name, count=other)
    if group_name:
        agreed = as_agreed_categorical(ctx.name, group_name, data[group_name], tuple(levels))
        group = np.asarray(agreed.codes, dtype=np.int64)
    else:
        group = np.zeros(len(time), dtype=np.int64)
    n_groups = max(len(levels), 1)
    if ctx.private(args):
        events, censored = leaving_counts(time, event.astype(bool), group, n_groups, grid)
        return TaskReply({"events": events, "censored": censored}, contributors=len(time))
    at_risk, events, truncated = grid_counts(
        time, event.astype(bool), group, n_groups, grid, ctx.policy.min_count,
        defer=args.get("sparse_events") == "defer", common_horizon=group_name is not None,
    )  # fmt: skip
    return TaskReply(
        {"at_risk": at_risk, "events": events, "truncated": truncated, "n_obs": len(time)},
        contributors=len(time),
    )


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


def coarsen(time: np.ndarray, event: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each time's grid index ``min{k : g_k >= t}`` and event flags; times after the last
    point sit there, censored."""
    point = np.searchsorted(grid, time, side="left")
    beyond = point >= len(grid)
    return np.minimum(point, len(grid) - 1), event & ~beyond


def grid_counts(
    time: np.ndarray,
    event: np.ndarray,
    group: np.ndarray,
    n_groups: int,
    grid: np.ndarray,
    k: int,
    *,
    defer: bool = False,
    common_horizon: bool = False,
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(at_risk, events, truncated)`` per group and grid point, each group cut at its horizon.

    With ``defer``, a group's deaths in an interval holding fewer than ``k``
    of them are moved to the next grid point by which ``k`` have accumulated
    (:func:`deferred_points`) instead of ending the curve there; with
    ``common_horizon`` (a grouped request) the points are those of all the
    groups' deaths together, the ungrouped curve's, so an ungrouped deferred
    curve minus the groups gives back no group's deaths more finely than
    released, and a group whose released deaths at a point are 1 to ``k - 1``
    ends every curve there.
    ``truncated`` counts the patients still followed after their group's
    horizon (all of a group's patients when no grid point qualifies); a
    count of 1 to ``k - 1`` is released as ``k`` (:func:`protected_count`). With
    ``common_horizon`` every group is cut where the first one must end
    (groups without patients aside), so no group's cells after that point can
    be had from an ungrouped curve minus the other groups (secondary
    suppression; :mod:`fedstats.site.survival_grid`).
    """
    coarse, event = coarsen(time, event, grid)
    at_risk = np.zeros((n_groups, len(grid)))
    events = np.zeros((n_groups, len(grid)))
    parts = []
    shared_release = None
    if defer and common_horizon:
        # One schedule for every group, the ungrouped curve's: the groups' released deaths then
        # sum to the ungrouped release at every point, so nothing follows from a difference.
        shared_release = deferred_points(
            np.bincount(coarse[event], minlength=len(grid)).astype(np.float64), k
        )
    for g in range(n_groups):
        mine = group == g
        point = coarse.copy()
        if defer:
            died = np.bincount(coarse[mine & event], minlength=len(grid)).astype(np.float64)
            release = deferred_points(died, k) if shared_release is None else shared_release
            moved = mine & event
            point[moved] = np.where(release[coarse[moved]] >= 0, release[coarse[moved]],
                                    len(grid))  # fmt: skip
        kept = point < len(grid)  # deaths never released stay at risk to the end, then cut
        starts = np.bincount(np.minimum(point[mine], len(grid) - 1), minlength=len(grid))
        risk = np.cumsum(starts[::-1])[::-1].astype(np.float64)
        died = np.bincount(point[mine & event & kept], minlength=len(grid)).astype(np.float64)
        horizon = safe_horizon(risk, died, k)
        if defer:  # end before deaths that were never released
            unreleased = mine & event & ~kept
            if unreleased.any():
                horizon = min(horizon, int(coarse[unreleased].min()) - 1)
        if not (mine & ((point > horizon) | ~kept)).any():
            horizon = len(grid) - 1  # nothing cut: every cell of this group is safe
        parts.append((mine, point, kept, risk, died, horizon))
    if common_horizon and parts:
        shared = (
            min(horizon for mine, *_, horizon in parts if mine.any())
            if any(p[0].any() for p in parts)
            else len(grid) - 1
        )
        parts = [(*p[:5], min(p[5], shared)) for p in parts]
    truncated = 0
    for g, (mine, point, kept, risk, died, horizon) in enumerate(parts):
        truncated += int((mine & ((point > horizon) | ~kept)).sum())
        if horizon >= 0:
            at_risk[g, : horizon + 1] = risk[: horizon + 1]
            events[g, : horizon + 1] = died[: horizon + 1]
    return at_risk, events, protected_count(truncated, k)


def protected_count(count: int, k: int) -> int:
    """A count of patients that may leave the site: 0 or ``count >= k`` as it is, and 1 to
    ``k - 1`` as ``k`` (an upper bound: "at most ``k``"), so no small cell is released."""
    return count if count == 0 or count >= k else k


def deferred_points(died: np.ndarray, k: int) -> np.ndarray:
    """For each grid point, where its deaths are released when deferred (-1: never).

    Deaths accumulate from point to point; once at least ``k`` are pending,
    they are all released at the current point. Deaths still pending at the
    last point are never released. Coarsening an event time to a later grid
    point keeps the patient at risk until then: a small, one-sided bias
    (survival is overstated between the true and the released time) traded
    for curves that do not stop at the first sparse interval.
    """
    release = np.full(len(died), -1, dtype=np.int64)
    pending: list[int] = []
    total = 0.0
    for j, count in enumerate(died):
        if count > 0:
            pending.append(j)
            total += count
        if total >= k:
            release[pending] = j
            pending, total = [], 0.0
    return release


def counts_private_release(args: dict[str, Any]) -> list[NoisyGroup]:
    """Under privacy a site releases, per group and grid interval, its deaths and censorings.

    Every patient leaves the risk set once, as a death or a censoring in one
    interval: adding or removing a patient changes one cell of the two
    tables by 1, an L2 sensitivity of 1 for both together, with no clipping
    and no threshold (the Gaussian noise protects small cells). The numbers
    at risk are their reverse cumulative sums, post-processing at the
    coordinator.
    """
    _arguments(args)
    return [NoisyGroup(("events", "censored"), l2_sensitivity=1.0)]


def leaving_counts(
    time: np.ndarray, event: np.ndarray, group: np.ndarray, n_groups: int, grid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Deaths and censorings per group and grid interval (times after the grid: censored last)."""
    coarse, died = coarsen(time, event, grid)
    events = np.zeros((n_groups, len(grid)))
    censored = np.zeros((n_groups, len(grid)))
    for g in range(n_groups):
        mine = group == g
        events[g] = np.bincount(coarse[mine & died], minlength=len(grid))
        censored[g] = np.bincount(coarse[mine & ~died], minlength=len(grid))
    return events, censored


def safe_horizon(risk: np.ndarray, died: np.ndarray, k: int, *, leavers: bool = False) -> int:
    """The last grid index up to which every released count stands for 0 or >= k patients.

    Checked at each grid point ``j``: the number at risk and the number of
    events; with ``leavers``, also the number leaving the risk set before the
    next point (``risk_j - risk_{j+1}``, events and censored), for releases
    of risk-set *sums* of covariates, whose difference would otherwise give
    the covariates of a few patients. -1 if no grid point qualifies.
    """
    small = lambda counts: (counts > 0) & (counts < k)  # noqa: E731
    unsafe = small(died) | (risk < k)
    if leavers:
        unsafe |= small(risk - np.append(risk[1:], 0.0))
    return int(np.argmax(unsafe)) - 1 if unsafe.any() else len(risk) - 1


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
    if args.get("sparse_events", "end") not in ("end", "defer"):
        raise MalformedRequestError(
            site=None, task=None, reason="'sparse_events' must be 'end' or 'defer'"
        )
    levels = [] if group is None else checked_group_levels(args.get("levels"), 1)
    return grid, names[0], names[1], group, levels
