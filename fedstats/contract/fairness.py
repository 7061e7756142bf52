"""The TPR-parity penalised objective, from summed replies: what both sides of a fair fit compute.

The penalised fit (:mod:`fedstats.models.fairness`) maximises

    Phi(w) = l(w) - gamma * sum_{g < h} (TPR_g(w) - TPR_h(w))^2,

with ``l`` the logistic log-likelihood summed over sites and the smooth
true-positive rate ``TPR_g = soft_g / positives_g`` of group ``g`` (sums of
``sigmoid(eta / T)`` over the group's patients with the outcome, Bechavod &
Ligett 2017; the equal-opportunity gap of Hardt, Price & Srebro, NeurIPS
2016, made differentiable). Its ascent direction is ``score - gamma * grad``
and its curvature the Gauss–Newton information ``H + 2 gamma sum d_gh d_gh'``
with ``d_gh = grad TPR_g - grad TPR_h``. The coordinator steps with it, and a
site that verifies paths re-derives the same step from the relayed replies
(:class:`fedstats.contract.paths.DampedNewtonPath` with ``evaluation="tpr-parity"``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

PARITY_FIELDS = ("loglik", "score", "information", "positives", "soft", "gradient")
"""The summed reply fields of one point of a fair fit (``fairness.summaries`` with
``likelihood``): the likelihood's log, score and information, and per group the number of
patients with the outcome, their smooth true-positive sum and its gradient."""


@dataclass(frozen=True)
class Penalised:
    """The penalised objective at one point, from the summed replies."""

    objective: float
    descent: np.ndarray
    """The objective's gradient (an ascent direction)."""
    curvature: np.ndarray
    loglik: float
    tpr: np.ndarray


def penalised(total: Mapping[str, Any], gamma: float) -> Penalised:
    """``Phi``, its gradient and Gauss–Newton curvature (see the module) from the summed
    fields :data:`PARITY_FIELDS`. Raises ``ValueError`` when a group has no patient with the
    outcome (its rate is undefined)."""
    positives = np.asarray(total["positives"], dtype=np.float64)
    if (positives <= 0).any():
        raise ValueError("a group has no patient with the outcome")
    tpr = np.asarray(total["soft"], dtype=np.float64) / positives
    d_tpr = np.asarray(total["gradient"], dtype=np.float64) / positives[:, None]
    p = d_tpr.shape[1]
    penalty, gradient = 0.0, np.zeros(p)
    gauss_newton = np.zeros((p, p))
    for g, h in itertools.combinations(range(len(tpr)), 2):
        gap, direction = tpr[g] - tpr[h], d_tpr[g] - d_tpr[h]
        penalty += gap**2
        gradient += 2 * gap * direction
        gauss_newton += 2 * np.outer(direction, direction)
    loglik = float(total["loglik"])
    return Penalised(
        objective=loglik - gamma * penalty,
        descent=np.asarray(total["score"], dtype=np.float64) - gamma * gradient,
        curvature=np.asarray(total["information"], dtype=np.float64) + gamma * gauss_newton,
        loglik=loglik,
        tpr=tpr,
    )


def penalty_weight(args: Mapping[str, Any]) -> float:
    """A request's ``gamma``: a finite number >= 0 (0 when absent), else ``nan``."""
    gamma = args.get("gamma", 0.0)
    if isinstance(gamma, bool) or not isinstance(gamma, int | float):
        return float("nan")
    gamma = float(gamma)
    return gamma if np.isfinite(gamma) and gamma >= 0 else float("nan")
