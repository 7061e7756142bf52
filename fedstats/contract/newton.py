"""Newton's method: the step, the stopping rule, the rank check, the covariance.

Part of the contract both sides share: the coordinator takes these steps, and a site
re-derives them before it answers at the next point (:mod:`fedstats.contract.paths`).
Used by every model whose sites return a score and an information matrix
(logistic regression, GLMs, the Cox model).

**Stopping rule.** The fit stops on the Newton decrement
``lambda^2 = g^T H^-1 g = g^T step`` (Boyd & Vandenberghe, *Convex
Optimization*, 2004, §9.5.1), divided by the dispersion ``phi`` where the
likelihood has one (a Gaussian GLM). It is invariant to any linear change of
the coefficients' scale — centring, rescaling, re-coding a covariate —
because ``lambda^2`` is the squared length of the step in the metric of the
information, the scale on which standard errors are measured:
``|step_j| <= lambda se_j``, and ``lambda^2 / 2`` estimates how far the
log-likelihood is from its maximum. A test on the raw step, ``|step| <= tol
(1 + |beta|)``, is not: with covariates on scales far apart (an information
matrix of condition number ``1e14``), rounding noise in the step exceeds any
fixed raw tolerance although the fit has converged.

:func:`decrement_converged` stops when ``lambda^2 <= tol * STRICT`` (the
current point is within ``1e-8`` standard errors of the maximum, so the
information and log-likelihood evaluated there are those of the estimate), or
when two successive rounds have ``lambda^2 <= tol`` (the previous step was
already small, and Newton's quadratic convergence puts the current point
within ``O(lambda_prev^2)`` of the maximum; this also ends fits whose
decrement cannot fall further because of rounding).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.linalg

from fedstats.errors import FormulaError

DECREMENT_TOL = 1e-10
"""Default ``tol`` of the Newton decrement (``lambda^2``, log-likelihood units)."""
STRICT = 1e-6
"""A decrement below ``tol * STRICT`` ends the fit at once (see the module docstring)."""


def newton_decrement(gradient: np.ndarray, step: np.ndarray, dispersion: float = 1.0) -> float:
    """``lambda^2 = g^T H^-1 g / phi``, from the score ``g`` and the Newton step ``H^-1 g``."""
    return float(gradient @ step) / dispersion


def decrement_converged(decrement: float, previous: float, tol: float) -> bool:
    """Whether a fit with this round's and the previous round's decrements has converged."""
    return decrement <= tol * STRICT or (decrement <= tol and previous <= tol)


def newton_step(
    hessian: np.ndarray, gradient: np.ndarray, names: list[str], first: bool
) -> np.ndarray | None:
    """Solve ``H step = g`` by Cholesky.

    In the first round the information is checked for rank deficiency on the
    correlation scale (``D^-1/2 H D^-1/2``, ``D = diag(H)``): a smallest
    eigenvalue below ``1e-10`` means collinear or constant design columns,
    reported by name. Later, a singular information signals separation and
    returns ``None``.
    """
    if first:
        check_rank(hessian, names)
    try:
        factor = scipy.linalg.cho_factor(hessian, check_finite=True)
        return scipy.linalg.cho_solve(factor, gradient)
    except (np.linalg.LinAlgError, ValueError):
        return None


def check_rank(hessian: np.ndarray, names: list[str]) -> None:
    diagonal = np.diag(hessian)
    constant = [names[j] for j in np.flatnonzero(diagonal <= 0)]
    if constant:
        raise FormulaError(f"design columns {constant} are zero at every site; drop them")
    scale = 1 / np.sqrt(diagonal)
    values, vectors = np.linalg.eigh(hessian * np.outer(scale, scale))
    if values[0] < 1e-10:
        null = vectors[:, 0]
        involved = [names[j] for j in np.flatnonzero(np.abs(null) > 0.1)]
        raise FormulaError(
            f"the design is rank-deficient across the federation: columns {involved} are "
            "collinear (or constant alongside the intercept); drop or combine them"
        )


def inverse_information(hessian: np.ndarray) -> np.ndarray:
    try:
        factor = scipy.linalg.cho_factor(hessian)
        return scipy.linalg.cho_solve(factor, np.eye(len(hessian)))
    except (np.linalg.LinAlgError, ValueError):
        return np.full_like(hessian, np.nan)


MAX_HALVINGS = 20
State = tuple[Any, ...]
"""One evaluation: ``(objective, score, information, ...)``, the rest the model's own."""


def damped_newton(
    evaluate: Callable[[np.ndarray, np.ndarray], State],
    beta: np.ndarray,
    state: State,
    names: list[str],
    *,
    tol: float,
    maxiter: int,
) -> tuple[np.ndarray, State, bool, int, list[str]]:
    """Newton rounds from ``beta`` (evaluated as ``state``) on a concave objective, each step
    halved until the objective does not fall (at most ``MAX_HALVINGS`` trials; the last is
    kept whatever its objective) (``evaluate(point, base)``:
    the point and the accepted point it was stepped from, :mod:`fedstats.contract.paths`);
    stops on the Newton decrement (:func:`decrement_converged`) at the last evaluated point,
    whose information and objective are then the estimate's own. Returns ``(beta, its
    evaluation, converged, rounds, notes)``; ``rounds`` counts evaluations, the first
    included."""
    objective, score, information = state[:3]
    notes: list[str] = []
    rounds = 1
    previous = np.inf
    while rounds < maxiter + 1:
        step = newton_step(information, score, names, first=False)
        if step is None:
            notes.append("the information matrix became singular; the fit stopped early")
            return beta, state, False, rounds, notes
        decrement = newton_decrement(score, step)
        if decrement_converged(decrement, previous, tol):
            return beta, state, True, rounds, notes
        previous = decrement
        candidate = beta + step
        for halving in range(MAX_HALVINGS):
            trial = evaluate(candidate, beta)  # a trial stepped from the base beta
            rounds += 1
            # the last halving is kept even if the objective fell: the point evaluated
            # becomes the base (a path rule accepts it, :mod:`fedstats.contract.paths`)
            if trial[0] >= objective - 1e-12 * (1 + abs(objective)) or halving == MAX_HALVINGS - 1:
                break
            step = step / 2
            candidate = beta + step
        beta, state = candidate, trial
        objective, score, information = state[:3]
    return beta, state, False, rounds, notes
