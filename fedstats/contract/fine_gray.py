"""What both sides of a Fine–Gray fit derive from summed replies: the censoring weights and the
robust variance's pooled increments.

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


def censoring_survival(
    at_risk: np.ndarray, events: np.ndarray, competing: np.ndarray, censored: np.ndarray
) -> np.ndarray:
    """Kaplan–Meier of the censoring distribution on the grid, censorings after events.

    ``G(g_j) = prod_{l<=j} (1 - c_l / (n_l - d_l - e_l))`` with ``c`` the
    censorings, ``d`` and ``e`` the events of the cause and of the others at
    ``g_l`` (R ``finegray()``'s convention: a censoring at a time happens after
    the events at it). A factor whose risk set is empty is 1; the value is
    kept above 0 (a curve reaching 0 leaves no later risk set to weigh).
    """
    remaining = at_risk - events - competing
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(remaining > 0, 1.0 - censored / remaining, 1.0)
    G = np.cumprod(factor)
    return np.maximum(G, np.finfo(float).tiny)


def censoring_from_counts(total: Mapping[str, Any]) -> np.ndarray:
    """``G`` from the first round's summed counts, each rounded to a whole number (sites
    summing in any order agree exactly)."""
    counts = {f: np.rint(np.asarray(total[f], dtype=np.float64)) for f in COUNT_FIELDS}
    return censoring_survival(counts["at_risk"], counts["d"], counts["competing"],
                              counts["censored"])  # fmt: skip


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
