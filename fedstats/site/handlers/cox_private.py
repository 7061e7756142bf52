"""Site side of the differentially private Cox model: clipped per-patient sums on a time grid.

The partial likelihood couples patients through risk sets: removing one
patient changes every other patient's term up to their exit, by an amount
that grows with ``exp(2 B ||beta||)`` and the inverse of the smallest risk
sets, so its sensitivity has no useful bound. The private fit therefore
uses the Cox model with a baseline hazard that is constant on each interval
of the study's time grid ``0 = g_0 < g_1 < ... < g_K`` (the piecewise
exponential model; Holford, Biometrics 1980; Laird & Olivier, JASA 1981),
``lambda(t | x) = exp(alpha_k + x' beta)`` for ``g_{k-1} < t <= g_k``. Its
log-likelihood is a sum over patients (Breslow, Biometrics 1974, showed that
profiling the ``alpha_k`` out on the distinct event times gives Cox's
partial likelihood), and ``beta`` keeps its meaning: log hazard ratios.

Patient ``i`` has exposure ``E_ik`` in interval ``k`` (in units of the
interval's width, so ``0 <= E_ik <= 1``; follow-up beyond ``g_K`` is
censored there), event indicator ``d_ik``, ``mu_ik = E_ik exp(alpha_k +
x_i' beta)`` and ``Lambda_i = sum_k mu_ik``. Its log-likelihood is
``sum_k [d_ik (alpha_k + x_i' beta) - mu_ik]``, its score
``g_i = (d_i - mu_i ; (delta_i - Lambda_i) x_i)`` and its information
``H_i = [[diag(mu_i), mu_i x_i'], [x_i mu_i', Lambda_i x_i x_i']]``, with
``||H_i||_F^2 = sum_k mu_ik^2 + 2 ||mu_i||^2 ||x_i||^2 + Lambda_i^2 ||x_i||^4``.

Each patient's contribution is clipped before summing (as DP-SGD clips each
example's gradient; Abadi et al., CCS 2016): ``g_i min(1, C_g / ||g_i||)``
and ``H_i min(1, C_H / ||H_i||_F)``, with the design scaled to ``[-1, 1]``
by public bounds and rows clipped to norm ``B`` first. Adding or removing
one patient then moves the summed score by at most ``C_g`` and the summed
information by at most ``C_H`` (Frobenius norm): the sensitivities of the
Gaussian releases, whatever the data. On a frame with several rows per
patient (a repeating index; :mod:`fedstats.site.patient_clipping`) the rows of
one patient are summed into ``g_i`` and ``H_i`` before the clip, so the bounds
hold per patient, not per row. A patient is clipped only when
``Lambda_i`` is large (long follow-up at high risk without the event); the
coordinator chooses ``C_g, C_H`` from a public cap on ``Lambda``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedstats.contract.dp_request import NoisyGroup
from fedstats.contract.tasks.cox_private import TASK, _alpha, _bounds
from fedstats.contract.tasks.design import checked_beta, spec_from_args
from fedstats.contract.tasks.logistic import (
    gradient_only,
)
from fedstats.contract.tasks.survival import checked_grid
from fedstats.errors import MalformedRequestError
from fedstats.site.handlers.design import site_design
from fedstats.site.handlers.logistic import clipped_design
from fedstats.site.patient_clipping import (
    clip_factors,
    crowded_patients,
    design_patients,
    patient_clip_factors,
    within_patient_pairs,
)
from fedstats.site.patient_rows import count_patients
from fedstats.site.task import SiteContext, TaskReply


def summaries_private_release(args: dict[str, Any]) -> list[NoisyGroup]:
    """The clipped score has sensitivity ``C_g``, the clipped information ``C_H``."""
    _, _, score_bound, info_bound = _bounds(args, spec_from_args(args).n_params)
    groups = [NoisyGroup(("gradient",), l2_sensitivity=score_bound)]
    if not gradient_only(args):
        groups.append(NoisyGroup(("hessian",), l2_sensitivity=info_bound, symmetric=True))
    return groups


def summaries(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """The clipped per-patient score and information summed over the site's patients at
    ``(alpha, beta)`` (alpha first, then beta; see the module docstring)."""
    spec = spec_from_args(args)
    grid = checked_grid(args)
    beta = checked_beta(ctx.name, args, spec.n_params)
    alpha = _alpha(args, len(grid))
    row_norm, scaling, score_bound, info_bound = _bounds(args, spec.n_params)
    design = site_design(ctx, spec)
    if design.time is None:
        raise MalformedRequestError(site=ctx.name, task=TASK, reason="not a survival design")
    X = clipped_design(design.X, row_norm, scaling)
    exposure, events = person_intervals(design.time, design.y.astype(bool), grid)
    mu = exposure * np.exp(alpha[None, :] + (X @ beta)[:, None])
    cumulative = mu.sum(axis=1)
    residual = events.sum(axis=1) - cumulative
    scores = np.hstack([events - mu, residual[:, None] * X])
    patients = design_patients(ctx, design.rows)
    if patients is None:
        score_weight = clip_factors(np.linalg.norm(scores, axis=1), score_bound)
    else:
        score_weight = patient_clip_factors(patients, scores, score_bound)
    released = {"gradient": score_weight @ scores}
    if not gradient_only(args):
        if patients is None:
            x_sq = np.einsum("ij,ij->i", X, X)
            mu_sq = np.einsum("ij,ij->i", mu, mu)
            info_norm = np.sqrt(mu_sq + 2 * mu_sq * x_sq + cumulative**2 * x_sq**2)
            w = clip_factors(info_norm, info_bound)
        else:
            w = clip_factors(patient_information_norms(patients, X, mu), info_bound)[patients]
        weighted_mu = w[:, None] * mu
        top_left = np.diag(weighted_mu.sum(axis=0))
        top_right = weighted_mu.T @ X
        bottom_right = X.T @ (X * (w * cumulative)[:, None])
        released["hessian"] = np.block([[top_left, top_right], [top_right.T, bottom_right]])
    return TaskReply(released, contributors=count_patients(ctx, design.rows, design.n_obs))


def patient_information_norms(patients: np.ndarray, X: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """``||H_i||_F`` of each patient's information summed over its rows ``r, s``:
    ``sum_{r,s} [mu_r'mu_s (1 + 2 x_r'x_s) + Lambda_r Lambda_s (x_r'x_s)^2]`` (the diagonal
    block, both off-diagonal blocks and the covariate block of the module docstring's ``H_i``;
    one row gives that formula); a patient of more than ``K + p`` rows from its summed blocks."""
    limit = mu.shape[1] + X.shape[1]
    first, second, owner = within_patient_pairs(patients, max_rows=limit)
    dots = np.einsum("ij,ij->i", X[first], X[second])
    cumulative = mu.sum(axis=1)
    terms = np.einsum("ij,ij->i", mu[first], mu[second]) * (1 + 2 * dots) + (
        cumulative[first] * cumulative[second] * dots**2
    )
    squares = np.bincount(owner, weights=terms, minlength=int(patients.max()) + 1).astype(float)
    for i, rows in crowded_patients(patients, limit):  # the blocks themselves: O(m_i (K + p)^2)
        corner = mu[rows].T @ X[rows]
        covariates = X[rows].T @ (X[rows] * cumulative[rows, None])
        squares[i] = np.sum(mu[rows].sum(axis=0) ** 2) + 2 * np.sum(corner**2)
        squares[i] += np.sum(covariates**2)
    return np.sqrt(np.maximum(squares, 0.0))


def person_intervals(
    time: np.ndarray, event: np.ndarray, grid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Exposure ``E_ik`` in units of each interval's width and event indicators ``d_ik``
    (``n x K``); follow-up beyond the last grid point is censored there."""
    edges = np.concatenate([[0.0], grid])
    widths = np.diff(edges)
    time = np.asarray(time, dtype=np.float64)
    covered = np.clip(time[:, None] - edges[None, :-1], 0.0, widths[None, :])
    exposure = covered / widths[None, :]
    interval = np.searchsorted(grid, time, side="left")  # g_{k-1} < t <= g_k  ->  k - 1
    inside = event & (interval < len(grid))
    events = np.zeros_like(exposure)
    events[np.flatnonzero(inside), interval[inside]] = 1.0
    return exposure, events
