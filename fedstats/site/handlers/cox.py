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

from collections import OrderedDict
from typing import Any

import numpy as np
import pandas as pd

from fedstats.cox_math import (
    TIES,
    SortedSurvival,
    concordance_counts,
    grid_sums,
    partial_likelihood,
    score_residuals,
    sort_survival,
)
from fedstats.errors import MalformedRequestError, MissingColumnError, MissingValuesError
from fedstats.schema import Array, Number
from fedstats.site.design import survival_outcome
from fedstats.site.handlers.design import build_design, checked_beta, site_design, spec_from_args
from fedstats.site.handlers.survival import checked_grid, coarsen, protected_count, safe_horizon
from fedstats.site.survival_grid import require_study_grid
from fedstats.site.task import SiteContext, TaskReply

_CACHE_SIZE = 4


def summaries_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)
    if spec.outcome_kind != "survival":
        raise MalformedRequestError(site=None, task=None, reason="the design is not a survival one")
    if args.get("ties") not in TIES:
        raise MalformedRequestError(site=None, task=None, reason=f"'ties' must be one of {TIES}")
    if args.get("dp") is not None:
        raise MalformedRequestError(
            site=None, task=None, reason="differentially private Cox fits are not offered yet"
        )
    p = spec.n_params
    return {"gradient": Array((p,)), "hessian": Array((p, p)), "loglik": Number()}


def summaries(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """Log partial likelihood, score (``gradient``) and information (``hessian``) at ``beta``."""
    spec = spec_from_args(args)
    beta = checked_beta(ctx.name, args, spec.n_params)
    data = _sorted(ctx, args)
    result = partial_likelihood(data, beta, args["ties"])
    return TaskReply(
        {"gradient": result.score, "hessian": result.information, "loglik": result.loglik},
        contributors=len(data.time),
    )


def _sorted(ctx: SiteContext, args: dict[str, Any]) -> SortedSurvival:
    """The site's survival design, sorted once per design and cached."""
    spec = spec_from_args(args)
    cache: OrderedDict = ctx.cache.setdefault("survival", OrderedDict())
    if spec.key in cache:
        cache.move_to_end(spec.key)
        return cache[spec.key]
    design = site_design(ctx, spec)
    if design.time is None or design.stratum is None:
        raise MalformedRequestError(site=ctx.name, task=None, reason="not a survival design")
    data = sort_survival(design.X, design.time, design.y, design.stratum)
    cache[spec.key] = data
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return data


# ------------------------------------------------------------------ pooled baseline (time grid)
GRID_TASK = "cox.grid_summaries"
_GRID_FIELDS = ("d", "S0", "S1", "S2", "E0", "E1", "E2", "x_events")


def grid_summaries_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)
    if spec.outcome_kind != "survival" or spec.strata:
        raise MalformedRequestError(
            site=None,
            task=None,
            reason="the pooled-baseline Cox model takes a survival design without strata",
        )
    if args.get("dp") is not None:
        raise MalformedRequestError(
            site=None, task=None, reason="differentially private Cox fits are not offered yet"
        )
    grid = checked_grid(args)
    p, K = spec.n_params, len(grid)
    return {
        "d": Array((K,)),
        "S0": Array((K,)),
        "S1": Array((K, p)),
        "S2": Array((K, p, p)),
        "E0": Array((K,)),
        "E1": Array((K, p)),
        "E2": Array((K, p, p)),
        "x_events": Array((p,)),
        "truncated": Number(),
    }


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
    names = survival_outcome(spec.outcome)
    if names is None:
        raise MalformedRequestError(site=ctx.name, task=None, reason="not a survival design")
    require_study_grid(ctx, names[0], names[1], grid, task=GRID_TASK)
    design = site_design(ctx, spec)
    if design.time is None:
        raise MalformedRequestError(site=ctx.name, task=None, reason="not a survival design")
    coarse, event, truncated = _coarsened(ctx, design.time, design.y.astype(bool), grid)
    try:
        sums = grid_sums(design.X[coarse >= 0], coarse[coarse >= 0], event[coarse >= 0], beta,
                         len(grid))  # fmt: skip
    except ValueError as error:
        raise MalformedRequestError(site=ctx.name, task=None, reason=str(error)) from None
    payload: dict[str, Any] = {name: getattr(sums, name) for name in _GRID_FIELDS}
    payload["truncated"] = truncated
    return TaskReply(payload, contributors=len(design.time))


def _coarsened(
    ctx: SiteContext, time: np.ndarray, event: np.ndarray, grid: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """Grid index of each row (-1: dropped), its event flag, and the patients censored early
    (1 to ``k - 1`` released as ``k``: :func:`~fedstats.site.handlers.survival.protected_count`).

    Rows after the safe horizon are censored there; with no safe grid point
    at all, every row is dropped.
    """
    coarse, event = coarsen(time, event, grid)
    risk = np.cumsum(np.bincount(coarse, minlength=len(grid))[::-1])[::-1].astype(np.float64)
    died = np.bincount(coarse[event], minlength=len(grid)).astype(np.float64)
    horizon = safe_horizon(risk, died, ctx.policy.min_count, leavers=True)
    late = coarse > horizon
    truncated = protected_count(int(late.sum()), ctx.policy.min_count)
    if horizon < 0:
        return np.full(len(time), -1), np.zeros(len(time), dtype=bool), truncated
    coarse = np.where(late, horizon, coarse)
    return coarse, event & ~late, truncated


# ------------------------------------------------------------------ concordance
CONCORDANCE_TASK = "cox.concordance"


def concordance_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)
    if spec.outcome_kind != "survival":
        raise MalformedRequestError(site=None, task=None, reason="the design is not a survival one")
    return {"concordant": Number(), "tied": Number(), "comparable": Number()}


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
ROBUST_TASK = "cox.robust"


def robust_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)
    if spec.outcome_kind != "survival":
        raise MalformedRequestError(site=None, task=None, reason="the design is not a survival one")
    cluster = args.get("cluster")
    if cluster is not None and not (isinstance(cluster, str) and cluster):
        raise MalformedRequestError(
            site=None, task=None, reason="'cluster' names a column or is null"
        )
    return {"meat": Array((spec.n_params, spec.n_params))}


def robust(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """``sum_c U_c U_c'`` over this site's clusters ``c`` of summed score residuals at ``beta``.

    Clusters are the values of the ``cluster`` column (patients, when null)
    within this site: a cluster never spans sites. The coordinator's robust
    covariance is ``I^-1 (sum over sites) I^-1`` (Lin & Wei, JASA 1989).
    """
    spec = spec_from_args(args)
    beta = checked_beta(ctx.name, args, spec.n_params)
    data = _sorted(ctx, args)
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
    return TaskReply({"meat": summed.T @ summed}, contributors=len(data.time))
