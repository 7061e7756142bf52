"""What both sides of a Fine–Gray fit derive from summed replies: the censoring weights and the
robust variance's pooled increments.

Two conventions (:data:`CONVENTIONS`), named after the R call each one equals:

* ``"crr"`` — ``cmprsk::crr``: the censoring curve is the ordinary Kaplan–Meier of the
  censorings, whose risk set at a time keeps the patients who fail at it (R's
  ``survfit(Surv(time, status == 0) ~ 1)``); Breslow's ties; and the variance of Fine &
  Gray (JASA 1999, 94:496–509, section 4) whose score residual ``eta_i + psi_i`` adds to
  each patient's Lin–Wei residual ``eta_i`` the term ``psi_i`` for the estimation of the
  censoring curve (:func:`censoring_terms`);
* ``"finegray"`` — ``survival::finegray()`` and a weighted ``coxph(..., cluster = id)``:
  censorings at a time counted after the events at it, Efron's or Breslow's ties, and the
  robust variance that takes the censoring weights as known.

A Fine–Gray fit (:mod:`fedstats.models.fine_gray`) asks its sites first for
counts on the grid at ``beta = 0`` with every censoring weight 1, then
computes the censoring curve ``G`` from their sums (:func:`censoring_survival`)
and sends it with every later round. A site that verifies paths re-derives
``G`` from the relayed, signed first-round replies, and the pooled increments
``dLambda_j = d_j / S0_j`` and means ``xbar_j = S1_j / S0_j`` a robust variance
is asked at (:func:`robust_inputs`) from the relayed replies at the fit's last
point, so neither can be chosen by the coordinator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

COUNT_FIELDS = ("at_risk", "d", "competing", "censored")
"""The first round's counts per grid point ``G`` is computed from."""

CONVENTIONS = ("crr", "finegray")
"""The Fine–Gray conventions: ``cmprsk::crr``'s and ``survival::finegray()`` + ``coxph``'s."""

WIRE_CONVENTION = "finegray"
"""The convention of a request that names none (requests made before conventions existed)."""

COMPETING_FIELDS = ("competing_S0", "competing_S1")
"""The ``"crr"`` convention's extra sums per grid point: ``sum exp(x' beta)`` and
``sum exp(x' beta) x`` over the competing events at the point (:func:`censoring_terms`)."""

CENSORING_INPUTS = ("censoring_term", "censoring_hazard")
"""The arrays a ``"crr"`` robust variance is asked at, besides ``hazard`` and ``means``."""


def convention_of(args: Mapping[str, Any]) -> str:
    """The request's convention, :data:`WIRE_CONVENTION` when it names none; ``ValueError``
    for anything else than one of :data:`CONVENTIONS`."""
    convention = args.get("convention", WIRE_CONVENTION)
    if not (isinstance(convention, str) and convention in CONVENTIONS):
        raise ValueError(f"'convention' must be one of {list(CONVENTIONS)}")
    return convention


def censoring_survival(
    at_risk: np.ndarray,
    events: np.ndarray,
    competing: np.ndarray,
    censored: np.ndarray,
    convention: str = WIRE_CONVENTION,
) -> np.ndarray:
    """Kaplan–Meier of the censoring distribution on the grid.

    ``"finegray"``: ``G(g_j) = prod_{l<=j} (1 - c_l / (n_l - d_l - e_l))`` with ``c`` the
    censorings, ``d`` and ``e`` the events of the cause and of the others at ``g_l``
    (R ``finegray()``'s convention: a censoring at a time happens after the events at it).
    ``"crr"``: ``G(g_j) = prod_{l<=j} (1 - c_l / n_l)``, the patients failing at ``g_l``
    still at risk of censoring there (``cmprsk::crr``'s ``survfit`` of the censorings).
    A factor whose risk set is empty is 1; the value is kept above 0 (a curve reaching 0
    leaves no later risk set to weigh).
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    remaining = at_risk if convention == "crr" else at_risk - events - competing
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(remaining > 0, 1.0 - censored / remaining, 1.0)
    G = np.cumprod(factor)
    return np.maximum(G, np.finfo(float).tiny)


def censoring_from_counts(
    total: Mapping[str, Any], convention: str = WIRE_CONVENTION
) -> np.ndarray:
    """``G`` from the first round's summed counts, each rounded to a whole number (sites
    summing in any order agree exactly), in the fit's ``convention``."""
    counts = {f: np.rint(np.asarray(total[f], dtype=np.float64)) for f in COUNT_FIELDS}
    return censoring_survival(counts["at_risk"], counts["d"], counts["competing"],
                              counts["censored"], convention)  # fmt: skip


def robust_inputs(total: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``dLambda_j = d_j / S0_j`` and ``xbar_j = S1_j / S0_j`` (0 where a risk set is empty)
    from the summed grid sums at the fit's last point."""
    S0 = np.asarray(total["S0"], dtype=np.float64)
    d = np.asarray(total["d"], dtype=np.float64)
    S1 = np.asarray(total["S1"], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        hazard = np.where(S0 > 0, d / S0, 0.0)
        means = np.where(S0[:, None] > 0, S1 / S0[:, None], 0.0)
    return hazard, means


def censoring_terms(
    total: Mapping[str, Any], censoring: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The pooled inputs of ``psi_i``, the censoring-estimation term of ``cmprsk::crr``'s
    score residuals (Fine & Gray, JASA 1999, section 4), from the summed grid sums at the fit's
    last point and its censoring curve ``G``.

    ``psi_i = sum_u q(u) / n_u dM^c_i(u)``, ``dM^c_i(u) = I(T_i = u, censored) - I(T_i >= u)
    c_u / n_u`` (``n_u`` at risk, ``c_u`` censored at grid point ``u``), with
    ``q(u) = sum_{s >= u} sum_{j: T_j < u, competing} w_j(s) exp(x_j' beta) (x_j - xbar_s)
    dLambda_s``: the paper's ``I(s >= u > X_j)``, as ``crr`` computes it. With
    ``w_j(s) = G_{s-1} / G_{e_j - 1}`` this is ``P1(u) T0(u) - P0(u) T1(u)`` for
    ``P_k(u) = sum_{e < u} R_k(e) / G_{e-1}`` (``R_0``, ``R_1`` the competing events' sums
    ``competing_S0``, ``competing_S1`` at point ``e``) and ``T_0(u) = sum_{s >= u} G_{s-1}
    dLambda_s``, ``T_1(u) = sum_{s >= u} G_{s-1} dLambda_s xbar_s``.

    Returns ``censoring_term`` (``q(u) / n_u``, K x p) and ``censoring_hazard``
    (``c_u / n_u``, K), 0 where nobody is at risk.
    """
    hazard, means = robust_inputs(total)
    n = np.rint(np.asarray(total["at_risk"], dtype=np.float64))
    c = np.rint(np.asarray(total["censored"], dtype=np.float64))
    R0 = np.asarray(total["competing_S0"], dtype=np.float64)
    R1 = np.asarray(total["competing_S1"], dtype=np.float64)
    G = np.asarray(censoring, dtype=np.float64)
    if not (n.shape == c.shape == R0.shape == G.shape == hazard.shape and R1.shape == means.shape):
        raise ValueError("the grid sums and the censoring curve have different lengths")
    before = np.r_[1.0, G[:-1]]  # G_{j-1}
    P0 = np.r_[0.0, np.cumsum(R0 / before)[:-1]]  # competing events strictly before u
    P1 = np.vstack([np.zeros((1, R1.shape[1])), np.cumsum(R1 / before[:, None], axis=0)[:-1]])
    step = before * hazard
    T0 = np.cumsum(step[::-1])[::-1]  # failure times s >= u
    T1 = np.cumsum((step[:, None] * means)[::-1], axis=0)[::-1]
    q = P1 * T0[:, None] - P0[:, None] * T1
    with np.errstate(divide="ignore", invalid="ignore"):
        term = np.where(n[:, None] > 0, q / n[:, None], 0.0)
        censoring_hazard = np.where(n > 0, c / n, 0.0)
    return term, censoring_hazard


def relayed_inputs(total: Mapping[str, Any], args: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Every array a robust variance of the fit ``args`` is asked at, from the summed replies
    at its last point: ``hazard`` and ``means`` (:func:`robust_inputs`), and under the
    ``"crr"`` convention ``censoring_term`` and ``censoring_hazard`` (:func:`censoring_terms`,
    with the fit's censoring curve)."""
    hazard, means = robust_inputs(total)
    derived = {"hazard": hazard, "means": means}
    if convention_of(args) == "crr":
        censoring = args.get("censoring")
        if not isinstance(censoring, np.ndarray):
            raise ValueError("the fit's censoring curve is missing")
        derived.update(zip(CENSORING_INPUTS, censoring_terms(total, censoring), strict=True))
    return derived


def relayed_fields(args: Mapping[str, Any]) -> tuple[str, ...]:
    """The summed reply fields :func:`relayed_inputs` reads for the fit ``args``."""
    fields = ("S0", "S1", "d")
    if convention_of(args) == "crr":
        fields += ("at_risk", "censored", *COMPETING_FIELDS)
    return fields
