"""Site side of the Fine–Gray model: weighted risk-set sums on the study's time grid.

Fine & Gray (JASA 1999) model the subdistribution hazard of one cause: a
patient who failed from a competing cause stays in the risk set after their
event time ``T_i``, with the censoring weight ``G(t-) / G(T_i-)`` (``G`` the
Kaplan–Meier curve of the censoring distribution, censorings at a time
counted after the events at it): the rows R's ``survival::finegray()``
expands to, which a weighted Cox fit then uses. On the grid (times coarsened
up to the next point ``g_j``), a competing event at point ``e`` weighs
``G_{j-1} / G_{e-1}`` in the risk set of point ``j > e`` (``G_{-1} = 1``), and
every other patient weighs 1 while ``t* >= g_j``.

The coordinator computes ``G`` from the pooled counts this task returns (the
first round, at ``beta = 0``, any valid ``G``) and sends it as numbers on the
grid. For coefficients ``beta`` the site returns the risk-set and tied-event
sums of :class:`fedstats.cox_math.GridSums` for those weights, with the events
of the cause only, plus the counts per grid point (at risk, events, competing
events, censorings). Under ``cmprsk::crr``'s convention (request field
``convention``, :mod:`fedstats.contract.fine_gray`) it adds, per grid point, the
sums of ``exp(x' beta)`` and ``exp(x' beta) x`` over the competing events there
(``competing_S0``, ``competing_S1``: a cell of 0 or at least ``k`` patients, as
the events of the cause in the Cox sums), from which the coordinator derives
the censoring term of ``crr``'s variance (:func:`score_residuals`).

Disclosure control: the horizon, the status cells and the pinned grid of
:mod:`fedstats.site.handlers.competing`, and the agreed design's own rules
(built with the event indicator ``status == cause``). The coordinator's ``G``
is hostile input: it must be a non-increasing function in ``(0, 1]`` on the
grid, else the request is refused. Then every weight is in ``(0, 1]``, and
a patient's weight depends only on the grid point of their event: every
patient shares it with the at least ``k - 1`` others of their cell (the
events of one cause at one point, or everyone still followed, both 0 or at
least ``k`` patients by the horizon rule), so no patient carries more than
``1/k`` of a risk set's total weight: a crafted ``G`` cannot make one patient
dominate a sum (the (n, k)-dominance rule with ``n = 1``, Hundepool et al.
2012, §4.2.2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedstats.contract.design import DesignSpec, survival_outcome
from fedstats.contract.fine_gray import CENSORING_INPUTS, COMPETING_FIELDS, convention_of
from fedstats.contract.tasks.competing import checked_cause
from fedstats.contract.tasks.design import checked_beta, spec_from_args
from fedstats.contract.tasks.fine_gray import ROBUST_TASK, SUM_FIELDS, TASK
from fedstats.contract.tasks.survival import checked_grid
from fedstats.cox_math import GridSums, grid_sums, risk_scores
from fedstats.errors import DisclosureError, MalformedRequestError, MissingColumnError
from fedstats.site.handlers.competing import (
    check_status_cells,
    coarsened,
    horizon_ok,
    last_ok,
    leaving_cells,
    status_codes,
)
from fedstats.site.handlers.design import SiteDesign, site_design
from fedstats.site.handlers.survival import protected_count
from fedstats.site.survival_grid import require_study_grid
from fedstats.site.task import SiteContext, TaskReply


def checked_censoring(site: str, args: dict[str, Any], n_points: int) -> np.ndarray:
    """The coordinator's censoring survival ``G`` on the grid, refused unless it is a
    non-increasing function with values in ``(0, 1]`` (see the module docstring)."""
    values = args.get("censoring")
    if not (isinstance(values, np.ndarray) and values.shape == (n_points,)):
        raise MalformedRequestError(
            site=site, task=None, reason=f"'censoring' must be an array of {n_points} numbers"
        )
    G = values.astype(np.float64)
    if not (np.isfinite(G).all() and (G > 0).all() and (G <= 1).all() and (np.diff(G) <= 0).all()):
        raise DisclosureError(
            site=site,
            task=TASK,
            reason=(
                "the censoring weights must come from a survival curve: values in (0, 1], "
                "never increasing along the grid (a crafted curve could make a few patients "
                "dominate the weighted sums)"
            ),
            rule="cells",
        )
    return G


@dataclass(frozen=True)
class Prepared:
    """One site's Fine–Gray rows on the grid, after the horizon (never leaves the site)."""

    X: np.ndarray
    point: np.ndarray
    """Each kept row's grid index (its event or censoring point)."""
    codes: np.ndarray
    """Each kept row's status code (0 for patients censored at the horizon)."""
    cause: int
    censoring: np.ndarray
    convention: str
    """``"crr"`` or ``"finegray"`` (:data:`fedstats.contract.fine_gray.CONVENTIONS`)."""
    n_obs: int
    n_dropped: int
    truncated: int


def prepared(ctx: SiteContext, args: dict[str, Any], task: str) -> Prepared:
    """Every check of a Fine–Gray request, then the site's rows cut at its safe horizon."""
    spec = spec_from_args(args)
    cause = checked_cause(args)
    grid = checked_grid(args)
    G = checked_censoring(ctx.name, args, len(grid))
    try:
        convention = convention_of(args)
    except ValueError as error:
        raise MalformedRequestError(site=ctx.name, task=None, reason=str(error)) from None
    names = survival_outcome(spec.outcome)
    if names is None:
        raise MalformedRequestError(site=ctx.name, task=None, reason="not a survival design")
    time_name, status_name = names
    require_study_grid(ctx, time_name, status_name, grid, task=task)
    if status_name not in ctx.frame.columns:
        raise MissingColumnError(site=ctx.name, column=status_name)
    all_codes = status_codes(ctx.name, status_name, ctx.frame[status_name])
    design = _cause_design(ctx, spec, status_name, cause, all_codes)
    rows = design.rows if design.rows is not None else np.arange(design.n_obs)
    codes = all_codes[rows]
    check_status_cells(ctx, task=task, column=status_name, codes=codes, rows=rows)
    point, codes = coarsened(np.asarray(design.time), codes, grid)
    risk, cells = leaving_cells(point, codes, len(grid))
    horizon = last_ok(horizon_ok(risk, cells, ctx.policy.min_count))
    late = point > horizon
    truncated = int(late.sum()) if horizon >= 0 else len(point)
    kept = np.full(len(point), horizon >= 0)
    return Prepared(
        X=design.X[kept],
        point=np.minimum(point, max(horizon, 0))[kept],
        codes=np.where(late, 0.0, codes)[kept],
        cause=cause,
        censoring=G,
        convention=convention,
        n_obs=design.n_obs,
        n_dropped=design.n_dropped,
        truncated=protected_count(truncated, ctx.policy.min_count),
    )


def summaries(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """Weighted risk-set sums and counts on the grid at ``beta`` (see the module docstring)."""
    beta = checked_beta(ctx.name, args, spec_from_args(args).n_params)
    rows = prepared(ctx, args, TASK)
    K, point, codes = len(rows.censoring), rows.point, rows.codes
    try:
        sums = fine_gray_sums(rows.X, point, codes, rows.cause, beta, rows.censoring, K)
    except ValueError as error:
        raise MalformedRequestError(site=ctx.name, task=None, reason=str(error)) from None
    counted = lambda mask: np.bincount(point[mask], minlength=K).astype(np.float64)  # noqa: E731
    starts = counted(np.ones(len(point), dtype=bool))
    payload: dict[str, Any] = {name: getattr(sums, name) for name in SUM_FIELDS}
    payload.update(
        at_risk=np.cumsum(starts[::-1])[::-1],
        competing=counted((codes > 0) & (codes != rows.cause)),
        censored=counted(codes == 0),
        truncated=rows.truncated,
        n_obs=rows.n_obs,
        n_dropped=rows.n_dropped,
    )
    if rows.convention == "crr":
        payload.update(zip(COMPETING_FIELDS, competing_sums(rows, beta), strict=True))
    return TaskReply(payload, contributors=rows.n_obs)


def competing_sums(rows: Prepared, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per grid point, ``sum exp(x' beta)`` and ``sum exp(x' beta) x`` over the competing
    events there (the events of every cause but the one modelled)."""
    K, p = len(rows.censoring), rows.X.shape[1]
    competing = (rows.codes > 0) & (rows.codes != rows.cause)
    Xc, e = rows.X[competing], rows.point[competing]
    r = risk_scores(Xc, beta)
    S0 = np.bincount(e, weights=r, minlength=K).astype(np.float64)
    S1 = np.zeros((K, p))
    np.add.at(S1, e, r[:, None] * Xc)
    return S0, S1


# ------------------------------------------------------------------ robust variance


def robust(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """``sum_i U_i U_i'`` over the site's patients of their Fine–Gray score residuals at
    ``beta`` (:func:`score_residuals`), for the pooled increments ``hazard`` (``dLambda_j``,
    K numbers >= 0) and risk-set means ``means`` (``xbar_j``, K x p) the coordinator sends.

    Each ``U_i`` is the patient's own event term less its weighted share of every risk set
    it belongs to, so the reply sums over cells of 0 or at least ``k`` patients (the events
    of a grid point, the risk set of a point, the competing events of a point), as the
    summaries do. Under ``cmprsk::crr``'s convention the request also carries the pooled
    ``censoring_term`` and ``censoring_hazard`` and ``U_i`` adds ``psi_i``
    (:func:`censoring_residuals`), which depends on the patient only through their grid
    point and whether they were censored there: the same cells.
    """
    p = spec_from_args(args).n_params
    beta = checked_beta(ctx.name, args, p)
    rows = prepared(ctx, args, ROBUST_TASK)
    K = len(rows.censoring)
    hazard, means = args.get("hazard"), args.get("means")
    if not (
        isinstance(hazard, np.ndarray)
        and hazard.shape == (K,)
        and isinstance(means, np.ndarray)
        and means.shape == (K, p)
        and np.isfinite(hazard).all()
        and (hazard >= 0).all()
        and np.isfinite(means).all()
    ):
        raise MalformedRequestError(
            site=ctx.name,
            task=None,
            reason=f"'hazard' must be {K} finite numbers >= 0 and 'means' a finite {K} x {p} array",
        )
    censoring = checked_censoring_inputs(ctx.name, args, rows.convention, K, p)
    try:
        residuals = score_residuals(rows, beta, hazard.astype(float), means.astype(float))
        if censoring is not None:
            residuals += censoring_residuals(rows, *censoring)
    except ValueError as error:
        raise MalformedRequestError(site=ctx.name, task=None, reason=str(error)) from None
    return TaskReply({"meat": residuals.T @ residuals}, contributors=rows.n_obs)


def checked_censoring_inputs(
    site: str, args: dict[str, Any], convention: str, K: int, p: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """``censoring_term`` (K x p, finite) and ``censoring_hazard`` (K numbers in [0, 1]) of a
    ``"crr"`` robust variance; ``None`` under ``"finegray"``, which must send neither."""
    if convention != "crr":
        if any(name in args for name in CENSORING_INPUTS):
            raise MalformedRequestError(
                site=site,
                task=None,
                reason="the censoring-estimation term belongs to the 'crr' convention only",
            )
        return None
    term, hazard = (args.get(name) for name in CENSORING_INPUTS)
    if not (
        isinstance(term, np.ndarray)
        and term.shape == (K, p)
        and np.isfinite(term).all()
        and isinstance(hazard, np.ndarray)
        and hazard.shape == (K,)
        and np.isfinite(hazard).all()
        and ((hazard >= 0) & (hazard <= 1)).all()
    ):
        raise MalformedRequestError(
            site=site,
            task=None,
            reason=f"'censoring_term' must be a finite {K} x {p} array and 'censoring_hazard' "
            f"{K} numbers in [0, 1]",
        )
    return term.astype(np.float64), hazard.astype(np.float64)


def censoring_residuals(rows: Prepared, term: np.ndarray, hazard: np.ndarray) -> np.ndarray:
    """``psi_i``, each patient's censoring-estimation term of ``cmprsk::crr``'s score residual
    (Fine & Gray, JASA 1999, section 4): ``psi_i = sum_u b_u [I(T_i = u, censored) - I(T_i >=
    u) lambda_u]`` with the pooled ``b_u = q(u) / n_u`` (``term``) and ``lambda_u = c_u / n_u``
    (``hazard``) of :func:`fedstats.contract.fine_gray.censoring_terms`.

    It depends on the patient only through their grid point and whether they were censored
    there, so every sum it enters is over cells of 0 or at least ``k`` patients, whatever
    ``term`` and ``hazard`` the coordinator sends.
    """
    point = rows.point
    cumulative = np.cumsum(term * hazard[:, None], axis=0)
    psi = -cumulative[point]
    censored = rows.codes == 0
    psi[censored] += term[point[censored]]
    return psi


def score_residuals(
    rows: Prepared, beta: np.ndarray, hazard: np.ndarray, means: np.ndarray
) -> np.ndarray:
    """Breslow-type score residuals of the weighted Fine–Gray partial likelihood, one per patient.

    ``U_i = sum_j w_i(t_j) [dN_i(t_j) - Y_i(t_j) r_i dLambda_j] (x_i - xbar_j)`` with
    ``r_i = exp(x_i' beta)``, ``w_i`` the patient's weight (1 while followed, ``G_{j-1} /
    G_{e-1}`` after a competing event at point ``e``), ``dLambda_j = d_j / S0_j`` and
    ``xbar_j = S1_j / S0_j`` from the pooled weighted sums: the residuals Lin & Wei (JASA
    1989) sum per patient, of which the robust covariance of R's ``coxph(..., weights =
    fgwt)`` with ``cluster(id)`` on ``finegray()`` rows is built. Cumulative sums over the
    grid give each patient's share of every risk set in ``O(n p + K p)``.
    """
    X, point, codes = rows.X, rows.point, rows.codes
    r = risk_scores(X, beta)
    before = np.r_[1.0, rows.censoring[:-1]]  # G_{j-1}
    C0, C1 = np.cumsum(hazard), np.cumsum(hazard[:, None] * means, axis=0)
    H0 = np.cumsum(before * hazard)
    H1 = np.cumsum((before * hazard)[:, None] * means, axis=0)
    share0, share1 = C0[point], C1[point]
    competing = (codes > 0) & (codes != rows.cause)
    e = point[competing]
    share0[competing] += (H0[-1] - H0[e]) / before[e]
    share1[competing] += (H1[-1] - H1[e]) / before[e][:, None]
    residuals = -r[:, None] * (X * share0[:, None] - share1)
    events = codes == rows.cause
    residuals[events] += X[events] - means[point[events]]
    return residuals


def fine_gray_sums(
    X: np.ndarray,
    point: np.ndarray,
    codes: np.ndarray,
    cause: int,
    beta: np.ndarray,
    G: np.ndarray,
    n_points: int,
) -> GridSums:
    """:class:`~fedstats.cox_math.GridSums` of the Fine–Gray risk sets at ``beta``.

    The unweighted part (every row while ``t* >= g_j``; events of ``cause``)
    is :func:`fedstats.cox_math.grid_sums`. A competing event at point ``e``
    adds ``w G_{j-1} / G_{e-1}`` (``w = exp(x' beta)``) to the risk set of every
    later point ``j``: per point, ``G_{j-1}`` times the running sum over
    ``e < j`` of ``w / G_{e-1}`` (and of ``w x``, ``w x x'``).
    """
    base = grid_sums(X, point, codes == cause, beta, n_points)
    competing = (codes > 0) & (codes != cause)
    if not competing.any():
        return base
    Xc, e = X[competing], point[competing]
    w = risk_scores(Xc, beta)
    before = np.r_[1.0, G[:-1]]  # G_{j-1}, with G_{-1} = 1
    scale = w / before[e]
    p = X.shape[1]
    A0 = np.bincount(e, weights=scale, minlength=n_points)
    A1 = np.zeros((n_points, p))
    np.add.at(A1, e, scale[:, None] * Xc)
    rows, columns = np.triu_indices(p)  # x x' packed as GridSums holds it
    A2 = np.zeros((n_points, len(rows)))
    np.add.at(A2, e, scale[:, None] * Xc[:, rows] * Xc[:, columns])

    def later(values: np.ndarray) -> np.ndarray:
        """``G_{j-1}`` times the sum of ``values`` over points ``e < j``."""
        running = np.cumsum(values, axis=0)
        shifted = np.concatenate([np.zeros_like(running[:1]), running[:-1]])
        return before.reshape((-1,) + (1,) * (values.ndim - 1)) * shifted

    return dataclasses.replace(
        base, S0=base.S0 + later(A0), S1=base.S1 + later(A1), S2=base.S2 + later(A2)
    )


def _cause_design(
    ctx: SiteContext, spec: DesignSpec, status: str, cause: int, codes: np.ndarray
) -> SiteDesign:
    """The agreed design with the event indicator ``status == cause`` (missing kept missing).

    Built through the design's own checks on a copy of the frame whose status
    column is that indicator, cached per status column and cause so each
    cause's design is checked once (its cell rules and differencing guard).
    """
    key = f"fine_gray:{status}:{cause}"
    cached = ctx.cache.get(key)
    if cached is None:
        frame = ctx.frame.copy()
        frame[status] = np.where(np.isnan(codes), np.nan, (codes == cause).astype(np.float64))
        cached = ctx.cache[key] = (frame, {})
    frame, cache = cached
    view = dataclasses.replace(ctx, frame=frame, cache=cache)
    design = site_design(view, spec)
    if design.time is None:
        raise MalformedRequestError(site=ctx.name, task=None, reason="not a survival design")
    return design
