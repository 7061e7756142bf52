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
each step of a curve). The site's own curve up to its horizon is its
Kaplan–Meier estimate. The horizon is decided by the counts of the interval
after it, so it is not a stopping time of the site's counting process
(Andersen, Borgan, Gill & Keiding, 1993, IV.3): a pooled curve past one
site's horizon lacks that site's patients, and as sites with a few events in
the next interval drop out, it can be biased upwards; so the coordinator
releases no pooled value past any site's horizon, which it reads off these
counts (:mod:`fedstats.models.survival_horizons`). A grid too fine for
the site's events ends its curves early, which the analyst sees in the
truncation counts and cures with a coarser grid.

A request may also split the counts by strata and weight them by a column of
frequency weights; its arguments, the cells (stratum x group) and the checks
those options need are in :mod:`fedstats.site.handlers.survival_cells`. With
weights, the released counts are sums of weights while every rule above counts
rows of positive weight (:func:`grid_counts`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fedstats.contract.dp_request import NoisyGroup
from fedstats.contract.tasks.survival import (
    TASK,
    CountsRequest,
    read_counts_request,
)
from fedstats.errors import (
    MissingColumnError,
    MissingValuesError,
)
from fedstats.site.column_values import event_flags, follow_up_times
from fedstats.site.handlers.survival_cells import (
    check_exact_cells,
    group_codes,
    refuse_private_weights,
    stratum_codes,
)
from fedstats.site.patient_clipping import refuse_several_rows
from fedstats.site.private_rows import outside_levels, usable_survival
from fedstats.site.survival_grid import require_study_grid
from fedstats.site.task import SiteContext, TaskReply
from fedstats.site.weights import frequency_weights

ONE_LEAVING = (
    "the private counts charge one death or censoring per patient while each of a patient's "
    "rows leaves the risk set once"
)
"""Why private counts are refused on a frame with several rows per patient: one patient of
``m`` rows would move the counts by ``sqrt(m)`` (``m`` cells) to ``m`` (one cell) times the
charged sensitivity."""

__all__ = ["counts", "grid_counts"]


def validate_private(ctx: SiteContext, args: dict[str, Any]) -> None:
    """Before a private release is charged: no weights, and one row per patient (the frame's
    layout, public; see :data:`ONE_LEAVING`)."""
    refuse_private_weights(read_counts_request(args))
    refuse_several_rows(ctx, TASK, ONE_LEAVING)


def counts(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """At-risk and event counts (sums of weights, when weighted) per cell and grid point,
    under the rules above and those of :mod:`fedstats.site.handlers.survival_cells`."""
    request = read_counts_request(args)
    private = ctx.private(args)
    if private:
        refuse_private_weights(request)
        refuse_several_rows(ctx, TASK, ONE_LEAVING)
    else:
        require_study_grid(ctx, request.time, request.event, request.grid, task=TASK)
    frame = ctx.frame
    for column in request.columns():
        if column not in frame.columns:
            raise MissingColumnError(site=ctx.name, column=column)
    data = frame[request.columns()]
    if private:  # unusable rows are left out, never refused (fedstats.site.private_rows)
        data = data[usable_count_rows(request, data)]
    missing = data.isna().sum()
    if missing.any():
        column = str(missing[missing > 0].index[0])
        raise MissingValuesError(site=ctx.name, column=column, count=int(missing[column]))
    time, event = _follow_up(ctx, request, data)
    groups = group_codes(ctx, request, data)
    strata = stratum_codes(ctx, request, data)
    cells = strata * request.n_groups + groups
    if private:
        events, censored = leaving_counts(time, event, cells, request.n_cells, request.grid)
        return TaskReply({"events": events, "censored": censored}, contributors=len(time))
    weights = (
        None
        if request.weights is None
        else frequency_weights(ctx.name, data[request.weights], request.weights)
    )
    check_exact_cells(ctx, request, task=TASK, groups=groups, strata=strata, weights=weights)
    at_risk, events, truncated = grid_counts(
        time, event, cells, request.n_cells, request.grid, ctx.policy.min_count,
        defer=request.defer, common_horizon=request.split, weights=weights,
        k_share=ctx.policy.k_cell,
    )  # fmt: skip
    contributors = len(time) if weights is None else int(np.count_nonzero(weights))
    return TaskReply(
        {"at_risk": at_risk, "events": events, "truncated": truncated, "n_obs": len(time)},
        contributors=contributors,
    )


def usable_count_rows(request: CountsRequest, data: pd.DataFrame) -> np.ndarray:
    """The rows a private count reads: complete, with a usable follow-up time and event flag,
    and groups and strata among the agreed levels."""
    levels = dict(zip(request.strata, (tuple(v) for v in request.strata_levels), strict=True))
    if request.group is not None:
        levels[request.group] = tuple(request.levels)
    usable = ~data.isna().any(axis=1).to_numpy()
    usable &= usable_survival(data[request.time], data[request.event])
    return usable & ~outside_levels(data, levels)


def _follow_up(
    ctx: SiteContext, request: CountsRequest, data: pd.DataFrame
) -> tuple[np.ndarray, np.ndarray]:
    """The follow-up times (finite, >= 0) and event flags (0/1), checked."""
    time = follow_up_times(ctx.name, request.time, data[request.time])
    event = event_flags(ctx.name, request.event, data[request.event])
    return time, event.astype(bool)


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
    weights: np.ndarray | None = None,
    k_share: int = 1,
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
    ``truncated`` counts the patients (rows of positive weight) still followed
    after their group's horizon (all of a group's patients when no grid point qualifies); a
    count of 1 to ``k - 1`` is released as ``k`` (:func:`protected_count`). With
    ``common_horizon`` every group is cut where the first one must end
    (groups without patients aside), so no group's cells after that point can
    be had from an ungrouped curve minus the other groups (secondary
    suppression; :mod:`fedstats.site.survival_grid`).

    With frequency ``weights`` the released counts are sums of weights (the
    counts of the rows repeated ``w_i`` times), while the horizon still counts
    *rows of positive weight*: every released non-zero sum stands for at least
    ``k`` of them, and no single row carries more than ``1 / k_share`` of it
    (the (1, k) dominance rule, Hundepool et al. 2012, §4.2.2), at risk or
    among the deaths.
    """
    coarse, event = coarsen(time, event, grid)
    counted = np.ones(len(time), dtype=bool) if weights is None else weights > 0
    at_risk = np.zeros((n_groups, len(grid)))
    events = np.zeros((n_groups, len(grid)))
    parts = []
    shared_release = None
    if defer and common_horizon:
        # One schedule for every group, the ungrouped curve's: the groups' released deaths then
        # sum to the ungrouped release at every point, so nothing follows from a difference.
        shared_release = deferred_points(
            np.bincount(coarse[event & counted], minlength=len(grid)).astype(np.float64), k
        )
    for g in range(n_groups):
        mine = group == g
        point = coarse.copy()
        if defer:
            died = np.bincount(coarse[mine & event & counted], minlength=len(grid))
            release = (
                deferred_points(died.astype(np.float64), k)
                if shared_release is None
                else shared_release
            )
            moved = mine & event
            point[moved] = np.where(release[coarse[moved]] >= 0, release[coarse[moved]],
                                    len(grid))  # fmt: skip
        kept = point < len(grid)  # deaths never released stay at risk to the end, then cut
        rows = mine & counted
        risk, died = _risk_and_deaths(point, rows, event & kept, len(grid), None)
        dominated = None
        if weights is not None:
            dominated = _dominated(point, rows, event & kept, len(grid), weights, k_share)
            risk_sum, died_sum = _risk_and_deaths(point, rows, event & kept, len(grid), weights)
        else:
            risk_sum, died_sum = risk, died
        horizon = safe_horizon(risk, died, k, dominated=dominated)
        if defer:  # end before deaths that were never released
            unreleased = rows & event & ~kept
            if unreleased.any():
                horizon = min(horizon, int(coarse[unreleased].min()) - 1)
        if not (rows & ((point > horizon) | ~kept)).any():
            horizon = len(grid) - 1  # nothing cut: every cell of this group is safe
        parts.append((rows, point, kept, risk_sum, died_sum, horizon))
    if common_horizon and parts:
        shared = (
            min(horizon for rows, *_, horizon in parts if rows.any())
            if any(p[0].any() for p in parts)
            else len(grid) - 1
        )
        parts = [(*p[:5], min(p[5], shared)) for p in parts]
    truncated = 0
    for g, (rows, point, kept, risk, died, horizon) in enumerate(parts):
        truncated += int((rows & ((point > horizon) | ~kept)).sum())
        if horizon >= 0:
            at_risk[g, : horizon + 1] = risk[: horizon + 1]
            events[g, : horizon + 1] = died[: horizon + 1]
    return at_risk, events, protected_count(truncated, k)


def _risk_and_deaths(
    point: np.ndarray,
    rows: np.ndarray,
    died: np.ndarray,
    length: int,
    weights: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Numbers (or weight sums) at risk and of deaths of ``rows`` at each grid point."""
    last = np.minimum(point, length - 1)
    starts = np.bincount(
        last[rows], weights=None if weights is None else weights[rows], minlength=length
    )
    risk = np.cumsum(starts[::-1])[::-1].astype(np.float64)
    here = rows & died
    deaths = np.bincount(
        point[here], weights=None if weights is None else weights[here], minlength=length
    )
    return risk, deaths.astype(np.float64)


def _dominated(
    point: np.ndarray,
    rows: np.ndarray,
    died: np.ndarray,
    length: int,
    weights: np.ndarray,
    k: int,
) -> np.ndarray:
    """Grid points where one row carries more than ``1/k`` of the weight at risk or of the
    weight of the deaths."""
    last = np.minimum(point, length - 1)
    heaviest_leaving = np.zeros(length)
    np.maximum.at(heaviest_leaving, last[rows], weights[rows])
    heaviest_at_risk = np.maximum.accumulate(heaviest_leaving[::-1])[::-1]
    heaviest_death = np.zeros(length)
    here = rows & died
    np.maximum.at(heaviest_death, point[here], weights[here])
    risk, deaths = _risk_and_deaths(point, rows, died, length, weights)
    slack = 1 + 1e-12
    return ((risk > 0) & (heaviest_at_risk * k > risk * slack)) | (
        (deaths > 0) & (heaviest_death * k > deaths * slack)
    )


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
    coordinator. That holds when each row is a patient: on a frame with several
    rows per patient a patient leaves once per row (``m`` cells for ``m`` rows), so
    the private counts are refused there (:data:`ONE_LEAVING`).
    """
    refuse_private_weights(read_counts_request(args))
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


def safe_horizon(
    risk: np.ndarray,
    died: np.ndarray,
    k: int,
    *,
    leavers: bool = False,
    dominated: np.ndarray | None = None,
) -> int:
    """The last grid index up to which every released count stands for 0 or >= k patients.

    Checked at each grid point ``j``: the number at risk and the number of
    events; with ``leavers``, also the number leaving the risk set before the
    next point (``risk_j - risk_{j+1}``, events and censored), of those
    censored (leavers less events) and of those at risk without an event
    (``risk_j - died_j``, everyone left when the curve ends at ``j``), for
    releases of risk-set *sums* of covariates beside event sums, whose
    differences would otherwise give the covariates of a few patients; with
    ``dominated``, the points where one row dominates a weighted count are
    unsafe too. -1 if no grid point qualifies.
    """
    small = lambda counts: (counts > 0) & (counts < k)  # noqa: E731
    unsafe = small(died) | (risk < k)
    if dominated is not None:
        unsafe |= dominated
    if leavers:
        leaving = risk - np.append(risk[1:], 0.0)
        # with the event sums released beside the risk-set sums, leavers less events are the
        # censored, and at-risk less events those left at a horizon: 0 or k of each too
        unsafe |= small(leaving) | small(leaving - died) | small(risk - died)
    return int(np.argmax(unsafe)) - 1 if unsafe.any() else len(risk) - 1
