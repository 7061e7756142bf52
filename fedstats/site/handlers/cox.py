"""Site side of the Cox model: the partial likelihood of this site's strata.

For the agreed survival design and coefficients ``beta``, a site returns its
log partial likelihood, score and information (:mod:`fedstats.cox_math`),
summed over its own strata. With the site as a stratum (or strata within
sites) the federation's partial likelihood is the sum over sites, so the
coordinator's Newton iterates are those of the pooled stratified fit. The
reply is ``p + p^2 + 1`` numbers whatever the number of patients: no event
time, risk set or individual value leaves the site.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fedstats.contract.design import DesignSpec, counting_outcome, survival_outcome
from fedstats.contract.paths import point_digest
from fedstats.contract.tasks.cox import GRID_TASK
from fedstats.contract.tasks.design import checked_beta, spec_from_args
from fedstats.contract.tasks.survival import checked_grid
from fedstats.cox_math import (
    GridRows,
    SortedSurvival,
    concordance_counts,
    partial_likelihood,
    risk_set_sizes,
    score_residuals,
    sort_survival,
)
from fedstats.errors import (
    DisclosureError,
    MalformedRequestError,
    MissingColumnError,
    MissingValuesError,
)
from fedstats.site.design_cache import BoundedCache, design_key
from fedstats.site.handlers.design import SiteDesign, build_design, site_design
from fedstats.site.handlers.survival import coarsen, protected_count, safe_horizon
from fedstats.site.patient_rows import count_patients
from fedstats.site.survival_grid import require_study_grid
from fedstats.site.task import SiteContext, TaskReply


def summaries(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """Log partial likelihood, score (``gradient``) and information (``hessian``) at ``beta``.

    For ``Surv(start, stop, event)`` an exact reply also needs every event
    time's risk set to hold at least ``k`` patients (:func:`_check_risk_sets`).
    """
    spec = spec_from_args(args)
    beta = checked_beta(ctx.name, args, spec.n_params)
    data, patients = _sorted(ctx, args)
    if ctx.exact:
        _check_counting_request(ctx, spec, task="cox.summaries")
        _check_risk_sets(ctx, spec, data)
    result = partial_likelihood(data, beta, args["ties"])
    return TaskReply(
        {"gradient": result.score, "hessian": result.information, "loglik": result.loglik},
        contributors=patients,
    )


def _sorted(ctx: SiteContext, args: dict[str, Any]) -> tuple[SortedSurvival, int]:
    """The site's survival design, sorted once per design and cached, and its patients."""
    spec = spec_from_args(args)
    cache: BoundedCache = ctx.cache.setdefault("survival", BoundedCache())
    key = design_key(spec, exact=ctx.exact, frame=ctx.frame)  # as the design's own
    kept = cache.get(key)
    if kept is not None:
        return kept
    design = site_design(ctx, spec)
    if design.time is None or design.stratum is None:
        raise MalformedRequestError(site=ctx.name, task=None, reason="not a survival design")
    data = sort_survival(
        design.X,
        design.time,
        design.y,
        design.stratum,
        entry=design.entry,
        case_weights=design.weights,
    )
    sorted_design = data, count_patients(ctx, design.rows, design.n_obs)
    cache.put(key, sorted_design)
    return sorted_design


def _check_counting_request(ctx: SiteContext, spec: DesignSpec, *, task: str) -> None:
    """Pin the entry column of an exact ``Surv(start, stop, event)`` request.

    The attack: two fits of one outcome whose start columns differ on a few
    rows differ only in those rows' risk-set terms, so their difference is a
    function of a few patients. The first start column a site answers about
    for ``(stop, event)`` is the study's (kept with the differencing guard, as
    the time grid of :mod:`fedstats.site.survival_grid`); another start column
    for that outcome is refused (:class:`~fedstats.errors.DisclosureError`,
    rule ``entry``). The approved protocol fixes it when it names the outcome.
    """
    counting = counting_outcome(spec.outcome)
    if counting is None or ctx.protocol is not None:  # a protocol admitted this outcome exactly
        return
    start, stop, event = counting
    study = ctx.guard.study_column(f"entry|{stop}|{event}", start)
    if study != start:
        raise DisclosureError(
            site=ctx.name,
            task=task,
            reason=(
                f"this site's study enters patients of Surv(·, {stop}, {event}) at {study!r}, "
                f"the first start column it answered about; an exact request with another "
                f"({start!r}) could be differenced against it. Use {study!r}, or ask for a "
                "private release"
            ),
            rule="entry",
        )


def _check_risk_sets(ctx: SiteContext, spec: DesignSpec, data: SortedSurvival) -> None:
    """Refuse an exact ``Surv(start, stop, event)`` reply with a risk set of 1 to ``k - 1``.

    The attack: a start column the coordinator picks (any numeric column
    earlier than the stop) can leave one patient, or two, at risk at an event
    time; that time's term of the score, ``x_i - S1/S0``, is then a function of
    those patients' covariates alone. So every event time's risk set must hold
    ``k`` patients at least (a patient's intervals never overlap, so rows at
    risk are patients). Risk sets of ``Surv(time, event)`` are the suffixes of
    the time order and are not checked here (a model of its own, whose cells
    the cell rules check).
    """
    if data.late is None:
        return
    k = ctx.policy.k_cell
    sizes = risk_set_sizes(data)
    if sizes.size and int(sizes.min()) < k:
        raise DisclosureError(
            site=ctx.name,
            task="cox.summaries",
            reason=(
                f"at {int((sizes < k).sum())} event times fewer than {k} patients are at risk "
                f"in {spec.outcome} (start < t <= stop), so those terms would describe single "
                "patients; check the start column, or fit the pooled model on a coarser grid"
            ),
            rule="cells",
        )


# ------------------------------------------------------------------ pooled baseline (time grid)
_GRID_FIELDS = ("d", "S0", "S1", "S2", "E0", "E1", "E2", "x_events", "d_weighted")


def grid_summaries(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """Risk-set and tied-event sums on the grid at ``beta`` (:func:`fedstats.cox_math.grid_sums`).

    Times are coarsened up to the next grid point and the site's follow-up
    ends at its safe horizon (:func:`fedstats.site.handlers.survival.safe_horizon`):
    every released sum covers 0 or at least ``k`` patients, and so does
    every difference of two consecutive risk-set sums. The grid is the
    study's grid for the outcome (:func:`fedstats.site.survival_grid.require_study_grid`).
    """
    spec = spec_from_args(args)
    beta = checked_beta(ctx.name, args, spec.n_params)
    grid = checked_grid(args)
    counting = counting_outcome(spec.outcome)
    names = survival_outcome(spec.outcome) if counting is None else counting[1:]
    if names is None:
        raise MalformedRequestError(site=ctx.name, task=None, reason="not a survival design")
    require_study_grid(ctx, names[0], names[1], grid, task=GRID_TASK)
    _check_counting_request(ctx, spec, task=GRID_TASK)
    design = site_design(ctx, spec)
    if design.time is None:
        raise MalformedRequestError(site=ctx.name, task=None, reason="not a survival design")
    try:
        rows, truncated = _grid_rows(ctx, spec, design, grid)
        sums = rows.sums(beta)
    except ValueError as error:
        raise MalformedRequestError(site=ctx.name, task=None, reason=str(error)) from None
    payload: dict[str, Any] = {name: getattr(sums, name) for name in _GRID_FIELDS}
    payload["truncated"] = truncated
    return TaskReply(payload, contributors=count_patients(ctx, design.rows, design.n_obs))


def _grid_rows(
    ctx: SiteContext, spec: DesignSpec, design: SiteDesign, grid: np.ndarray
) -> tuple[GridRows, int]:
    """The design's rows coarsened to ``grid`` (:func:`_coarsened`) and laid out for grid
    sums (:class:`~fedstats.cox_math.GridRows`), with the patients censored early; built once
    per design and grid and kept between the rounds of a fit, as the design is."""
    cache: BoundedCache = ctx.cache.setdefault("grid rows", BoundedCache())
    key = (*design_key(spec, exact=ctx.exact, frame=ctx.frame), point_digest(grid))
    kept = cache.get(key)
    if kept is not None:
        return kept
    coarse, entry, event, truncated = _coarsened(
        ctx, design.time, design.y.astype(bool), grid, entry=design.entry
    )
    used = coarse >= 0
    weights = design.weights
    rows = GridRows.of(
        design.X[used],
        coarse[used],
        event[used],
        len(grid),
        entry=None if entry is None else entry[used],
        case_weights=None if weights is None else weights[used],
    )
    cache.put(key, (rows, truncated))
    return rows, truncated


def _coarsened(
    ctx: SiteContext,
    time: np.ndarray,
    event: np.ndarray,
    grid: np.ndarray,
    *,
    entry: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, int]:
    """Grid index of each row's stop (-1: dropped) and start (``None`` for ``Surv(time, event)``),
    its event flag, and the patients censored early (1 to ``k - 1`` released as ``k``:
    :func:`~fedstats.site.handlers.survival.protected_count`).

    Starts and stops are coarsened up alike (``t -> min{g_k >= t}``, a start of
    0 before the first point), so one patient's consecutive intervals stay
    consecutive, and a row is at risk at the points ``start* < j <= stop*``; a
    row whose interval lies between two grid points is never at risk on the
    grid and is dropped (its event with it: the fit reports the events used).
    Rows after the safe horizon are censored there; with no safe grid point at
    all, every row is dropped. With entries the horizon also needs 0 or at
    least ``k`` rows entering at each point, since a risk-set sum's change then
    holds the entrants too.
    """
    coarse, event = coarsen(time, event, grid)
    start = None
    if entry is not None:
        start = np.searchsorted(np.concatenate(([0.0], grid)), entry, side="left") - 1
        empty = start >= coarse
        coarse, event = np.where(empty, -1, coarse), event & ~empty
    used = coarse >= 0
    risk = np.cumsum(np.bincount(coarse[used], minlength=len(grid))[::-1])[::-1]
    died = np.bincount(coarse[event], minlength=len(grid)).astype(np.float64)
    if start is None:
        horizon = safe_horizon(risk.astype(np.float64), died, ctx.policy.min_count, leavers=True)
    else:
        horizon = _counting_horizon(risk, died, coarse[used], start[used], ctx.policy.min_count)
    late = used & (coarse > horizon)
    truncated = protected_count(int(late.sum()), ctx.policy.min_count)
    if horizon < 0:
        return np.full(len(time), -1), start, np.zeros(len(time), dtype=bool), truncated
    if start is not None:  # rows entering after the horizon are never at risk on the grid
        gone = used & (start >= horizon)
        coarse, event = np.where(gone, -1, coarse), event & ~gone
        late &= ~gone
    coarse = np.where(late, horizon, coarse)
    return coarse, start, event & ~late, truncated


def _counting_horizon(
    reaching: np.ndarray, died: np.ndarray, stop: np.ndarray, start: np.ndarray, k: int
) -> int:
    """The safe horizon of ``Surv(start, stop, event)`` rows on the grid (-1: none).

    As :func:`~fedstats.site.handlers.survival.safe_horizon` with leavers,
    except that nobody at risk is safe (before the first entry, nobody is),
    and that the rows entering at a point, which join the next point's risk
    set, are 0 or at least ``k`` too: a risk-set sum then changes by the
    leavers less the entrants, each a sum over ``k`` rows or none.
    ``reaching`` counts, per point, the rows whose stop is at or after it;
    ``stop`` and ``start`` are the rows' grid indices (-1: entered before the
    first point).
    """
    n_points = len(died)
    small = lambda counts: (counts > 0) & (counts < k)  # noqa: E731
    entering = np.bincount(start[start >= 0], minlength=n_points)
    at_risk = reaching - np.cumsum(entering[::-1])[::-1]
    stopping = np.bincount(stop, minlength=n_points)
    unsafe = small(died) | small(at_risk) | small(stopping) | small(stopping - died)
    unsafe |= small(at_risk - died)
    unsafe[1:] |= small(entering[:-1])  # entrants at j join at j + 1: end at j
    return int(np.argmax(unsafe)) - 1 if unsafe.any() else n_points - 1


# ------------------------------------------------------------------ concordance


def concordance(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """Harrell's C pair counts among this site's patients at ``beta`` (pairs within the site).

    Three counts whatever the design's size, so the saturation rule of
    ``prepare`` (parameters per patient) does not apply: held-out sets may be
    small.
    """
    spec = spec_from_args(args)
    beta = checked_beta(ctx.name, args, spec.n_params)
    design = build_design(ctx, spec, saturation=False)
    if design.time is None:
        raise MalformedRequestError(site=ctx.name, task=None, reason="not a survival design")
    concordant, tied, comparable = concordance_counts(design.time, design.y, design.X @ beta)
    return TaskReply(
        {"concordant": concordant, "tied": tied, "comparable": comparable},
        contributors=len(design.time),
    )


# ------------------------------------------------------------------ robust variance


def robust(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """``sum_c U_c U_c'`` over this site's clusters ``c`` of summed score residuals at ``beta``.

    Clusters are the values of the ``cluster`` column (patients, when null)
    within this site: a cluster never spans sites. The coordinator's robust
    covariance is ``I^-1 (sum over sites) I^-1`` (Lin & Wei, JASA 1989).
    """
    spec = spec_from_args(args)
    beta = checked_beta(ctx.name, args, spec.n_params)
    data, patients = _sorted(ctx, args)
    residuals = score_residuals(data, beta)
    cluster = args.get("cluster")
    if cluster is None:
        summed = residuals
    else:
        if cluster not in ctx.frame.columns:
            raise MissingColumnError(site=ctx.name, column=cluster)
        design = site_design(ctx, spec)
        labels = ctx.frame[cluster].to_numpy()[design.rows][data.order]
        if pd.isna(labels).any():
            raise MissingValuesError(
                site=ctx.name, column=cluster, count=int(pd.isna(labels).sum())
            )
        codes = pd.factorize(labels)[0]
        summed = np.zeros((codes.max() + 1, spec.n_params))
        np.add.at(summed, codes, residuals)
    return TaskReply({"meat": summed.T @ summed}, contributors=patients)
