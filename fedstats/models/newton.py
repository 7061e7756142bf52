"""Newton's method at the coordinator: the step, the rank check and the covariance.

Shared by every model whose sites return a score and an information matrix
(logistic regression, the Cox model).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from fedstats.errors import FormulaError


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
