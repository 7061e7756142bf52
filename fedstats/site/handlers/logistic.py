"""Site side of logistic regression: the summed score, information and log-likelihood.

For the design ``X``, outcome ``y``, offset ``o`` and coefficients ``beta``
(with ``eta = X beta + o`` and ``mu = expit(eta)``), a site returns

* gradient ``X^T (y - mu)``,
* Hessian (Fisher information) ``X^T diag(mu (1 - mu)) X``,
* log-likelihood ``sum y eta - log(1 + exp(eta))``,

which are sums over patients, so the coordinator's totals equal the pooled
quantities exactly (the federated Newton method of DataSHIELD ``ds.glm``,
Gaye et al. 2014, and vantage6 ``v6-glm-py``, Cellamare et al. 2022). The
reply also carries two flags for separation diagnostics: whether every /
any patient's fitted probability lies within ``1e-10`` of 0 or 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from scipy.special import expit

from fedstats.contract.dp_request import NoisyGroup
from fedstats.contract.tasks.design import checked_beta, spec_from_args
from fedstats.contract.tasks.logistic import clip_from_args, gradient_only
from fedstats.site.handlers.design import site_design
from fedstats.site.patient_clipping import (
    clip_factors,
    design_patients,
    gram_frobenius,
    patient_clip_factors,
)
from fedstats.site.patient_rows import count_patients
from fedstats.site.row_blocks import Information, column_blocks
from fedstats.site.task import SiteContext, TaskReply

EXTREME_PROBABILITY = 1e-10


def summaries(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    spec = spec_from_args(args)
    beta = checked_beta(ctx.name, args, spec.n_params)
    private = ctx.private(args)
    design = site_design(ctx, spec)
    contributors = count_patients(ctx, design.rows, design.n_obs)
    if not (private or "clip" in args):
        blocks = column_blocks(design.columns, design.n_obs)
        return TaskReply(exact_sums(blocks, design.y, design.offset, beta), contributors)
    # B ||beta|| was bounded by the schema, before any charge
    X, y = clipped_design(design.X, *clip_from_args(args, spec.n_params)), design.y
    eta = X @ beta
    if design.offset is not None:
        eta = eta + design.offset
    mu = expit(eta)
    weights = mu * (1.0 - mu)
    if private:
        patients = design_patients(ctx, design.rows)
        if patients is not None:
            return TaskReply(patient_clipped(args, X, y - mu, weights, patients), contributors)
    gradient, hessian = score_and_information(X, y, mu)
    if private:
        released = {"gradient": gradient}
        if not gradient_only(args):
            released["hessian"] = hessian
        return TaskReply(released, contributors=contributors)
    return TaskReply(
        {
            "gradient": gradient,
            "hessian": hessian,
            "loglik": log_likelihood(y, eta),
            **extreme_flags(mu),
        },
        contributors=contributors,
    )


def exact_sums(
    blocks: Iterable[tuple[slice, np.ndarray]],
    y: np.ndarray,
    offset: np.ndarray | None,
    beta: np.ndarray,
) -> dict[str, Any]:
    """The exact reply at ``beta``: score, information, log-likelihood and the separation
    flags, summed over the design's blocks of rows (``(rows, block)`` pairs:
    :mod:`fedstats.site.row_blocks`)."""
    p = len(beta)
    gradient = np.zeros(p)
    information = Information(p)
    loglik = 0.0
    all_extreme, any_extreme = True, False
    for rows, block in blocks:
        eta = np.dot(block, beta)
        if offset is not None:
            eta += offset[rows]
        mu = expit(eta)
        gradient += np.dot(y[rows] - mu, block)
        information.add(block, mu * (1.0 - mu))
        loglik += log_likelihood(y[rows], eta)
        flags = extreme_flags(mu)
        all_extreme &= flags["all_extreme"]
        any_extreme |= flags["any_extreme"]
    return {
        "gradient": gradient,
        "hessian": information.total(),
        "loglik": loglik,
        "all_extreme": all_extreme,
        "any_extreme": any_extreme,
    }


def extreme_flags(mu: np.ndarray) -> dict[str, bool]:
    """Whether every / any fitted probability lies within ``1e-10`` of 0 or 1."""
    extreme = np.minimum(mu, 1.0 - mu) < EXTREME_PROBABILITY
    return {"all_extreme": bool(extreme.all()), "any_extreme": bool(extreme.any())}


def log_likelihood(y: np.ndarray, eta: np.ndarray) -> float:
    """``sum y eta - log(1 + exp(eta))``, stable for large ``|eta|``."""
    return float(np.sum(y * eta - np.logaddexp(0.0, eta)))


def score_and_information(
    X: np.ndarray, y: np.ndarray, mu: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``X'(y - mu)`` and ``X' diag(mu (1 - mu)) X``."""
    return X.T @ (y - mu), X.T @ (X * (mu * (1.0 - mu))[:, None])


# ------------------------------------------------------------ private release


def summaries_private_release(args: dict[str, Any]) -> list[NoisyGroup]:
    """Sensitivities of the score and information once rows are clipped to norm ``B``.

    With ``||x_i|| <= B``, ``|y_i - mu_i| <= 1`` and ``mu_i (1 - mu_i) <= 1/4``,
    adding or removing one patient moves the score by at most ``B`` and the
    information (Frobenius norm, hence its upper triangle) by at most
    ``B^2 / 4`` — the sensitivities of the noisy Newton method of
    Avella-Medina, Bradshaw & Loh (2023), "Differentially private inference
    via noisy optimization", Ann. Statist. A patient of several rows has its
    rows' contributions summed and clipped to the same bounds
    (:func:`patient_clipped`).
    """
    row_norm, _ = clip_from_args(args, spec_from_args(args).n_params)
    groups = [NoisyGroup(("gradient",), l2_sensitivity=row_norm)]
    if not gradient_only(args):
        groups.append(NoisyGroup(("hessian",), l2_sensitivity=row_norm**2 / 4, symmetric=True))
    return groups


def patient_clipped(
    args: dict[str, Any],
    X: np.ndarray,
    residual: np.ndarray,
    weights: np.ndarray,
    patients: np.ndarray,
) -> dict[str, np.ndarray]:
    """The score and information with each *patient's* rows summed, then clipped to the
    sensitivities :func:`summaries_private_release` charges (a frame with several rows per
    patient; :mod:`fedstats.site.patient_clipping`).

    Patient ``i`` contributes ``g_i = sum_{r in i} x_r (y_r - mu_r)``, released as
    ``g_i min(1, B / ||g_i||)``, and ``H_i = sum_{r in i} w_r x_r x_r'`` as
    ``H_i min(1, (B^2 / 4) / ||H_i||_F)``: a patient of one row is within both bounds and
    unchanged, a patient of ``m`` rows (up to ``m B`` and ``m B^2 / 4``) is scaled down, so
    removing any one patient moves each release by at most its charged sensitivity.
    """
    row_norm, _ = clip_from_args(args, X.shape[1])
    score_factor = patient_clip_factors(patients, X * residual[:, None], row_norm)
    released = {"gradient": X.T @ (residual * score_factor)}
    if not gradient_only(args):
        info_factor = clip_factors(gram_frobenius(patients, X, weights), row_norm**2 / 4)
        released["hessian"] = X.T @ (X * (weights * info_factor[patients])[:, None])
    return released


def clipped_design(X: np.ndarray, row_norm: float, scaling: np.ndarray) -> np.ndarray:
    """Scale columns to ``[-1, 1]`` by public bounds, clip, then clip each row to norm ``B``.

    ``x'_j = clip((x_j - c_j) / h_j, -1, 1)``; rows with ``||x'|| > B`` are
    scaled down to norm ``B``. With bounds that hold, only the row clip can
    bias; it never binds when ``B`` is at least the design's worst-case norm.
    """
    scaled = np.clip((X - scaling[:, 0]) / scaling[:, 1], -1.0, 1.0)
    norms = np.linalg.norm(scaled, axis=1)
    factor = np.minimum(1.0, row_norm / np.maximum(norms, 1e-300))
    return scaled * factor[:, None]
